"""Human rendering of ``gae inspect`` for the terminal (rich): per file its footer's figures,
its schema with the role of each column read, what can be computed and whether a diff against
stored advantages is possible. Nothing here computes."""

from __future__ import annotations

import json
import re

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from gaecli.report import displayed

SAME_AS_ABOVE = ("schema", "read", "estimators", "variants", "diff", "candidates")
"""The parts of a file's entry that, when equal to the file above's, are not shown again."""


HAVE = re.compile(r" \(have: [^)]*\)")
RULE_CODE = re.compile(r" \[[a-z-]+\]$")
REPEATED_COLUMN = re.compile(r"^column '([^']*)': (?=column '\1')")


def _line(console: Console, text: str, indent: int = 2) -> None:
    """One line of a file's entry, ``indent`` columns in (its wrapped lines too)."""
    console.print(Padding(text, (0, 0, 0, indent), expand=False))


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _tokens(tokens: dict) -> str:
    if tokens["tokens"] is not None:
        return f"{tokens['tokens']:,} tokens ({tokens['column']})"
    if tokens["levels"] is not None:
        return f"at most {tokens['levels']:,} tokens ({tokens['column']}: the footer has no statistics)"
    return f"tokens unknown (no list column {tokens['column']!r})"


def _reason(entry: dict, file: str) -> str:
    """Why an estimator or variant cannot be computed, without the file's name and the
    estimator's own name (which the line shows already)."""
    reason = entry["reason"] or ""
    for prefix in (f"{file}, ", f"{file}: "):
        if reason.startswith(prefix):
            reason = reason[len(prefix) :]
    if "estimator" in entry:
        reason = reason.replace(f"--estimator {entry['estimator']} ", "")
    # the schema is listed above the reasons: not again in each, nor the rule's code
    return REPEATED_COLUMN.sub("", RULE_CODE.sub("", HAVE.sub("", reason)))


def _schema_table(entry: dict) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    table.add_column("column", overflow="fold")
    table.add_column("type", overflow="fold")
    table.add_column("read as", overflow="fold")
    for column in entry["schema"]:
        role = column["read_as"]
        table.add_row(escape(column["column"]), escape(column["type"]), escape(role or "–"))
    return table


def _read_line(entry: dict, estimator: str) -> str:
    names = []
    for column in entry["read"]:
        name = column["column"] if column["role"] == column["column"] else f"{column['column']} ({column['role']})"
        names.append(escape(name) if column["present"] else f"[bold red]{escape(name)} missing[/]")
    return f"[bold]reads for {escape(estimator)}[/]: {', '.join(names)}"


def _computable(entry: dict, file: str, console: Console) -> None:
    """The estimators and variants the file allows, those it does not (grouped by reason) and the id columns."""
    possible = [e["estimator"] for e in entry["estimators"] if e["ok"]]
    _line(console, f"[bold green]can compute[/]: {escape(', '.join(possible)) if possible else 'none'}")
    by_reason: dict[str, list[str]] = {}
    for e in entry["estimators"]:
        if not e["ok"]:
            by_reason.setdefault(_reason(e, file), []).append(e["estimator"])
    for reason, names in by_reason.items():
        _line(console, f"[yellow]not[/] {escape(', '.join(names))}: {escape(reason)}", 4)
    gae = next(e for e in entry["estimators"] if e["estimator"] == "gae")
    variants = [v["variant"] for v in entry["variants"] if v["ok"]]
    without_gae = "" if gae["ok"] else " (gae cannot be computed)"
    _line(console, f"[bold]GAE variants[/]: {escape(', '.join(variants)) if variants else 'none'}{without_gae}")
    for v in entry["variants"]:
        if not v["ok"] and v["reason"] != gae["reason"]:
            _line(console, f"[yellow]not[/] {escape(v['variant'])}: {escape(_reason(v, file))}", 4)
    for flag, names in entry["candidates"].items():
        _line(console, f"[bold]columns that may serve {flag}[/]: {escape(', '.join(names))}")


def _diff_line(entry: dict, file: str) -> str:
    diff = entry["diff"]
    if diff["possible"]:
        return f"[bold]diff against stored advantages[/]: possible ({escape(', '.join(diff['columns']))})"
    if diff["columns"]:
        why = f"the estimator cannot be computed: {_reason({'reason': diff['new_side']}, file)}"
    else:
        why = diff["reason"]
    return f"[bold]diff against stored advantages[/]: not possible ({escape(why)})"


def render_inspect(report: dict, console: Console) -> None:
    """``report`` (:meth:`gaecli.inspection.InspectReport.to_dict`) file by file: the footer's
    rows, row groups and tokens; the schema with what each column is read as; the columns read
    for the estimator (missing ones in red); the estimators and variants it allows and why the
    others are not; candidate id columns; whether a diff against stored advantages is possible.
    A file whose schema and findings equal the file above's shows only its figures."""
    report = displayed(report)
    files = [f for f in report["files"] if f["status"] == "ok"]
    rows = sum(f["rows"] for f in files)
    tokens = [f["tokens"]["tokens"] for f in files]
    counted = f" · {sum(tokens):,} tokens" if files and None not in tokens else ""
    unreadable = len(report["unreadable"])
    console.print(
        f"[bold]gae inspect[/]: {_plural(len(files), 'file')}{f' ({unreadable:,} unreadable)' if unreadable else ''}"
        f" · {_plural(rows, 'row')}{counted} · estimator {escape(report['estimator'])}",
    )
    previous = None
    for entry in files:
        file = entry["file"]
        console.print()
        console.print(f"[bold]{escape(file)}[/]")
        _line(
            console,
            f"{_plural(entry['rows'], 'row')} in {_plural(entry['row_groups'], 'row group')} · "
            f"{escape(_tokens(entry['tokens']))}",
        )
        shown = json.dumps({key: entry[key] for key in SAME_AS_ABOVE}).replace(json.dumps(file)[1:-1], "")
        if shown == previous:
            _line(console, "schema and what it allows: as the file above")
            continue
        previous = shown
        console.print(Padding(_schema_table(entry), (0, 0, 0, 2), expand=False))
        _line(console, _read_line(entry, report["estimator"]))
        _computable(entry, file, console)
        _line(console, _diff_line(entry, file))
    for item in report["unreadable"]:
        console.print(f"[bold red]error:[/] {escape(item['message'])}", soft_wrap=True)  # one line each
