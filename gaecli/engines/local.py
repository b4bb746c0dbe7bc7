"""The local engine's pool: work units in worker processes started with ``spawn`` (torch,
numba and ``fork`` do not mix), each worker's Arrow, numba (and, if a unit loads it,
torch) threads set to its share of the cores so that the workers do not oversubscribe
them. Workers report progress batch by batch through a pipe that a thread of the parent
drains into the parent's progress, so a long file moves the bar while it runs.

Signals: a worker that gets SIGINT or SIGTERM (Ctrl-C reaches the whole process group; the
parent sends SIGTERM when it is interrupted alone, and the pool when another worker died)
stops its unit, which aborts (temp files removed), says so on the pipe and exits; it starts
no unit after that. Workers start with SIGINT and SIGTERM blocked until their handler is in
place (no tracebacks from a Ctrl-C during start-up), and die with the parent: SIGTERM on the
parent's death (``PR_SET_PDEATHSIG`` on Linux, and a thread that watches the parent's pid)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional, Sequence

from gaecli.engines import EXIT_UNUSABLE, FINISHED, EngineSession, TaskFailure, run_unit
from gaecli.engines.gathering import UnitResults
from gaecli.errors import RunInterrupted
from gaecli.progress import ForwardingProgress, NoProgress
from gaecli.stop import interruptible, quiet_swallowed_interrupts, request_stop

START_METHOD = "spawn"

# In a worker: the write end of the pipe to the parent, the unit it is running, and whether
# a signal told it to stop. On the pipe go ("advance", rows, tokens) batch by batch,
# ("start", unit) as a unit begins, ("finished", unit) once its output is in place and
# ("terminated", unit) when a signal stopped it. A message is one small write (< PIPE_BUF
# bytes), atomic on a pipe, so the workers share the pipe without a lock (a worker killed
# mid-message cannot leave a lock held or half a message).
_progress_pipe = None
_running_unit = None
_stopping = False
_FLUSH, _STOP = "flush", "stop"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED = 130
# How long the parent, interrupted, waits for its workers to abort their units before it
# kills them (then removes what they left itself).
STOP_GRACE_SECONDS = 30.0
# How long a worker whose parent died may take to abort its unit (remove its temp files)
# before it exits regardless: as long as a living parent would wait (a busy machine's abort
# can take seconds).
ORPHAN_GRACE_SECONDS = STOP_GRACE_SECONDS
PARENT_POLL_SECONDS = 0.5


class _Drain:
    """The parent's side: a thread that feeds the workers' reports into ``progress``.

    A worker sends its reports before its unit's result, so once every result of a map is
    in, :meth:`flush` (a marker sent down the same pipe, behind them) returns when all of
    them have been applied."""

    def __init__(self, context) -> None:
        self.reader, self.writer = context.Pipe(duplex=False)
        self.progress = NoProgress()
        self.started: set[int] = set()  # units a worker began, since clear()
        self.terminated: set[int] = set()  # units a signal stopped (their worker's or another's)
        self.finished: set[int] = set()  # units whose output is in place
        self._error: BaseException | None = None
        self._flushed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gaecli-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (item := self.reader.recv()) != _STOP:
                if item == _FLUSH:
                    self._flushed.set()
                elif item[0] == "start":
                    self.started.add(item[1])
                elif item[0] == "terminated":
                    self.terminated.add(item[1])
                elif item[0] == "finished":
                    self.finished.add(item[1])
                elif self._error is None:
                    try:
                        self.progress.advance(*item[1:])
                    except Exception as error:  # noqa: BLE001 - raised in the parent by flush()
                        self._error = error  # keep reading: a full pipe would stall the workers
        finally:
            self._flushed.set()  # never leave flush() waiting

    def flush(self) -> None:
        """Return once every report sent so far is applied; raise what ``progress`` raised."""
        self._flushed.clear()
        self.writer.send(_FLUSH)
        while not self._flushed.wait(0.1) and self._thread.is_alive():
            pass
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def stop(self) -> None:
        self.writer.send(_STOP)
        self._thread.join()
        self.reader.close()
        self.writer.close()


def _on_stop_signal(signum, frame) -> None:
    """SIGINT or SIGTERM in a worker: stop. Idle, it exits at once; running a unit, the unit
    gets a KeyboardInterrupt (it aborts, removing its temp files; :func:`_pool_unit` then
    exits). Later signals are ignored so that nothing interrupts the abort."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    if _running_unit is None:
        os._exit(EXIT_INTERRUPTED)
    request_stop()  # also checked between batches: an interrupt swallowed in a unit still stops it
    if interruptible(frame):  # else the unit stops at its next check
        raise KeyboardInterrupt


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM this worker when the parent dies (a kill -9 cannot be caught there)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:  # also where prctl is missing, and if the parent died before it
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        # the unit aborts meanwhile; a worker still here is stuck (e.g. waiting for a task
        # from the dead parent, the signal already taken): it must not outlive its parent
        time.sleep(ORPHAN_GRACE_SECONDS)
        os._exit(EXIT_INTERRUPTED)

    threading.Thread(target=watch, name="gaecli-parent-watch", daemon=True).start()


def _init_worker(threads: int, progress_pipe, parent_pid: int) -> None:
    global _progress_pipe
    _progress_pipe = progress_pipe
    quiet_swallowed_interrupts()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it started us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _die_with_parent(parent_pid)
    # torch is not imported here (the CPU path runs without it); if a unit imports it, it
    # reads its thread count from the environment.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    import pyarrow

    pyarrow.set_cpu_count(threads)
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except (ImportError, ValueError):
        pass


def _tell_parent(message: tuple) -> None:
    """Send ``message`` on the progress pipe if the parent still reads it (on the way out)."""
    try:
        _progress_pipe.send(message)
    except (OSError, EOFError, ValueError):
        pass


def _pool_unit(function: Callable, args: tuple, unit: int) -> Any:
    global _running_unit
    if _stopping:  # never start a unit after a signal
        os._exit(EXIT_INTERRUPTED)
    try:
        _running_unit = unit
        _progress_pipe.send(("start", unit))
        result = run_unit(function, args, ForwardingProgress(lambda report: _progress_pipe.send(("advance", *report))))
        if not isinstance(result, TaskFailure):
            _progress_pipe.send(("finished", unit))
    except KeyboardInterrupt:  # a signal: the unit has aborted, its temp files are gone
        _tell_parent(("terminated", unit))
        os._exit(EXIT_INTERRUPTED)
    except BaseException:
        if _stopping:  # what a signal turned into (a parent gone: its pipe broken): stop here too
            _tell_parent(("terminated", unit))
            os._exit(EXIT_INTERRUPTED)
        raise
    finally:
        _running_unit = None
    if isinstance(result, TaskFailure):
        result.error = None  # exceptions with extra state do not survive pickling; the message does
    return result


@contextlib.contextmanager
def _stop_signals_blocked():
    """Block SIGINT and SIGTERM in this thread while worker processes are started: they
    inherit the mask and unblock once their handler is set; a signal that came meanwhile is
    delivered here when the block ends."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class LocalPool:
    """``processes`` worker processes (each with ``cores / processes`` threads) and the
    progress pipe from them. Kept by an :class:`gaecli.engines.EngineSession` for the
    command's next pass, else closed after one map."""

    def __init__(self, processes: int) -> None:
        threads = max(1, (os.cpu_count() or 1) // processes)
        context = multiprocessing.get_context(START_METHOD)
        self.drain = _Drain(context)
        self.executor = ProcessPoolExecutor(
            processes, mp_context=context, initializer=_init_worker, initargs=(threads, self.drain.writer, os.getpid())
        )

    def stop_workers(self) -> None:
        """SIGTERM every worker (each stops its unit, which aborts) and wait for them to
        exit; after :data:`STOP_GRACE_SECONDS` kill those still there."""
        processes = list((self.executor._processes or {}).values())  # the pool keeps no public list
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

    def close(self, cancel: bool = False) -> None:
        """Stop the workers (``cancel``: drop the units not started; running ones finish
        whole or abort) and the progress thread; return once no process the pool started
        is alive (:func:`_end_helper_processes`)."""
        try:
            self.executor.shutdown(wait=True, cancel_futures=cancel)
        finally:
            self.drain.stop()
            _end_helper_processes()


def _end_helper_processes() -> None:
    """Wait for every process this one started through multiprocessing (the pool joins its
    workers; one it lost track of is killed after :data:`STOP_GRACE_SECONDS`), then stop
    Python's resource tracker if this process started it: otherwise it outlives the
    command by a moment, in the command's process group."""
    import gc
    from multiprocessing import resource_tracker

    for child in multiprocessing.active_children():
        child.join(STOP_GRACE_SECONDS)
        if child.is_alive():
            child.kill()
            child.join()
    gc.collect()  # the pool's semaphores unregister from the tracker now, not at exit
    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):  # started here
        tracker._stop()


def map_units_local(
    function: Callable,
    tasks: Sequence[tuple],
    labels: Sequence[str],
    workers: int,
    *,
    stop_on_failure: bool,
    progress=None,
    session: Optional[EngineSession] = None,
) -> list[Any]:
    """:func:`gaecli.engines.map_units` on a process pool of ``min(workers, tasks)``
    processes (the ``session``'s, when it has a pool of that size). A worker that
    dies (killed, out of memory, ``os._exit``) breaks the pool: every unit not finished
    then is a failure naming its file, and the pool is not used again. ``progress`` is
    advanced batch by batch as the workers report (a unit that fails counts the batches it
    read)."""
    processes = min(workers, len(tasks))
    key = ("local-pool", processes)
    pool = (
        LocalPool(processes)
        if session is None
        else session.resource(key, lambda: LocalPool(processes), LocalPool.close)
    )
    pool.drain.progress = progress if progress is not None else NoProgress()
    pool.drain.started.clear()
    pool.drain.terminated.clear()
    results = UnitResults(len(tasks), progress, stop_on_failure)
    futures: dict[Future, int] = {}
    try:
        with _stop_signals_blocked():
            futures = {
                pool.executor.submit(_pool_unit, function, args, index): index for index, args in enumerate(tasks)
            }
        broken = _gather(futures, results)
        pool.drain.flush()
    except BaseException as error:
        if session is not None:
            session.forget(key)
        _stop_pool(pool, futures, results.values, error)
    finally:
        pool.drain.progress = NoProgress()
    if broken and session is not None:
        session.forget(key)
    if broken or session is None:
        pool.close()
    if broken:
        _name_the_dead_worker(results.values, labels, pool.drain)
    return results.values


def _gather(futures: dict[Future, int], results: UnitResults) -> bool:
    """Record each unit's result as it finishes (a failure cancels the units not started,
    with ``stop_on_failure``); returns whether the pool broke (a worker died)."""
    broken = False
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=futures.__getitem__):
            if future.cancelled():
                continue
            try:
                result = future.result()
            except BrokenProcessPool:
                broken = True
                result = _WORKER_DIED  # said precisely later, once the pool has stopped
            if results.record(futures[future], result):
                for other in pending:
                    other.cancel()
    return broken


def _stop_pool(pool: LocalPool, futures: dict[Future, int], results: list[Any], error: BaseException) -> None:
    """After ``error`` in the map: close the pool and raise it again, or, for an interrupt,
    stop the workers and raise :class:`RunInterrupted` with the results of the units that
    had finished."""
    if not isinstance(error, KeyboardInterrupt):
        for future in futures:
            future.cancel()
        pool.close(cancel=True)  # running units finish whole (or abort) before we leave
        raise error
    # No future is cancelled: the pool, broken by its workers' exit, fails every unit
    # not finished (and would trip over a cancelled one); workers start no unit anyway.
    with _stop_signals_blocked():  # nothing interrupts the stop
        pool.stop_workers()
        pool.close()
    for future, index in futures.items():
        if future.done() and not future.cancelled() and future.exception() is None:
            results[index] = future.result()
    for index in pool.drain.finished:  # in place, though its result was lost with the pool
        if results[index] is None:
            results[index] = FINISHED
    raise RunInterrupted(results=results) from error


_WORKER_DIED = object()


def _name_the_dead_worker(results: list[Any], labels: Sequence[str], drain: _Drain) -> None:
    """Replace each unit the broken pool failed with what became of it. The units started
    and not stopped by the pool are the dead worker's; the others were running beside it
    (stopped) or waiting (not started). Without that knowledge (a report lost), every
    unit is "this file or one beside it"."""
    failed = [index for index, result in enumerate(results) if result is _WORKER_DIED]
    dead = [index for index in failed if index in drain.started and index not in drain.terminated]
    culprits = ", ".join(labels[index] for index in dead)
    for index in failed:
        if len(dead) != 1:
            why = (
                "a worker process died (killed, out of memory or crashed) while this file or one beside it "
                "was being processed"
            )
        elif index in dead:
            why = "the worker process running this file died (killed, out of memory or crashed)"
        elif index in drain.started:
            why = f"stopped when the worker process running {culprits} died"
        else:
            why = f"not started: the worker process running {culprits} died"
        results[index] = TaskFailure(EXIT_UNUSABLE, f"{labels[index]}: {why}; nothing was written for it")
