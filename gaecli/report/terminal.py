"""``gae diff`` on the terminal: the summary, the top samples and the groups as rich
tables (the CLI prints them on stderr)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gaecli.report import groups_note, headline, number, percent, summary_rows


def sample_label(entry: dict) -> str:
    """``file-name:row`` and the id when there is one (the full path is in the other reports)."""
    label = f"{Path(entry['file']).name}:{entry['row']}"
    return label if entry["id"] is None else f"{label} {entry['id']}"


def render_diff(document: dict, console: Console) -> None:
    """Headline, summary table, top samples, then the groups hit hardest (the document's)."""
    console.print(f"[bold]gae diff[/]: {escape(headline(document))}", soft_wrap=True)
    summary = Table(show_header=False, title="over trainable tokens", title_justify="left")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    for label, value in summary_rows(document):
        summary.add_row(escape(label), escape(value))
    console.print(summary)
    if document["top_samples"]:
        table = Table(title="top samples by max |Δ advantage|", title_justify="left")
        for header in ("#", "sample", "length", "masked", "tail", "max |Δ|", "flips", "credit"):
            table.add_column(header, justify="left" if header == "sample" else "right")
        for rank, entry in enumerate(document["top_samples"], start=1):
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
    if document["groups"]:
        table = Table(title=f"by {escape(document['group_by'])}", title_justify="left")
        for header in ("key", "samples", "changed", "tails", "credit", "mean |Δ|", "max |Δ|", "corr"):
            table.add_column(header, justify="left" if header == "key" else "right")
        for group in document["groups"]:
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
    if document["per_sample"]:
        console.print(f"per-sample figures → {escape(document['per_sample'])}", soft_wrap=True)
