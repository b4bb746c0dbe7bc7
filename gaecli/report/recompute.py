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


def files_line(report: dict) -> str:
    """The first line: rows written in how many files (how many of them skipped, with
    ``--skip-existing``: their outputs were whole already) and where they went."""
    files = report["files"]
    skipped = sum(1 for file in files if file.get("skipped"))
    written = [file["output"] for file in files if not file.get("skipped")]
    count = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    if not written:
        return f"nothing recomputed: {count}, {skipped} skipped (--skip-existing: each output was whole already)"
    if skipped:
        count += f", {skipped} skipped (--skip-existing: output whole already)"
    shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
    return f"{report['rows']:,} rows in {count} → {shown}"


def summary_title(report: dict) -> str:
    """What the summary compares: the new side against the old (``masked GAE against the
    unmasked baseline``), or that nothing was compared (a critic-free estimator without one
    of its trainer profiles as ``--baseline``)."""
    label, baseline = estimator_label(report), report["summary"]["baseline"]
    if baseline is not None:
        return f"{label} against the {baseline} baseline"
    return f"{label}: the samples (nothing compared)"


def nothing_compared_note(report: dict) -> str:
    """What to give to compare a critic-free estimator with something."""
    label = estimator_label(report)
    return f"--baseline PROFILE compares {label} with a trainer's (gae diff --list-baselines names them)."


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """The (figure, value) rows of the summary: only the figures that mean something for the
    sides compared (none of Δ without an old side, no terminal credit without a GAE baseline)."""
    samples = summary["samples"]
    rows = [
        ("samples", f"{samples:,}"),
        ("tokens (trainable)", f"{summary['tokens']:,} ({summary['trainable_tokens']:,})"),
    ]
    if summary["changed_samples"] is not None:
        rows.append((f"samples changed (tol {summary['tolerance']:g})", _share(summary["changed_samples"], samples)))
    rows.append(("samples with a masked tail", _share(summary["masked_tail_samples"], samples)))
    if summary["masked_tail_samples"]:
        tails = f"{_number(summary['mean_masked_tail_length'])} / {summary['longest_masked_tail']:,}"
        rows.append(("  mean / longest tail (tokens)", tails))
        if summary["mean_terminal_credit"] is not None:
            credit = f"{_number(summary['mean_terminal_credit'])} / {_number(summary['min_terminal_credit'])}"
            rows.append(("  terminal credit the old GAE gave (mean / min)", credit))
    rows.append(("fully masked samples", _share(summary["fully_masked_samples"], samples)))
    if summary["mean_abs_delta_advantage"] is not None:
        rows.append(("mean |Δ advantage| (trainable)", _number(summary["mean_abs_delta_advantage"])))
        rows.append(("max |Δ advantage| (trainable)", _number(summary["max_abs_delta_advantage"])))
    return rows


def render_recompute(report: dict, console: Console) -> None:
    """Summary of a recompute run: files, then the comparison against the baseline (the
    figures of the samples alone when nothing was compared; no table when every file was
    skipped)."""
    report = displayed(report)
    files = report["files"]
    console.print(f"[bold]gae recompute[/]: {escape(files_line(report))}", soft_wrap=True)
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
    if files and all(file.get("skipped") for file in files):
        return  # nothing read: no figures to show
    table = Table(title=escape(summary_title(report)), show_header=False, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, value in summary_rows(report["summary"]):
        table.add_row(escape(label), escape(value))
    console.print(table)
    if report["summary"]["baseline"] is None:
        console.print(f"[dim]{escape(nothing_compared_note(report))}[/]", soft_wrap=True)
