"""Exceptions raised by the gaecli library (the CLI maps them to exit codes)."""

from __future__ import annotations

from typing import Optional, Sequence

from gaecli.display import display


class GAEError(Exception):
    """Base class of every error gaecli raises on purpose. Its text is the message as
    :func:`gaecli.display.display` shows it (credentials redacted, undecodable bytes and
    control characters escaped: one line); a multi-line error (``LINES``) keeps its line
    breaks and shows each line so."""

    LINES = False

    def __str__(self) -> str:
        return displayed_message(super().__str__(), lines=self.LINES)


def displayed_message(message: str, *, lines: bool = False) -> str:
    """``message`` as :func:`display` shows it; ``lines``: its line breaks kept (a message
    that lists files one a line, each line displayed)."""
    if not lines:
        return display(message)
    return "\n".join(display(line) for line in message.split("\n"))


class GAEInputError(GAEError, ValueError):
    """Arguments or data that break the input contract (exit code 1 in the CLI).

    The message names the sample (row) index where one is known.
    """


class GAEUsageError(GAEError):
    """A refused operation or an unusable path: existing output without overwrite, output
    equal to an input, missing optional extra (exit code 2 in the CLI)."""


class InvalidOptionError(GAEUsageError, GAEInputError):
    """An option value out of its range or not one of its choices, or options that
    contradict each other (exit code 2 in the CLI), raised before any work is done. Also a
    :class:`GAEInputError`, so that callers catching that keep working."""


class KernelUnavailableError(InvalidOptionError):
    """A kernel was asked for by name that does not exist or cannot run on the device."""


class UnreadableFileError(GAEUsageError):
    """A file that cannot be read as Parquet (not Parquet, truncated, unreadable)."""


class InvalidDataError(GAEInputError):
    """Rows that break the rollout format; carries the finding that stopped the run."""

    def __init__(self, finding) -> None:
        super().__init__(finding.line())
        self.finding = finding


class FilesFailedError(GAEError):
    """Some files of a multi-file run failed while others were written. ``written`` and
    ``not_written`` list the output paths; the message says which failed and why, one
    file a line."""

    LINES = True

    def __init__(self, message: str, written: list[str], not_written: list[str]) -> None:
        super().__init__(message)
        self.written = written
        self.not_written = not_written


class InvalidFilesError(FilesFailedError, GAEInputError):
    """Files failed, all of them for invalid data (exit code 1)."""


class UnusableFilesError(FilesFailedError, GAEUsageError):
    """Files failed, at least one unreadable, unwritable or refused (exit code 2 wins)."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM (exit code 130 in the CLI); a
    :class:`KeyboardInterrupt`, so code that catches that still does.

    ``results``: what each work unit of the map that was stopped gave back before the stop
    (None for a unit not started or stopped while running). A command that writes files
    raises it again with the message listing the outputs ``written`` (whole) and
    ``not_written`` (absent: no temp file left)."""

    def __init__(
        self,
        message: str = "interrupted",
        results: Optional[list] = None,
        written: Sequence[str] = (),
        not_written: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.results = results
        self.written = list(written)
        self.not_written = list(not_written)

    def __str__(self) -> str:
        return displayed_message(self.message, lines=True)


EXIT_INVALID_DATA = 1
"""The exit code of invalid input data (rows that break the format)."""
EXIT_USAGE = 2
"""The exit code of a usage error, an unreadable or unwritable file, a refused operation."""
EXIT_INTERRUPTED = 130
"""The exit code of a run stopped by Ctrl-C or SIGTERM."""


def exit_code(error: BaseException) -> Optional[int]:
    """The documented exit code of a gaecli error (the one mapping, which the CLI and the
    engines' failures both use), None for any other exception. Usage comes first: an
    :class:`InvalidOptionError` is both."""
    if isinstance(error, GAEUsageError):
        return EXIT_USAGE
    if isinstance(error, GAEInputError):
        return EXIT_INVALID_DATA
    return None
