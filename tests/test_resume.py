"""Resuming and replacing outputs: ``--skip-existing`` keeps an output only when it was
computed from these inputs as they are now (its own input's identity, and every input's
where its statistics span the run), else recomputes it and says why; a run owns the rejects
file beside each output it replaces (``--overwrite``): written anew or removed."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_files import files_under, gae, random_rollouts, rollout_table, sha256, write_table

GAE = ("--gamma", 0.9, "--lambd", 0.8)


def recompute(inputs, output, *options):
    return gae("recompute", inputs, "-o", output, "--kernel", "native", "--workers", 1, *options)


def outcomes(result) -> list[tuple[bool, object]]:
    assert result.exit_code == 0, result.output
    return [(f["skipped"], f["recomputed"]) for f in json.loads(result.stdout)["files"]]


def grouped_table(rows: int, seed: int) -> pa.Table:
    table = rollout_table(random_rollouts(rows, seed=seed))
    return table.append_column("prompt_id", pa.array([row // 4 for row in range(rows)], pa.int64()))


# ----------------------------------------------------------------------------- case 6: the inputs' identity


def test_skip_existing_recomputes_an_output_of_another_input(tmp_path):
    write_table(rollout_table(random_rollouts(4, seed=1)), tmp_path / "a.parquet")
    write_table(rollout_table(random_rollouts(50, seed=2)), tmp_path / "b.parquet")
    output = tmp_path / "out.parquet"
    assert recompute(tmp_path / "a.parquet", output, *GAE, "--quiet").exit_code == 0
    resumed = recompute(tmp_path / "b.parquet", output, *GAE, "--skip-existing", "--json", "-")
    assert outcomes(resumed) == [(False, "its output was computed from another input")]
    assert pq.read_metadata(output).num_rows == 50
    said = recompute(tmp_path / "b.parquet", tmp_path / "said.parquet", *GAE)
    assert said.exit_code == 0
    os.replace(tmp_path / "said.parquet", output)  # an output of b.parquet under a.parquet's name: the same case
    report = recompute(tmp_path / "a.parquet", output, *GAE, "--skip-existing")
    assert report.exit_code == 0
    said = f"{tmp_path / 'a.parquet'}: recomputed: its output was computed from another input"
    assert re.sub(r"\s", "", said) in re.sub(r"\s", "", report.stderr)  # the terminal may wrap it
    assert pq.read_metadata(output).num_rows == 4
    again = recompute(tmp_path / "a.parquet", output, *GAE, "--skip-existing", "--json", "-")
    assert outcomes(again) == [(True, None)]


@pytest.mark.parametrize("change", ["rewritten", "touched"])
def test_skip_existing_recomputes_an_output_whose_input_changed(tmp_path, change):
    source = write_table(rollout_table(random_rollouts(20, seed=3)), tmp_path / "in" / "a.parquet")
    output = tmp_path / "out"
    assert recompute(source.parent, output, *GAE, "--quiet").exit_code == 0
    if change == "rewritten":
        write_table(rollout_table(random_rollouts(30, seed=4)), source)
        field = "size"
    else:  # the same bytes, written again later: not known to be the same
        status = source.stat()
        os.utime(source, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
        field = "mtime_ns"
    resumed = recompute(source.parent, output, *GAE, "--skip-existing", "--json", "-")
    [(skipped, why)] = outcomes(resumed)
    assert not skipped and why.startswith(f"the input changed since its output was written ({field} ")
    fresh = tmp_path / "fresh"
    assert recompute(source.parent, fresh, *GAE, "--quiet").exit_code == 0
    assert sha256(output / "a.parquet") == sha256(fresh / "a.parquet")  # the same bytes as a run from scratch
    assert outcomes(recompute(source.parent, output, *GAE, "--skip-existing", "--json", "-")) == [(True, None)]


@pytest.mark.parametrize(
    "computation",
    [(*GAE, "--normalize"), (*GAE, "--normalize-by", "prompt_id"), ("--estimator", "grpo", "--group-col", "prompt_id")],
    ids=["normalize", "normalize-by", "grpo"],
)
def test_skip_existing_recomputes_every_output_when_statistics_span_a_changed_input(tmp_path, computation):
    source = tmp_path / "in"
    for index, name in enumerate(("a.parquet", "b.parquet", "c.parquet")):
        write_table(grouped_table(12, seed=10 + index), source / name)
    output = tmp_path / "out"
    assert recompute(source, output, *computation, "--quiet").exit_code == 0
    write_table(grouped_table(16, seed=20), source / "c.parquet")
    resumed = recompute(source, output, *computation, "--skip-existing", "--json", "-")
    spanned = "the inputs of the run changed since its output was written (its statistics span every input)"
    found = outcomes(resumed)
    assert found[:2] == [(False, spanned)] * 2
    assert not found[2][0] and found[2][1].startswith("the input changed since its output was written (size ")
    fresh = tmp_path / "fresh"
    assert recompute(source, fresh, *computation, "--quiet").exit_code == 0
    assert {name: sha256(output / name) for name in files_under(output)} == {
        name: sha256(fresh / name) for name in files_under(fresh)
    }
    again = recompute(source, output, *computation, "--skip-existing", "--json", "-")
    assert outcomes(again) == [(True, None)] * 3


def test_outputs_of_their_own_input_only_are_kept_when_another_input_changes(tmp_path):
    source = tmp_path / "in"
    for index, name in enumerate(("a.parquet", "b.parquet")):
        write_table(rollout_table(random_rollouts(10, seed=30 + index)), source / name)
    output = tmp_path / "out"
    assert recompute(source, output, *GAE, "--quiet").exit_code == 0
    write_table(rollout_table(random_rollouts(11, seed=40)), source / "b.parquet")
    found = outcomes(recompute(source, output, *GAE, "--skip-existing", "--json", "-"))
    assert found[0] == (True, None) and not found[1][0]


def test_an_output_written_without_the_input_identity_is_recomputed(tmp_path):
    """Outputs of gaecli before the identity was recorded: the same computation, but not
    known to come from this input as it is; recomputed."""
    source = write_table(rollout_table(random_rollouts(8, seed=5)), tmp_path / "a.parquet")
    output = tmp_path / "out.parquet"
    assert recompute(source, output, *GAE, "--quiet").exit_code == 0
    table = pq.read_table(output)
    older = {k: v for k, v in table.schema.metadata.items() if k not in (b"gaecli.input", b"gaecli.inputs")}
    pq.write_table(table.replace_schema_metadata(older), output)
    found = outcomes(recompute(source, output, *GAE, "--skip-existing", "--json", "-"))
    assert found == [(False, "its output records no input identity (written by an earlier gaecli)")]
    assert b"gaecli.input" in pq.read_schema(output).metadata


def test_the_output_records_its_input_identity(tmp_path):
    source = write_table(rollout_table(random_rollouts(7, seed=6)), tmp_path / "a.parquet")
    output = tmp_path / "out.parquet"
    assert recompute(source, output, *GAE, "--quiet").exit_code == 0
    metadata = pq.read_schema(output).metadata
    status = source.stat()
    assert json.loads(metadata[b"gaecli.input"]) == {
        "path": str(source.resolve()),
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "rows": 7,
    }
    assert b"gaecli.inputs" not in metadata  # its own input only: no statistics span the run


# ----------------------------------------------------------------------------- case 7: the rejects file


def _with_an_invalid_row(path: Path) -> Path:
    rollouts = random_rollouts(6, seed=7)
    rollouts.masks[2] = [2] * len(rollouts.masks[2])
    return write_table(rollout_table(rollouts), path)


@pytest.mark.parametrize("on_invalid", ["skip", "stop"])
def test_overwrite_removes_the_rejects_file_of_an_earlier_run(tmp_path, on_invalid):
    source = _with_an_invalid_row(tmp_path / "in.parquet")
    output = tmp_path / "out" / "o.parquet"
    assert recompute(source, output, *GAE, "--on-invalid", "skip", "--quiet").exit_code == 0
    assert files_under(output.parent) == ["o.parquet", "o.rejected.parquet"]
    write_table(rollout_table(random_rollouts(6, seed=8)), source)  # all valid now
    result = recompute(source, output, *GAE, "--on-invalid", on_invalid, "--overwrite", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["files"][0]["rejects_file"] is None
    assert files_under(output.parent) == ["o.parquet"]
    assert pq.read_metadata(output).num_rows == 6


def test_overwrite_replaces_the_rejects_file_of_an_earlier_run(tmp_path):
    source = _with_an_invalid_row(tmp_path / "in.parquet")
    output = tmp_path / "o.parquet"
    rejects = tmp_path / "o.rejected.parquet"
    write_table(pa.table({"stale": [1, 2, 3]}), rejects)
    result = recompute(source, output, *GAE, "--on-invalid", "skip", "--overwrite", "--quiet")
    assert result.exit_code == 0, result.output
    assert pq.read_table(rejects).num_rows == 1 and "reason" in pq.read_schema(rejects).names


def test_a_rejects_file_that_is_an_input_is_refused_with_overwrite(tmp_path):
    """Under ``--overwrite`` the run owns ``OUT.rejected.parquet`` whatever the mode: it is
    checked against the inputs like every path a run writes (here it would be removed)."""
    source = write_table(rollout_table(random_rollouts(6, seed=9)), tmp_path / "o.rejected.parquet")
    result = recompute(source, tmp_path / "o.parquet", *GAE, "--overwrite")
    assert result.exit_code == 2
    assert source.exists() and pq.read_metadata(source).num_rows == 6
    assert files_under(tmp_path) == ["o.rejected.parquet"]


def test_a_recomputed_output_takes_its_stale_rejects_file_along(tmp_path):
    source = _with_an_invalid_row(tmp_path / "in" / "a.parquet")
    output = tmp_path / "out"
    assert recompute(source.parent, output, *GAE, "--on-invalid", "skip", "--quiet").exit_code == 0
    write_table(rollout_table(random_rollouts(9, seed=11)), source)  # changed, and all valid
    result = recompute(source.parent, output, *GAE, "--on-invalid", "skip", "--skip-existing", "--json", "-")
    assert outcomes(result)[0][0] is False
    assert files_under(output) == ["a.parquet"]
