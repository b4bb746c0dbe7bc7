"""Progress on stderr: the labeled status (rows, files, rates, elapsed, left) against a fake
clock; plain lines every few seconds when stderr is not a terminal; the closing line
(elapsed, tokens per second) of every human summary, absent from the JSON."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from test_import_nemo_rl import batch, write_step
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.cli.progress import (
    INTERVAL_VARIABLE,
    PLAIN_INTERVAL_SECONDS,
    PlainProgress,
    ProgressState,
    duration,
    plain_interval,
    token_rate,
)
from gaecli.engines import EngineOptions, map_units

from rollout_files import random_rollouts, rollout_table, write_table


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_duration_and_rate_words():
    assert duration(0.4) == "0:00" and duration(74.9) == "1:14" and duration(3725) == "1:02:05"
    assert token_rate(2_100_000, 1.0) == "2.1 M tokens/s"
    assert token_rate(83_000, 0.1) == "830 k tokens/s"
    assert token_rate(120, 1.0) == "120 tokens/s" and token_rate(5, 0.0) == "0 tokens/s"


def test_status_is_labeled_from_the_first_moment():
    clock = FakeClock()
    state = ProgressState(clock)
    state.start("recompute", 61_440)
    state.files_done(0, 60)
    assert state.status() == "0/61,440 rows (0 %) · 0/60 files · elapsed 0:00 · waiting for the first batch"
    clock.now += 14
    state.advance(6_912, 29_400_000)
    state.files_done(3, 60)
    # 6,912 rows in 14 s: 494 rows/s, 2.1 M tokens/s; the rest at that pace: 14 · 54,528 / 6,912 = 110.4 s
    assert state.status() == (
        "6,912/61,440 rows (11 %) · 3/60 files · elapsed 0:14 · left 1:50 · 494 rows/s · 2.1 M tokens/s"
    )


def test_plain_lines_every_interval_and_a_last_one():
    clock, stream = FakeClock(), io.StringIO()
    progress = PlainProgress(stream, interval=5.0, clock=clock)
    progress.start("diff", 100)
    clock.now += 1
    progress.advance(10, 1_000)
    assert stream.getvalue() == ""  # a short run prints none
    clock.now += 5  # 6 s since the start
    progress.files_done(1, 4)
    clock.now += 2
    progress.advance(10, 1_000)  # 2 s since the last line: none
    clock.now += 4
    progress.advance(30, 3_000)  # 6 s since the last line
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "diff: 10/100 rows (10 %) · 1/4 files · elapsed 0:06 · left 0:54 · 2 rows/s · 167 tokens/s",
        "diff: 50/100 rows (50 %) · 1/4 files · elapsed 0:12 · left 0:12 · 4 rows/s · 417 tokens/s",
        "diff: 50/100 rows (50 %) · 1/4 files · elapsed 0:12 · left 0:12 · 4 rows/s · 417 tokens/s",
    ]
    assert progress.closing() == "took 0:12 (12.0 s) · 417 tokens/s"


def test_a_phase_that_printed_nothing_prints_no_last_line():
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=5.0, clock=FakeClock())
    progress.start("validate", 3)
    progress.advance(3, 30)
    progress.finish()
    assert stream.getvalue() == ""


def test_the_closing_line_counts_the_tokens_once_over_two_passes():
    clock = FakeClock()
    state = ProgressState(clock)
    for phase in ("statistics", "recompute"):  # both passes read the same 4,000 tokens
        state.start(phase, 10)
        state.advance(10, 4_000)
        clock.now += 1
    assert state.closing() == "took 0:02 (2.0 s) · 2 k tokens/s"


def _square(x, progress=None):
    class Result:
        rows, tokens = x, 10 * x

    if progress is not None:
        progress.advance(x, 10 * x)
    return Result()


def test_the_engine_reports_files_done_in_order_of_completion():
    seen = []

    class Recorder:
        def start(self, phase, total_rows):
            pass

        def advance(self, rows, tokens):
            pass

        def finish(self):
            pass

        def files_done(self, done, total):
            seen.append((done, total))

    map_units(_square, [(1,), (2,), (3,)], ["a", "b", "c"], EngineOptions(workers=1), progress=Recorder())
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_a_progress_without_files_done_still_works():
    class Minimal:
        rows = 0

        def start(self, phase, total_rows):
            pass

        def advance(self, rows, tokens):
            self.rows += rows

        def finish(self):
            pass

    minimal = Minimal()
    map_units(_square, [(1,), (2,)], ["a", "b"], EngineOptions(workers=1), progress=minimal)
    assert minimal.rows == 3


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture
def rollouts(tmp_path) -> list[Path]:
    return [
        write_table(rollout_table(random_rollouts(20, seed)), tmp_path / "in" / f"step_{seed}.parquet")
        for seed in range(2)
    ]


def cli(*args, interval: str = "0"):
    result = CliRunner().invoke(app, [str(arg) for arg in args], env={INTERVAL_VARIABLE: interval, "COLUMNS": "100"})
    assert "Traceback" not in result.output, result.output
    return result


def closing_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_recompute_prints_plain_progress_lines_and_closes_with_the_time(tmp_path, rollouts):
    result = cli("recompute", *rollouts, "-o", tmp_path / "out", "--gamma", 1, "--lambd", 0.95, "--workers", 1)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    progress = [line for line in lines if line.startswith("recompute: ")]
    assert progress, result.stderr
    assert "/40 rows" in progress[-1] and "2/2 files" in progress[-1] and "elapsed " in progress[-1]
    assert closing_line(result.stderr).startswith("took ") and closing_line(result.stderr).endswith("tokens/s")


def test_no_progress_lines_in_a_short_run_at_the_default_interval(tmp_path, rollouts):
    result = cli("validate", *rollouts, interval="60")
    assert not [line for line in result.stderr.splitlines() if line.startswith("validate: ")]
    assert closing_line(result.stderr).startswith("took ")


def test_quiet_prints_no_progress_and_no_closing_line(tmp_path, rollouts):
    result = cli("recompute", *rollouts, "-o", tmp_path / "out", "--gamma", 1, "--lambd", 1, "--quiet")
    assert result.exit_code == 0 and result.stderr == ""


def test_diff_and_validate_close_with_the_time_and_the_json_has_none(tmp_path, rollouts):
    diff = cli("diff", *rollouts, "--gamma", 1, "--lambd", 0.95, "--json", tmp_path / "d.json")
    assert diff.exit_code == 0, diff.output
    assert closing_line(diff.stderr).startswith("took ") and "tokens/s" in closing_line(diff.stderr)
    validate = cli("validate", *rollouts, "--json", tmp_path / "v.json")
    assert closing_line(validate.stderr).startswith("took ")
    for name in ("d.json", "v.json"):
        text = (tmp_path / name).read_text()
        assert "took" not in text and "tokens/s" not in text and "elapsed" not in text
    assert cli("diff", *rollouts, "--gamma", 1, "--lambd", 0.95, "--json", tmp_path / "d2.json").exit_code == 0
    assert json.loads((tmp_path / "d2.json").read_text()) == json.loads((tmp_path / "d.json").read_text())


def test_import_closes_with_the_time(tmp_path):
    dump = write_step(tmp_path / "dumps", 1, batch(0, 6))
    result = cli("import", "nemo-rl", dump, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 0, result.output
    assert closing_line(result.stderr).startswith("took ") and "tokens/s" in closing_line(result.stderr)


def test_the_bar_shows_one_phase_at_a_time():
    from gaecli.cli.progress import _RichProgress

    progress = _RichProgress()
    for phase in ("statistics", "recompute"):
        progress.start(phase, 10)
        progress.advance(10, 100)
        progress.finish()
    assert [task.description for task in progress._bar.tasks] == ["recompute"]


@pytest.mark.parametrize(
    "setting, seconds",
    [
        ("abc", PLAIN_INTERVAL_SECONDS),
        ("nan", PLAIN_INTERVAL_SECONDS),
        ("", PLAIN_INTERVAL_SECONDS),
        ("-2", 0.0),
        ("0.5", 0.5),
    ],
)
def test_a_malformed_interval_setting_falls_back_to_the_default(monkeypatch, setting, seconds):
    """Not a number, or NaN (which would silence every line): the default interval."""
    monkeypatch.setenv(INTERVAL_VARIABLE, setting)
    assert plain_interval() == seconds
