"""A process-wide request to stop: set by the signal handlers of the command line and of the
worker processes, checked between units and between batches.

A signal handler raises KeyboardInterrupt where the main thread happens to be. When that is
inside third-party code that swallows it or turns it into another error (a C extension's
import: pyarrow imports pandas on its first conversion to numpy), the run must still stop:
the request outlives the exception."""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()


def request_stop() -> None:
    """Ask the run in this process to stop (from a signal handler)."""
    _REQUESTED.set()


def clear_stop() -> None:
    """Forget an earlier request (a command starting, or finished)."""
    _REQUESTED.clear()


def stop_requested() -> bool:
    return _REQUESTED.is_set()


def check_stop() -> None:
    """Raise KeyboardInterrupt when a stop was requested (where a run may stop cleanly)."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt
