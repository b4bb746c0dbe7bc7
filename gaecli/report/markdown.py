"""``gae diff --markdown``: the report as GitHub-flavoured Markdown tables, for a pull
request or an issue."""

from __future__ import annotations

from gaecli.report import (
    comparison_title,
    comparisons,
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


def cell(text: str) -> str:
    """Text that stays inside one table cell: pipes escaped, no line breaks."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def table(headers: list[str], rows: list[list[str]], align_right: set[int] = frozenset()) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---:" if i in align_right else "---" for i in range(len(headers))) + "|")
    lines.extend("| " + " | ".join(cell(value) for value in row) + " |" for row in rows)
    return lines


SUB_ROW_MARK = "↳ "
"""What starts the label of a row that details the row above (Markdown drops leading spaces)."""


def nested_label(label: str) -> str:
    """A table label with its level (:func:`gaecli.report.nesting`) shown: ``↳ ÷ σ …``."""
    level, text = nesting(label)
    return "  " * max(level - 1, 0) + SUB_ROW_MARK * min(level, 1) + text


def render_markdown(document: dict) -> str:
    """The whole report: the verdict, headline, the summary (one column per comparison),
    then per comparison its top samples and the groups hit hardest, and how the quantiles
    were computed."""
    document = displayed(document)
    lines = ["# gae diff", "", f"**{verdict(document)}**", "", headline(document), ""]
    if skipped_note(document) is not None:
        lines += [cell(skipped_note(document, lambda name: f"`{name}`")), ""]
    lines += ["## Summary (trainable tokens only)", ""]
    headers, rows = summary_table(document)
    rows = [[nested_label(row[0]), *row[1:]] for row in rows]
    lines += table(headers, rows, set(range(1, len(headers))))
    for comparison in comparisons(document):
        title = comparison_title(document, comparison)
        headers, rows = top_table(document, comparison)
        lines += ["", f"## Top samples by max |Δ advantage|{title}", ""]
        if rows:
            lines += table(headers, rows, {0, 2, *range(headers.index("length"), len(headers))})
        else:
            lines.append("No sample differs.")
        headers, rows = group_table(document, comparison)
        if comparison["groups"] is not None:
            lines += ["", f"## By `{document['group_by']}`{title}", ""]
            lines += table(headers, rows, set(range(1, len(headers))))
            lines += ["", groups_note(document)]
    lines += ["", files_note(document, lambda name: f"`{name}`"), ""]
    return "\n".join(lines)
