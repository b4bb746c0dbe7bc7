"""Engines that run per-file work units: ``local`` (this process, or a pool of worker
processes) and ``ray`` (Ray tasks, on this machine or a cluster).

A work unit is a picklable top-level function called with picklable arguments; it returns
a result with ``rows`` and ``tokens`` (what the parent reports as progress). A unit that
raises a gaecli error becomes a :class:`TaskFailure` (exit code and message, naming the
file) instead of stopping the others; a worker that dies becomes one too. Results come
back in input order whatever the completion order, so whatever is merged from them does
not depend on the engine or the number of workers.

Ctrl-C or SIGTERM (in this process, or to its process group) stops a map on every engine:
no unit starts after it, running units stop and abort (their temp files removed), and
:class:`gaecli.errors.RunInterrupted` is raised with what the units finished before gave
back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from gaecli.errors import (
    EXIT_INVALID_DATA,
    EXIT_USAGE,
    GAEInputError,
    GAEUsageError,
    InvalidOptionError,
    RunInterrupted,
    exit_code,
)
from gaecli.options import check_choice, check_count
from gaecli.progress import report_files_done
from gaecli.stop import check_stop, stop_requested

ENGINES = ("local", "ray")
EXIT_UNUSABLE = EXIT_USAGE  # the name the engines and the recompute driver import
# Without --workers the local engine starts at most one worker per this many bytes of
# input: a worker costs ~0.8 s of CPU to start, about what 256 MB of rollouts cost to
# recompute (scripts/bench_scale.py: 8 files of 273 MB in all ran as fast in this process
# as on two workers; 1.1 GB ran 1.2x faster on two).
AUTO_BYTES_PER_WORKER = 256 << 20


@dataclass(frozen=True)
class EngineOptions:
    """``engine``: ``local`` or ``ray``; ``workers``: processes (local) or CPUs of a local
    Ray instance (None: the number of cores); ``ray_address``: a Ray cluster to join
    (None: start Ray here)."""

    engine: str = "local"
    workers: Optional[int] = None
    ray_address: Optional[str] = None

    def __post_init__(self) -> None:
        self.check()

    def worker_count(self, input_bytes: Optional[int] = None) -> int:
        """``workers`` when given; else the number of cores, and for the local engine with
        the inputs' total size known, no more than one per :data:`AUTO_BYTES_PER_WORKER`
        (at least one)."""
        if self.workers is not None:
            return self.workers
        cores = os.cpu_count() or 1
        if input_bytes is None or self.engine != "local":
            return cores
        return max(1, min(cores, input_bytes // AUTO_BYTES_PER_WORKER))

    def for_inputs(self, input_bytes: int) -> "EngineOptions":
        """These options with the worker count fixed for inputs of ``input_bytes`` in all
        (see :meth:`worker_count`), so that every pass of a command uses the same count."""
        if self.workers is not None or self.engine != "local":
            return self
        return replace(self, workers=self.worker_count(input_bytes))

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) an unknown engine, a worker count below 1 and
        an address without Ray; run when the options are made."""
        check_choice("--engine", self.engine, ENGINES, "engine")
        check_count("--workers", self.workers, 1)
        if self.ray_address is not None and self.engine != "ray":
            raise InvalidOptionError("--ray-address needs --engine ray")


@dataclass
class TaskFailure:
    """A work unit that did not finish: ``code`` 1 (invalid data) or 2 (unreadable or
    unwritable file, refused operation, a worker that died) and a message naming the file."""

    code: int
    message: str
    error: Optional[BaseException] = field(default=None, repr=False, compare=False)  # in this process only

    rows = 0
    tokens = 0

    def raise_error(self) -> None:
        """Raise the error itself (when the unit ran here) or one of the same kind."""
        if self.error is not None:
            raise self.error
        raise (GAEInputError if self.code == EXIT_INVALID_DATA else GAEUsageError)(self.message)


def failure_of(error: BaseException) -> Optional[TaskFailure]:
    """The failure a gaecli error stands for (None for any other exception: a bug)."""
    code = exit_code(error)
    return None if code is None else TaskFailure(code, str(error), error)


def run_unit(function: Callable, args: tuple, progress=None) -> Any:
    """Call a work unit; gaecli errors become a :class:`TaskFailure`."""
    try:
        return function(*args, progress=progress)
    except Exception as error:  # noqa: BLE001 - only gaecli errors are turned into failures
        failure = failure_of(error)
        if failure is None:
            raise
        return failure


# In RunInterrupted.results: a unit that finished (its output in place) whose result was
# lost when the workers were stopped.
FINISHED = object()


# ----------------------------------------------------------------------------- sessions


class EngineSession:
    """What the engines start (a local pool of workers, a Ray instance started here), kept
    from one :func:`map_units` call to the next that is given this session, and closed when
    the ``with`` block ends. A command's passes (the ``--normalize`` statistics, then the
    work) thus pay the start-up once."""

    def __init__(self) -> None:
        self._resources: dict = {}  # key -> (resource, close)

    def resource(self, key, create: Callable[[], Any], close: Callable[[Any], None]) -> Any:
        """The resource under ``key``, created on first use; the session closes it."""
        if key not in self._resources:
            self._resources[key] = (create(), close)
        return self._resources[key][0]

    def forget(self, key) -> None:
        """Drop ``key`` without closing it (the caller closes a resource that broke)."""
        self._resources.pop(key, None)

    def close(self) -> None:
        while self._resources:
            _, (resource, close) = self._resources.popitem()
            close(resource)

    def __enter__(self) -> "EngineSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def map_units(
    function: Callable,
    tasks: Sequence[tuple],
    labels: Sequence[str],
    engine: EngineOptions,
    *,
    stop_on_failure: bool = False,
    progress=None,
    session: Optional[EngineSession] = None,
) -> list[Any]:
    """Run ``function(*task, progress=...)`` for every task and return the results in task
    order: the unit's result, a :class:`TaskFailure`, or None for a unit never started
    (cancelled after a failure with ``stop_on_failure``). ``labels`` name each task in
    messages (the input file). ``progress`` is advanced with the units' rows and tokens,
    batch by batch, whatever the engine. ``session``: keep the pool (or a Ray started
    here) for the next call given it (:class:`EngineSession`).
    With one worker or one task the units run in this process, one after the other (no
    pool to start); a failure's ``error`` then holds the exception itself.
    """
    engine.check()
    if engine.engine == "ray":
        from gaecli.engines.ray import map_units_ray

        return map_units_ray(
            function, tasks, labels, engine, stop_on_failure=stop_on_failure, progress=progress, session=session
        )
    workers = engine.worker_count()
    if workers == 1 or len(tasks) <= 1:
        return _map_in_process(function, tasks, stop_on_failure, progress)
    from gaecli.engines.local import map_units_local

    return map_units_local(
        function, tasks, labels, workers, stop_on_failure=stop_on_failure, progress=progress, session=session
    )


class FilesDone:
    """Counts the units of a map that have finished and tells ``progress`` (its optional
    ``files_done``: one unit is one file): 0 of ``total`` at once, then one more per :meth:`add`."""

    def __init__(self, progress, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0
        report_files_done(progress, 0, total)

    def add(self) -> None:
        self.done += 1
        report_files_done(self.progress, self.done, self.total)


def _map_in_process(function, tasks, stop_on_failure, progress) -> list[Any]:
    from gaecli.engines.gathering import UnitResults

    results = UnitResults(len(tasks), progress, stop_on_failure)
    try:
        for index, args in enumerate(tasks):
            check_stop()  # an interrupt swallowed by the unit before still stops the run here
            if results.record(index, run_unit(function, args, progress)):
                break
    except BaseException as error:  # the running unit has aborted; the rest never start
        if isinstance(error, KeyboardInterrupt) or stop_requested():  # or what a signal turned into
            raise RunInterrupted(results=results.values) from error
        raise
    return results.values


def advance(progress, result: Any) -> None:
    if progress is not None and not isinstance(result, TaskFailure) and result is not None:
        progress.advance(result.rows, result.tokens)
