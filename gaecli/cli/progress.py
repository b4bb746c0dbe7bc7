"""The progress display of the commands on stderr (the library's Progress protocol)."""

from __future__ import annotations

import sys

from gaecli.cli.common import stderr_console


class _RichProgress:
    """A rich progress bar on stderr with rows and tokens per second (the library's
    Progress protocol)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rows · {task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=stderr_console(),
            transient=True,
        )
        self._task = None
        self._tokens = 0

    def start(self, phase: str, total_rows: int) -> None:
        import time

        self._bar.start()
        self._tokens = 0
        self._started = time.perf_counter()
        self._task = self._bar.add_task(phase, total=total_rows, rate="")

    def advance(self, rows: int, tokens: int) -> None:
        import time

        self._tokens += tokens
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        done = self._bar.tasks[-1].completed + rows
        rate = f"{done / elapsed:,.0f} rows/s · {self._tokens / elapsed / 1e6:,.1f} M tokens/s"
        self._bar.update(self._task, advance=rows, rate=rate)

    def finish(self) -> None:
        self._bar.stop()


def make_progress(quiet: bool):
    """A progress bar when stderr is a terminal and not ``quiet``, else nothing."""
    if quiet or not sys.stderr.isatty():
        return None
    return _RichProgress()
