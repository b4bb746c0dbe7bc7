"""The local engine's pool: work units in worker processes started with ``spawn`` (torch,
numba and ``fork`` do not mix), each worker's Arrow, numba (and, if a unit loads it,
torch) threads set to its share of the cores so that the workers do not oversubscribe
them. Workers report progress batch by batch through a pipe that a thread of the parent
drains into the parent's progress, so a long file moves the bar while it runs."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional, Sequence

from gaecli.engines import EXIT_UNUSABLE, EngineSession, TaskFailure, run_unit
from gaecli.progress import ForwardingProgress, NoProgress

START_METHOD = "spawn"

# In a worker: the write end of the pipe to the parent, and the unit it is running. On the
# pipe go ("advance", rows, tokens) batch by batch, ("start", unit) as a unit begins and
# ("terminated", unit) when the pool stops the worker. A message is one small write
# (< PIPE_BUF bytes), atomic on a pipe, so the workers share the pipe without a lock (a
# worker killed mid-message cannot leave a lock held or half a message).
_progress_pipe = None
_running_unit = None
_FLUSH, _STOP = "flush", "stop"


class _Drain:
    """The parent's side: a thread that feeds the workers' reports into ``progress``.

    A worker sends its reports before its unit's result, so once every result of a map is
    in, :meth:`flush` (a marker sent down the same pipe, behind them) returns when all of
    them have been applied."""

    def __init__(self, context) -> None:
        self.reader, self.writer = context.Pipe(duplex=False)
        self.progress = NoProgress()
        self.started: set[int] = set()  # units a worker began, since clear()
        self.terminated: set[int] = set()  # units whose worker the pool stopped
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


def _on_terminate(signum, frame) -> None:
    """A worker stopped by the pool (after another one died) says which unit it was running,
    so that the parent can tell the dead worker's file from the others."""
    _progress_pipe.send(("terminated", _running_unit))
    os._exit(128 + signum)


def _init_worker(threads: int, progress_pipe) -> None:
    global _progress_pipe
    _progress_pipe = progress_pipe
    signal.signal(signal.SIGTERM, _on_terminate)
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


def _pool_unit(function: Callable, args: tuple, unit: int) -> Any:
    global _running_unit
    _running_unit = unit
    _progress_pipe.send(("start", unit))
    try:
        result = run_unit(function, args, ForwardingProgress(lambda report: _progress_pipe.send(("advance", *report))))
    finally:
        _running_unit = None
    if isinstance(result, TaskFailure):
        result.error = None  # exceptions with extra state do not survive pickling; the message does
    return result


class LocalPool:
    """``processes`` worker processes (each with ``cores / processes`` threads) and the
    progress pipe from them. Kept by an :class:`gaecli.engines.EngineSession` for the
    command's next pass, else closed after one map."""

    def __init__(self, processes: int) -> None:
        threads = max(1, (os.cpu_count() or 1) // processes)
        context = multiprocessing.get_context(START_METHOD)
        self.drain = _Drain(context)
        self.executor = ProcessPoolExecutor(processes, mp_context=context, initializer=_init_worker,
                                            initargs=(threads, self.drain.writer))

    def close(self, cancel: bool = False) -> None:
        """Stop the workers (``cancel``: drop the units not started; running ones finish
        whole or abort) and the progress thread."""
        try:
            self.executor.shutdown(wait=True, cancel_futures=cancel)
        finally:
            self.drain.stop()


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
    pool = LocalPool(processes) if session is None else session.resource(key, lambda: LocalPool(processes), LocalPool.close)
    pool.drain.progress = progress if progress is not None else NoProgress()
    pool.drain.started.clear()
    pool.drain.terminated.clear()
    results: list[Any] = [None] * len(tasks)
    futures: dict[Future, int] = {}
    broken = False
    try:
        futures = {pool.executor.submit(_pool_unit, function, args, index): index for index, args in enumerate(tasks)}
        pending = set(futures)
        stopping = False
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.__getitem__):
                index = futures[future]
                if future.cancelled():
                    continue
                try:
                    results[index] = future.result()
                except BrokenProcessPool:
                    broken = True
                    results[index] = _WORKER_DIED  # said precisely below, once the pool has stopped
                if stop_on_failure and isinstance(results[index], TaskFailure) and not stopping:
                    stopping = True
                    for other in pending:
                        other.cancel()
        pool.drain.flush()
    except BaseException:
        for future in futures:
            future.cancel()
        if session is not None:
            session.forget(key)
        pool.close(cancel=True)  # running units finish whole (or abort) before we leave
        raise
    finally:
        pool.drain.progress = NoProgress()
    if broken and session is not None:
        session.forget(key)
    if broken or session is None:
        pool.close()
    if broken:
        _name_the_dead_worker(results, labels, pool.drain)
    return results


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
            why = "a worker process died (killed, out of memory or crashed) while this file or one beside it was being processed"
        elif index in dead:
            why = "the worker process running this file died (killed, out of memory or crashed)"
        elif index in drain.started:
            why = f"stopped when the worker process running {culprits} died"
        else:
            why = f"not started: the worker process running {culprits} died"
        results[index] = TaskFailure(EXIT_UNUSABLE, f"{labels[index]}: {why}; nothing was written for it")
