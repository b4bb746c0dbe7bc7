"""How library functions report progress without printing: a small protocol the CLI
implements with a rich progress bar, a no-op default, and a forwarder that worker
processes use to send their reports to the parent."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives progress of long work. ``start`` opens a phase over ``total_rows`` rows;
    ``advance`` adds rows and tokens done; ``finish`` closes the phase.

    Optional: a ``files_done(done, total)`` method, when the object has one, hears how many
    of the phase's ``total`` files are finished: ``(0, total)`` as the engine starts them,
    then after each file (:func:`report_files_done`)."""

    def start(self, phase: str, total_rows: int) -> None: ...

    def advance(self, rows: int, tokens: int) -> None: ...

    def finish(self) -> None: ...


def report_files_done(progress, done: int, total: int) -> None:
    """Tell ``progress`` that ``done`` of ``total`` files are finished, when it has the
    optional ``files_done`` method (a progress object written for the three methods alone
    works unchanged)."""
    files_done = getattr(progress, "files_done", None)
    if files_done is not None:
        files_done(done, total)


class NoProgress:
    """The default: reports nothing."""

    def start(self, phase: str, total_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass

    def finish(self) -> None:
        pass


class ForwardingProgress:
    """Progress in a worker that hands each ``advance`` as ``(rows, tokens)`` to ``send``
    (a pipe's or a queue's), for the parent to apply to its own progress."""

    def __init__(self, send) -> None:
        self._send = send

    def start(self, phase: str, total_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        self._send((rows, tokens))

    def finish(self) -> None:
        pass
