"""``gae diff`` on the terminal: the summary, the top samples and the groups as rich
tables (the CLI prints them on stderr)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gaecli.report import comparison_title, comparisons, groups_note, headline, number, percent, summary_table


def sample_label(entry: dict) -> str:
    """``file-name:row`` and the id when there is one (the full path is in the other reports)."""
    label = f"{Path(entry['file']).name}:{entry['row']}"
    return label if entry["id"] is None else f"{label} {entry['id']}"


def render_diff(document: dict, console: Console) -> None:
    """Headline, summary table (one column per comparison), then per comparison its top
    samples and the groups hit hardest."""
    console.print(f"[bold]gae diff[/]: {escape(headline(document))}", soft_wrap=True)
    headers, rows = summary_table(document)
    summary = Table(show_header=len(headers) > 2, title="over trainable tokens", title_justify="left")
    for position, header in enumerate(headers):
        summary.add_column(escape(header), justify="left" if position == 0 else "right")
    for row in rows:
        summary.add_row(*(escape(value) for value in row))
    console.print(summary)
    for comparison in comparisons(document):
        _render_comparison(document, comparison, console)
    if document["per_sample"]:
        console.print(f"per-sample figures → {escape(document['per_sample'])}", soft_wrap=True)


def _render_comparison(document: dict, comparison: dict, console: Console) -> None:
    """One comparison's top samples and groups."""
    title = escape(comparison_title(document, comparison))
    if comparison["top_samples"]:
        table = Table(title=f"top samples by max |Δ advantage|{title}", title_justify="left")
        for header in ("#", "sample", "length", "masked", "tail", "max |Δ|", "flips", "credit"):
            table.add_column(header, justify="left" if header == "sample" else "right")
        for rank, entry in enumerate(comparison["top_samples"], start=1):
            table.add_row(
                str(rank),
                escape(sample_label(entry)),
                f"{entry['length']:,}",
                percent(entry["masked_share"]),
                f"{entry['masked_tail']:,}",
                number(entry["max_abs_delta_advantage"]),
                f"{entry['sign_flips']:,}",
                number(entry["terminal_credit"]),
            )
        console.print(table)
    if comparison["groups"]:
        table = Table(title=f"by {escape(document['group_by'])}{title}", title_justify="left")
        for header in ("key", "samples", "changed", "tails", "credit", "mean |Δ|", "max |Δ|", "corr"):
            table.add_column(header, justify="left" if header == "key" else "right")
        for group in comparison["groups"]:
            table.add_row(
                escape(str(group["key"])),
                f"{group['samples']:,}",
                percent(group["changed_share"]),
                f"{group['masked_tail_samples']:,}",
                number(group["mean_terminal_credit"]),
                number(group["mean_abs_delta_advantage"]),
                number(group["max_abs_delta_advantage"]),
                number(group["correlation"]),
            )
        console.print(table)
        console.print(f"[dim]{escape(groups_note(document))}[/]", soft_wrap=True)
