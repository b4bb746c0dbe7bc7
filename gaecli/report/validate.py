"""Human renderings of ``gae validate`` for the terminal (rich): the findings grouped by
rule with counts and their first rows, and the rule list. Nothing here computes."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape

from gaecli.checks import tail_reading
from gaecli.report import displayed
from gaecli.rules import ERROR, RULES, rule_hint

ROWS_PER_RULE = 3
STYLE = {ERROR: "bold red", "warning": "yellow"}


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _quoted(value) -> str:
    """An id or column name of a finding, quoted: a string (displayed already) as it is."""
    return f"'{value}'" if isinstance(value, str) else repr(value)


def _where(finding: dict) -> str:
    parts = [finding["file"]]
    if finding["row"] is not None:
        parts.append(f"row {finding['row']}")
    if finding["id"] is not None:
        parts.append(f"id {_quoted(finding['id'])}")
    if finding["column"] is not None:
        parts.append(f"column {_quoted(finding['column'])}")
    return ", ".join(parts)


def render_validate(
    report: dict, console: Console, *, strict: bool = False, rows_per_rule: Optional[int] = None
) -> None:
    """The findings of ``report`` (:meth:`ValidationReport.to_dict`) grouped by rule, errors
    first: severity, code, count and summary, the first ``rows_per_rule`` findings listed
    (None: :data:`ROWS_PER_RULE`), the fix hint (for the report's estimator); then unreadable files and a
    verdict line."""
    rows_per_rule = ROWS_PER_RULE if rows_per_rule is None else rows_per_rule
    report = displayed(report)
    files, counts = report["files"], report["counts"]
    checked = sum(f["rows_checked"] for f in files)
    unreadable = len(report["unreadable"])
    console.print(
        f"[bold]gae validate[/]: {_plural(checked, 'row')} checked in {_plural(len(files) - unreadable, 'file')}"
        f"{f' ({unreadable:,} unreadable)' if unreadable else ''} · "
        f"{_plural(report['errors'], 'error')} · {_plural(report['warnings'], 'warning')}",
        soft_wrap=True,
    )
    listed: dict[str, list[dict]] = {}
    for finding in report["findings"]:
        listed.setdefault(finding["code"], []).append(finding)
    ordered = sorted((code for code in RULES if counts.get(code)), key=lambda code: RULES[code].severity != ERROR)
    for code in ordered:
        rule, count = RULES[code], counts[code]
        style = STYLE.get(rule.severity, "")
        console.print(
            f"[{style}]{rule.severity}[/] [bold]{code}[/] ({count:,}): {escape(rule.summary)}", soft_wrap=True
        )
        shown = listed.get(code, [])[:rows_per_rule]
        for finding in shown:
            console.print(f"  {escape(_where(finding))}: {escape(finding['message'])}", soft_wrap=True)
        if count > len(shown):
            more = count - len(shown)
            console.print(
                f"  [dim]… and {more:,} "
                f"more{' (see --json)' if listed.get(code) else ' (not listed: --max-findings)'}[/]"
            )
        hint = rule_hint(code, tail_reading(report.get("estimator", "gae")))
        console.print(f"  [dim]fix: {escape(hint)}[/]", soft_wrap=True)
    for entry in report["unreadable"]:
        console.print(f"[bold red]unreadable[/] {escape(entry['message'] or entry['file'])}", soft_wrap=True)
    if report["unreadable"]:
        verdict = f"[bold red]{_plural(len(report['unreadable']), 'file')} could not be read[/]"
    elif report["errors"]:
        verdict = "[bold red]invalid[/]: fix the errors above before training on these files"
    elif report["warnings"] and strict:
        verdict = "[bold red]warnings fail under --strict[/]"
    else:
        verdict = "[green]no errors[/]" + (" (warnings only)" if report["warnings"] else "")
    console.print(verdict)


def render_rules(console: Console) -> None:
    """Every rule on two lines: code, severity and what it finds, then how to fix it."""
    width = max(len(code) for code in RULES) + 2
    for rule in RULES.values():
        style = STYLE.get(rule.severity, "")
        console.print(
            f"[bold]{rule.code:<{width}}[/][{style}]{rule.severity:<8}[/] {escape(rule.summary)}", soft_wrap=True
        )
        console.print(f"{'':<{width}}{'':<8} [dim]fix: {escape(rule.hint)}[/]", soft_wrap=True)
