"""The terminal (rich) summary of ``gae recompute``, printed by the CLI on stderr. Nothing
here computes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gaecli.report import displayed, estimator_label, parameters_label


def _number(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    return f"{value:.4g}"


def _share(part: int, whole: int) -> str:
    return f"{part:,} ({100.0 * part / whole:.1f} %)" if whole else f"{part:,}"


def render_recompute(report: dict, console: Console) -> None:
    """Summary of a recompute run: files, then the comparison against the baseline."""
    report = displayed(report)
    summary = report["summary"]
    files = report["files"]
    written = ", ".join(f["output"] for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    console.print(
        f"[bold]gae recompute[/]: {report['rows']:,} rows in {len(files)} file{'s' if len(files) != 1 else ''} "
        f"→ {written}"
    )
    console.print(
        f"{estimator_label(report)}: {parameters_label(report)}, kernel {report['kernel']}, "
        f"normalize {report['normalize']}"
    )
    for file in files:
        if file.get("recomputed"):
            console.print(f"[yellow]{escape(file['file'])}: recomputed[/]: {escape(file['recomputed'])}")
    if report["rejected_rows"]:
        rejects = ", ".join(f["rejects_file"] for f in files if f["rejects_file"])
        console.print(f"[yellow]{report['rejected_rows']:,} invalid rows rejected[/] → {rejects}")
    table = Table(
        title=f"{estimator_label(report)} against the {summary['baseline']} baseline"
        if summary["baseline"] is not None
        else f"{estimator_label(report)} (no baseline computed)",
        show_header=False,
        title_justify="left",
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    samples = summary["samples"]
    table.add_row("samples", f"{samples:,}")
    table.add_row("tokens (trainable)", f"{summary['tokens']:,} ({summary['trainable_tokens']:,})")
    table.add_row(f"samples changed (tol {summary['tolerance']:g})", _share(summary["changed_samples"], samples))
    table.add_row("samples with a masked tail", _share(summary["masked_tail_samples"], samples))
    if summary["masked_tail_samples"]:
        table.add_row(
            "  mean / longest tail (tokens)",
            f"{_number(summary['mean_masked_tail_length'])} / {summary['longest_masked_tail']:,}",
        )
        table.add_row(
            "  terminal credit the old GAE gave (mean / min)",
            f"{_number(summary['mean_terminal_credit'])} / {_number(summary['min_terminal_credit'])}",
        )
    table.add_row("fully masked samples", _share(summary["fully_masked_samples"], samples))
    table.add_row("mean |Δ advantage| (trainable)", _number(summary["mean_abs_delta_advantage"]))
    table.add_row("max |Δ advantage| (trainable)", _number(summary["max_abs_delta_advantage"]))
    console.print(table)
