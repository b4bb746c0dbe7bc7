"""Every path a run writes, checked before any work (docs/reliability.md, "Paths"): a
report, output or rejects file that is an input or another output (same name, symlink,
``..``, hard link, ``file://``) is refused with exit 2 naming both; character devices,
FIFOs and pipes are written directly, never replaced by a rename; directories and sockets
are refused; temp names fit in 255 bytes and name their owner, so a run removes only a
dead run's leftovers; unreadable subdirectories are errors; a directory and its
subdirectory given together are read once. Real files, devices, FIFOs, pipes and
processes throughout."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import gaecli.io.paths
from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import NAME_MAX, temp_beside
from gaecli.io.paths import discover_inputs
from gaecli.io.writer import AtomicParquetWriter

from rollout_files import (
    assert_rows_close,
    files_under,
    gae,
    random_rollouts,
    reference_outputs,
    rollout_table,
    rollouts_from_table,
    sha256,
    write_table,
)

GAMMA, LAMBD = 0.9, 0.8
ROOT = Path(__file__).resolve().parents[1]


def rollout(path: Path, rows: int = 10, seed: int = 1, *, nan_row: int | None = None) -> Path:
    data = random_rollouts(rows, seed=seed)
    if nan_row is not None:  # the first non-empty row from nan_row on gets a NaN value
        row = next(r for r in range(nan_row, rows) if data.values[r])
        data.values[row][0] = math.nan
    return write_table(rollout_table(data), path)


def recompute(*args):
    return gae("recompute", *args, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet")


def assert_gae_of(source_table: pa.Table, output: pa.Table) -> None:
    """The output's advantages and returns are the float64 reference's on the input's data."""
    advantages, returns = reference_outputs(rollouts_from_table(source_table), GAMMA, LAMBD)
    assert_rows_close("advantages", advantages, output.column("advantages").to_pylist(), 2e-5)
    assert_rows_close("returns", returns, output.column("returns").to_pylist(), 2e-5)


def cli_subprocess(*args, **kwargs) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` in a child process with this tree first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **kwargs.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)], env=env, capture_output=True, timeout=300, **kwargs
    )


# ----------------------------------------------------------------------------- 1. --json onto inputs and outputs


def test_validate_json_onto_a_globbed_input_is_refused(tmp_path):
    """``gae validate --json d/*.parquet``: the shell makes the first file the JSON path."""
    first, second = rollout(tmp_path / "d" / "step_0000.parquet"), rollout(tmp_path / "d" / "step_0001.parquet", seed=2)
    before = sha256(first)
    result = gae("validate", "--json", first, second, "--quiet")
    assert result.exit_code == 2 and str(first) in result.stderr and "data file" in result.stderr
    assert sha256(first) == before


@pytest.mark.parametrize("spelling", ["same", "symlink", "dotdot", "hardlink", "uri"])
def test_validate_json_onto_an_input_in_any_spelling_is_refused(tmp_path, spelling):
    source = rollout(tmp_path / "d" / "x.parquet")
    before = sha256(source)
    if spelling == "same":
        report = str(source)
    elif spelling == "symlink":
        report = str(tmp_path / "link.json")
        os.symlink(source, report)
    elif spelling == "dotdot":
        (tmp_path / "e").mkdir()
        report = str(tmp_path / "e" / ".." / "d" / "x.parquet")
    elif spelling == "hardlink":
        report = str(tmp_path / "report.json")
        os.link(source, report)
    else:
        report = source.as_uri()
    result = gae("validate", source, "--json", report, "--quiet")
    assert result.exit_code == 2, result.output
    assert report in result.stderr and str(source) in result.stderr
    assert sha256(source) == before


@pytest.mark.parametrize("onto", ["input", "output", "output-uri", "input-hardlink"])
def test_recompute_json_onto_its_input_or_output_is_refused_before_any_work(tmp_path, onto):
    source = rollout(tmp_path / "x.parquet")
    target = tmp_path / "y.parquet"
    before = sha256(source)
    report = {
        "input": str(source),
        "output": str(target),
        "output-uri": target.as_uri(),
        "input-hardlink": str(tmp_path / "r.json"),
    }[onto]
    if onto == "input-hardlink":
        os.link(source, report)
    result = recompute(source, "-o", target, "--json", report)
    assert result.exit_code == 2, result.output
    assert report in result.stderr and str(source if "input" in onto else target) in result.stderr
    assert sha256(source) == before
    assert not target.exists()  # refused before any work


def test_import_json_onto_the_dump_is_refused(tmp_path):
    dump = tmp_path / "g.pt"
    torch.save({"rollout_id": 0, "rank": 0, "cp_rank": 0, "cp_size": 1, "qkv_format": "thd", "rollout_data": {}}, dump)
    before = sha256(dump)
    result = gae("import", "miles", dump, "-o", tmp_path / "o.parquet", "--json", dump, "--quiet")
    assert result.exit_code == 2 and str(dump) in result.stderr
    assert sha256(dump) == before and not (tmp_path / "o.parquet").exists()


def test_diff_refusals_go_through_the_one_rule(tmp_path):
    source = rollout(tmp_path / "x.parquet")
    result = gae(
        "diff",
        source,
        "--gamma",
        1,
        "--lambd",
        1,
        "--quiet",
        "--json",
        tmp_path / "r.json",
        "--markdown",
        tmp_path / "." / "r.json",
    )
    assert result.exit_code == 2 and "same file" in result.stderr and "JSON report" in result.stderr
    os.link(source, tmp_path / "samples")
    result = gae("diff", source, "--gamma", 1, "--lambd", 1, "--quiet", "--per-sample", tmp_path / "samples")
    assert result.exit_code == 2 and "replace an input" in result.stderr and str(source) in result.stderr
    assert files_under(tmp_path) == ["samples", "x.parquet"]


def test_check_writes_names_roles_and_both_paths(tmp_path):
    source = rollout(tmp_path / "a.parquet")
    with pytest.raises(
        GAEUsageError, match=r"out\.parquet: the HTML report and the output \(.*out\.parquet\) are the same file"
    ):
        gaecli.io.paths.check_writes(
            [source],
            [("output", tmp_path / "out.parquet"), ("HTML report", str(tmp_path / "x" / ".." / "out.parquet"))],
        )
    gaecli.io.paths.check_writes(
        [source],
        [
            ("output", tmp_path / "b.parquet"),
            ("JSON report", "-"),
            ("JSON report", None),
            ("Markdown report", str(tmp_path / "r.md")),
        ],
    )


# ----------------------------------------------------------------------------- 2. rejects files


def test_rejects_file_onto_the_input_is_refused(tmp_path):
    source = rollout(tmp_path / "r.rejected.parquet", nan_row=3)
    before = sha256(source)
    result = recompute(source, "-o", tmp_path / "r.parquet", "--on-invalid", "skip", "--overwrite")
    assert result.exit_code == 2 and "replace an input" in result.stderr and str(source) in result.stderr
    assert sha256(source) == before and files_under(tmp_path) == ["r.rejected.parquet"]


@pytest.mark.parametrize("workers", [1, 2])
def test_rejects_file_onto_another_output_is_refused(tmp_path, workers):
    """A directory with a.parquet (a bad row) and a.rejected.parquet: a's rejects file and
    the output of a.rejected.parquet would be one file."""
    rollout(tmp_path / "in" / "a.parquet", nan_row=2)
    rollout(tmp_path / "in" / "a.rejected.parquet", seed=2)
    out = tmp_path / "out"
    result = recompute(tmp_path / "in", "-o", out, "--on-invalid", "skip", "--workers", workers)
    assert result.exit_code == 2, result.output
    assert str(out / "a.rejected.parquet") in result.stderr and "same file" in result.stderr
    assert (
        str(tmp_path / "in" / "a.parquet") in result.stderr
        and str(tmp_path / "in" / "a.rejected.parquet") in result.stderr
    )
    assert not out.exists()


# ----------------------------------------------------------------------------- 3. special files


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A character device with /dev/null's numbers (needs root, as the trial had)."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    except PermissionError:
        pytest.skip("making a device node needs root")
    return node


def assert_still_the_device(node: Path) -> None:
    status = os.stat(node)
    assert stat.S_ISCHR(status.st_mode) and status.st_rdev == os.stat("/dev/null").st_rdev, f"{node} was replaced"
    assert [p for p in os.listdir(node.parent) if ".gaecli-" in p] == []


def test_json_to_a_character_device_is_written_to_it(tmp_path, null_device):
    source = rollout(tmp_path / "in" / "x.parquet")
    assert gae("validate", source, "--json", null_device, "--quiet").exit_code == 0
    assert_still_the_device(null_device)
    result = recompute(source, "-o", tmp_path / "y.parquet", "--json", null_device)
    assert result.exit_code == 0, result.output
    assert_still_the_device(null_device)
    assert_gae_of(pq.read_table(source), pq.read_table(tmp_path / "y.parquet"))


def test_output_and_per_sample_to_a_character_device(tmp_path, null_device):
    source = rollout(tmp_path / "in" / "x.parquet")
    result = recompute(source, "-o", null_device)
    assert result.exit_code == 2 and "--overwrite" in result.stderr  # it exists: --overwrite says so
    result = recompute(source, "-o", null_device, "--overwrite")
    assert result.exit_code == 0, result.output
    assert_still_the_device(null_device)
    result = gae("diff", source, "--gamma", 1, "--lambd", 1, "--quiet", "--per-sample", null_device)
    assert result.exit_code == 2 and "--overwrite" in result.stderr  # a data output, as -o is
    result = gae("diff", source, "--gamma", 1, "--lambd", 1, "--quiet", "--per-sample", null_device, "--overwrite")
    assert result.exit_code == 0, result.output
    assert_still_the_device(null_device)


def read_fifo(path: Path, into: list) -> threading.Thread:
    def reader():
        with open(path, "rb") as fifo:
            into.append(fifo.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread


def test_json_and_output_to_a_fifo_reach_its_reader(tmp_path):
    source = rollout(tmp_path / "in" / "x.parquet", rows=12)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    thread = read_fifo(fifo, received)
    result = gae("validate", source, "--json", fifo, "--quiet")
    thread.join(60)
    assert result.exit_code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    document = json.loads(received[0])
    assert document["files"][0]["file"] == str(source) and document["files"][0]["rows"] == 12

    received.clear()
    thread = read_fifo(fifo, received)
    result = recompute(source, "-o", fifo, "--overwrite")
    thread.join(60)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert_gae_of(pq.read_table(source), pq.read_table(io.BytesIO(received[0])))
    assert files_under(tmp_path) == ["fifo", "in/x.parquet"]


def test_json_to_a_pipe_and_to_dev_stdout(tmp_path):
    """``--json >(jq .)`` is ``/dev/fd/N`` on a pipe; ``--json /dev/stdout`` the process's
    stdout: both written to, never renamed over."""
    source = rollout(tmp_path / "x.parquet", rows=7)
    read_end, write_end = os.pipe()
    received: list[bytes] = []

    def reader():
        with os.fdopen(read_end, "rb") as pipe:
            received.append(pipe.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        result = cli_subprocess("validate", source, "--json", f"/dev/fd/{write_end}", "--quiet", pass_fds=(write_end,))
    finally:
        os.close(write_end)
    thread.join(60)
    assert result.returncode == 0, result.stderr
    assert json.loads(received[0])["files"][0]["rows"] == 7

    link = os.readlink("/dev/stdout")
    result = cli_subprocess("validate", source, "--json", "/dev/stdout", "--quiet")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"][0]["rows"] == 7
    assert os.readlink("/dev/stdout") == link


def test_directories_and_sockets_are_refused(tmp_path):
    source = rollout(tmp_path / "x.parquet")
    (tmp_path / "reports").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        for target, kind in ((tmp_path / "reports", "directory"), (tmp_path / "sock", "socket")):
            result = recompute(source, "-o", tmp_path / "y.parquet", "--json", target)
            assert result.exit_code == 2 and kind in result.stderr and str(target) in result.stderr
            assert not (tmp_path / "y.parquet").exists()  # refused before any work
            result = gae("diff", source, "--gamma", 1, "--lambd", 1, "--quiet", "--per-sample", target)
            assert result.exit_code == 2 and kind in result.stderr
        result = recompute(source, "-o", tmp_path / "sock", "--overwrite")
        assert result.exit_code == 2 and "socket" in result.stderr
        assert stat.S_ISSOCK(os.stat(tmp_path / "sock").st_mode)
    finally:
        server.close()


# ----------------------------------------------------------------------------- 7. long names


@pytest.mark.parametrize("length", [240, 250, 255])
def test_long_input_names_are_written(tmp_path, length):
    name = "r" * (length - len(".parquet")) + ".parquet"
    source = rollout(tmp_path / "in" / name)
    out = tmp_path / "out" / "deep"
    result = recompute(tmp_path / "in", "-o", out)
    assert result.exit_code == 0, result.output
    assert files_under(tmp_path / "out") == [f"deep/{name}"]
    assert_gae_of(pq.read_table(source), pq.read_table(out / name))


def test_temp_names_fit_and_stay_apart(tmp_path):
    for length in (1, 180, 190, 255):
        target = tmp_path / ("é" * (length // 2) if length > 1 else "a")
        temp = temp_beside(target)
        assert len(temp.name.encode()) <= NAME_MAX and temp.parent == tmp_path and temp.name.endswith(".tmp")
        assert temp != temp_beside(target)
    assert temp_beside(tmp_path / "a.parquet").name.startswith(".a.parquet.gaecli-")


def test_a_rejects_name_too_long_is_refused_before_anything_is_made(tmp_path):
    name = "r" * 240 + ".parquet"  # its rejects file would be 257 bytes
    rollout(tmp_path / "in" / name, nan_row=1)
    result = recompute(tmp_path / "in", "-o", tmp_path / "out" / "deep", "--on-invalid", "skip")
    assert result.exit_code == 2 and "longer than 255" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_writer_that_cannot_open_leaves_no_directory(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "ParquetWriter", refuse)
    with pytest.raises(GAEUsageError, match="cannot write"):
        AtomicParquetWriter(tmp_path / "new" / "deeper" / "x.parquet", pa.schema([("a", pa.int64())]))
    assert files_under(tmp_path) == [] and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- 9. concurrent runs, kill -9


HOLD_A_TEMP = """
import sys, time
import pyarrow as pa
from gaecli.io.writer import AtomicParquetWriter
writer = AtomicParquetWriter(sys.argv[1], pa.schema([("a", pa.int64())]))
writer.write(pa.record_batch([pa.array([1, 2, 3])], names=["a"]))
print(writer.temp.name, flush=True)
time.sleep(600)
"""


def holder(target: Path) -> tuple[subprocess.Popen, Path]:
    """A process writing ``target`` (its temp file in place), held until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_TEMP, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    name = process.stdout.readline().strip()
    assert name, "the holder did not start"
    return process, target.parent / name


def test_a_run_removes_only_dead_runs_temp_files(tmp_path):
    source = rollout(tmp_path / "x.parquet")
    target = tmp_path / "out" / "x.parquet"
    killed, killed_temp = holder(target)
    alive, alive_temp = holder(target)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert killed_temp.exists() and alive_temp.exists()
        result = recompute(source, "-o", target)
        assert result.exit_code == 0, result.output
        assert not killed_temp.exists(), "a kill -9's leftover stays"
        assert alive_temp.exists(), "a running writer's temp file was deleted"
        assert_gae_of(pq.read_table(source), pq.read_table(target))
    finally:
        alive.kill()
        alive.wait(30)


def test_a_failed_run_leaves_a_concurrent_runs_temp_files(tmp_path):
    rollout(tmp_path / "in" / "a.parquet", seed=1)
    rollout(tmp_path / "in" / "b.parquet", seed=2, nan_row=4)
    alive, alive_temp = holder(tmp_path / "out" / "b.parquet")
    try:
        result = recompute(tmp_path / "in", "-o", tmp_path / "out", "--workers", 2)
        assert result.exit_code == 1, result.output
        assert alive_temp.exists()
        assert sorted(files_under(tmp_path / "out")) == sorted(["a.parquet", alive_temp.name])
    finally:
        alive.kill()
        alive.wait(30)


def test_temp_files_of_unknown_owners_stay(tmp_path):
    source = rollout(tmp_path / "x.parquet")
    target = tmp_path / "out" / "x.parquet"
    target.parent.mkdir()
    foreign = [
        target.parent / ".x.parquet.gaecli-1a2b3c4d.tmp",  # an older gaecli's name: owner unknown
        target.parent / ".x.parquet.gaecli-ffffff-1-1-0123abcd.tmp",
    ]  # another host's
    for path in foreign:
        path.write_bytes(b"partial")
    assert recompute(source, "-o", target).exit_code == 0
    assert all(path.exists() for path in foreign)


# ----------------------------------------------------------------------------- 10. unreadable subdirectories


def test_an_unreadable_subdirectory_is_an_error_in_discovery(tmp_path, monkeypatch):
    rollout(tmp_path / "d" / "a.parquet")
    rollout(tmp_path / "d" / "locked" / "b.parquet", seed=2)
    locked = tmp_path / "d" / "locked"
    scandir = os.scandir

    def refusing(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(GAEUsageError, match=f"{locked}: cannot read this directory"):
        discover_inputs([str(tmp_path / "d")])
    result = gae("validate", "--strict", tmp_path / "d")
    assert result.exit_code == 2 and str(locked) in result.stderr


AS_NOBODY = """
import os, sys
import gaecli.cli
gid, uid, readable, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
try:  # a first run as root loads every module (the interpreter may be where nobody cannot read)
    gaecli.cli.app(["validate", readable, "--workers", "1"])
except SystemExit as exit:
    assert exit.code == 0, exit.code
print("--- as nobody ---", file=sys.stderr)
os.setgid(gid); os.setgroups([]); os.setuid(uid)
gaecli.cli.app(command)
"""


def test_an_unreadable_subdirectory_fails_validate_strict():
    """For real: chmod 000 stops a user; as root (whom it does not stop) the check runs
    in a child that drops to the user nobody once its modules are loaded (the
    interpreter may live where nobody cannot reach)."""
    as_root = os.geteuid() == 0
    if as_root:
        try:
            import pwd

            nobody = pwd.getpwnam("nobody")
        except (ImportError, KeyError):
            pytest.skip("running as root and there is no user 'nobody' to run the check as")
    top = Path(tempfile.mkdtemp(prefix="gaecli-unreadable-"))  # reachable by nobody, unlike tmp_path
    try:
        top.chmod(0o755)
        rollout(top / "d" / "a.parquet")
        rollout(top / "d" / "locked" / "b.parquet", seed=2)
        for path in (top / "d", top / "d" / "a.parquet"):
            path.chmod(0o755)
        (top / "d" / "locked").chmod(0)
        command = ["validate", "--strict", str(top / "d"), "--workers", "1"]
        if as_root:
            command = [
                sys.executable,
                "-c",
                AS_NOBODY,
                str(nobody.pw_gid),
                str(nobody.pw_uid),
                str(top / "d" / "a.parquet"),
                *command,
            ]
        else:
            command = [sys.executable, "-m", "gaecli", *command]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=300,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "PYTHONDONTWRITEBYTECODE": "1",
                "HOME": str(top),
                "COLUMNS": "400",
            },
        )
        assert result.returncode == 2, result.stderr
        stderr = result.stderr.split("--- as nobody ---")[-1]
        assert str(top / "d" / "locked") in stderr and "cannot read" in stderr and "Traceback" not in stderr
    finally:
        (top / "d" / "locked").chmod(0o755)
        shutil.rmtree(top)


# ----------------------------------------------------------------------------- 11. nested inputs


def test_a_directory_and_its_subdirectory_are_read_once(tmp_path):
    sources = [rollout(tmp_path / "d" / "a.parquet", seed=1), rollout(tmp_path / "d" / "sub" / "b.parquet", seed=2)]
    out = tmp_path / "out"
    result = recompute(
        tmp_path / "d",
        tmp_path / "d" / "sub",
        tmp_path / "d" / "sub" / ".." / "a.parquet",
        "-o",
        out,
        "--json",
        tmp_path / "r.json",
    )
    assert result.exit_code == 0, result.output
    assert files_under(out) == ["a.parquet", "sub/b.parquet"]  # the first root (d) is mirrored
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows"] == 20 and [f["file"] for f in report["files"]] == [str(s) for s in sources]
    for source in sources:
        assert_gae_of(pq.read_table(source), pq.read_table(out / source.relative_to(tmp_path / "d")))
