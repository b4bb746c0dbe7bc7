"""What a person reads after a run says only what is so (issue 33, points 7, 8 and 10): a
critic-free run with nothing to compare shows no comparison, a diff with no GAE baseline no
terminal credit; the two terminal-reward figures are told apart and the group column has the
user's name in every output; a resumed run says what it skipped, a failed ``--json -`` run
still prints a document, an output inside its input directory is refused the first time,
an interrupted run leaves no directory it made, an unreachable store is named so.

Expected figures come from the files themselves (pyarrow and numpy), not from gaecli."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from gaecli.io import filesystem

from rollout_files import gae, random_rollouts, rollout_table, write_table

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATA = ROOT / "sample_data"
CRITIC_FREE = SAMPLE_DATA / "critic_free" / "grpo_step_0000.parquet"
WAIT_SECONDS = 120.0  # bound on every wait of the interrupted run
FILES = 3  # files of the interrupted run, written at once
# rows of each: read one per batch, a file takes seconds (about 0.5 ms a row on a 2-core machine),
# far longer than the workers take to start one after another on a busy machine
INTERRUPTED_ROWS = 12_000


def mask_counts(path: Path) -> dict:
    """Samples, fully masked samples, samples ending in masked tokens after a trainable one,
    and samples with no trainable token and a terminal reward (what every side but a
    last-token profile drops), read with pyarrow."""
    table = pq.read_table(path, columns=["loss_mask", "terminal_reward"])
    masks = [np.asarray(mask, dtype=bool) for mask in table.column("loss_mask").to_pylist()]
    terminal = table.column("terminal_reward").to_pylist()
    return {
        "samples": len(masks),
        "fully_masked": sum(1 for mask in masks if mask.size and not mask.any()),
        "tails": sum(1 for mask in masks if mask.any() and not mask[-1]),
        "nothing_trainable": sum(
            1 for mask, z in zip(masks, terminal) if (mask.size and not mask.any()) or (not mask.size and z != 0)
        ),
    }


# ----------------------------------------------------------------------------- point 7


def test_a_critic_free_recompute_with_nothing_to_compare_shows_no_comparison(tmp_path):
    result = gae(
        "recompute", CRITIC_FREE, "-o", tmp_path / "out.parquet", "--estimator", "grpo", "--group-col", "prompt_id",
        "--json", "-",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    counts = mask_counts(CRITIC_FREE)
    assert summary["baseline"] is None
    assert summary["changed_samples"] is None  # not 0: nothing was compared
    assert summary["mean_abs_delta_advantage"] is None and summary["max_abs_delta_advantage"] is None
    assert summary["samples"] == counts["samples"] and summary["fully_masked_samples"] == counts["fully_masked"]
    text = result.stderr
    assert "grpo: the samples (nothing compared)" in text and "--baseline PROFILE compares grpo" in text
    for misleading in ("no baseline computed", "samples changed", "|Δ advantage|", "terminal credit"):
        assert misleading not in text, misleading
    assert f"fully masked samples │ {counts['fully_masked']} (" in " ".join(text.split())


def test_a_critic_free_recompute_against_its_trainer_profile_names_it(tmp_path):
    result = gae(
        "recompute", CRITIC_FREE, "-o", tmp_path / "out.parquet", "--estimator", "grpo", "--group-col", "prompt_id",
        "--baseline", "verl", "--json", "-",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["baseline"] == "verl" and isinstance(summary["changed_samples"], int)
    assert "grpo against the verl baseline" in result.stderr and "samples changed" in result.stderr
    assert "terminal credit" not in result.stderr  # a GAE figure: not defined for grpo's profile


def test_a_diff_between_estimators_shows_no_stored_side_nor_credit():
    result = gae(
        "diff", CRITIC_FREE, "--estimator", "rloo", "--group-col", "prompt_id", "--old-estimator", "grpo",
        "--markdown", "-",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for text in (result.stdout, result.stderr):
        assert "stored advantages" not in text and "defined for a GAE baseline only" not in text
        assert "old terminal credit" not in text and "old side" not in text
    top = next(line for line in result.stdout.splitlines() if line.startswith("| # | file | row |"))
    assert "credit" not in top  # the top samples carry no column of dashes
    assert "terminal reward dropped, new side" in result.stdout  # the new side's figure stays


# ----------------------------------------------------------------------------- point 8


def test_the_terminal_reward_figures_are_told_apart():
    path = SAMPLE_DATA / "agentic" / "step_0000.parquet"
    result = gae("diff", path, "--gamma", "1", "--lambd", "0.95", "--baseline", "slime", "--markdown", "-")
    assert result.exit_code == 0, result.output
    cells = {}
    for line in result.stdout.splitlines():
        parts = re.split(r"(?<!\\)\|", line)  # the cells between unescaped pipes
        if line.startswith("| ") and len(parts) == 4:
            cells[parts[1].strip()] = parts[2].strip()
    counts = mask_counts(path)
    # slime with γλ > 0 delivers (γλ)^tail > 0 to every tail: none kept none of it
    assert cells["↳ tails that kept none of the terminal reward"] == "0 (0.0 %)"
    dropped = cells["terminal reward dropped (reaches no trainable token), old side"]
    share = 100 * counts["nothing_trainable"] / counts["samples"]
    assert dropped.startswith(f"{counts['nothing_trainable']} ({share:.1f} %)")
    assert not any("lost" in label for label in cells)


def test_the_group_column_has_the_users_name_in_every_output(tmp_path):
    data = random_rollouts(24, seed=33)
    groups = pa.array([row % 3 for row in range(24)], pa.int64())
    path = write_table(
        rollout_table(data, extra={"step": groups, "changed": groups, "samples": groups}), tmp_path / "in.parquet"
    )
    for column, per_sample_name, groups_name in (
        ("step", "step", "step"),
        ("changed", "group_changed", "changed"),  # a column of the --per-sample file
        ("samples", "samples", "group_samples"),  # a column of the --groups-out file
    ):
        per_sample, groups_out = tmp_path / f"rows_{column}.parquet", tmp_path / f"groups_{column}.parquet"
        result = gae(
            "diff", path, "--gamma", "0.9", "--lambd", "0.8", "--group-by", column, "--per-sample", per_sample,
            "--groups-out", groups_out, "--markdown", "-",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = pq.read_table(per_sample)
        assert rows.column_names[2] == per_sample_name and "group" not in rows.column_names
        assert rows.column(per_sample_name).to_pylist() == [row % 3 for row in range(24)]
        listed = pq.read_table(groups_out)
        assert listed.column_names[0] == groups_name and "key" not in listed.column_names
        assert listed.column(groups_name).to_pylist() == [0, 1, 2]
        assert listed.column("samples").to_pylist() == [8, 8, 8]
        assert f"| {column} | samples |" in result.stdout  # the Markdown groups table
        assert f"\n{column} " in result.stderr  # the terminal's groups table heads its column so too


# ----------------------------------------------------------------------------- point 10


def test_a_fully_resumed_run_says_it_skipped_every_file(tmp_path):
    inputs, output = SAMPLE_DATA / "agentic", tmp_path / "out"
    first = gae("recompute", inputs, "-o", output, "--gamma", "1", "--lambd", "0.95")
    assert first.exit_code == 0, first.output
    again = gae("recompute", inputs, "-o", output, "--gamma", "1", "--lambd", "0.95", "--skip-existing")
    assert again.exit_code == 0, again.output
    files = len(list(inputs.glob("*.parquet")))
    assert f"nothing recomputed: {files} files, {files} skipped (--skip-existing" in again.stderr
    assert "samples changed" not in again.stderr and "0 rows in" not in again.stderr


def test_a_failed_run_prints_a_json_error_document_on_stdout(tmp_path):
    data = random_rollouts(8, seed=5)
    table = rollout_table(data)
    masks = table.column("loss_mask").to_pylist()
    bad = next(row for row, mask in enumerate(masks) if len(mask) >= 2)
    masks[bad][1] = 2  # a mask value that is neither 0 nor 1
    table = table.set_column(
        table.schema.get_field_index("loss_mask"), "loss_mask", pa.array(masks, pa.list_(pa.int8()))
    )
    path = write_table(table, tmp_path / "bad.parquet")
    result = gae("recompute", path, "-o", tmp_path / "out.parquet", "--gamma", "1", "--lambd", "1", "--json", "-")
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 1 and error["row"] == bad and error["column"] == "loss_mask"
    assert error["file"] == str(path) and isinstance(error["code"], str) and error["message"]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"row {bad}" in lines[0]


def test_a_usage_failure_prints_its_json_error_document_too(tmp_path):
    result = gae("diff", tmp_path / "absent.parquet", "--gamma", "1", "--lambd", "1", "--json", "-")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 2 and "absent.parquet" in error["message"] and error["row"] is None


def test_an_output_inside_the_input_directory_is_refused_the_first_time(tmp_path):
    inputs = tmp_path / "d2"
    shutil.copytree(SAMPLE_DATA / "agentic", inputs)
    before = sorted(path.name for path in inputs.rglob("*"))
    result = gae("recompute", inputs, "-o", inputs / "fixed", "--gamma", "1", "--lambd", "0.95")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "inside the input directory" in lines[0]
    assert sorted(path.name for path in inputs.rglob("*")) == before  # nothing written, no directory made


@pytest.mark.parametrize(
    "uri, host",
    [
        ("s3://bucket/in.parquet", "the s3 endpoint"),
        ("s3://bucket/in.parquet?endpoint_override=minio:9000", "minio:9000"),
    ],
)
def test_an_unreachable_store_is_named_so(tmp_path, monkeypatch, uri, host):
    said = (
        "When resolving region for bucket 'bucket': AWS Error NETWORK_CONNECTION during HeadBucket operation: "
        "curlCode: 6, Couldn't resolve host name"
    )

    def unreachable(uri):
        raise OSError(said)

    class Stores:  # pyarrow.fs, but a file system from a URI cannot be reached
        FileSystem = SimpleNamespace(from_uri=unreachable)

        def __getattr__(self, name):
            return getattr(pafs, name)

    monkeypatch.setattr(filesystem, "pafs", Stores())
    result = gae("recompute", uri, "-o", tmp_path / "out.parquet", "--gamma", "1", "--lambd", "1")
    assert result.exit_code == 2
    assert f"{host} could not be reached (its name does not resolve: " in result.stderr
    assert "file systems understand" not in result.stderr


def test_an_interrupted_run_leaves_no_directory_it_made(tmp_path):
    inputs = tmp_path / "in"
    rows = rollout_table(random_rollouts(INTERRUPTED_ROWS, seed=71))
    for index in range(FILES):  # each worker makes its output's directories, or finds them made by another
        write_table(rows, inputs / (f"s{index}" if index else "") / f"f{index}.parquet")
    made = tmp_path / "new"  # absent: the run makes new/, new/out/ and new/out/s*/
    environment = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen(
        [sys.executable, "-m", "gaecli", "recompute", str(inputs), "-o", str(made / "out"), "--gamma", "0.99",
         "--lambd", "0.95", "--batch-rows", "1", "--workers", str(FILES), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while sum(path.is_file() for path in made.rglob("*")) < FILES:  # every worker writing its temp file
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "no output was being written"
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole group
        _, stderr = process.communicate(timeout=WAIT_SECONDS)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130, stderr
    # A unit that finished before the Ctrl-C (a slow start of the others) keeps its output and
    # the directories above it; nothing else the run made is left.
    written = {Path(line.split("written: ", 1)[1]) for line in stderr.splitlines() if line.startswith("  written: ")}
    assert "  not written: " in stderr, stderr  # the interrupt stopped units that were writing
    left = {made, *made.rglob("*")} if made.exists() else set()
    assert {path for path in left if not path.is_dir()} == written, stderr
    above_written = {folder for path in written for folder in path.parents if folder.is_relative_to(made)}
    assert {path for path in left if path.is_dir()} == above_written, stderr
