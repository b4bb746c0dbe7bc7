"""What the diff reports show a person: the verdict sentence on top of the terminal,
Markdown and HTML reports; sub-rows nested (not leading spaces) in Markdown and HTML; at 80
columns a top-samples table that keeps file names told apart and every row number, and
summary labels on one line; the HTML's per-token plot of new − old."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

from gaecli.diff import DiffOptions, diff_files
from gaecli.report import nesting, summary_rows, verdict
from gaecli.report.markdown import render_markdown
from gaecli.report.terminal import shortened_left, shortened_names

from rollout_files import random_rollouts, rollout_table, write_table


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
            "advantages kept 0.50 of the terminal reward on average.",
        ),
        (
            {"zero_credit_samples": 3, "mean_terminal_credit": 0.25},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages kept 0.25 of the terminal reward on average (3 kept none of it).",
        ),
        (
            {"zero_credit_samples": 12, "mean_terminal_credit": 0.0},
            "72 of 92 samples changed; largest |Δ advantage| 1.67 σ; 12 samples end in a masked tail, where the old "
            "advantages lost the terminal reward.",
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


def test_terminal_at_80_columns_keeps_files_rows_and_labels(report):
    document = report.to_dict()
    text = terminal_text(document)
    lines = text.splitlines()
    assert max(len(line) for line in lines[1:]) <= 80  # the headline (soft-wrapped) aside
    assert lines[1].startswith(verdict(document)[:40])  # the verdict right under the headline
    for label, _ in summary_rows(document):
        assert any(label.strip() in line for line in lines), label  # each label whole, on one line
    top = text[text.index("top samples") :]
    rows = [line for line in top.splitlines() if re.match(r"│\s+\d+ │", line)]
    assert len(rows) == len(document["top_samples"])
    for line, entry in zip(rows, document["top_samples"]):
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        step = re.search(r"global_step_(\d{4})", entry["file"]).group(1)
        assert step in cells[1], (cells[1], entry["file"])  # the file told apart
        assert cells[2] == str(entry["row"])  # the row number, whole
    assert all(entry["id"] in top for entry in document["top_samples"])  # each id under its file


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
