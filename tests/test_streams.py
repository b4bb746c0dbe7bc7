"""The standard streams of a real ``gae`` process (``python -m gaecli``): stdout on a full
device, a stdout whose reader went away, a closed stderr, and library warnings. Each run is
a subprocess, bounded by a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rollout_files import (
    TOLERANCE,
    assert_rows_close,
    files_under,
    random_rollouts,
    reference_outputs,
    rollout_table,
    rollouts_from_table,
    write_table,
)

ROOT = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 240.0
ROWS = 3000  # a JSON document of validate's findings, diff's tables: larger than a pipe's buffer


def environment() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def gae_argv(*arguments) -> list[str]:
    return [sys.executable, "-m", "gaecli", *map(str, arguments)]


def run(*arguments, **popen) -> subprocess.CompletedProcess:
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(gae_argv(*arguments), env=environment(), timeout=WAIT_SECONDS, cwd=ROOT, **popen)


@pytest.fixture(scope="module")
def rollout(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("streams")
    table = rollout_table(random_rollouts(ROWS, seed=26, max_length=12))
    return write_table(table, directory / "in.parquet")


def commands(rollout: Path, out: Path) -> dict[str, list]:
    """A command of each kind that writes a document to stdout ('-')."""
    discount = ["--gamma", 1, "--lambd", 0.9]
    return {
        "recompute --json": ["recompute", rollout, "-o", out / "o.parquet", *discount, "--json", "-"],
        "validate --json": ["validate", rollout, "--json", "-"],
        "diff --json": ["diff", rollout, *discount, "--per-sample", out / "s.parquet", "--json", "-"],
        "diff --markdown": ["diff", rollout, *discount, "--top", 1000, "--markdown", "-"],
        "kernels": ["kernels"],
        "validate --list-rules": ["validate", "--list-rules"],
    }


COMMANDS = ["recompute --json", "validate --json", "diff --json", "diff --markdown", "kernels", "validate --list-rules"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("command", COMMANDS)
def test_stdout_on_a_full_device_is_one_line_and_exit_2(rollout, tmp_path, command):
    with open("/dev/full", "w") as full:
        result = run(*commands(rollout, tmp_path)[command], stdout=full, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "standard output" in lines[0] and "No space left on device" in lines[0], lines


def outputs_whole_and_no_temps(tmp_path: Path) -> None:
    """What a recompute or diff run wrote under ``tmp_path`` is whole; no temp file is left."""
    for path in files_under(tmp_path):
        assert not Path(path).name.startswith("."), f"temp file left: {path}"
        assert pq.read_table(tmp_path / path).num_rows == ROWS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_reader_gone_ends_the_command_by_sigpipe_quietly(rollout, tmp_path, command):
    """The test closes its end of the child's stdout before the child writes: every write
    there meets EPIPE. The child ends by SIGPIPE (the shell's 141), says nothing, and what
    it wrote besides is whole."""
    process = subprocess.Popen(
        gae_argv(*commands(rollout, tmp_path)[command]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
        cwd=ROOT,
    )
    process.stdout.close()
    try:
        _, stderr = process.communicate(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == -signal.SIGPIPE, stderr.decode()
    assert stderr == b"", stderr.decode()
    outputs_whole_and_no_temps(tmp_path)
    if command == "recompute --json":
        assert files_under(tmp_path) == ["o.parquet"]


def test_a_reader_gone_through_a_shell_pipe_is_141(rollout, tmp_path):
    script = " ".join(f"'{part}'" for part in gae_argv("validate", rollout, "--json", "-", "--quiet"))
    result = subprocess.run(
        ["bash", "-c", f"{script} | true; echo ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=WAIT_SECONDS,
    )
    assert result.stdout.strip() == "141" and result.stderr == "", result


def test_a_closed_stderr_does_not_stop_the_work(rollout, tmp_path):
    """``2>&-``: the summary and progress go nowhere; the output is written, exit 0, and
    no file the run opened took descriptor 2."""
    output = tmp_path / "o.parquet"
    argv = gae_argv("recompute", rollout, "-o", output, "--gamma", 1, "--lambd", 0.9)
    script = " ".join(f"'{part}'" for part in argv)
    result = subprocess.run(
        ["bash", "-c", f"GAE_PROGRESS_SECONDS=0 {script} 2>&-"],
        capture_output=True,
        env=environment(),
        timeout=WAIT_SECONDS,
    )
    assert result.returncode == 0 and result.stdout == b"", result
    table = pq.read_table(output)
    expected, _ = reference_outputs(rollouts_from_table(table), 1.0, 0.9)
    assert_rows_close("advantages", expected, table.column("advantages").to_pylist(), TOLERANCE["float"])
    assert files_under(tmp_path) == ["o.parquet"]
    validated = subprocess.run(
        ["bash", "-c", " ".join(f"'{part}'" for part in gae_argv("validate", output, "--json", "-")) + " 2>&-"],
        capture_output=True,
        env=environment(),
        timeout=WAIT_SECONDS,
    )
    assert validated.returncode == 0 and json.loads(validated.stdout)["files"], validated


def test_an_overflowing_lambd_alpha_is_computed_without_a_warning(rollout, tmp_path):
    """α·L beyond float64 (α = 1e308): λ = 1 − 1/max(α·L, 1) is 1 for every sample with a
    trainable token, so the advantages are plain masked GAE with λ = 1; nothing on stderr
    but the summary."""
    output = tmp_path / "o.parquet"
    result = run("recompute", rollout, "-o", output, "--gamma", 0.99, "--lambd", 0.5, "--lambd-alpha", 1e308, text=True)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "overflow encountered" not in result.stderr, result.stderr
    table = pq.read_table(output)
    expected, _ = reference_outputs(rollouts_from_table(table), 0.99, 1.0)
    assert_rows_close("advantages", expected, table.column("advantages").to_pylist(), TOLERANCE["float"])


def test_adaptive_lambd_of_an_overflowing_product_is_the_limit_without_a_warning():
    import warnings

    import numpy as np

    from gaecli.advantages.variants import adaptive_lambd

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = adaptive_lambd(1e308, np.array([0, 1, 7, 10**6]))
        tiny = adaptive_lambd(1e-300, np.array([3]))
    assert got.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert tiny.tolist() == [0.0]
