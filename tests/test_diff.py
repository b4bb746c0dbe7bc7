"""``gae diff`` end to end: small real Parquet files through the CLI (Typer's CliRunner),
every figure held against plain numpy / Python loops over the trainers' own GAE loops
(``helpers.ORACLES``, no gaecli code), the terminal credit measured by perturbing the
terminal reward, grouped figures, top-K order, --against with stored columns, every
output parsed (JSON, Markdown tables, self-contained HTML, per-sample Parquet), batch-size
invariance, and the usage errors."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.comparison.token_sample import TokenSample
from gaecli.stats import DeltaHistograms, SignedLogHistogram, diff_rows

from helpers import ORACLES
from rollout_files import Rollouts, gae, random_rollouts, rollout_table, write_table

QUANTILE_ERROR = 0.005
BASELINES = ["unmasked", "skip-masked", "zero-masked"]
# γ = 0, γλ < 1 and γ = λ = 1
DISCOUNTS = [(0.0, 0.9), (0.9, 0.8), (1.0, 1.0)]


def diff_json(*args, gamma, lambd) -> dict:
    result = gae("diff", *args, "--gamma", gamma, "--lambd", lambd, "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------- data


def rollouts(rows: int = 40, seed: int = 7) -> Rollouts:
    return random_rollouts(rows, seed=seed, max_length=30)


def masked_tail_rollouts() -> Rollouts:
    """Three samples, the first ending in 3 masked tokens (the terminal credit's case)."""
    return Rollouts(
        values=[[0.5, -0.2, 0.3, 0.1, 0.4], [0.2, 0.1, 0.3], [0.1, 0.2]],
        rewards=[[0.0, 0.1, 0.0, 0.0, 0.2], [0.0, 0.0, 0.0], [0.0, 0.0]],
        masks=[[1, 1, 0, 0, 0], [1, 0, 1], [1, 1]],
        terminal=[1.0, -1.0, 0.5],
    )


def data_table(data: Rollouts, *, extra: dict | None = None) -> pa.Table:
    """float64 rollouts with an id and a step column (4 steps)."""
    rows = len(data)
    columns = {
        "sample_id": pa.array([f"s{row:03d}" for row in range(rows)]),
        "step": pa.array([row % 4 for row in range(rows)]),
    }
    return rollout_table(data, float_type=pa.float64(), extra={**columns, **(extra or {})})


def write_data(tmp_path: Path, data: Rollouts, name: str = "rollouts.parquet", **options) -> Path:
    return write_table(data_table(data, **options), tmp_path / name)


# ----------------------------------------------------------------------------- the oracle


def outputs(semantics: str, data: Rollouts, gamma: float, lambd: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Advantages and returns per sample from the trainers' loops (float64)."""
    advantages, returns = [], []
    for values, rewards, mask, terminal in zip(data.values, data.rewards, data.masks, data.terminal):
        a, r = ORACLES[semantics](values, rewards, mask, terminal, gamma, lambd)
        advantages.append(np.asarray(a, dtype=np.float64))
        returns.append(np.asarray(r, dtype=np.float64))
    return advantages, returns


def perturbed_credit(semantics: str, data: Rollouts, gamma: float, lambd: float) -> list[float | None]:
    """d A_old[last trainable token] / d z, measured: the old advantage there with z + 1
    minus with z (None without a trainable token)."""
    credits = []
    for values, rewards, mask, terminal in zip(data.values, data.rewards, data.masks, data.terminal):
        trainable = [t for t, m in enumerate(mask) if m]
        if not trainable:
            credits.append(None)
            continue
        last = trainable[-1]
        plain = ORACLES[semantics](values, rewards, mask, terminal, gamma, lambd)[0][last]
        bumped = ORACLES[semantics](values, rewards, mask, terminal + 1.0, gamma, lambd)[0][last]
        credits.append(bumped - plain)
    return credits


def whiten_lists(advantages: list[np.ndarray], masks: list[list[int]], groups: list | None = None) -> list[np.ndarray]:
    """(A − mean) / sqrt(var + 1e-8) over trainable tokens of the whole input (or of each
    group of rows), float64 loops."""
    groups = groups or [None] * len(advantages)
    out = [np.array(a, dtype=np.float64) for a in advantages]
    for key in set(groups):
        rows = [i for i, g in enumerate(groups) if g == key]
        tokens = [a for i in rows for a, m in zip(advantages[i], masks[i]) if m]
        mean = sum(tokens) / len(tokens)
        std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1) + 1e-8)
        for i in rows:
            out[i] = (np.asarray(advantages[i], dtype=np.float64) - mean) / std
    return out


def nearest_rank(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def trainable_tokens(mask, new_row, old_row) -> list[tuple[int, float, float]]:
    """``(t, new, old)`` at each trainable token ``t`` of one sample (floats)."""
    return [(t, float(new_row[t]), float(old_row[t])) for t, m in enumerate(mask) if m]


def expected_figures(data: Rollouts, new, old, new_returns, old_returns, credits, tol: float = 1e-6) -> dict:
    """Every summary figure by plain loops over samples and tokens."""
    deltas, return_deltas, news, olds = [], [], [], []
    changed = changed_tokens = flips = 0
    tails, tail_credits = [], []
    for row, mask in enumerate(data.masks):
        sample_changed = False
        for t, a, b in trainable_tokens(mask, new[row], old[row]):
            deltas.append(abs(a - b))
            news.append(a)
            olds.append(b)
            if old_returns is not None:
                return_deltas.append(abs(float(new_returns[row][t]) - float(old_returns[row][t])))
            if abs(a - b) / (1 + abs(a)) > tol:
                sample_changed = True
                changed_tokens += 1
            if a * b < 0:
                flips += 1
        changed += sample_changed
        if any(mask) and not mask[-1]:
            last = max(t for t, m in enumerate(mask) if m)
            tails.append(len(mask) - 1 - last)
            tail_credits.append(credits[row] if credits is not None else None)
    n = len(news)
    std = float(np.std(news, ddof=1))
    figures = {
        "samples": len(data.masks),
        "tokens": sum(len(m) for m in data.masks),
        "trainable_tokens": n,
        "changed_samples": changed,
        "changed_tokens": changed_tokens,
        "fully_masked_samples": sum(1 for m in data.masks if m and not any(m)),
        "empty_samples": sum(1 for m in data.masks if not m),
        "masked_tail_samples": len(tails),
        "mean_masked_tail_length": sum(tails) / len(tails) if tails else None,
        "median_masked_tail_length": nearest_rank(tails, 0.5),
        "p99_masked_tail_length": nearest_rank(tails, 0.99),
        "longest_masked_tail": max(tails, default=0),
        "sign_flip_tokens": flips,
        "sign_flip_share": flips / n,
        "correlation": float(np.corrcoef(news, olds)[0, 1]),
        "new_advantage_mean": sum(news) / n,
        "new_advantage_std": std,
        "old_advantage_mean": sum(olds) / n,
        "old_advantage_std": float(np.std(olds, ddof=1)),
    }
    for quantity, values in (("advantage", deltas), ("return", return_deltas if old_returns is not None else None)):
        for stat, value in (
            ("mean", None if values is None else sum(values) / n),
            ("median", None if values is None else nearest_rank(values, 0.5)),
            ("p99", None if values is None else nearest_rank(values, 0.99)),
            ("max", None if values is None else max(values)),
        ):
            figures[f"{stat}_abs_delta_{quantity}"] = value
            figures[f"{stat}_abs_delta_{quantity}_over_std"] = None if value is None else value / std
    if credits is None:
        figures.update(mean_terminal_credit=None, min_terminal_credit=None, zero_credit_samples=None)
    else:
        figures.update(
            mean_terminal_credit=sum(tail_credits) / len(tail_credits) if tail_credits else None,
            min_terminal_credit=min(tail_credits) if tail_credits else None,
            zero_credit_samples=sum(1 for c in tail_credits if abs(c) < 1e-12),
        )
    return figures


def assert_figures(summary: dict, expected: dict, *, exact_tol: float = 1e-9) -> None:
    """Counts equal, sums and means to ``exact_tol`` (relative), quantiles within the
    histogram's relative error."""
    for key, want in expected.items():
        got = summary[key]
        if want is None:
            assert got is None, f"{key}: {got!r}, expected None"
        elif isinstance(want, int) and not isinstance(want, bool) and "credit" not in key:
            assert got == want, f"{key}: {got!r}, expected {want!r}"
        elif key.startswith(("median_abs", "p99_abs")):
            assert got is not None and abs(got - want) <= QUANTILE_ERROR * 1.01 * abs(want) + 1e-9, (
                f"{key}: {got!r}, expected {want!r}"
            )
        else:
            assert got == pytest.approx(want, rel=exact_tol, abs=1e-9), f"{key}: {got!r}, expected {want!r}"


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("gamma, lambd", DISCOUNTS, ids=["gamma0", "gammalambda-lt-1", "gamma-lambda-1"])
@pytest.mark.parametrize("baseline", BASELINES)
def test_every_figure_against_plain_loops(tmp_path, baseline, gamma, lambd):
    data = rollouts()
    path = write_data(tmp_path, data)
    report = diff_json(path, "--baseline", baseline, gamma=gamma, lambd=lambd)
    new, new_returns = outputs("masked", data, gamma, lambd)
    old, old_returns = outputs(baseline, data, gamma, lambd)
    credits = perturbed_credit(baseline, data, gamma, lambd)
    expected = expected_figures(data, new, old, new_returns, old_returns, credits)
    summary = report["summary"]
    assert summary["baseline"] == baseline and report["old"] == {
        "source": "baseline",
        "baseline": baseline,
        "advantages_column": None,
        "returns_column": None,
    }
    assert summary["masked_tail_samples"] > 0 and summary["fully_masked_samples"] > 0 and summary["empty_samples"] > 0
    assert_figures(summary, expected)
    assert summary["trainable_share"] == pytest.approx(expected["trainable_tokens"] / expected["tokens"])
    assert summary["changed_share"] == pytest.approx(expected["changed_samples"] / expected["samples"])


@pytest.mark.parametrize("gamma, lambd", DISCOUNTS, ids=["gamma0", "gammalambda-lt-1", "gamma-lambda-1"])
def test_terminal_credit_per_baseline(tmp_path, gamma, lambd):
    """The credit each baseline gives the last trainable token of a masked-tail sample, as
    measured by perturbing z, and the documented formula: unmasked (γλ)^gap, skip-masked
    0, zero-masked 1."""
    data = masked_tail_rollouts()
    path = write_data(tmp_path, data)
    for baseline, formula in (("unmasked", (gamma * lambd) ** 3), ("skip-masked", 0.0), ("zero-masked", 1.0)):
        summary = diff_json(
            path,
            "--baseline",
            baseline,
            "--per-sample",
            tmp_path / "rows.parquet",
            "--overwrite",  # each baseline's rows replace the last one's
            gamma=gamma,
            lambd=lambd,
        )["summary"]
        measured = perturbed_credit(baseline, data, gamma, lambd)
        assert measured[0] == pytest.approx(formula, abs=1e-12)
        assert summary["masked_tail_samples"] == 1 and summary["longest_masked_tail"] == 3
        assert summary["mean_terminal_credit"] == pytest.approx(measured[0], abs=1e-12)
        assert summary["min_terminal_credit"] == pytest.approx(measured[0], abs=1e-12)
        assert summary["zero_credit_samples"] == (1 if formula == 0.0 else 0)
        per_sample = pq.read_table(tmp_path / "rows.parquet").column("terminal_credit").to_pylist()
        assert per_sample == pytest.approx([m for m in measured], abs=1e-12)  # no tail: credit 1 in every baseline


def test_normalize_whitens_new_and_old_each_with_its_own_statistics(tmp_path):
    gamma, lambd = 0.95, 0.9
    data = rollouts(seed=11)
    path = write_data(tmp_path, data)
    new, new_returns = outputs("masked", data, gamma, lambd)
    old, old_returns = outputs("unmasked", data, gamma, lambd)
    credits = perturbed_credit("unmasked", data, gamma, lambd)

    report = diff_json(path, "--normalize", gamma=gamma, lambd=lambd)
    assert report["normalize"] == "all"
    expected = expected_figures(
        data, whiten_lists(new, data.masks), whiten_lists(old, data.masks), new_returns, old_returns, credits
    )
    assert_figures(report["summary"], expected, exact_tol=1e-7)
    assert report["summary"]["new_advantage_std"] == pytest.approx(1.0, abs=1e-6)

    steps = [row % 4 for row in range(len(data))]
    report = diff_json(path, "--normalize-by", "step", gamma=gamma, lambd=lambd)
    assert report["normalize"] == "by:step"
    expected = expected_figures(
        data,
        whiten_lists(new, data.masks, steps),
        whiten_lists(old, data.masks, steps),
        new_returns,
        old_returns,
        credits,
    )
    assert_figures(report["summary"], expected, exact_tol=1e-7)


def test_against_stored_columns(tmp_path):
    gamma, lambd = 1.0, 0.95
    data = rollouts(seed=5)
    rng = np.random.default_rng(0)
    stored, stored_returns = outputs("unmasked", data, gamma, lambd)
    stored = [a + rng.normal(0, 0.01, a.size) for a in stored]  # what a trainer logged, say
    path = write_data(
        tmp_path,
        data,
        extra={
            "trained_advantages": pa.array([a.tolist() for a in stored], pa.list_(pa.float32())),
            "trained_returns": pa.array([r.tolist() for r in stored_returns], pa.list_(pa.float64())),
        },
    )
    as_stored = [np.asarray(a, dtype=np.float32).astype(np.float64) for a in stored]
    new, new_returns = outputs("masked", data, gamma, lambd)

    report = diff_json(
        path, "--against", "trained_advantages", "--against-returns", "trained_returns", gamma=gamma, lambd=lambd
    )
    assert report["old"] == {
        "source": "stored",
        "baseline": None,
        "advantages_column": "trained_advantages",
        "returns_column": "trained_returns",
    }
    expected = expected_figures(data, new, as_stored, new_returns, stored_returns, credits=None)
    assert_figures(report["summary"], expected)
    assert all(entry["terminal_credit"] is None for entry in report["top_samples"])

    report = diff_json(path, "--against", "trained_advantages", gamma=gamma, lambd=lambd)
    expected = expected_figures(data, new, as_stored, new_returns, None, credits=None)
    assert_figures(report["summary"], expected)
    assert report["summary"]["max_abs_delta_return"] is None


def test_grouped_figures(tmp_path):
    gamma, lambd = 0.9, 0.9
    data = rollouts(rows=43, seed=3)
    path = write_data(tmp_path, data)
    report = diff_json(path, "--group-by", "step", "--baseline", "skip-masked", gamma=gamma, lambd=lambd)
    new, new_returns = outputs("masked", data, gamma, lambd)
    old, old_returns = outputs("skip-masked", data, gamma, lambd)
    credits = perturbed_credit("skip-masked", data, gamma, lambd)
    groups = report["groups"]
    # every group (4 < 20), the hardest hit (largest max |Δ advantage|) first
    assert sorted(group["key"] for group in groups) == [0, 1, 2, 3] and report["group_count"] == 4
    maxima = [group["max_abs_delta_advantage"] for group in groups]
    assert maxima == sorted(maxima, reverse=True) and report["groups_out"] is None
    for group in groups:
        rows = [row for row in range(len(data)) if row % 4 == group["key"]]
        part = data.take(rows)

        def pick(xs, rows=rows):
            return [xs[row] for row in rows]

        expected = expected_figures(part, pick(new), pick(old), pick(new_returns), pick(old_returns), pick(credits))
        assert group["samples"] == expected["samples"] and group["tokens"] == expected["tokens"]
        assert group["trainable_tokens"] == expected["trainable_tokens"]
        assert group["changed_samples"] == expected["changed_samples"]
        assert group["changed_share"] == pytest.approx(expected["changed_samples"] / expected["samples"])
        assert group["fully_masked_samples"] == expected["fully_masked_samples"]
        assert group["masked_tail_samples"] == expected["masked_tail_samples"]
        assert group["mean_terminal_credit"] == pytest.approx(expected["mean_terminal_credit"], abs=1e-12)
        for key in (
            "mean_abs_delta_advantage",
            "max_abs_delta_advantage",
            "mean_abs_delta_return",
            "max_abs_delta_return",
            "sign_flip_share",
            "correlation",
        ):
            assert group[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), key
    assert sum(group["samples"] for group in groups) == report["summary"]["samples"]


def test_figures_do_not_depend_on_the_batch_size(tmp_path):
    data = rollouts(rows=50, seed=9)
    paths = [
        write_data(tmp_path / "in", data, "a.parquet"),
        write_data(tmp_path / "in", rollouts(rows=30, seed=10), "b.parquet"),
    ]
    options = ["--group-by", "step", "--id-col", "sample_id", "--normalize", "--top", "7"]
    reports = [diff_json(*paths, *options, "--batch-rows", rows, gamma=0.99, lambd=0.9) for rows in (1, 7, 1000)]
    assert reports[0] == reports[1] == reports[2]


# ----------------------------------------------------------------------------- top samples


def test_top_samples_order_ties_and_fields(tmp_path):
    gamma, lambd = 0.9, 0.8
    data = rollouts(rows=30, seed=21)
    first = write_data(tmp_path, data, "a.parquet")
    second = write_data(tmp_path, data, "b.parquet")  # the same rows: every max |Δ| tied across files
    report = diff_json(
        first, second, "--top", "6", "--id-col", "sample_id", "--group-by", "step", gamma=gamma, lambd=lambd
    )
    new, _ = outputs("masked", data, gamma, lambd)
    old, old_returns = outputs("unmasked", data, gamma, lambd)
    _, new_returns = outputs("masked", data, gamma, lambd)
    credits = perturbed_credit("unmasked", data, gamma, lambd)
    candidates = []
    for file_index, path in enumerate((first, second)):
        for row, mask in enumerate(data.masks):
            deltas = [abs(new[row][t] - old[row][t]) for t, m in enumerate(mask) if m]
            if deltas and max(deltas) > 0:
                candidates.append((-max(deltas), file_index, row, str(path)))
    candidates.sort()
    top = report["top_samples"]
    assert len(top) == 6
    got = [(entry["file"], entry["row"]) for entry in top]
    # equal maxima (up to rounding) in both files: the first file's row first
    assert got == [(path, row) for _, _, row, path in candidates[:6]]
    assert [entry["max_abs_delta_advantage"] for entry in top] == sorted(
        (e["max_abs_delta_advantage"] for e in top), reverse=True
    )
    for entry in top:
        row, mask = entry["row"], data.masks[entry["row"]]
        trainable = [t for t, m in enumerate(mask) if m]
        deltas = [abs(new[row][t] - old[row][t]) for t in trainable]
        assert entry["id"] == f"s{row:03d}" and entry["group"] == row % 4
        assert entry["length"] == len(mask) and entry["trainable_tokens"] == len(trainable)
        assert entry["masked_share"] == pytest.approx(1 - len(trainable) / len(mask))
        assert entry["masked_tail"] == len(mask) - 1 - trainable[-1]
        assert entry["max_abs_delta_advantage"] == pytest.approx(max(deltas), rel=1e-12)
        assert entry["mean_abs_delta_advantage"] == pytest.approx(sum(deltas) / len(deltas), rel=1e-9)
        assert entry["max_abs_delta_return"] == pytest.approx(
            max(abs(new_returns[row][t] - old_returns[row][t]) for t in trainable), rel=1e-9
        )
        assert entry["sign_flips"] == sum(1 for t in trainable if new[row][t] * old[row][t] < 0)
        assert entry["terminal_credit"] == pytest.approx(credits[row], abs=1e-12)
        assert entry["changed"] is True


def test_top_zero_and_no_differences(tmp_path):
    data = Rollouts(values=[[0.1, 0.2]], rewards=[[0.0, 0.0]], masks=[[1, 1]], terminal=[1.0])
    path = write_data(tmp_path, data)
    report = diff_json(path, gamma=1.0, lambd=1.0)
    assert report["top_samples"] == [] and report["summary"]["changed_samples"] == 0
    assert report["summary"]["median_abs_delta_advantage"] == 0.0
    assert diff_json(path, "--top", "0", gamma=1.0, lambd=1.0)["top_samples"] == []


# ----------------------------------------------------------------------------- outputs


def assert_markdown_tables(text: str) -> int:
    """Every table row has the header's number of (unescaped) pipes; returns the tables."""
    tables, header_pipes = 0, None
    for line in text.splitlines():
        if line.startswith("|"):
            pipes = len(re.findall(r"(?<!\\)\|", line))
            if header_pipes is None:
                header_pipes = pipes
                tables += 1
            assert pipes == header_pipes, line
        else:
            header_pipes = None
    return tables


def test_every_output_parses(tmp_path):
    data = rollouts(seed=4)
    path = write_data(tmp_path, data)
    json_path, markdown_path, html_path, rows_path = (
        tmp_path / name for name in ("r.json", "r.md", "r.html", "rows.parquet")
    )
    result = gae(
        "diff",
        path,
        "--gamma",
        0.9,
        "--lambd",
        0.8,
        "--group-by",
        "step",
        "--id-col",
        "sample_id",
        "--top",
        "3",
        "--json",
        json_path,
        "--markdown",
        markdown_path,
        "--html",
        html_path,
        "--per-sample",
        rows_path,
    )
    assert result.exit_code == 0, result.output
    assert "gae diff" in result.stderr and "top samples" in result.stderr and "by step" in result.stderr

    document = json.loads(json_path.read_text())
    assert set(document) == {
        "version",
        "gamma",
        "lambd",
        "kernel",
        "new",
        "new_spec",
        "estimator",
        "group_col",
        "step_col",
        "old",
        "normalize",
        "tolerance",
        "group_by",
        "id_col",
        "top",
        "files",
        "on_invalid",
        "skipped",
        "rejects",
        "quantiles",
        "summary",
        "top_samples",
        "groups",
        "comparisons",
        "group_count",
        "groups_out",
        "per_sample",
    }
    assert (
        document["quantiles"]["name"] == "log-histogram" and document["quantiles"]["relative_error"] == QUANTILE_ERROR
    )
    assert document["files"] == [{"file": str(path), "rows": len(data), "tokens": sum(len(m) for m in data.masks)}]

    markdown = markdown_path.read_text()
    assert assert_markdown_tables(markdown) == 3  # summary, top samples, groups
    assert "| figure | value |" in markdown and "## By `step`" in markdown

    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 4  # histogram, scatter, groups, traces
    import base64

    assert all(base64.b64decode(image).startswith(b"\x89PNG") for image in images)
    references = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page)
    assert len(references) == 4 and all(ref.startswith("data:image/png;base64,") for ref in references)
    assert not re.search(r"https?://|<link|<script|@import|url\(", page)

    table = pq.read_table(rows_path)
    assert table.num_rows == len(data)
    assert table.column_names[:4] == ["file", "row", "id", "step"]  # the group column: --group-by's own name
    new, _ = outputs("masked", data, 0.9, 0.8)
    old, _ = outputs("unmasked", data, 0.9, 0.8)
    for row, record in enumerate(table.to_pylist()):
        mask = data.masks[row]
        deltas = [abs(new[row][t] - old[row][t]) for t, m in enumerate(mask) if m]
        assert record["row"] == row and record["id"] == f"s{row:03d}" and record["step"] == row % 4
        assert record["length"] == len(mask) and record["trainable_tokens"] == sum(mask)
        assert record["fully_masked"] == (bool(mask) and not any(mask))
        assert record["max_abs_delta_advantage"] == pytest.approx(max(deltas, default=0.0), rel=1e-12, abs=1e-15)
        if deltas:
            assert record["mean_abs_delta_advantage"] == pytest.approx(sum(deltas) / len(deltas), rel=1e-9, abs=1e-15)
        else:
            assert record["mean_abs_delta_advantage"] is None and record["terminal_credit"] is None


def test_markdown_to_stdout_and_html_without_groups(tmp_path):
    path = write_data(tmp_path, rollouts(rows=12, seed=2))
    result = gae("diff", path, "--gamma", 1, "--lambd", 1, "--markdown", "-", "--html", tmp_path / "r.html", "--quiet")
    assert result.exit_code == 0, result.output
    assert assert_markdown_tables(result.stdout) == 2 and "## By" not in result.stdout
    assert len(re.findall(r'src="data:image/png;base64,', (tmp_path / "r.html").read_text())) == 3


# ----------------------------------------------------------------------------- errors


def test_usage_errors(tmp_path, monkeypatch):
    path = write_data(
        tmp_path,
        rollouts(rows=8, seed=1),
        extra={"trained": pa.array([[0.0] * len(m) for m in rollouts(rows=8, seed=1).masks])},
    )

    def run(*args):
        return gae("diff", path, "--gamma", 1, "--lambd", 1, "--quiet", *args)

    result = run("--against", "trained", "--old-estimator", "gae")
    assert result.exit_code == 2 and "--against" in result.stderr and "--old-estimator" in result.stderr
    result = run("--against", "trained_advantages")
    assert result.exit_code == 2 and "'trained_advantages' is missing" in result.stderr
    result = run("--against-returns", "trained")
    assert result.exit_code == 2 and "needs --against" in result.stderr
    result = run("--baseline", "sometimes-masked")
    assert result.exit_code == 2 and "unknown baseline" in result.stderr
    result = run("--group-by", "nope")
    assert result.exit_code == 2 and "--group-by column 'nope' is missing" in result.stderr
    result = run("--markdown", path)
    assert result.exit_code == 2 and "input file" in result.stderr
    result = run("--json", "-", "--markdown", "-")
    assert result.exit_code == 2
    result = run("--html", tmp_path / "missing" / "r.html")
    assert result.exit_code == 2 and "does not exist" in result.stderr

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "r.html"
    result = run("--html", out)
    assert result.exit_code == 2 and "pip install 'gaecli[plot]'" in result.stderr
    assert not out.exists()


def test_invalid_stored_column_names_file_row_and_column(tmp_path):
    data = rollouts(rows=6, seed=1)
    stored = [[0.0] * len(m) for m in data.masks]
    stored[4] = stored[4] + [0.0]
    path = write_data(tmp_path, data, extra={"trained": pa.array(stored, pa.list_(pa.float64()))})
    result = gae("diff", path, "--gamma", 1, "--lambd", 1, "--quiet", "--against", "trained")
    assert result.exit_code == 1
    assert str(path) in result.stderr and "row 4" in result.stderr and "'trained'" in result.stderr


# ----------------------------------------------------------------------------- pieces


def test_log_histogram_quantiles_are_within_the_stated_error():
    rng = np.random.default_rng(0)
    numbers = np.concatenate([rng.lognormal(-3, 3, 5000) * rng.choice([-1, 1], 5000), np.zeros(700), [1e-13, -2e-14]])
    histogram = SignedLogHistogram(QUANTILE_ERROR, 1e-12)
    trainable = np.ones(numbers.size, dtype=bool)
    offsets = np.array([0, numbers.size])
    diff_rows(
        numbers,
        np.zeros_like(numbers),
        trainable,
        offsets,
        1e-6,
        histograms=DeltaHistograms(histogram, SignedLogHistogram(QUANTILE_ERROR, 1e-12)),
    )
    magnitudes = np.abs(numbers)
    for q in (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0):
        want = nearest_rank(magnitudes.tolist(), q)
        got = histogram.abs_quantile(q, float(magnitudes.max()))
        if want <= 1e-12:
            assert got == 0.0
        else:
            assert abs(got - want) <= QUANTILE_ERROR * 1.0001 * want, (q, got, want)


def test_row_figures_are_named_and_match_a_loop_per_row():
    rng = np.random.default_rng(2)
    lengths = [0, 1, 7, 12, 5, 9]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    size = int(offsets[-1])
    new, old = rng.normal(size=size), rng.normal(size=size)
    old[::4] = new[::4]  # unchanged tokens
    new_returns, old_returns = rng.normal(size=size), rng.normal(size=size)
    trainable = rng.random(size) < 0.7
    trainable[offsets[4] : offsets[5]] = False  # a fully masked row
    tolerance = 0.3
    rows = diff_rows(new, old, trainable, offsets, tolerance, returns=(new_returns, old_returns))
    without_returns = diff_rows(new, old, trainable, offsets, tolerance)
    for row in range(len(lengths)):
        tokens = [t for t in range(offsets[row], offsets[row + 1]) if trainable[t]]
        deltas = [abs(float(new[t]) - float(old[t])) for t in tokens]
        relative = [deltas[i] / (1.0 + abs(float(new[t]))) for i, t in enumerate(tokens)]
        return_deltas = [abs(float(new_returns[t]) - float(old_returns[t])) for t in tokens]
        want = {
            "max_abs": max(deltas, default=0.0),
            "max_relative": max(relative, default=0.0),
            "sum_abs": math.fsum(deltas),
            "sign_flips": sum(float(new[t]) * float(old[t]) < 0 for t in tokens),
            "max_abs_return": max(return_deltas, default=0.0),
            "sum_abs_return": math.fsum(return_deltas),
            "sum_new": math.fsum(new[t] for t in tokens),
            "sum_old": math.fsum(old[t] for t in tokens),
            "sum_new_sq": math.fsum(new[t] ** 2 for t in tokens),
            "sum_old_sq": math.fsum(old[t] ** 2 for t in tokens),
            "sum_cross": math.fsum(new[t] * old[t] for t in tokens),
            "trainable_tokens": len(tokens),
            "changed_tokens": sum(value > tolerance for value in relative),
        }
        for name, value in want.items():
            assert getattr(rows, name)[row] == pytest.approx(value, rel=1e-12, abs=1e-12), (row, name)
        assert without_returns.max_abs_return[row] == 0.0 and without_returns.sum_abs_return[row] == 0.0
    assert rows.trainable_tokens.dtype == rows.sign_flips.dtype == rows.changed_tokens.dtype == np.int64
    assert rows.trainable_tokens[4] == 0 and rows.changed_tokens.sum() > 0


def test_token_sample_is_uniform_and_independent_of_batching():
    rng = np.random.default_rng(1)
    new, old = rng.normal(size=5000), rng.normal(size=5000)
    trainable = rng.random(5000) < 0.7
    samples = []
    for cuts in ([0, 5000], [0, 1, 999, 2500, 5000], list(range(0, 5001, 250))):
        sample = TokenSample(300)
        for start, end in zip(cuts[:-1], cuts[1:]):
            sample.update(new[start:end], old[start:end], trainable[start:end], 0, start)
        samples.append(sample.points())
    for points in samples[1:]:
        np.testing.assert_array_equal(points[0], samples[0][0])
        np.testing.assert_array_equal(points[1], samples[0][1])
    picked = samples[0][0]
    assert picked.size == 300 and set(picked.tolist()) <= set(new[trainable].tolist())
