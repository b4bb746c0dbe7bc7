"""The progress display of the commands on stderr (the library's Progress protocol): a rich
bar on a terminal, one plain line every few seconds otherwise (CI logs, ``make demo``), a
notice when a run starts on a cold kernel cache, and the closing line of every human summary
(elapsed time, tokens per second)."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Callable, Optional, TextIO

from gaecli.cli.common import stderr_console

PLAIN_INTERVAL_SECONDS = 5.0
"""Seconds between two plain progress lines when stderr is not a terminal."""
INTERVAL_VARIABLE = "GAE_PROGRESS_SECONDS"
"""The environment variable that sets :data:`PLAIN_INTERVAL_SECONDS` (0: a line per report)."""
COMPILE_NOTICE = "compiling kernels, first run only"
"""The line shown before the progress of a run that starts with numba's cache cold
(:func:`gaecli.advantages.kernels.cache.kernels_cached`): its first batch waits for the
compiler."""


def duration(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour): 74.2 → ``1:14``."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def token_rate(tokens: int, seconds: float) -> str:
    """Tokens per second in words: ``2.1 M tokens/s``, ``830 k tokens/s``, ``120 tokens/s``."""
    rate = tokens / seconds if seconds > 0 else 0.0
    if rate >= 1e6:
        return f"{rate / 1e6:,.1f} M tokens/s"
    if rate >= 1e3:
        return f"{rate / 1e3:,.0f} k tokens/s"
    return f"{rate:,.0f} tokens/s"


class ProgressState:
    """What the displays show, counted from the library's reports: the phase, rows and
    tokens done of the total, files done of the total (when the engine says), and the times
    (``clock``: seconds, monotonic). Also the largest token count of any phase, for the
    closing line (a statistics pass reads the same tokens as the pass after it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.run_started = clock()
        self.lock = threading.Lock()  # the local engine reports rows from a thread, files from the main one
        self.phase = ""
        self.phase_started = self.run_started
        self.total_rows = self.rows = self.tokens = 0
        self.total_files = self.files = 0
        self.run_tokens = 0
        self.notice: Optional[str] = None  # shown once, before the first progress shown

    def take_notice(self) -> Optional[str]:
        """:attr:`notice` the first time (then None)."""
        with self.lock:
            notice, self.notice = self.notice, None
        return notice

    def start(self, phase: str, total_rows: int) -> None:
        with self.lock:
            self.phase, self.total_rows = phase, total_rows
            self.rows = self.tokens = self.total_files = self.files = 0
            self.phase_started = self.clock()

    def advance(self, rows: int, tokens: int) -> None:
        with self.lock:
            self.rows += rows
            self.tokens += tokens
            self.run_tokens = max(self.run_tokens, self.tokens)

    def files_done(self, done: int, total: int) -> None:
        with self.lock:
            self.files, self.total_files = done, total

    def status(self, share: bool = True) -> str:
        """``6,912/61,440 rows (11 %) · 3/60 files · elapsed 0:14 · left 1:50 · 494 rows/s · 2.1 M
        tokens/s`` (``left`` and the rates once a row is done; the share only with ``share``:
        a bar shows it)."""
        with self.lock:
            elapsed = max(self.clock() - self.phase_started, 0.0)
            rows, total, tokens = self.rows, self.total_rows, self.tokens
            files, total_files = self.files, self.total_files
        parts = [f"{rows:,}/{total:,} rows" + (f" ({100 * rows // total} %)" if total and share else "")]
        if total_files:
            parts.append(f"{files:,}/{total_files:,} files")
        parts.append(f"elapsed {duration(elapsed)}")
        if rows and total > rows and elapsed > 0:
            parts.append(f"left {duration(elapsed * (total - rows) / rows)}")
        elif not rows and total:
            parts.append("waiting for the first batch")
        if rows and elapsed > 0:  # last: what a narrow terminal crops first
            parts.append(f"{rows / elapsed:,.0f} rows/s · {token_rate(tokens, elapsed)}")
        return " · ".join(parts)

    def closing(self) -> str:
        """The last line of a human summary: ``took 1:14 · 2.1 M tokens/s``."""
        elapsed = max(self.clock() - self.run_started, 0.0)
        return f"took {duration(elapsed)} ({elapsed:.1f} s) · {token_rate(self.run_tokens, elapsed)}"


class _RichProgress(ProgressState):
    """A rich progress bar on stderr (a terminal), redrawn ten times a second with the
    labeled status, from the moment a phase starts."""

    def __init__(self) -> None:
        super().__init__()
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        state = self

        class StatusColumn(ProgressColumn):
            def render(self, task) -> Text:
                return Text(state.status(share=False))

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=12),
            StatusColumn(),
            console=stderr_console(),
            transient=True,
        )
        self._task = None

    def start(self, phase: str, total_rows: int) -> None:
        super().start(phase, total_rows)
        if self._task is not None:  # the bar of the phase before
            self._bar.remove_task(self._task)
        notice = self.take_notice()
        if notice is not None:
            self._bar.console.print(f"[dim]{notice}[/]", soft_wrap=True)
        self._bar.start()
        self._task = self._bar.add_task(phase, total=total_rows)
        self._bar.refresh()

    def advance(self, rows: int, tokens: int) -> None:
        super().advance(rows, tokens)
        self._bar.update(self._task, advance=rows)

    def finish(self) -> None:
        self._bar.stop()


class PlainProgress(ProgressState):
    """One plain line ``phase: status`` on ``stream`` at most every ``interval`` seconds while
    reports come (the first one ``interval`` after the phase started, so short runs print
    none), and a last one when a phase that printed finishes."""

    def __init__(
        self, stream: TextIO, interval: float = PLAIN_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(clock)
        self.stream, self.interval = stream, interval
        self._last_line: Optional[float] = None

    def start(self, phase: str, total_rows: int) -> None:
        super().start(phase, total_rows)
        self._last_line = None

    def advance(self, rows: int, tokens: int) -> None:
        super().advance(rows, tokens)
        self._maybe_line()

    def files_done(self, done: int, total: int) -> None:
        super().files_done(done, total)
        self._maybe_line()

    def finish(self) -> None:
        if self._last_line is not None:
            self._line()

    def _maybe_line(self) -> None:
        now = self.clock()
        since = now - (self.phase_started if self._last_line is None else self._last_line)
        if since >= self.interval:
            self._line()

    def _line(self) -> None:
        self._last_line = self.clock()
        notice = self.take_notice()
        if notice is not None:
            self.stream.write(f"{notice}\n")
        self.stream.write(f"{self.phase}: {self.status()}\n")
        self.stream.flush()


def plain_interval() -> float:
    """:data:`PLAIN_INTERVAL_SECONDS`, or what :data:`INTERVAL_VARIABLE` says (a value that
    is no number, or NaN, is ignored: the default applies; below 0 counts as 0)."""
    try:
        seconds = float(os.environ[INTERVAL_VARIABLE])
    except (KeyError, ValueError):
        return PLAIN_INTERVAL_SECONDS
    return PLAIN_INTERVAL_SECONDS if math.isnan(seconds) else max(seconds, 0.0)


def make_progress(quiet: bool, compiles: bool = True) -> Optional[ProgressState]:
    """A progress bar when stderr is a terminal, plain lines when it is not; nothing when
    ``quiet``. Made as the command starts: its clock times the run for :func:`print_closing`.
    ``compiles``: the command runs compiled kernels; when numba's cache holds none of them yet,
    :data:`COMPILE_NOTICE` comes before the first progress shown (on a terminal as the first
    phase starts; plain, before the first plain line)."""
    if quiet:
        return None
    progress = _RichProgress() if sys.stderr.isatty() else PlainProgress(sys.stderr, plain_interval())
    if compiles:
        from gaecli.advantages.kernels.cache import kernels_cached

        progress.notice = None if kernels_cached() else COMPILE_NOTICE
    return progress


def print_closing(progress: Optional[ProgressState], console) -> None:
    """The last line of a human summary: the run's elapsed time and tokens per second."""
    if progress is not None:
        console.print(f"[dim]{progress.closing()}[/]", soft_wrap=True)
