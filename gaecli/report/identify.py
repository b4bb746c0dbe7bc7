"""The terminal report of ``gae identify``: the verdict, the ranked candidates as a table, what
the column holds at masked positions, and the notes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

HOLDS = {
    "none": "no masked token",
    "zeros": "zeros",
    "carry": "the best candidate's own values (the trainer's carry)",
    "values": "values that are neither zeros nor the best candidate's",
}


NORMALIZATION_WORDS = {"trainable": "batch", "response": "response", None: "batch, fit"}
"""A batch whitening in the table: over the trainable tokens read, over every token read, or a
fitted mean and std (not the rows' own)."""


def _parameter(value) -> str:
    return "—" if value is None else f"{value:.4g}"


def _normalization(candidate: dict) -> str:
    if candidate["normalization"] != "batch":
        return candidate["normalization"]
    return NORMALIZATION_WORDS[(candidate.get("whitening") or {}).get("over")]


def _share(candidate: dict) -> str:
    from gaecli.identify.report import share_words

    return share_words(candidate["share_reproduced"])


def render_identify(document: dict, console: Console) -> None:
    """``document`` (:meth:`gaecli.identify.IdentifyReport.to_dict`) on ``console``: the
    candidates' share of samples reproduced and max |Δ| (the RMS is in the JSON)."""
    read = f"{document['rows_read']:,} of {document['input_rows']:,} rows"
    console.print(f"[bold]gae identify[/] {escape(document['column'])!s}: {read} read", soft_wrap=True)
    style = "green" if document["explained"] else "yellow"
    console.print(f"[{style}]{escape(document['verdict'])}[/]", soft_wrap=True)
    table = Table(show_edge=False, pad_edge=False)
    for name, justify in (
        ("#", "right"),
        ("candidate", "left"),
        ("γ", "right"),
        ("λ", "right"),
        ("whitening", "left"),
        ("reproduced", "right"),
        ("max |Δ|", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=name != "candidate", overflow="fold")
    for rank, candidate in enumerate(document["candidates"], 1):
        table.add_row(
            str(rank),
            escape(candidate["name"]),
            _parameter(candidate["gamma"]),
            _parameter(candidate["lambd"]),
            _normalization(candidate),
            _share(candidate),
            f"{candidate['max_abs_residual']:.1e}",
        )
    console.print(table)
    masked = document["masked_positions"]
    if masked["tokens"]:
        console.print(
            f"at {masked['tokens']:,} masked positions the column holds {HOLDS[masked['holds']]}"
            f" ({masked['rows_nonzero']:,} rows non-zero there)",
            soft_wrap=True,
        )
    for note in document["notes"]:
        console.print(f"[dim]note: {escape(note)}[/]", soft_wrap=True)
