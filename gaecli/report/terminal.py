"""``gae diff`` on the terminal: the summary, the top samples and the groups as rich
tables (the CLI prints them on stderr)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from gaecli.report import (
    comparison_rows,
    comparison_title,
    comparisons,
    displayed,
    group_table,
    groups_note,
    headline,
    nesting,
    number,
    percent,
    skipped_note,
    summary_table,
    verdict,
    with_credit,
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


COLUMN_GAP = 2
"""Spaces between two columns of a terminal table (:func:`report_table`)."""


def report_table(**options) -> Table:
    """A table of the terminal report: a rule under the header, no edges, columns
    :data:`COLUMN_GAP` spaces apart, so that figures keep their digits at 80 columns."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, **options)


def print_table(console: Console, title: str, table: Table) -> None:
    """``table`` under its ``title`` (rich markup), a line of its own that is never wrapped
    to the table's width."""
    console.print(f"[italic]{title}[/]", soft_wrap=True)
    console.print(table)


def file_width(rows: list[list[str]], file_column: int, console_width: int) -> int:
    """The width left for the file column of a table of ``rows`` on a console this wide:
    every other column keeps its widest cell; at least :data:`MIN_FILE_WIDTH`."""
    others = sum(max(len(row[i]) for row in rows) + COLUMN_GAP for i in range(len(rows[0])) if i != file_column)
    return max(console_width - others, MIN_FILE_WIDTH)


def natural_width(console: Console, table: Table) -> int:
    """The width ``table`` takes when nothing in it wraps or is cut."""
    return Measurement.get(console, console.options.update_width(1_000_000), table).maximum


INPUT_KEYS = ("samples", "tokens", "tails", "tail_length", "new_lost", "fully_masked", "empty")
"""The summary rows that describe the samples and the new side: the same against every old
side, shown once when the comparisons are rows."""

COMPARISON_TABLES = (
    ("changed", ("changed", "changed_tokens", "flips", "correlation")),
    (None, ("advantage",)),
    (None, ("advantage_std",)),
    (None, ("return",)),
    (None, ("return_std",)),
    ("the old side's terminal reward", ("credit", "zero_credit", "lost")),
)
"""The tables of the comparisons-as-rows layout: a title (None: the row's own) and the
summary rows whose figures are its columns. Rows named nowhere here go to a last table."""


def side_by_side(document: dict) -> Table:
    """The summary table, one column per comparison (:func:`gaecli.report.summary_table`)."""
    headers, rows = summary_table(document)
    summary = report_table(show_header=len(headers) > 2)
    for position, header in enumerate(headers):
        summary.add_column(escape(header), justify="left" if position == 0 else "right", no_wrap=True)
    for row in rows:
        level, label = nesting(row[0])
        summary.add_row(escape("  " * level + label), *(escape(value) for value in row[1:]))
    return summary


def comparisons_as_rows(document: dict) -> list[tuple[str, Table]]:
    """The summary as tables that fit a narrow terminal: the rows the same against every old
    side once (figure, value), then for each group of :data:`COMPARISON_TABLES` a table with
    one row per comparison and one column per figure (each row's ``parts``); a figure a
    comparison lacks is "—"."""
    listed = [(name, {row.key: row for row in rows}) for name, rows in comparison_rows(document)]
    first = listed[0][1]
    shared = [key for key in INPUT_KEYS if key in first and all(rows.get(key) == first[key] for _, rows in listed)]
    tables = []
    if shared:
        samples = report_table()
        samples.add_column("figure", no_wrap=True)
        samples.add_column("value", justify="right", no_wrap=True)
        for key in shared:
            level, label = nesting(first[key].label)
            samples.add_row(escape("  " * level + label), escape(first[key].value))
        tables.append(("the samples" + (", against every old side" if len(listed) > 1 else ""), samples))
    grouped = [*shared, *(key for _, keys in COMPARISON_TABLES for key in keys)]
    seen = dict.fromkeys(key for _, rows in listed for key in rows)
    others = ("other figures", tuple(key for key in seen if key not in grouped))
    for title, keys in (*COMPARISON_TABLES, others):
        present = [key for key in keys if key in seen]
        if present:
            tables.append(_rows_table(title, present, listed))
    return tables


def _rows_table(title: Optional[str], keys: list[str], listed: list[tuple[str, dict]]) -> tuple[str, Table]:
    """One table of :func:`comparisons_as_rows`: a row per comparison, the parts of ``keys``'
    rows as columns (their headers from the first comparison that has each row)."""
    models = {key: next(rows[key] for _, rows in listed if key in rows) for key in keys}
    table = report_table()
    table.add_column("against", no_wrap=True)
    for key in keys:
        for header, _ in models[key].parts:
            table.add_column(escape(header), justify="right", no_wrap=True)
    for name, rows in listed:
        cells = []
        for key in keys:
            parts = rows[key].parts if key in rows else (("", "—"),) * len(models[key].parts)
            cells += [text for _, text in parts]
        table.add_row(escape(name), *(escape(cell) for cell in cells))
    return escape(title or models[keys[0]].title), table


def render_diff(document: dict, console: Console) -> None:
    """Headline, the verdict, the summary (one column per comparison where that fits the
    console, else :func:`comparisons_as_rows`), then per comparison its top samples and
    the groups hit hardest."""
    document = displayed(document)
    console.print(f"[bold]gae diff[/]: {escape(headline(document))}", soft_wrap=True)
    console.print(f"[bold]{escape(verdict(document))}[/]")
    if skipped_note(document) is not None:
        console.print(f"[yellow]{escape(skipped_note(document))}[/]", soft_wrap=True)
    summary = side_by_side(document)
    if natural_width(console, summary) <= console.width:
        print_table(console, "over trainable tokens", summary)
    else:
        for title, table in comparisons_as_rows(document):
            print_table(console, title, table)
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
        table = report_table()
        with_id = any(entry["id"] is not None for entry in entries)
        headers = ("#", "file · id" if with_id else "file", "row", "length", "masked", "tail", "max |Δ|", "flips")
        credited = with_credit(comparison)
        headers += ("credit",) if credited else ()
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
                    *([number(entry["terminal_credit"])] if credited else []),
                ]
            )
        width = file_width([list(headers), *rows], 1, console.width)
        ids = [entry["id"] for entry in entries]
        ids = shortened_names(["" if sample_id is None else str(sample_id) for sample_id in ids], width)
        for cells, name, sample_id in zip(rows, shortened_names([row[1] for row in rows], width), ids):
            file_cell = name + (f"\n{sample_id}" if sample_id else "")  # the id under its file
            table.add_row(*(escape(file_cell if i == 1 else cell) for i, cell in enumerate(cells)))
        print_table(console, f"top samples by max |Δ advantage|{title}", table)
    if comparison["groups"]:
        table = report_table()
        columns = [0, 1, 2, 3, *([4] if comparison["summary"]["mean_terminal_credit"] is not None else []), 5, 6, 9]
        headers = dict(
            enumerate([document["group_by"], "samples", "changed", "tails", "credit", "mean |Δ|", "max |Δ|"])
        )
        for column in columns:  # all but mean |Δ ret| and sign flips; the credit where defined
            header = headers.get(column, "corr")
            table.add_column(escape(header), justify="left" if column == 0 else "right", no_wrap=column != 0)
        for cells in group_table(document, comparison)[1]:
            table.add_row(*(escape(cells[column]) for column in columns))
        print_table(console, f"by {escape(document['group_by'])}{title}", table)
        console.print(f"[dim]{escape(groups_note(document))}[/]", soft_wrap=True)
