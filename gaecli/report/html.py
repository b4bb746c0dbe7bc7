"""``gae diff --html``: one self-contained HTML file — the tables, and plots drawn with
matplotlib (the optional ``plot`` extra, Agg canvas, no pyplot state) embedded as base64
PNG: the Δ advantage histogram, old vs new advantages on a token sample, the figures per
group, and new − old along the response of the top samples with their masked spans shaded.
The page opens with the verdict sentence.
Nothing in the file points outside it."""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Optional

import numpy as np

from gaecli.display import display
from gaecli.errors import GAEUsageError
from gaecli.report import (
    comparison_title,
    displayed,
    files_note,
    group_table,
    groups_note,
    headline,
    nesting,
    skipped_note,
    summary_table,
    top_table,
    verdict,
)

if TYPE_CHECKING:
    from gaecli.diff.report import ComparisonResult, DiffReport

INSTALL_HINT = "pip install 'gaecli[plot]'"
SCATTER_POINTS = 5_000
TRACES = 10
DPI = 100
NEW_COLOR, OLD_COLOR, MASK_COLOR = "#1f77b4", "#d62728", "#bbbbbb"
DIRECTIONS = ((1, NEW_COLOR, "new > old"), (-1, OLD_COLOR, "new < old"))
"""The sign of new − old, its colour and its legend label, for the plots that split them."""

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; line-height: 1.4; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5rem 0; }
.note { color: #666; font-size: 0.85rem; }
.verdict { font-size: 1.15rem; font-weight: 600; }
td.sub1 { padding-left: 1.8rem; color: #444; } td.sub2 { padding-left: 3.2rem; color: #444; }
"""


def require_matplotlib() -> None:
    """Raise :class:`GAEUsageError` (exit 2) saying how to install matplotlib when it is
    missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise GAEUsageError(
            f"--html draws its plots with matplotlib, which is not installed: {INSTALL_HINT}"
        ) from error


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _one_axes(width: float, height: float, nothing: Optional[str]):
    """A figure and its one axes; with ``nothing`` (a text saying there is nothing to plot),
    bare axes with that text in their middle."""
    figure = _figure(width, height)
    axes = figure.add_subplot()
    if nothing is not None:
        axes.text(0.5, 0.5, nothing, ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
    return figure, axes


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(figure, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(figure)}">'


def histogram_plot(report: "DiffReport | ComparisonResult") -> str:
    """|Δ advantage| on a log axis, tokens where new > old and where new < old apart."""
    values, counts = report.histogram.signed_bins()
    zeros = int(report.histogram.counts[report.histogram.bins])
    figure, axes = _one_axes(9, 3.6, "no trainable token differs" if values.size == 0 else None)
    if values.size:
        magnitudes = np.abs(values)
        low, high = magnitudes.min() / 1.01, magnitudes.max() * 1.01
        edges = np.geomspace(low, high, 61) if high > low * 1.05 else np.geomspace(low / 2, high * 2, 11)
        for sign, color, label in DIRECTIONS:
            kept = np.sign(values) == sign
            if kept.any():
                axes.hist(
                    magnitudes[kept],
                    bins=edges,
                    weights=counts[kept],
                    histtype="step",
                    linewidth=1.6,
                    color=color,
                    label=f"{label} ({int(counts[kept].sum()):,} tokens)",
                )
        axes.set_xscale("log")
        axes.set_xlabel("|Δ advantage| = |new − old|")
        axes.set_ylabel("trainable tokens")
        axes.legend(loc="upper left", frameon=False)
    axes.set_title(
        f"Δ advantage over trainable tokens ({zeros:,} tokens with |Δ| ≤ {report.histogram.zero:g} not shown)",
        fontsize=10,
    )
    return _img(figure, "histogram of the advantage differences")


def scatter_plot(report: "DiffReport | ComparisonResult") -> str:
    """Old against new advantages on the uniform token sample (at most SCATTER_POINTS)."""
    new, old = report.scatter
    new, old = new[:SCATTER_POINTS], old[:SCATTER_POINTS]
    figure, axes = _one_axes(5.5, 5.2, "no trainable token" if new.size == 0 else None)
    if new.size:
        axes.scatter(old, new, s=4, alpha=0.35, color=NEW_COLOR, linewidths=0)
        low, high = float(min(old.min(), new.min())), float(max(old.max(), new.max()))
        axes.plot([low, high], [low, high], linestyle="--", color="#555", linewidth=1, label="new = old")
        axes.set_xlabel("old advantage")
        axes.set_ylabel("new advantage (masked GAE)")
        axes.legend(loc="upper left", frameon=False)
    axes.set_title(f"old vs new, {new.size:,} trainable tokens sampled uniformly", fontsize=10)
    return _img(figure, "scatter of old against new advantages")


def group_plot(document: dict, comparison: Optional[dict] = None) -> str:
    """Mean |Δ advantage| and the share of changed samples of the groups hit hardest of
    ``comparison`` (default: the first; largest max |Δ advantage| first), as bars."""
    groups = (comparison or document)["groups"]
    keys = [str(group["key"]) for group in groups]
    mean_delta = [group["mean_abs_delta_advantage"] for group in groups]
    changed = [100.0 * (group["changed_share"] or 0.0) for group in groups]
    figure = _figure(10, 4.2)
    top, bottom = figure.subplots(2, 1, sharex=True)
    positions = np.arange(len(groups))
    top.bar(positions, mean_delta, color=NEW_COLOR)
    bottom.bar(positions, changed, color=OLD_COLOR)
    bottom.set_xticks(positions, keys, rotation=90 if len(groups) > 12 else 0, fontsize=8)
    top.set_ylabel("mean |Δ advantage|")
    bottom.set_ylabel("samples changed (%)")
    top.set_title(f"by {document['group_by']}", fontsize=10)
    return _img(figure, f"figures per {document['group_by']}")


def token_delta(entry) -> np.ndarray:
    """new − old advantage of a top sample at each response token (float64), NaN at masked
    tokens (not trained on: nothing to compare)."""
    return np.where(entry.trainable, np.asarray(entry.new, np.float64) - np.asarray(entry.old, np.float64), np.nan)


def delta_trace_plot(report: "DiffReport | ComparisonResult") -> str:
    """Per-token new − old advantage of the first TRACES top samples along the response, at
    their trainable tokens (what was trained on), masked spans shaded: where the old
    advantages went wrong (before observation blocks, over masked tails) stands out."""
    entries = report.top[:TRACES]
    figure = _figure(10, 1.9 * len(entries) + 0.5)
    for axes, entry in zip(np.atleast_1d(figure.subplots(len(entries), 1)), entries):
        positions = np.arange(entry.new.size)
        delta = token_delta(entry)
        axes.fill_between(
            positions,
            0,
            1,
            where=~entry.trainable,
            step="mid",
            color=MASK_COLOR,
            alpha=0.5,
            transform=axes.get_xaxis_transform(),
            linewidth=0,
            label="masked",
        )
        axes.axhline(0.0, color="#555", linewidth=0.8)
        for sign, color, label in DIRECTIONS:
            part = np.where(np.sign(delta) == sign, delta, 0.0)
            axes.fill_between(positions, 0, part, step="mid", color=color, alpha=0.35, linewidth=0, label=label)
        axes.step(positions, delta, where="mid", color="#222", linewidth=0.9, label="new − old")
        label = display(f"{entry.file} row {entry.row}" + (f" · id {entry.id}" if entry.id is not None else ""))
        axes.set_title(f"{label} · max |Δ| {entry.max_abs_delta_advantage:.4g}", fontsize=9, loc="left")
        axes.set_xlim(-0.5, max(entry.new.size - 0.5, 0.5))
        axes.set_ylabel("Δ advantage", fontsize=8)
    figure.axes[0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, ncols=4)
    figure.axes[-1].set_xlabel("response token")
    return _img(figure, "per-token new minus old advantage of the top samples, masked spans shaded")


def _summary_table(headers: list[str], rows: list[list[str]]) -> str:
    """The summary table (one value column per comparison), a row that details the one above
    it in a nested cell."""
    body = []
    for label, *values in rows:
        level, text = nesting(label)
        label_class = f"text sub{level}" if level else "text"
        cells = "".join(f"<td>{html.escape(value)}</td>" for value in values)
        body.append(f'<tr><td class="{label_class}">{html.escape(text)}</td>{cells}</tr>')
    head_cells = "".join(f"<th>{html.escape(header)}</th>" for header in headers[1:])
    head = f'<thead><tr><th class="text">{html.escape(headers[0])}</th>{head_cells}</tr></thead>'
    return f"<table>{head}<tbody>{''.join(body)}</tbody></table>"


def _table(headers: list[str], rows: list[list[str]], text_columns: set[int]) -> str:
    text_class = ' class="text"'

    def cells(values, tag):
        return "".join(
            f"<{tag}{text_class if i in text_columns else ''}>{html.escape(str(value))}</{tag}>"
            for i, value in enumerate(values)
        )

    body = "".join(f"<tr>{cells(row, 'td')}</tr>" for row in rows)
    return f"<table><thead><tr>{cells(headers, 'th')}</tr></thead><tbody>{body}</tbody></table>"


def _comparison_parts(document: dict, result: "ComparisonResult", comparison: dict) -> list[str]:
    """One comparison's plots and tables: the histogram and the scatter, the groups, the top
    samples and their traces (headed by the comparison's name when there are several)."""
    title = comparison_title(document, comparison)
    parts = []
    if title:
        parts.append(f"<h2>{html.escape(title.removeprefix(' — ').capitalize())}</h2>")
    parts += [histogram_plot(result), scatter_plot(result)]
    if comparison["groups"] is not None:
        headers, rows = group_table(document, comparison)
        parts += [
            f"<h2>By {html.escape(document['group_by'])}{html.escape(title)}</h2>",
            group_plot(document, comparison),
            _table(headers, rows, {0}),
            f'<p class="note">{html.escape(groups_note(document))}</p>',
        ]
    headers, rows = top_table(document, comparison)
    parts.append(f"<h2>Top samples by max |Δ advantage|{html.escape(title)}</h2>")
    if rows:
        parts += [_table(headers, rows, {1, 3, 4} if document["group_by"] else {1, 3}), delta_trace_plot(result)]
        if len(result.top) > TRACES:
            parts.append(f'<p class="note">Traces of the first {TRACES} samples.</p>')
    else:
        parts.append("<p>No sample differs.</p>")
    return parts


def render_html(report: "DiffReport") -> str:
    """The whole report as one HTML document (str)."""
    require_matplotlib()
    document = displayed(report.to_dict())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>gae diff</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        "<h1>gae diff</h1>",
        f'<p class="verdict">{html.escape(verdict(document))}</p>',
        f"<p>{html.escape(headline(document))}</p>",
        *([f'<p class="note">{html.escape(skipped_note(document))}</p>'] if skipped_note(document) else []),
        "<h2>Summary (trainable tokens only)</h2>",
        _summary_table(*summary_table(document)),
    ]
    for result, comparison in zip(report.comparisons, document["comparisons"], strict=True):
        parts += _comparison_parts(document, result, comparison)
    parts += [
        f'<p class="note">{html.escape(files_note(document))}</p>',
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)
