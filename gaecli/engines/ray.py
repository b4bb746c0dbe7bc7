"""The Ray engine: each work unit is one Ray task (``ray.remote`` over the same function
the local engine runs), on a local Ray instance started here or on a cluster joined with
``--ray-address``. Results are gathered as tasks finish and returned in input order.

Ctrl-C or SIGTERM in the driver cancels every task: a running one gets a KeyboardInterrupt
(its unit aborts, removing its temp files), the driver waits for them to end, then raises
:class:`gaecli.errors.RunInterrupted` with the results of the tasks that had finished. Ray's
own handlers would abort the driver on SIGTERM; the driver's are kept across ``ray.init``."""

from __future__ import annotations

import logging
import signal
import socket
import time
from typing import Any, Callable, Optional, Sequence

from gaecli.engines import EXIT_UNUSABLE, EngineOptions, EngineSession, TaskFailure, advance, run_unit
from gaecli.engines.gathering import UnitResults
from gaecli.errors import GAEUsageError, RunInterrupted
from gaecli.progress import ForwardingProgress, NoProgress

INSTALL_HINT = "pip install 'gaecli[ray]'"


def import_ray():
    """The ``ray`` module, or :class:`GAEUsageError` saying how to install it."""
    try:
        import ray
    except ImportError as error:
        raise GAEUsageError(f"--engine ray needs Ray, which is not installed here: {INSTALL_HINT}") from error
    return ray


CONNECT_TIMEOUT_SECONDS = 5.0
PROGRESS_SECONDS = 0.2  # how often the parent applies the tasks' reports
STOP_GRACE_SECONDS = 30.0  # how long an interrupted driver waits for its cancelled tasks


def check_reachable(address: str) -> None:
    """Refuse (:class:`GAEUsageError`) a ``host:port`` or ``ray://host:port`` where nothing
    accepts a connection, at once: Ray itself retries such an address for minutes.
    Other forms (``auto``, ``local``) are left to Ray, which settles them quickly."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise GAEUsageError(
            f"cannot join Ray at {address}: nothing answers there ({reason}); start the cluster or check --ray-address"
        ) from error


def _start_ray(ray, engine: EngineOptions) -> None:
    """Join ``engine.ray_address``, or start Ray here with ``workers`` CPUs and no dashboard.
    Ray's own log lines are kept off stderr (the commands' output, silent with ``--quiet``)
    but for errors, and warnings when joining a cluster."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        if engine.ray_address is not None:
            check_reachable(engine.ray_address)
            ray.init(address=engine.ray_address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(
                num_cpus=engine.worker_count(),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = engine.ray_address or "locally"
        raise GAEUsageError(f"cannot start or join Ray ({where}): {str(error).splitlines()[0]}") from error
    finally:
        _restore_handlers(handlers)


def _restore_handlers(handlers: dict) -> None:
    """Put back the Python handlers Ray replaced (its SIGTERM handler aborts the driver)."""
    for signum, handler in handlers.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            try:
                signal.signal(signum, handler)
            except ValueError:  # not the main thread: Ray cannot have set them either
                pass


def _stop_tasks(ray, refs: dict, results: list) -> None:
    """Cancel every task (a running one gets a KeyboardInterrupt and aborts its unit), wait
    up to :data:`STOP_GRACE_SECONDS` for them to end, and keep the results of those that had
    finished. Ray may be half gone (its processes got the signal too): anything it raises
    here only means there is nothing more to gather."""
    try:
        for ref in refs:
            ray.cancel(ref)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        pending = list(refs)
        while pending and time.monotonic() < deadline:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
            for ref in done:
                try:
                    result = ray.get(ref, timeout=1)
                except Exception:  # noqa: BLE001 - cancelled or lost: not written
                    continue
                if not isinstance(result, TaskFailure):
                    results[refs[ref]] = result
    except Exception:  # noqa: BLE001 - see above
        pass


def _ray_unit(function: Callable, args: tuple, queue=None) -> Any:
    # queue.put returns once the report is in the queue: before the task's result is
    result = run_unit(function, args, None if queue is None else ForwardingProgress(queue.put))
    if isinstance(result, TaskFailure):
        result.error = None
    return result


def _drain(queue, progress) -> None:
    """Apply the reports waiting in ``queue``."""
    waiting = queue.size()
    if waiting:
        for rows, tokens in queue.get_nowait_batch(waiting):
            progress.advance(rows, tokens)


def map_units_ray(
    function: Callable,
    tasks: Sequence[tuple],
    labels: Sequence[str],
    engine: EngineOptions,
    *,
    stop_on_failure: bool,
    progress=None,
    session: Optional[EngineSession] = None,
) -> list[Any]:
    """:func:`gaecli.engines.map_units` as Ray tasks (one CPU each, never retried: a unit
    that failed is reported, not run twice). Starts Ray here (``num_cpus`` = workers, no
    dashboard) unless it is running already or ``engine.ray_address`` names a cluster; a
    Ray started here is shut down at the end (of ``session``, when one is given). With a
    ``progress`` to show, the tasks report batch by batch through a Ray queue (an actor
    that takes no CPU), drained while waiting for the results."""
    ray = import_ray()
    started_here = _ensure_ray(ray, engine, session)
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_unit)
    results = UnitResults(len(tasks), progress, stop_on_failure)
    refs: dict = {}
    queue = None
    try:
        if progress is not None and not isinstance(progress, NoProgress):
            from ray.util.queue import Queue

            queue = Queue(actor_options={"num_cpus": 0})
        waiting = iter(enumerate(tasks))

        def submit() -> Optional[Any]:
            """The next task handed to Ray (None: none left)."""
            index, args = next(waiting, (None, None))
            if index is None:
                return None
            ref = remote.remote(function, args, queue)
            refs[ref] = index
            return ref

        in_flight = max(1, int(ray.cluster_resources().get("CPU", 1)))
        for _ in range(min(in_flight, len(tasks))):
            submit()
        _gather(ray, refs, results, labels, queue, progress, submit)
    except KeyboardInterrupt as error:
        _stop_tasks(ray, refs, results.values)
        raise RunInterrupted(results=results.values) from error
    except BaseException:
        for ref in refs:
            ray.cancel(ref)
        raise
    finally:
        if queue is not None:
            queue.shutdown(force=True)
        if started_here:
            ray.shutdown()
    return results.values


def _ensure_ray(ray, engine: EngineOptions, session: Optional[EngineSession]) -> bool:
    """Start or join Ray unless it is running already; returns whether the map shuts it
    down at its end (started here, without a ``session``, which does it otherwise)."""
    if ray.is_initialized():
        return False
    _start_ray(ray, engine)
    if session is None:
        return True
    session.resource("ray", lambda: ray, lambda module: module.shutdown())  # up for the next pass
    return False


def _gather(ray, refs: dict, results: UnitResults, labels: Sequence[str], queue, progress, submit) -> None:
    """Record each task's result as it finishes and hand Ray the next one (``submit``: as many
    in flight as the cluster has CPUs, none queued in Ray, so that a signal, which the wait
    hears only when a task ends, finds no task Ray could start meanwhile); a failure cancels
    the others, with ``stop_on_failure``; the tasks' progress reports from ``queue`` are
    applied meanwhile."""
    pending = list(refs)
    stopped = False
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=None if queue is None else PROGRESS_SECONDS)
        if queue is not None:
            _drain(queue, progress)
        for ref in done:
            if _recorded(ray, ref, refs[ref], results, labels[refs[ref]], progress if queue is None else None):
                stopped = True
                for other in pending:
                    ray.cancel(other)
            following = None if stopped else submit()
            if following is not None:
                pending.append(following)
    if queue is not None:
        _drain(queue, progress)


def _recorded(ray, ref, index: int, results: UnitResults, label: str, progress) -> bool:
    """Record a finished task's result (a cancelled one has none; ``progress``: advanced by
    the result where the tasks report no progress of their own); True: stop the others."""
    try:
        result = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return False
    except ray.exceptions.RayError as error:
        result = _task_failure(error, label)
    if progress is not None:
        advance(progress, result)
    return results.record(index, result)


def _task_failure(error: Exception, label: str) -> TaskFailure:
    """The failure of a task that Ray lost (its error, not the unit's)."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return TaskFailure(
        EXIT_UNUSABLE,
        f"{label}: the Ray task failed ({type(error).__name__}: {reason}); nothing was written for it",
    )
