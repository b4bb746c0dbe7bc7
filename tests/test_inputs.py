"""Inputs: nothing skipped (docs/reliability.md, "Inputs"). A dangling symlink, a symlink
loop or a FIFO named like an input — inside an input directory, matched by a glob or named
on the command line — is an unreadable input: ``recompute`` and ``diff`` exit 2 with one
line naming it before any work; ``validate`` lists it in ``unreadable`` (exit 2, also under
``--strict``) and still checks the other files. Each command runs in a child process with
a hard timeout: a run that opened the FIFO would block on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaecli.errors import GAEUsageError
from gaecli.io.paths import discover_inputs

from rollout_files import files_under, random_rollouts, rollout_table, sha256, write_table

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("dangling symlink", "symlink loop", "FIFO")
MESSAGES = {"dangling symlink": "symbolic link to nothing", "symlink loop": "symbolic link loop", "FIFO": "a FIFO"}


def make_odd(path: Path, kind: str) -> Path:
    """``path`` made a ``kind``: a link to a missing file, a link to itself, or a FIFO."""
    if kind == "dangling symlink":
        os.symlink(path.parent / "missing.parquet", path)
    elif kind == "symlink loop":
        os.symlink(path.name, path)
    else:
        os.mkfifo(path)
    return path


@pytest.fixture(params=KINDS)
def directory(request, tmp_path) -> tuple[Path, Path, list[Path], str]:
    """``d/`` with two rollout files and, between them in name order, one odd entry."""
    d = tmp_path / "d"
    files = [
        write_table(rollout_table(random_rollouts(6, seed=1)), d / "a.parquet"),
        write_table(rollout_table(random_rollouts(7, seed=2)), d / "sub" / "c.parquet"),
    ]
    odd = make_odd(d / "b.parquet", request.param)
    return d, odd, files, request.param


def run(*args) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` in a child process (this tree first on the path), ended after
    120 s: the test then fails instead of hanging on a FIFO."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )


def assert_refused(result: subprocess.CompletedProcess, odd: Path, kind: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert str(odd) in lines[0] and MESSAGES[kind] in lines[0], lines[0]


def test_discovery_refuses_or_reports_every_odd_entry(directory):
    d, odd, files, kind = directory
    with pytest.raises(GAEUsageError, match=MESSAGES[kind]) as refused:
        discover_inputs([str(d)])
    assert str(odd) in str(refused.value)
    unreadable: list = []
    found, _ = discover_inputs([str(d)], unreadable=unreadable)
    assert [path for path, _root in found] == files
    assert [(path, MESSAGES[kind] in message) for path, message in unreadable] == [(odd, True)]
    for given in (str(odd), str(d / "*.parquet")):  # named on the command line, or by a glob
        with pytest.raises(GAEUsageError, match=MESSAGES[kind]):
            discover_inputs([given])


def test_recompute_and_diff_refuse_an_odd_entry_before_any_work(directory, tmp_path):
    d, odd, files, kind = directory
    before = [sha256(path) for path in files]
    out = tmp_path / "out"
    result = run("recompute", d, "-o", out, "--gamma", 1, "--lambd", 0.9, "--workers", 1, "--quiet")
    assert_refused(result, odd, kind)
    assert not out.exists()
    samples = tmp_path / "s.parquet"
    result = run("diff", files[0], odd, "--gamma", 1, "--lambd", 0.9, "--quiet", "--per-sample", samples)
    assert_refused(result, odd, kind)  # named on the command line
    assert files_under(tmp_path) == sorted(str(p.relative_to(tmp_path)) for p in [*files, odd])
    assert [sha256(path) for path in files] == before


def test_validate_lists_an_odd_entry_as_unreadable_and_checks_the_others(directory, tmp_path):
    d, odd, files, kind = directory
    result = run("validate", d, "--strict", "--workers", 1, "--json", "-", "--quiet")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert [entry["file"] for entry in report["unreadable"]] == [str(odd)]
    assert MESSAGES[kind] in report["unreadable"][0]["message"]
    statuses = {entry["file"]: (entry["status"], entry["rows_checked"]) for entry in report["files"]}
    assert statuses == {str(files[0]): ("ok", 6), str(odd): ("unreadable", 0), str(files[1]): ("ok", 7)}
    assert [entry["file"] for entry in report["files"]] == [str(files[0]), str(odd), str(files[1])]  # name order
