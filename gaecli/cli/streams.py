"""The ``gae`` process's standard streams and what a fault of one does to a run.

- A standard descriptor that is closed when the command starts (``2>&-``, ``>&-``) is
  reopened on ``/dev/null``, so no file the run opens can take its number (a JSON report
  written to "stdout" would land in a Parquet output).
- stderr is for the human only: a write there that fails (closed, a reader gone, a full
  disk) is dropped, and the run goes on; its outputs and its exit code are what they would be.
- stdout carries results (``--json -``, ``--markdown -``, listings): a reader that went away
  (``gae … --json - | head``) ends the command the way it ends a Unix tool, by SIGPIPE (the
  shell sees 141), once the run has unwound (its outputs whole, its temp files removed, its
  workers gone); any other fault (``> /dev/full``: ENOSPC) is an unwritable file, exit 2.
- Library warnings (numpy's overflow notes, deprecations) never reach the user's terminal,
  in this process or its workers, unless the user asked for them (``-W``, ``PYTHONWARNINGS``).
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import warnings
from typing import Any


class StdoutClosed(BaseException):
    """Standard output's reader went away (EPIPE). A BaseException, as SIGPIPE is not an
    error of the run: nothing on the way out reports it; :func:`run_guarded` ends the
    process by SIGPIPE once everything has unwound."""


class StdoutUnwritable(OSError):
    """Standard output cannot take what is written (a full device, a descriptor that was
    closed when the command started): an unwritable file, exit 2."""


class _Stderr(io.TextIOBase):
    """stderr that drops what cannot be written (and never raises on a write or flush)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True


class _Stdout(_Stderr):
    """stdout, written through (a fault shows at the write that meets it): a reader gone is
    :class:`StdoutClosed`, any other fault :class:`StdoutUnwritable`. After a fault the
    descriptor is pointed at ``/dev/null``, so that nothing buffered fails again on exit."""

    def __init__(self, stream: Any, was_closed: bool) -> None:
        super().__init__(stream)
        self._was_closed = was_closed

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:  # a probe (click writes '' to learn the stream's kind)
            return 0
        if self._was_closed:
            raise StdoutUnwritable(errno.EBADF, "standard output was closed")
        try:
            self._stream.write(text)
            self._stream.flush()
        except OSError as error:
            self._silence()
            if error.errno == errno.EPIPE:
                raise StdoutClosed() from None
            raise StdoutUnwritable(error.errno, error.strerror or str(error)) from None
        return len(text)

    def _silence(self) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()
        except (OSError, ValueError):
            pass


def _reopen_closed_descriptors() -> set[int]:
    """Open ``/dev/null`` on each of descriptors 0, 1, 2 that is closed; the ones reopened."""
    reopened = set()
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            reopened.add(fd)
    return reopened


def _text_stream(stream: Any, fd: int) -> Any:
    """``stream``, or a text stream on ``fd`` where Python found the descriptor closed (None)."""
    if stream is not None:
        return stream
    return open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def quiet_library_warnings() -> None:
    """Keep library warnings off the terminal, here and in the worker processes (which
    read the environment), unless the user asked for warnings."""
    if sys.warnoptions or os.environ.get("PYTHONWARNINGS"):
        return
    warnings.simplefilter("ignore")
    os.environ["PYTHONWARNINGS"] = "ignore"


def guard_streams() -> None:
    """Set up the standard streams of the ``gae`` process as the module says."""
    reopened = _reopen_closed_descriptors()
    sys.stdout = _Stdout(_text_stream(sys.stdout, 1), was_closed=1 in reopened)
    sys.stderr = _Stderr(_text_stream(sys.stderr, 2))
    quiet_library_warnings()


def die_of_sigpipe() -> None:
    """End this process as a write to a closed pipe ends a Unix tool: by SIGPIPE."""
    sys.stderr.flush()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # where the signal could not end it


def _leave_pending_store_calls(code) -> None:
    """End the process now, with ``code``, when a store call it gave up on (a signal, a
    store that does not answer) is still pending: the interpreter's exit would wait for
    it (or for the store client it holds). None is pending where no store was opened."""
    if "gaecli.io.filesystem" not in sys.modules:
        return
    from gaecli.io.filesystem import store_calls_pending

    if store_calls_pending():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def run_guarded(command) -> None:
    """Run ``command`` (the typer app) with the streams guarded; a stdout whose reader went
    away ends the process by SIGPIPE, a stdout fault that escaped the command is one line
    on stderr and exit 2. A KeyboardInterrupt that escapes the command (a signal after its
    report, the command's handlers restored) exits 130 without a traceback."""
    guard_streams()
    try:
        _run_guarded(command)
    except KeyboardInterrupt:
        from gaecli.errors import EXIT_INTERRUPTED

        sys.exit(EXIT_INTERRUPTED)


def _run_guarded(command) -> None:
    try:
        command()
    except SystemExit as exit_:
        _leave_pending_store_calls(exit_.code)
        raise
    except StdoutClosed:
        die_of_sigpipe()
    except StdoutUnwritable as error:  # a listing or help (reports name themselves, see write_text)
        import typer

        from gaecli.cli.common import EXIT_USAGE, fail

        try:
            fail(f"standard output: cannot write ({error.strerror})", EXIT_USAGE)
        except typer.Exit as exit_:
            sys.exit(exit_.exit_code)
