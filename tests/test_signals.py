"""Signals, kill -9 and a stalled object store, for real: ``gae recompute`` runs as its own
process group (``python -m gaecli``), gets SIGINT or SIGTERM (the whole group, as Ctrl-C
sends, or the parent alone) once it is writing, or a kill -9, and must then have stopped at
once: exit 130, no temp file left under the output, every output whole (and listed as
written) or absent (listed as not written), no output of a file that had not started, and
no worker process left.

The inputs are small but read one row per batch, so each file takes seconds: the signal
always lands while files are being written. Every wait is bounded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loopback_stores import SilentServer, StallingProxy
from rollout_files import random_rollouts, rollout_table, write_table

ROOT = Path(__file__).resolve().parents[1]
FILES, ROWS = 6, 120  # rows per file, read one per batch (tens of ms a file: the checks allow files finished first)
WAIT_SECONDS = 120.0  # bound on every wait: start-up, stop


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("signals") / "in"
    for index in range(FILES):
        write_table(rollout_table(random_rollouts(ROWS, seed=700 + index)), directory / f"f{index}.parquet")
    return directory


def start(*arguments) -> subprocess.Popen:
    """``gae`` as a process of its own group (as a shell starts a command)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "gaecli", *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        cwd=ROOT,
    )


def recompute(inputs: Path, output: Path, *options) -> subprocess.Popen:
    return start(
        "recompute", inputs, "-o", output, "--gamma", 0.99, "--lambd", 0.95, "--batch-rows", 1, "--quiet", *options
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """Exit code and stderr; kills the group if it does not end in time (then fails)."""
    try:
        _, stderr = process.communicate(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("gae did not exit after the signal")
    return process.returncode, stderr


def files_under(directory: Path) -> set[Path]:
    return {path for path in directory.rglob("*") if path.is_file()} if directory.exists() else set()


def wait_until(condition, process: subprocess.Popen, what: str):
    """Poll ``condition`` until it returns something true; fail if ``process`` ends first."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            said = process.stderr.read() if process.stderr is not None else ""
            pytest.fail(f"gae exited ({process.returncode}) before {what}: {said}")
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {what}")


def descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        starts[int(entry.name)] = fields[19]
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def alive(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` still running (not a zombie, not a new process on a reused pid)."""
    living = []
    for pid, start_time in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start_time and fields[0] != "Z":
            living.append(pid)
    return living


def importing(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` that have loaded a compiled module of an installed package (a
    worker under way through its imports)."""
    found = []
    for pid in processes:
        try:
            if "site-packages" in Path(f"/proc/{pid}/maps").read_text():
                found.append(pid)
        except OSError:
            pass
    return found


def wait_gone(processes: dict[int, str], seconds: float = WAIT_SECONDS) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(processes)


def poll_until(condition, seconds: float) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def expected_outputs(inputs: Path, output: Path) -> set[Path]:
    return {output / path.relative_to(inputs) for path in inputs.rglob("*.parquet")}


def check_stopped(inputs: Path, output: Path, code: int, stderr: str, before: set[Path], running: int) -> set[Path]:
    """The promises after a signal; returns the outputs written. ``before``: the files under
    ``output`` when the signal was sent (those listed before it and right after it: a unit may
    end, and the next one start, between a listing and the signal); ``running``: how many
    units can have been under way then (the workers)."""
    assert code == 130, stderr
    assert "Traceback" not in stderr, stderr
    targets = expected_outputs(inputs, output)
    left = files_under(output)
    assert left <= targets, f"temp files left: {sorted(map(str, left - targets))}"
    lines = [line.strip() for line in stderr.splitlines()]
    written = {Path(line.split("written: ", 1)[1]) for line in lines if line.startswith("written: ")}
    not_written = {
        Path(re.sub(r" \(.*", "", line.split("not written: ", 1)[1]))
        for line in lines
        if line.startswith("not written: ")
    }
    assert written | not_written == targets and not written & not_written, stderr
    assert left == written, stderr  # listed as written exactly when in place
    for path in written:  # whole: every row there, the new columns too
        table = pq.read_table(path)
        assert table.num_rows == ROWS and "advantages" in table.column_names
    # no file started after the signal: only those finished or running then can have finished
    assert len(written - (before & targets)) <= running, (sorted(map(str, before)), stderr)
    assert not_written, "the signal came too late to test anything"
    return written


def wait_for_writing(process: subprocess.Popen, output: Path, inputs: Path) -> tuple[set[Path], int]:
    """Wait until a unit is writing (a temp file under ``output``); the files there then
    and the number of temp files."""
    targets = expected_outputs(inputs, output)
    temps = wait_until(lambda: files_under(output) - targets, process, "a temp file appeared")
    return files_under(output), len(temps)


# ----------------------------------------------------------------------------- local engine


@pytest.mark.parametrize(
    "workers, signum, group",
    [
        (2, signal.SIGINT, True),
        (2, signal.SIGTERM, True),
        (2, signal.SIGINT, False),
        (2, signal.SIGTERM, False),
        (1, signal.SIGINT, True),
        (1, signal.SIGTERM, False),
    ],
    ids=[
        "2-workers-SIGINT-group",
        "2-workers-SIGTERM-group",
        "2-workers-SIGINT-parent",
        "2-workers-SIGTERM-parent",
        "in-process-SIGINT-group",
        "in-process-SIGTERM-parent",
    ],
)
def test_a_signal_stops_the_run(inputs, tmp_path, workers, signum, group):
    output = tmp_path / "out"
    process = recompute(inputs, output, "--workers", workers)
    before, running = wait_for_writing(process, output, inputs)
    workers_then = descendants(process.pid)
    assert len(workers_then) >= (workers if workers > 1 else 0)
    (os.killpg if group else os.kill)(process.pid, signum)
    finished = files_under(output)  # at least every output finished before the signal
    code, stderr = finish(process)
    check_stopped(inputs, output, code, stderr, before | finished, max(running, workers))
    assert wait_gone(workers_then) == []


def test_ctrl_c_while_workers_start_prints_no_traceback(inputs, tmp_path):
    output = tmp_path / "out"
    process = recompute(inputs, output, "--workers", 2)
    wait_until(lambda: len(importing(descendants(process.pid))) >= 2, process, "the workers were importing")
    started = descendants(process.pid)
    os.killpg(process.pid, signal.SIGINT)
    code, stderr = finish(process)
    assert code == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert files_under(output) <= expected_outputs(inputs, output)
    assert wait_gone(started) == []


def test_kill_9_of_the_parent_takes_the_workers_and_a_resume_completes(inputs, tmp_path):
    output = tmp_path / "out"
    process = recompute(inputs, output, "--workers", 2)
    wait_for_writing(process, output, inputs)
    workers = descendants(process.pid)
    assert len(workers) >= 2
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=WAIT_SECONDS)
    assert wait_gone(workers) == [], "worker processes outlived their parent"
    targets = expected_outputs(inputs, output)
    # they abort on the parent's death, removing their temp files before they exit; the
    # poll only spares a busy machine's slow directory listing a false alarm
    left = poll_until(lambda: files_under(output) <= targets, WAIT_SECONDS)
    assert left, f"a worker left its temp file: {sorted(map(str, files_under(output) - targets))}"
    resumed = recompute(inputs, output, "--workers", 2, "--skip-existing", "--json", "-")
    try:
        _, stderr = resumed.communicate(timeout=WAIT_SECONDS * 2)
    except subprocess.TimeoutExpired:
        os.killpg(resumed.pid, signal.SIGKILL)
        raise
    assert resumed.returncode == 0, stderr
    assert files_under(output) == targets
    for path in targets:
        assert pq.read_table(path).num_rows == ROWS


# ----------------------------------------------------------------------------- Ray


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM-group", "SIGINT-group"])
def test_a_signal_stops_a_ray_run(inputs, tmp_path, signum):
    pytest.importorskip("ray", reason="ray is not installed")
    output = tmp_path / "out"
    process = recompute(inputs, output, "--engine", "ray", "--workers", 2)
    before, running = wait_for_writing(process, output, inputs)
    os.killpg(process.pid, signum)
    finished = files_under(output)  # at least every output finished before the signal
    code, stderr = finish(process)
    check_stopped(inputs, output, code, stderr, before | finished, max(running, 2))


# ----------------------------------------------------------------------------- a stalled object store


@pytest.fixture
def s3_endpoint():
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto: pip install 'moto[s3,server]'")
    import pyarrow.fs as pafs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    filesystem = pafs.S3FileSystem(
        access_key="key",
        secret_key="secret",
        endpoint_override=f"{host}:{port}",
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    filesystem.create_dir("rollouts")
    yield (host, port), filesystem
    server.stop()


def s3_uri(port: int, key: str, **query) -> str:
    extra = "".join(f"&{name}={value}" for name, value in query.items())
    return f"s3://key:secret@rollouts/{key}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1{extra}"


def test_a_stalled_store_times_out(inputs, s3_endpoint):
    upstream, filesystem = s3_endpoint
    proxy = StallingProxy(upstream, allowed=0)
    try:
        process = recompute(
            inputs / "f0.parquet",
            s3_uri(proxy.port, "out/f0.parquet", connect_timeout=1, request_timeout=1),
            "--batch-rows",
            64,
        )
        code, stderr = finish(process)
    finally:
        proxy.close()
    assert proxy.stalled.is_set()
    assert code == 2 and "Traceback" not in stderr, stderr
    assert "out/f0.parquet" in stderr and ("timeout" in stderr.lower() or "too slow" in stderr.lower()), stderr
    import pyarrow.fs as pafs

    assert filesystem.get_file_info("rollouts/out/f0.parquet").type == pafs.FileType.NotFound


def test_sigterm_during_a_stalled_upload_stops_and_says_what_was_written(inputs, s3_endpoint):
    """The first output goes up whole; the store stalls on the second; SIGTERM to the
    parent alone: exit 130, the first listed as written (and whole), the others not (and
    absent)."""
    import pyarrow.fs as pafs

    upstream, filesystem = s3_endpoint
    proxy = StallingProxy(upstream, allowed=3)  # the first output, whole
    output = s3_uri(proxy.port, "out", connect_timeout=1, request_timeout=1)
    try:
        process = recompute(inputs, output, "--workers", 1, "--batch-rows", 64)
        wait_until(proxy.stalled.is_set, process, "the store stalled")
        os.kill(process.pid, signal.SIGTERM)
        code, stderr = finish(process)
    finally:
        proxy.close()
    assert code == 130 and "Traceback" not in stderr, stderr
    names = sorted(path.name for path in inputs.glob("*.parquet"))
    written = [line for line in stderr.splitlines() if line.strip().startswith("written: ")]
    not_written = [line for line in stderr.splitlines() if line.strip().startswith("not written: ")]
    first = s3_uri(proxy.port, f"out/{names[0]}", connect_timeout=1, request_timeout=1)
    first = first.replace("s3://key:secret@", "s3://***@")  # as messages show it
    assert len(written) == 1 and written[0].strip() == f"written: {first}", stderr
    assert len(not_written) == len(names) - 1, stderr
    keys = sorted(
        info.path
        for info in filesystem.get_file_info(pafs.FileSelector("rollouts/out", recursive=True, allow_not_found=True))
        if info.type == pafs.FileType.File
    )
    assert keys == [f"rollouts/out/{names[0]}"], keys
    with filesystem.open_input_file(keys[0]) as file:
        assert pq.read_table(file).num_rows == ROWS


# ----------------------------------------------------------------------------- swallowed interrupts


def _unit_that_swallows_the_interrupt(index: int, started: list, progress=None) -> int:
    """A unit in whose third-party code a signal's KeyboardInterrupt was lost: the handler
    requested the stop, nothing was raised."""
    started.append(index)
    if index == 0:
        from gaecli.stop import request_stop

        request_stop()
    return index


def test_a_swallowed_interrupt_still_stops_the_run_before_the_next_unit_and_batch(tmp_path):
    from gaecli.engines import EngineOptions, map_units
    from gaecli.errors import RunInterrupted
    from gaecli.io.format import Columns
    from gaecli.io.reader import RolloutFile
    from gaecli.pipeline import computed_batches
    from gaecli.recompute import RecomputeOptions
    from gaecli.stop import clear_stop, request_stop

    started: list = []
    try:
        with pytest.raises(RunInterrupted) as stopped:
            map_units(
                _unit_that_swallows_the_interrupt,
                [(0, started), (1, started), (2, started)],
                ["a", "b", "c"],
                EngineOptions(workers=1),
            )
        assert started == [0]  # no unit started after the request
        assert stopped.value.results == [0, None, None]
        # within a unit: the next batch does not start either
        clear_stop()
        source = write_table(rollout_table(random_rollouts(6, seed=5)), tmp_path / "in.parquet")
        options = RecomputeOptions(gamma=1.0, lambd=0.95, kernel="native", batch_rows=2, columns=Columns())
        computation = options.computation
        batches = computed_batches(RolloutFile(source), computation)
        assert next(batches).batch.num_rows == 2
        request_stop()
        with pytest.raises(KeyboardInterrupt):
            next(batches)
    finally:
        clear_stop()


# ----------------------------------------------------------------------------- a store that never answers


@pytest.fixture
def silent_store():
    server = SilentServer()
    yield server
    server.close()


STORE_URIS = {
    # the store's own timeouts far beyond the test's patience: only the signal can end the call
    "s3": "s3://key:secret@rollouts/in/x.parquet?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    "&connect_timeout=300&request_timeout=300",
    "gcs": "gs://anonymous@rollouts/in/x.parquet?endpoint_override=127.0.0.1:{port}&scheme=http&request_timeout=300",
}
PROMPT_SECONDS = 20.0  # how soon after the signal the run must have ended, on a busy machine


@pytest.mark.parametrize("store", sorted(STORE_URIS))
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_run_while_a_store_call_is_pending(silent_store, store, signum):
    """``gae validate URI`` of a store that takes the request and never answers: the
    signal, sent once the request reached the store, ends the run at once (exit 130, one
    line), the store call still pending."""
    process = start("validate", STORE_URIS[store].format(port=silent_store.port))
    wait_until(silent_store.requested.is_set, process, "the store got the request")
    os.kill(process.pid, signum)
    try:
        _, stderr = process.communicate(timeout=PROMPT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"gae did not stop within {PROMPT_SECONDS:g} s of the signal while the store call was pending")
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_signal_as_a_store_call_starts_still_leaves_the_call_behind(monkeypatch):
    """The signal's KeyboardInterrupt can come while the call's thread is being started,
    before the caller waits on it (a busy machine widens that window): the call still
    counts as pending, so the command ends at once rather than waiting for the store."""
    import threading

    from gaecli.io import filesystem

    release = threading.Event()
    started = threading.Thread.start

    def start_then_interrupted(thread):
        started(thread)
        raise KeyboardInterrupt  # as a signal handler raises it, the call now running

    monkeypatch.setattr(filesystem, "_PENDING_CALLS", [])
    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(threading.Thread, "start", start_then_interrupted)
        filesystem.store_call(None, release.wait)
    try:
        assert filesystem.store_calls_pending()
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while filesystem.store_calls_pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not filesystem.store_calls_pending()  # the call ended: nothing pending any more


def test_a_store_call_that_answers_is_not_left_pending():
    from gaecli.io import filesystem

    assert filesystem.store_call(None, lambda x: x * 2, 21) == 42
    assert not filesystem.store_calls_pending()


def test_a_store_without_request_timeouts_is_bounded(silent_store):
    """GCS has no request timeout in pyarrow (its retry limit does not cut a stalled
    request): gaecli bounds each call itself (6 request timeouts; 2 s here), so a store
    that never answers ends the run instead of hanging."""
    uri = STORE_URIS["gcs"].format(port=silent_store.port).replace("request_timeout=300", "request_timeout=2")
    began = time.monotonic()
    process = start("validate", uri)
    code, stderr = finish(process)
    assert silent_store.requested.is_set()
    assert code == 2 and time.monotonic() - began < WAIT_SECONDS, stderr
    assert "did not answer within 12 s" in stderr, stderr
    assert "Traceback" not in stderr and "unreadable gs://" in stderr, stderr  # validate's finding, no traceback


def test_gcs_without_its_metadata_server_ends(tmp_path):
    """``gae validate gs://bucket/x.parquet`` with default credentials and no GCS metadata
    server (or no network at all): bounded by the retry time limit gaecli sets (the
    request timeout, 10 s), not pyarrow's default of 15 minutes."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GOOGLE_", "GCE_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["HOME"] = str(tmp_path)  # no gcloud configuration of the user's
    began = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gaecli", "validate", "gs://gaecli-no-such-bucket/x.parquet"],
            capture_output=True,
            text=True,
            env=env,
            timeout=WAIT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gae validate gs://… did not end within {WAIT_SECONDS:g} s")
    assert result.returncode == 2 and time.monotonic() - began < WAIT_SECONDS, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "unreadable gs://gaecli-no-such-bucket/x.parquet: " in result.stderr, result.stderr


# ----------------------------------------------------------------------------- nothing left behind


def session_members(session: int) -> list[str]:
    """The processes of ``session`` still running (zombies excepted), as ``pid command``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] not in "ZX":
            members.append(f"{entry.name} {command[:160]}")
    return members


@pytest.mark.parametrize("outcome", ["finished", "SIGINT-group", "SIGTERM-parent"])
def test_the_command_returns_only_when_its_processes_have_exited(inputs, tmp_path, outcome):
    """``--workers 2`` in a session of its own, its output streams on files (a pipe's end
    of file would wait for every holder of the pipe): the moment the command has exited
    (no grace period), no process of its session is alive, neither a worker nor Python's
    resource tracker, whether the run finished or a signal stopped it."""
    output = tmp_path / "out"
    options = ["--gamma", 1, "--lambd", 1, "--quiet", "--workers", 2]
    if outcome != "finished":
        options += ["--batch-rows", 1]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(tmp_path / "stderr", "w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gaecli", "recompute", str(inputs), "-o", str(output), *map(str, options)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            start_new_session=True,
            cwd=ROOT,
        )
        if outcome != "finished":
            wait_for_writing(process, output, inputs)
            if outcome == "SIGINT-group":
                os.killpg(process.pid, signal.SIGINT)
            else:
                os.kill(process.pid, signal.SIGTERM)
        try:
            code = process.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        left = session_members(process.pid)  # the session's id is the command's pid
        stderr.seek(0)
        message = stderr.read()
    assert left == [], left
    assert code == (0 if outcome == "finished" else 130), message


def test_an_interrupt_python_only_prints_is_quiet_once_a_stop_was_requested(capsys):
    """A KeyboardInterrupt from the signal handler that lands where Python only prints an
    exception ("Exception ignored in ...": a ``__del__``, an import-lock or ctypes callback)
    prints nothing once the stop was requested (the request stops the run at its next
    check); before a request, and for any other exception, the hook there was still speaks."""
    import sys

    from gaecli.stop import clear_stop, quiet_swallowed_interrupts, request_stop

    heard = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: heard.append(unraisable.exc_type)
    try:
        quiet_swallowed_interrupts()
        quiet_swallowed_interrupts()  # once only: the hook is not wrapped twice

        class Interrupted:
            def __init__(self, error):
                self.error = error

            def __del__(self):
                raise self.error

        request_stop()
        Interrupted(KeyboardInterrupt())
        Interrupted(ValueError("a real fault"))
        clear_stop()
        Interrupted(KeyboardInterrupt())
    finally:
        sys.unraisablehook = previous
        clear_stop()
    assert heard == [ValueError, KeyboardInterrupt]


def test_the_handler_raises_nowhere_numba_or_the_import_system_runs():
    """The signal's KeyboardInterrupt is not raised while numba or llvmlite run anywhere on the
    stack (compiling or loading a kernel), in the import system or in a ``__del__``: there the
    handler only asks for the stop, which leaves no half-made object behind (a llvmlite
    reference whose finaliser then failed at exit). Elsewhere (gaecli's code, a wait in the
    standard library or in Ray) it raises, and the run stops at once."""
    import threading
    import types

    import llvmlite.binding.ffi
    import numba.core.compiler

    import gaecli.engines
    from gaecli.stop import interruptible

    def frame(filename, name="f", back=None):
        return types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=filename, co_name=name), f_back=back)

    ours = frame(gaecli.engines.__file__, "map_units")
    compiling = frame(numba.core.compiler.__file__, "compile_extra", ours)
    assert interruptible(ours)
    assert interruptible(frame(threading.__file__, "wait", ours))
    assert interruptible(frame("/site-packages/ray/_private/worker.py", "wait", ours))
    assert not interruptible(compiling)
    detaching = frame(llvmlite.binding.ffi.__file__, "detach", compiling)
    assert not interruptible(frame(threading.__file__, "acquire", detaching))
    assert not interruptible(frame("<frozen importlib._bootstrap>", "cb", ours))
    assert not interruptible(frame(gaecli.engines.__file__, "__del__", ours))
    assert interruptible(sys._getframe())


def test_a_keyboard_interrupt_that_escapes_the_command_exits_130_quietly():
    """A KeyboardInterrupt escaping the typer app (after the command's report, its handlers
    restored) exits 130 (not by SIGINT), without a traceback."""
    program = (
        "from gaecli.cli.streams import run_guarded\n"
        "def command():\n"
        "    try:\n"
        "        raise SystemExit(0)\n"
        "    finally:\n"
        "        raise KeyboardInterrupt\n"
        "run_guarded(command)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-c", program]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WAIT_SECONDS)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
