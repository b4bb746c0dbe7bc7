"""A process-wide request to stop: set by the signal handlers of the command line and of the
worker processes, checked between units and between batches.

A signal handler raises KeyboardInterrupt where the main thread happens to be. When that is
inside third-party code that swallows it or turns it into another error (a C extension's
import: pyarrow imports pandas on its first conversion to numpy), the run must still stop:
the request outlives the exception."""

from __future__ import annotations

import os
import sys
import threading

_REQUESTED = threading.Event()
_FRAGILE = ("numba", "llvmlite")
"""Where an asynchronous KeyboardInterrupt can leave objects half made: numba compiling or
loading a kernel, and llvmlite under it (a reference whose finaliser then fails at exit)."""


def request_stop() -> None:
    """Ask the run in this process to stop (from a signal handler)."""
    _REQUESTED.set()


def clear_stop() -> None:
    """Forget an earlier request (a command starting, or finished)."""
    _REQUESTED.clear()


def stop_requested() -> bool:
    return _REQUESTED.is_set()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until a stop is requested (or ``timeout`` seconds pass); whether it was (for a
    thread that turns the request into another component's own stop)."""
    return _REQUESTED.wait(timeout)


def check_stop() -> None:
    """Raise KeyboardInterrupt when a stop was requested (where a run may stop cleanly)."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


def interruptible(frame) -> bool:
    """Whether a signal's handler may raise KeyboardInterrupt at ``frame`` (where the main
    thread was when the signal came): not while numba or llvmlite run (:data:`_FRAGILE`), in
    the import system or in a ``__del__`` anywhere on the stack. There the exception would
    leave objects half made (their finaliser then fails at exit) or be swallowed and printed;
    the handler then only asks the run to stop (:func:`request_stop`), which it does at its
    next check (:func:`check_stop`, between batches and units)."""
    fragile = ("<frozen importlib", *_package_directories(_FRAGILE))
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename.startswith(fragile):
            return False
        frame = frame.f_back
    return True


def _package_directories(names) -> list[str]:
    """The directories of those of the packages ``names`` that are imported."""
    found = []
    for name in names:
        module = sys.modules.get(name)
        location = getattr(module, "__file__", None)
        if location:
            found.append(os.path.join(os.path.dirname(os.path.abspath(location)), ""))
    return found


def quiet_swallowed_interrupts() -> None:
    """Where the signal's KeyboardInterrupt lands in code whose exceptions Python only prints
    ("Exception ignored in ...": an import-lock callback, a ctypes callback while numba
    compiles, a ``__del__``), print nothing: the request (:func:`request_stop`) stops the run
    at its next check. Every other unraisable exception goes to the hook there was."""

    previous = sys.unraisablehook
    if getattr(previous, "quiet_interrupts", False):
        return

    def hook(unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _REQUESTED.is_set():
            return
        previous(unraisable)

    hook.quiet_interrupts = True
    sys.unraisablehook = hook
