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


def quiet_swallowed_interrupts() -> None:
    """Where the signal's KeyboardInterrupt lands in code whose exceptions Python only prints
    ("Exception ignored in ...": an import-lock callback, a ctypes callback while numba
    compiles, a ``__del__``), print nothing: the request (:func:`request_stop`) stops the run
    at its next check. Every other unraisable exception goes to the hook there was."""
    import sys

    previous = sys.unraisablehook
    if getattr(previous, "quiet_interrupts", False):
        return

    def hook(unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _REQUESTED.is_set():
            return
        previous(unraisable)

    hook.quiet_interrupts = True
    sys.unraisablehook = hook

