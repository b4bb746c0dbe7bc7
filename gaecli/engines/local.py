"""The local engine's pool: work units in worker processes started with ``spawn`` (torch,
numba and ``fork`` do not mix), each worker's Arrow, numba (and, if a unit loads it,
torch) threads set to its share of the cores so that the workers do not oversubscribe
them. Workers report progress batch by batch through a pipe that a thread of the parent
drains into the parent's progress, so a long file moves the bar while it runs."""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from gaecli.engines import EXIT_UNUSABLE, TaskFailure, advance, run_unit
from gaecli.progress import NoProgress

START_METHOD = "spawn"

# In a worker: the write end of the pipe its units report (rows, tokens) on, batch by batch.
# A report is one small write (< PIPE_BUF bytes), atomic on a pipe, so the workers share
# the pipe without a lock (a worker killed mid-report cannot leave a lock held).
_progress_pipe = None
POLL_SECONDS = 0.05


class _PipeProgress:
    """A worker's side of the parent's progress: each ``advance`` is sent to the parent."""

    def __init__(self, pipe) -> None:
        self._pipe = pipe

    def start(self, phase: str, total_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        self._pipe.send((rows, tokens))

    def finish(self) -> None:
        pass


class _Drain:
    """The parent's side: a thread that feeds the workers' reports into ``progress``.
    A report is written before its unit's result is sent, so once every result is in,
    :meth:`stop` applies whatever is still in the pipe and ends the thread."""

    def __init__(self, context, progress) -> None:
        self.reader, self.writer = context.Pipe(duplex=False)
        self._progress = progress
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gaecli-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self.reader.poll(POLL_SECONDS):
                self._progress.advance(*self.reader.recv())
            elif self._stopping.is_set():
                return

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.reader.close()
        self.writer.close()


def _init_worker(threads: int, progress_pipe=None) -> None:
    global _progress_pipe
    _progress_pipe = progress_pipe
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


def _pool_unit(function: Callable, args: tuple) -> Any:
    result = run_unit(function, args, None if _progress_pipe is None else _PipeProgress(_progress_pipe))
    if isinstance(result, TaskFailure):
        result.error = None  # exceptions with extra state do not survive pickling; the message does
    return result


def map_units_local(
    function: Callable,
    tasks: Sequence[tuple],
    labels: Sequence[str],
    workers: int,
    *,
    stop_on_failure: bool,
    progress=None,
) -> list[Any]:
    """:func:`gaecli.engines.map_units` on a process pool of ``min(workers, tasks)``
    processes. A worker that dies (killed, out of memory, ``os._exit``) breaks the pool:
    every unit not finished then is a failure naming its file. ``progress`` is advanced
    batch by batch as the workers report (a unit that fails counts the batches it read)."""
    processes = min(workers, len(tasks))
    threads = max(1, (os.cpu_count() or 1) // processes)
    context = multiprocessing.get_context(START_METHOD)
    results: list[Any] = [None] * len(tasks)
    drain = _Drain(context, progress) if progress is not None and not isinstance(progress, NoProgress) else None
    initargs = (threads, None if drain is None else drain.writer)
    executor = ProcessPoolExecutor(processes, mp_context=context, initializer=_init_worker, initargs=initargs)
    futures: dict[Future, int] = {}
    try:
        futures = {executor.submit(_pool_unit, function, args): index for index, args in enumerate(tasks)}
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
                    results[index] = TaskFailure(
                        EXIT_UNUSABLE,
                        f"{labels[index]}: a worker process died (killed, out of memory or crashed) while this file "
                        f"or one beside it was being processed; nothing was written for it",
                    )
                if drain is None:
                    advance(progress, results[index])
                if stop_on_failure and isinstance(results[index], TaskFailure) and not stopping:
                    stopping = True
                    for other in pending:
                        other.cancel()
    except BaseException:
        for future in futures:
            future.cancel()
        executor.shutdown(wait=True, cancel_futures=True)  # running units finish whole (or abort) before we leave
        raise
    finally:
        if drain is not None:
            drain.stop()
    executor.shutdown(wait=True)
    return results
