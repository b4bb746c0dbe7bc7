"""Environment settings a library that ``gae`` imports would crash on (a traceback before
any command runs), refused in one line as the process starts. Settings gaecli reads itself
fall back to their default where they are read (``GAE_PROGRESS_SECONDS``:
:func:`gaecli.cli.progress.plain_interval`); the allocator's are left to glibc
(:mod:`gaecli.cli.memory`)."""

from __future__ import annotations

import os
from typing import Optional

import typer

from gaecli.cli.common import EXIT_USAGE, fail

# variable → (what it sets, the smallest whole number the library takes). numba raises at
# import on NUMBA_NUM_THREADS below 1, and prints a traceback as a warning for a non-number.
WHOLE_NUMBERS = {"NUMBA_NUM_THREADS": ("numba's thread count", 1)}


def malformed_setting() -> Optional[str]:
    """The message refusing the first malformed setting of :data:`WHOLE_NUMBERS`, or None."""
    for variable, (meaning, minimum) in WHOLE_NUMBERS.items():
        value = os.environ.get(variable)
        if value is None:
            continue
        try:
            number: Optional[int] = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            return (
                f"{variable}={value!r} in the environment: {meaning} must be a whole number of at least "
                f"{minimum}; correct or unset it"
            )
    return None


def check_environment() -> None:
    """Exit 2 with one line on stderr when :func:`malformed_setting` finds one."""
    problem = malformed_setting()
    if problem is None:
        return
    try:
        fail(problem, EXIT_USAGE)
    except typer.Exit as stop:
        raise SystemExit(stop.exit_code) from None
