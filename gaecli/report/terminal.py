"""``gae diff`` on the terminal: the summary, the top samples and the groups as rich
tables (the CLI prints them on stderr)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gaecli.report import (
    comparison_title,
    comparisons,
    displayed,
    group_table,
    groups_note,
    headline,
    nesting,
    number,
    percent,
    summary_table,
    verdict,
)

ELLIPSIS = "…"
MIN_FILE_WIDTH = 12
"""The file column of the top samples is never narrowed below this many characters."""


def shortened_left(text: str, width: int) -> str:
    """``text`` cut from the left to ``width`` characters, ``…`` first: the end of a file
    name (what tells files apart: ``…_0001.parquet``) stays."""
    return text if len(text) <= width else ELLIPSIS + text[len(text) - width + 1 :]


def shortened_names(names: list[str], width: int) -> list[str]:
    """``names`` in at most ``width`` characters each, still told apart: cut from the left
    (:func:`shortened_left`), or, where that leaves names that differed the same (they
    differ before a long common end: ``step_0001_rank_07.parquet``), from a little before
    the first character where they differ, ``…`` at both ends."""
    cut = [shortened_left(name, width) for name in names]
    if len(set(cut)) == len(set(names)):
        return cut
    start = max(len(os.path.commonprefix(names)) - 4, 0)

    def middle(name: str) -> str:
        if len(name) <= width:
            return name
        head = ELLIPSIS if start else ""
        piece = name[start:]
        return head + piece if len(head + piece) <= width else head + piece[: width - len(head) - 1] + ELLIPSIS

    return [middle(name) for name in names]


def file_width(rows: list[list[str]], file_column: int, console_width: int) -> int:
    """The width left for the file column of a table of ``rows`` on a console this wide:
    every other column keeps its widest cell; at least :data:`MIN_FILE_WIDTH`."""
    others = sum(max(len(row[i]) for row in rows) + 3 for i in range(len(rows[0])) if i != file_column)
    return max(console_width - others - 4, MIN_FILE_WIDTH)  # 3 a column: 2 of padding, 1 of border


def render_diff(document: dict, console: Console) -> None:
    """Headline, the verdict, the summary table (one column per comparison), then per
    comparison its top samples and the groups hit hardest."""
    document = displayed(document)
    console.print(f"[bold]gae diff[/]: {escape(headline(document))}", soft_wrap=True)
    console.print(f"[bold]{escape(verdict(document))}[/]")
    headers, rows = summary_table(document)
    summary = Table(show_header=len(headers) > 2, title="over trainable tokens", title_justify="left")
    for position, header in enumerate(headers):
        if position == 0:
            summary.add_column(escape(header), no_wrap=True)
        else:
            summary.add_column(escape(header), justify="right")
    for row in rows:
        level, label = nesting(row[0])
        summary.add_row(escape("  " * level + label), *(escape(value) for value in row[1:]))
    console.print(summary)
    for comparison in comparisons(document):
        _render_comparison(document, comparison, console)
    if document["per_sample"]:
        console.print(f"per-sample figures → {escape(document['per_sample'])}", soft_wrap=True)


def _render_comparison(document: dict, comparison: dict, console: Console) -> None:
    """One comparison's top samples (file names shortened to fit, the row in its own
    column, the id under the file) and its groups."""
    title = escape(comparison_title(document, comparison))
    entries = comparison["top_samples"]
    if entries:
        table = Table(title=f"top samples by max |Δ advantage|{title}", title_justify="left")
        with_id = any(entry["id"] is not None for entry in entries)
        headers = ("#", "file · id" if with_id else "file", "row", "length", "masked", "tail", "max |Δ|", "flips")
        headers += ("credit",)
        for header in headers:
            table.add_column(header, justify="left" if header.startswith("file") else "right", no_wrap=True)
        rows = []
        for rank, entry in enumerate(entries, start=1):
            rows.append(
                [
                    str(rank),
                    Path(entry["file"]).name,  # the full path is in the other reports
                    str(entry["row"]),
                    f"{entry['length']:,}",
                    percent(entry["masked_share"]),
                    f"{entry['masked_tail']:,}",
                    number(entry["max_abs_delta_advantage"]),
                    f"{entry['sign_flips']:,}",
                    number(entry["terminal_credit"]),
                ]
            )
        width = file_width([list(headers), *rows], 1, console.width)
        ids = [entry["id"] for entry in entries]
        ids = shortened_names(["" if sample_id is None else str(sample_id) for sample_id in ids], width)
        for cells, name, sample_id in zip(rows, shortened_names([row[1] for row in rows], width), ids):
            file_cell = name + (f"\n{sample_id}" if sample_id else "")  # the id under its file
            table.add_row(*(escape(file_cell if i == 1 else cell) for i, cell in enumerate(cells)))
        console.print(table)
    if comparison["groups"]:
        table = Table(title=f"by {escape(document['group_by'])}{title}", title_justify="left")
        for header in ("key", "samples", "changed", "tails", "credit", "mean |Δ|", "max |Δ|", "corr"):
            table.add_column(header, justify="left" if header == "key" else "right")
        for cells in group_table(document, comparison)[1]:  # all but mean |Δ ret| and sign flips
            table.add_row(*(escape(cells[column]) for column in (0, 1, 2, 3, 4, 5, 6, 9)))
        console.print(table)
        console.print(f"[dim]{escape(groups_note(document))}[/]", soft_wrap=True)
