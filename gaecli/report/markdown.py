"""``gae diff --markdown``: the report as GitHub-flavoured Markdown tables, for a pull
request or an issue."""

from __future__ import annotations

from gaecli.report import group_table, headline, nesting, quantile_note, summary_rows, top_table, verdict

MARKDOWN_GROUPS = 200


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
    """The whole report: headline, summary, top samples, groups (at most
    ``MARKDOWN_GROUPS``), and how the quantiles were computed."""
    lines = ["# gae diff", "", f"**{verdict(document)}**", "", headline(document), ""]
    lines += ["## Summary (trainable tokens only)", ""]
    lines += table(["figure", "value"], [[nested_label(label), value] for label, value in summary_rows(document)], {1})
    headers, rows = top_table(document)
    lines += ["", "## Top samples by max |Δ advantage|", ""]
    if rows:
        lines += table(headers, rows, {0, 2, *range(len(headers) - 7, len(headers))})
    else:
        lines.append("No sample differs.")
    headers, rows = group_table(document)
    if document["groups"] is not None:
        lines += ["", f"## By `{document['group_by']}`", ""]
        lines += table(headers, rows[:MARKDOWN_GROUPS], set(range(1, len(headers))))
        if len(rows) > MARKDOWN_GROUPS:
            lines += ["", f"{len(rows) - MARKDOWN_GROUPS:,} more groups in the JSON report."]
    files = ", ".join(f"`{f['file']}`" for f in document["files"])
    lines += ["", f"Files: {files}. {quantile_note(document)} gaecli {document['version']}.", ""]
    return "\n".join(lines)
