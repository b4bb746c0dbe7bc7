"""The local engine's pool: work units in worker processes started with ``spawn`` (torch,
numba and ``fork`` do not mix), each worker's Arrow, numba (and, if a unit loads it,
torch) threads set to its share of the cores so that the workers do not oversubscribe
them."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from gaecli.engines import EXIT_UNUSABLE, TaskFailure, advance, run_unit

START_METHOD = "spawn"


def _init_worker(threads: int) -> None:
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
    result = run_unit(function, args)
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
    every unit not finished then is a failure naming its file."""
    processes = min(workers, len(tasks))
    threads = max(1, (os.cpu_count() or 1) // processes)
    context = multiprocessing.get_context(START_METHOD)
    results: list[Any] = [None] * len(tasks)
    executor = ProcessPoolExecutor(processes, mp_context=context, initializer=_init_worker, initargs=(threads,))
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
    executor.shutdown(wait=True)
    return results
