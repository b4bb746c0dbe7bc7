"""What the diff reports show a person: the verdict sentence on top of the terminal,
Markdown and HTML reports, naming every comparison and the worst; sub-rows nested (not
leading spaces) in Markdown and HTML; at 80 columns every figure of seven comparisons whole
(comparisons as rows) and a top-samples table that keeps file names told apart and every
row number; the HTML's per-token plot of new − old."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

from gaecli.diff import DiffOptions, diff_files
from gaecli.report import groups_note, nesting, summary_rows, verdict
from gaecli.report.markdown import render_markdown
from gaecli.report.terminal import shortened_left, shortened_names

from rollout_files import random_rollouts, rollout_table, write_table

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample_data"


def summary(**figures) -> dict:
    base = {
        "samples": 92,
        "changed_samples": 72,
        "tolerance": 1e-6,
        "max_abs_delta_advantage": 2.0,
        "max_abs_delta_advantage_over_std": 1.6666,
        "masked_tail_samples": 12,
        "mean_terminal_credit": 0.5,
        "zero_credit_samples": 0,
    }
    return {"summary": {**base, **figures}}


@pytest.mark.parametrize(
    "figures, expected",
    [
        (
            {},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages kept 0.5 of the terminal reward on average.",
        ),
        (
            {"mean_terminal_credit": 0.0034},  # significant digits, not "0.00"
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages kept 0.0034 of the terminal reward on average.",
        ),
        (
            {"zero_credit_samples": 3, "mean_terminal_credit": 0.25},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages kept 0.25 of the terminal reward on average (3 kept none of it).",
        ),
        (
            {"zero_credit_samples": 12, "mean_terminal_credit": 0.0},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages kept none of the terminal reward.",
        ),
        (
            {"mean_terminal_credit": 1.0, "masked_tail_samples": 1},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 1 sample ends in a masked tail, where the old "
            "advantages kept all of the terminal reward.",
        ),
        (
            {"mean_terminal_credit": None, "zero_credit_samples": None, "max_abs_delta_advantage_over_std": None},
            "72 of 92 samples changed; largest |Δ advantage| 2; 12 samples end in a masked tail.",
        ),
        (
            {"masked_tail_samples": 0, "mean_terminal_credit": None},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; no sample ends in a masked tail.",
        ),
        ({"changed_samples": 0}, "No sample changed (of 92, tol 1e-06)."),
    ],
)
def test_verdict(figures, expected):
    assert verdict(summary(**figures)) == expected


def test_nesting():
    assert nesting("samples") == (0, "samples")
    assert nesting("  ÷ σ of the new advantages") == (1, "÷ σ of the new advantages")
    assert nesting("    deeper") == (2, "deeper")


def test_shortening_keeps_names_apart():
    assert shortened_left("step_0001.parquet", 12) == "…001.parquet" and len(shortened_left("a" * 30, 12)) == 12
    assert shortened_left("short.parquet", 20) == "short.parquet"
    names = [f"global_step_{step:04d}_rank_07.parquet" for step in (1, 2, 13)]
    shown = shortened_names(names, 14)
    assert len(set(shown)) == 3 and all(len(name) <= 14 for name in shown)
    assert [re.search(r"_(\d{4})_", name).group(1) for name in shown] == ["0001", "0002", "0013"]
    assert shortened_names(["step_1.parquet", "step_2.parquet"], 14) == ["step_1.parquet", "step_2.parquet"]


# ----------------------------------------------------------------------------- a real diff


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reports") / "experiment_alpha_2026" / "rollouts"
    files = []
    for step in (1, 2):
        data = random_rollouts(30, seed=step, max_length=60)
        ids = pa.array([f"sample-{step}-{row:05d}" for row in range(30)])
        table = rollout_table(data, extra={"sample_id": ids})
        files.append(str(write_table(table, directory / f"global_step_{step:04d}_rank_07.parquet")))
    options = DiffOptions(gamma=1.0, lambd=0.9, id_col="sample_id", top=6)
    return diff_files(files, options)


def terminal_text(document: dict, width: int = 80) -> str:
    from gaecli.report.terminal import render_diff

    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)
    render_diff(document, console)
    return console.export_text()


def shown(value) -> str:
    """A figure as the terminal shows it, written out here apart from the code: integers with
    thousands separators, floats with 4 significant digits, 0 as "0", None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return "0" if value == 0 else f"{value:.4g}"


def counted(part: int, whole: int) -> str:
    return f"{part:,} ({100.0 * part / whole:.1f} %)"


def table_rows(text: str, title: str, count: int) -> tuple[list[str], list[list[str]]]:
    """The header cells and the first ``count`` rows' cells of the table under the line
    ``title`` (cells are two or more spaces apart; the line under the header is a rule)."""
    lines = text.splitlines()
    start = lines.index(title)
    assert set(lines[start + 2].strip()) == {"─"}, lines[start : start + 3]
    split = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 3 : start + 3 + count]]
    return re.split(r"\s{2,}", lines[start + 1].strip()), split


def test_terminal_at_80_columns_keeps_files_rows_and_ids(report):
    document = report.to_dict()
    text = terminal_text(document)
    lines = text.splitlines()
    assert max(len(line) for line in lines[1:]) <= 80  # the headline (soft-wrapped) aside
    assert lines[1].startswith(verdict(document)[:40])  # the verdict right under the headline
    entries = document["top_samples"]
    header, rows = table_rows(text, "top samples by max |Δ advantage|", 2 * len(entries))  # each id on its own line
    assert header == ["#", "file · id", "row", "length", "masked", "tail", "max |Δ|", "flips", "credit"]
    for (cells, id_line), entry in zip(zip(rows[::2], rows[1::2]), entries):
        step = re.search(r"global_step_(\d{4})", entry["file"]).group(1)
        assert step in cells[1], (cells[1], entry["file"])  # the file told apart
        assert cells[2] == str(entry["row"])  # the row number, whole
        assert id_line == [entry["id"]]  # the id under its file
        assert cells[-2:] == [f"{entry['sign_flips']:,}", shown(entry["terminal_credit"])]


@pytest.fixture(scope="module")
def every_profile():
    """``gae diff sample_data/agentic --baseline all``: seven comparisons on the sample dump."""
    options = DiffOptions(gamma=1.0, lambd=0.95, baseline="all", id_col="sample_id", top=5, group_by="rollout_id")
    return diff_files([str(SAMPLE_DATA / "agentic")], options).to_dict()


def test_every_figure_of_seven_comparisons_is_whole_at_80_columns(every_profile):
    """Each comparison a row of each table, each figure of its JSON summary in its column with
    every digit; each top sample's file name and figures whole; nothing wider than 80."""
    document = every_profile
    listed = document["comparisons"]
    assert [c["name"] for c in listed] == ["verl", "openrlhf", "slime", "roll", "areal", "nemo-rl", "skyrl"]
    text = terminal_text(document)
    wrapped = [line for line in text.splitlines()[1:] if line != groups_note(document)]  # soft-wrapped: headline, note
    assert max(len(line) for line in wrapped) <= 80
    first = listed[0]["summary"]
    header, rows = table_rows(text, "the samples, against every old side", 3)
    assert rows == [
        ["samples", shown(first["samples"])],
        [
            "tokens (trainable)",
            f"{first['tokens']:,} ({first['trainable_tokens']:,}, {100 * first['trainable_share']:.1f} %)",
        ],
        ["samples with a masked tail", counted(first["masked_tail_samples"], first["samples"])],
    ]
    over_sigma = f" ÷ σ of the new advantages (σ = {shown(first['new_advantage_std'])})"
    spreads = {
        "|Δ advantage|": "_abs_delta_advantage",
        "|Δ advantage|" + over_sigma: "_abs_delta_advantage_over_std",
        "|Δ return|": "_abs_delta_return",
        "|Δ return|" + over_sigma: "_abs_delta_return_over_std",
    }
    for title, suffix in spreads.items():
        header, rows = table_rows(text, title, len(listed))
        assert header == ["against", "mean", "median", "p99", "max"]
        for cells, comparison in zip(rows, listed):
            s = comparison["summary"]
            assert cells == [
                comparison["name"],
                *(shown(s[stat + suffix]) for stat in ("mean", "median", "p99", "max")),
            ]
    header, rows = table_rows(text, "changed", len(listed))
    assert header == ["against", "samples changed", "tokens changed", "sign flips", "correlation"]
    for cells, comparison in zip(rows, listed):
        s = comparison["summary"]
        assert cells == [
            comparison["name"],
            counted(s["changed_samples"], s["samples"]),
            counted(s["changed_tokens"], s["trainable_tokens"]),
            counted(s["sign_flip_tokens"], s["trainable_tokens"]),
            shown(s["correlation"]),
        ]
    header, rows = table_rows(text, "the old side's terminal reward", len(listed))
    assert header == ["against", "mean credit", "min credit", "kept none", "dropped", "Σ|z|"]
    for cells, comparison in zip(rows, listed):
        s = comparison["summary"]
        assert cells == [
            comparison["name"],
            shown(s["mean_terminal_credit"]),
            shown(s["min_terminal_credit"]),
            counted(s["zero_credit_samples"], s["masked_tail_samples"]),
            counted(s["lost_terminal_samples"], s["samples"]),
            shown(s["lost_terminal_abs_sum"]),
        ]
    for comparison in listed:
        if not comparison["top_samples"]:
            continue
        entries = comparison["top_samples"]
        _, rows = table_rows(text, f"top samples by max |Δ advantage| — against {comparison['name']}", 2 * len(entries))
        for cells, entry in zip(rows[::2], entries):
            assert cells == [
                *(str(value) for value in (entries.index(entry) + 1, Path(entry["file"]).name, entry["row"])),
                f"{entry['length']:,}",
                f"{100 * entry['masked_share']:.1f} %",
                f"{entry['masked_tail']:,}",
                shown(entry["max_abs_delta_advantage"]),
                f"{entry['sign_flips']:,}",
                shown(entry["terminal_credit"]),
            ]


def test_the_summary_sits_side_by_side_where_it_fits(every_profile):
    document = every_profile
    listed = document["comparisons"]
    text = terminal_text(document, width=400)
    header = next(line for line in text.splitlines() if line.startswith("figure "))
    assert header.split() == ["figure", *(c["name"] for c in listed)]
    changed = next(line for line in text.splitlines() if line.startswith("samples changed (tol"))
    assert re.split(r"\s{2,}", changed.strip())[1:] == [
        counted(c["summary"]["changed_samples"], c["summary"]["samples"]) for c in listed
    ]
    assert "the samples, against every old side" not in text


def test_the_verdict_names_every_comparison_and_the_worst(every_profile):
    document = every_profile
    listed = document["comparisons"]
    sentence = verdict(document)
    samples = listed[0]["summary"]["samples"]
    counts = ", ".join(f"{c['summary']['changed_samples']} against {c['name']}" for c in listed)
    assert sentence.startswith(f"Of {samples} samples, {counts.replace(' against', ' changed against', 1)}; ")
    hardest = max(c["summary"]["changed_samples"] for c in listed)
    candidates = [c for c in listed if c["summary"]["changed_samples"] == hardest]
    largest = max(c["summary"]["max_abs_delta_advantage_over_std"] for c in candidates)
    worst = [c for c in candidates if c["summary"]["max_abs_delta_advantage_over_std"] == largest]
    names = " and ".join(c["name"] for c in worst) if len(worst) <= 2 else None
    assert names is not None and f"; the most against {names}: largest |Δ advantage| {largest:.3g} σ; " in sentence
    assert terminal_text(document).splitlines()[1] in sentence  # the terminal opens with it
    assert f"**{sentence}**" in render_markdown(document)


def many(*figures: dict) -> dict:
    names = [f"p{position}" for position in range(len(figures))]
    listed = [{"name": name, **summary(**each)} for name, each in zip(names, figures)]
    return {"summary": listed[0]["summary"], "comparisons": listed}


@pytest.mark.parametrize(
    "figures, expected",
    [
        (
            ({"changed_samples": 8}, {}),
            "Of 92 samples, 8 changed against p0, 72 against p1; the most against p1: largest |Δ advantage| 1.67 σ; "
            "12 samples end in a masked tail, where the old advantages kept 0.5 of the terminal reward on average.",
        ),
        (
            ({}, {"max_abs_delta_advantage_over_std": 3.0}, {"max_abs_delta_advantage_over_std": 3.0}),
            "Of 92 samples, 72 changed against p0, 72 against p1, 72 against p2; the most against p1 and p2: largest "
            "|Δ advantage| 3 σ; 12 samples end in a masked tail, where the old advantages kept 0.5 of the terminal "
            "reward on average.",
        ),
        (
            ({}, {"mean_terminal_credit": 0.0, "zero_credit_samples": 12}),
            "Of 92 samples, 72 changed against p0, 72 against p1; the most against p0: largest |Δ advantage| 1.67 σ; "
            "12 samples end in a masked tail, where the old advantages kept 0.5 of the terminal reward on average.",
        ),
        (
            ({"changed_samples": 0}, {"changed_samples": 0}),
            "No sample changed against any of the 2 comparisons (of 92, tol 1e-06).",
        ),
    ],
)
def test_the_verdict_of_several_comparisons(figures, expected):
    assert verdict(many(*figures)) == expected


def test_markdown_opens_with_the_verdict_and_nests_sub_rows(report):
    document = report.to_dict()
    text = render_markdown(document)
    assert text.splitlines()[:3] == ["# gae diff", "", f"**{verdict(document)}**"]
    labels = [line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ")]
    assert not [label for label in labels if label.startswith(" ")]
    nested = [label for label in labels if label.startswith("↳ ")]
    expected = [label.strip() for label, _ in summary_rows(document) if label.startswith("  ")]
    assert [label[2:] for label in nested] == expected and len(expected) >= 3


def test_html_opens_with_the_verdict_nests_sub_rows_and_plots_new_minus_old(report):
    pytest.importorskip("matplotlib")
    from gaecli.report.html import render_html

    document = report.to_dict()
    page = render_html(report)
    body = page[page.index("<body>") :]
    first = re.findall(r"<(h1|p|h2)[^>]*>(.*?)</\1>", body)[:2]
    assert first[0] == ("h1", "gae diff") and first[1][1] == verdict(document)
    sub_cells = re.findall(r'<td class="text sub1">(.*?)</td>', page)
    expected = [label.strip() for label, _ in summary_rows(document) if label.startswith("  ")]
    assert [cell.replace("&amp;", "&") for cell in sub_cells] == expected
    assert 'alt="per-token new minus old advantage of the top samples, masked spans shaded"' in page


def test_token_delta_is_new_minus_old_at_trainable_tokens():
    pytest.importorskip("matplotlib")
    from gaecli.report.html import token_delta

    entry = SimpleNamespace(
        new=np.array([1.0, 2.0, 3.0, 4.0], np.float32),
        old=np.array([0.5, 9.0, 1.0, 4.5], np.float32),
        trainable=np.array([True, False, True, True]),
    )
    delta = token_delta(entry)
    assert delta.dtype == np.float64
    assert delta[0] == 0.5 and np.isnan(delta[1]) and delta[2] == 2.0 and delta[3] == -0.5
