"""The one run driver of the commands (recompute, diff, validate) and of the table functions:
footers read once (:func:`read_footers`), the pre-passes and the units of a run on one engine
session (:class:`Run`), and the outcome of a run where files failed or were stopped
(:mod:`.outcome`). Each command says only what a unit does and how results merge."""

from gaecli.run.driver import Run, read_footers, reader_statistics, total_rows
from gaecli.run.outcome import SKIPPED, failed_run, interrupted_run, raise_first_failure, stamp

__all__ = [
    "SKIPPED",
    "Run",
    "failed_run",
    "interrupted_run",
    "raise_first_failure",
    "read_footers",
    "reader_statistics",
    "stamp",
    "total_rows",
]
