"""Exceptions raised by the gaecli library (the CLI maps them to exit codes)."""

from __future__ import annotations


class GAEError(Exception):
    """Base class of every error gaecli raises on purpose."""


class GAEInputError(GAEError, ValueError):
    """Arguments or data that break the input contract (exit code 1 in the CLI).

    The message names the sample (row) index where one is known.
    """


class KernelUnavailableError(GAEError, ValueError):
    """A kernel was asked for by name that does not exist or cannot run on the device."""
