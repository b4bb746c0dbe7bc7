"""How library functions report progress without printing: a small protocol the CLI
implements with a rich progress bar, and a no-op default."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives progress of long work. ``start`` opens a phase over ``total_rows`` rows;
    ``advance`` adds rows and tokens done; ``finish`` closes the phase."""

    def start(self, phase: str, total_rows: int) -> None: ...

    def advance(self, rows: int, tokens: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    """The default: reports nothing."""

    def start(self, phase: str, total_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass

    def finish(self) -> None:
        pass
