"""``gae diff --on-invalid skip``: one bad row stops a diff by default (exit 1, one line naming
file, row and column); with ``skip`` it is left out of every comparison, counted and named in
every report, written to ``--rejects PATH``, and the figures are those of the file without it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from gaecli.cli import app

runner = CliRunner()

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("values", pa.list_(pa.float32())),
        ("rewards", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("terminal_reward", pa.float64()),
    ]
)
BAD_ROW = 3
GAE = ("--gamma", "1", "--lambd", "0.95")


def rows() -> list[dict]:
    """Six rows, every other one with a masked tail, so that the baseline differs."""
    return [
        {
            "sample_id": f"s{i}",
            "values": [0.1 * i, 0.2, 0.3, 0.05],
            "rewards": [0.0, 0.1, 0.0, 0.0],
            "loss_mask": [1, 1, 0, 0] if i % 2 else [1, 0, 1, 1],
            "terminal_reward": float(i % 3),
        }
        for i in range(6)
    ]


def files(tmp_path: Path) -> tuple[Path, Path]:
    """The file with one bad row (a NaN value at row 3) and the same file without that row."""
    good = rows()
    bad = [dict(row) for row in good]
    bad[BAD_ROW]["values"] = [0.1, math.nan, 0.3, 0.05]
    bad_path, without_path = tmp_path / "bad.parquet", tmp_path / "without.parquet"
    pq.write_table(pa.Table.from_pylist(bad, schema=SCHEMA), bad_path)
    pq.write_table(pa.Table.from_pylist(good[:BAD_ROW] + good[BAD_ROW + 1 :], schema=SCHEMA), without_path)
    return bad_path, without_path


def diff(*args):
    result = runner.invoke(app, ["diff", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_one_bad_row_stops_a_diff_by_default(tmp_path):
    bad, _ = files(tmp_path)
    result = diff(bad, *GAE)
    assert result.exit_code == 1  # invalid input data (docs/diff.md#exit-codes)
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {bad}, row 3, column 'values': 'values' is nan at token 1 [non-finite]"]


def test_skip_leaves_the_row_out_counts_names_and_writes_it(tmp_path):
    bad, without = files(tmp_path)
    rejects, markdown = tmp_path / "rejects.parquet", tmp_path / "report.md"
    per_sample = tmp_path / "samples.parquet"
    result = diff(
        bad, *GAE, "--on-invalid", "skip", "--rejects", rejects, "--json", "-", "--markdown", markdown,
        "--per-sample", per_sample, "--id-col", "sample_id",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["on_invalid"] == "skip" and document["rejects"] == str(rejects)
    [named] = document["skipped"]["rows"]
    assert document["skipped"]["count"] == 1
    assert (named["file"], named["row"]) == (str(bad), 3) and "[non-finite]" in named["reason"]

    reference = json.loads(diff(without, *GAE, "--json", "-", "--id-col", "sample_id").stdout)
    assert reference["skipped"] == {"count": 0, "rows": []} and reference["on_invalid"] == "stop"
    assert document["summary"] == reference["summary"] and document["summary"]["samples"] == 5
    assert [c["summary"] for c in document["comparisons"]] == [c["summary"] for c in reference["comparisons"]]
    # the top samples keep their rows in the file: those after the skipped one count it
    assert sorted((e["row"], e["id"]) for e in document["top_samples"]) == sorted(
        (e["row"] + (e["row"] >= BAD_ROW), e["id"]) for e in reference["top_samples"]
    )
    samples = pq.read_table(per_sample)
    assert samples.column("row").to_pylist() == [0, 1, 2, 4, 5]
    assert samples.column("id").to_pylist() == ["s0", "s1", "s2", "s4", "s5"]

    written = pq.read_table(rejects).to_pylist()
    assert [(r["source_file"], r["source_row"], r["sample_id"]) for r in written] == [(str(bad), 3, "s3")]
    assert math.isnan(written[0]["values"][1]) and written[0]["reason"] == named["reason"]

    assert f"1 row skipped (invalid): {bad}:3 → {rejects}" in result.stderr
    assert f"1 row skipped (invalid): `{bad}`:3 → `{rejects}`" in markdown.read_text()


def test_the_rows_skipped_in_several_files_are_named_in_input_order(tmp_path):
    bad, without = files(tmp_path)
    result = diff(without, bad, bad.with_name("bad.parquet"), *GAE, "--on-invalid", "skip", "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["skipped"]["count"] == 1  # a file named twice is read once
    assert [(e["file"], e["row"]) for e in document["skipped"]["rows"]] == [(str(bad), 3)]
    assert document["summary"]["samples"] == 10
    assert f"1 row skipped (invalid): {bad}:3" in result.stderr


def test_rejects_needs_skip_and_is_never_replaced_without_overwrite(tmp_path):
    bad, _ = files(tmp_path)
    rejects = tmp_path / "rejects.parquet"
    result = diff(bad, *GAE, "--rejects", rejects)
    assert result.exit_code == 2 and "--rejects needs --on-invalid skip" in result.stderr
    assert not rejects.exists()
    rejects.write_bytes(b"keep")
    result = diff(bad, *GAE, "--on-invalid", "skip", "--rejects", rejects)
    assert result.exit_code == 2 and rejects.read_bytes() == b"keep"
    result = diff(bad, *GAE, "--on-invalid", "skip", "--rejects", rejects, "--overwrite")
    assert result.exit_code == 0 and pq.read_table(rejects).num_rows == 1


def test_rejects_onto_an_input_is_refused_before_any_work(tmp_path):
    bad, _ = files(tmp_path)
    before = bad.read_bytes()
    result = diff(bad, *GAE, "--on-invalid", "skip", "--rejects", bad, "--overwrite")
    assert result.exit_code == 2 and "input" in result.stderr
    assert bad.read_bytes() == before


def test_an_unknown_mode_exits_2(tmp_path):
    bad, _ = files(tmp_path)
    result = diff(bad, *GAE, "--on-invalid", "drop")
    assert result.exit_code == 2 and "--on-invalid" in result.stderr
