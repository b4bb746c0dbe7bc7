"""The outcome of a run whose units failed or were stopped: the first failure raised (one
file, or a run that stops at it), or the error listing which outputs were written (or
skipped, being whole already) and which were not, and why."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from gaecli.display import display
from gaecli.engines import EXIT_INVALID_DATA, EXIT_UNUSABLE, FINISHED, TaskFailure
from gaecli.errors import FilesFailedError, InvalidFilesError, RunInterrupted, UnusableFilesError

SKIPPED = object()
"""The result of a job left alone (``--skip-existing``: its output is whole already)."""


def succeeded(result) -> bool:
    """Whether a unit's result is its work done (not a failure, not a unit never started)."""
    return not (result is None or result is FINISHED or result is SKIPPED or isinstance(result, TaskFailure))


def raise_first_failure(results: list) -> None:
    """Raise the error of the first failed unit, as for a run over that one file."""
    for result in results:
        if isinstance(result, TaskFailure):
            result.raise_error()


def failed_run(targets: list, results: list, stopped: bool) -> FilesFailedError:
    """The error of a multi-file run where some files failed: which outputs (``targets``, one
    per result) were written (or skipped, being whole already) and which were not, and why.
    ``stopped``: the run stopped at its first failure (files not started were cancelled)."""
    written, not_written, lines, worst = [], [], [], EXIT_INVALID_DATA
    for target, result in zip(targets, results):
        if result is SKIPPED or succeeded(result):
            written.append(str(target))
            lines.append(f"  {'skipped (whole already)' if result is SKIPPED else 'written'}: {display(target)}")
            continue
        not_written.append(str(target))
        if isinstance(result, TaskFailure):
            worst = max(worst, result.code)
            lines.append(f"  not written: {display(target)} ({result.message})")
        else:
            lines.append(f"  not written: {display(target)} (not started: the run stopped at the first failure)")
    failed = sum(isinstance(result, TaskFailure) for result in results)
    message = (
        f"{failed} of {len(targets)} files failed; {len(written)} written, {len(not_written)} not written"
        + (" (--on-invalid stop: files not started were cancelled)" if stopped and failed < len(not_written) else "")
        + ":\n"
        + "\n".join(lines)
    )
    error_class = UnusableFilesError if worst == EXIT_UNUSABLE else InvalidFilesError
    return error_class(message, written, not_written)


def stamp(target) -> Optional[tuple]:
    """What identifies the local file at ``target`` now (None: none there, or remote)."""
    try:
        status = target.stat() if isinstance(target, Path) else None
    except OSError:
        return None
    return None if status is None else (status.st_ino, status.st_mtime_ns, status.st_size)


def interrupted_run(
    targets: list, results: list, stamps: list, remove_leftovers: Callable[[object], None]
) -> RunInterrupted:
    """The error of a run stopped by Ctrl-C or SIGTERM: which outputs (``targets``, one per
    result) are in place (whole) and which are not (absent; their temp files removed by
    ``remove_leftovers``). ``stamps``: each target's :func:`stamp` before the run; a local
    output renamed into place by a unit stopped before it could report it counts as written
    (a rename puts only whole files there)."""
    written, not_written, lines = [], [], []
    for target, result, before in zip(targets, results, stamps):
        if result is SKIPPED:
            written.append(str(target))
            lines.append(f"  skipped (whole already): {display(target)}")
        elif succeeded(result) or result is FINISHED or stamp(target) not in (before, None):
            written.append(str(target))
            lines.append(f"  written: {display(target)}")
        else:
            remove_leftovers(target)  # a worker killed after the grace period
            not_written.append(str(target))
            why = result.message if isinstance(result, TaskFailure) else "stopped or not started"
            lines.append(f"  not written: {display(target)} ({why})")
    message = (
        f"interrupted; {len(written)} of {len(targets)} outputs written (whole), {len(not_written)} not written "
        f"(no partial output left):\n" + "\n".join(lines)
    )
    return RunInterrupted(message, written=written, not_written=not_written)
