"""Renderers of what the commands return: ``recompute`` and ``validate`` summaries for the
terminal, and ``gae diff`` reports — terminal (rich), Markdown, self-contained HTML — with
what those share: the rows of the summary, top-samples and groups tables as text, so
that every output shows the same figures. Nothing here computes statistics."""

from __future__ import annotations

import math
import sys
from typing import Callable, Optional

import pyarrow as pa

from gaecli.display import display
from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import write_whole


def number(value) -> str:
    """A figure for a person: integers with separators, floats with 4 significant digits,
    None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    return f"{value:.4g}"


def percent(value: Optional[float]) -> str:
    return "—" if value is None else f"{100.0 * value:.1f} %"


def share(part: Optional[int], whole: int) -> str:
    if part is None:
        return "—"
    return f"{part:,} ({100.0 * part / whole:.1f} %)" if whole else f"{part:,}"


def comparisons(document: dict) -> list[dict]:
    """The document's comparisons (``{name, summary, top_samples, groups}``, in the order
    given); a document without them is its top level's one comparison."""
    if document.get("comparisons"):
        return document["comparisons"]
    old = document["old"]
    name = old["baseline"] or old.get("estimator") or old["advantages_column"]
    return [{"name": name, **{key: document[key] for key in ("summary", "top_samples", "groups")}}]


def old_label(document: dict) -> str:
    """What the old advantages are, in words: the stored column, the estimator or the
    baselines, or the stored column and then the baselines compared beside it (a baseline
    beside masked GAE over episodes: each row computed as its own episode, as the trainers
    that treat a row as an episode do)."""
    old = document["old"]
    if old["source"] == "estimator":
        return f"the {old['estimator']} estimator"
    names = [comparison["name"] for comparison in comparisons(document)]
    stored = ""
    if old["source"] == "stored":
        returns = f", returns {old['returns_column']!r}" if old["returns_column"] else ""
        stored, names = f"stored column {old['advantages_column']!r}{returns}", names[1:]
        if not names:
            return stored
        stored += " and "
    rows = ", each row its own episode" if (document.get("new_spec") or {}).get("episode_by") else ""
    if len(names) > 1:
        return f"{stored}the baselines {', '.join(names)}{rows}"
    return f"{stored}the {names[0]} baseline{rows}"


def new_label(document: dict) -> str:
    """What the new advantages are, in words: ``masked GAE``, a critic-free estimator's name,
    or the estimator and its semantics."""
    spec = document.get("new_spec") or {"estimator": document.get("estimator", "gae"), "semantics": "masked"}
    if spec["estimator"] == "gae" and spec["semantics"] == "masked":
        return "masked GAE over episodes" if spec.get("episode_by") else "masked GAE"
    if spec["semantics"] == "masked":
        return spec["estimator"]
    return f"{spec['estimator']} ({spec['semantics']})"


def estimator_label(document: dict) -> str:
    """The new side of a recompute report in words: ``masked GAE`` or the critic-free
    estimator's name."""
    estimator = document.get("estimator", "gae")
    return "masked GAE" if estimator == "gae" else estimator


def comparison_title(document: dict, comparison: dict) -> str:
    """The suffix of a section about one comparison: empty when there is only one."""
    return f" — against {comparison['name']}" if len(comparisons(document)) > 1 else ""


def parameters_label(document: dict) -> str:
    """γ and λ where given (``γ = 0.99, λ = 0.95``), else ``no γ, λ``; with the group and step
    columns of the estimators when named."""
    given = [
        f"{symbol} = {document[key]:g}" for key, symbol in (("gamma", "γ"), ("lambd", "λ")) if document[key] is not None
    ]
    for key, what in (("group_col", "groups"), ("step_col", "steps")):
        if document.get(key):
            given.append(f"{what} {document[key]!r}")
    return ", ".join(given) or "no γ, λ"


def headline(document: dict) -> str:
    summary, files = document["summary"], document["files"]
    return (
        f"{new_label(document)} against {old_label(document)} · {parameters_label(document)} · "
        f"normalize {document['normalize']} · {summary['samples']:,} samples in {len(files)} "
        f"file{'s' if len(files) != 1 else ''}"
    )


def _four(summary: dict, quantity: str, suffix: str = "") -> str:
    values = [summary[f"{stat}_abs_delta_{quantity}{suffix}"] for stat in ("mean", "median", "p99", "max")]
    return " / ".join(number(value) for value in values)


def _lost(samples: Optional[int], abs_sum: Optional[float], whole: int) -> str:
    if samples is None:
        return "— (not defined for stored advantages)"
    return f"{share(samples, whole)}, Σ|z| {number(abs_sum)}"


def _summary_entries(s: dict) -> list[tuple[str, str, str]]:
    """(key, figure, value) rows of one comparison's summary (the key tells apart rows that
    read the same)."""
    samples, trainable = s["samples"], s["trainable_tokens"]
    sigma = number(s["new_advantage_std"])
    rows = [
        ("samples", "samples", f"{samples:,}"),
        ("tokens", "tokens (trainable)", f"{s['tokens']:,} ({trainable:,}, {percent(s['trainable_share'])})"),
        ("changed", f"samples changed (tol {s['tolerance']:g})", share(s["changed_samples"], samples)),
        ("changed_tokens", "trainable tokens changed", share(s["changed_tokens"], trainable)),
        ("advantage", "|Δ advantage| mean / median / p99 / max", _four(s, "advantage")),
        ("advantage_std", f"  ÷ σ of the new advantages (σ = {sigma})", _four(s, "advantage", "_over_std")),
    ]
    if s["max_abs_delta_return"] is None:
        rows.append(("return", "|Δ return| mean / median / p99 / max", "— (no old returns)"))
    else:
        rows.append(("return", "|Δ return| mean / median / p99 / max", _four(s, "return")))
        rows.append(("return_std", f"  ÷ σ of the new advantages (σ = {sigma})", _four(s, "return", "_over_std")))
    rows += [
        ("flips", "tokens whose advantage changed sign", share(s["sign_flip_tokens"], trainable)),
        ("correlation", "correlation old vs new", number(s["correlation"])),
        ("tails", "samples with a masked tail", share(s["masked_tail_samples"], samples)),
    ]
    if s["masked_tail_samples"]:
        tail = " / ".join(
            number(s[k])
            for k in (
                "mean_masked_tail_length",
                "median_masked_tail_length",
                "p99_masked_tail_length",
                "longest_masked_tail",
            )
        )
        rows.append(("tail_length", "  tail length mean / median / p99 / max", tail))
        if s["mean_terminal_credit"] is None:
            rows.append(("credit", "  old terminal credit (mean / min)", "— (defined for a GAE baseline only)"))
        else:
            rows.append(
                (
                    "credit",
                    "  old terminal credit (mean / min)",
                    f"{number(s['mean_terminal_credit'])} / {number(s['min_terminal_credit'])}",
                )
            )
            rows.append(
                (
                    "zero_credit",
                    "  samples whose terminal reward was lost",
                    share(s["zero_credit_samples"], s["masked_tail_samples"]),
                )
            )
    if s.get("new_lost_terminal_samples") is not None:
        rows += [
            (
                "lost",
                "terminal rewards lost (reach no trainable token), old side",
                _lost(s["lost_terminal_samples"], s["lost_terminal_abs_sum"], samples),
            ),
            (
                "new_lost",
                "terminal rewards lost, new side",
                _lost(s["new_lost_terminal_samples"], s["new_lost_terminal_abs_sum"], samples),
            ),
        ]
    rows += [
        ("fully_masked", "fully masked samples", share(s["fully_masked_samples"], samples)),
        ("empty", "empty samples", share(s["empty_samples"], samples)),
    ]
    return rows


def summary_rows(document: dict) -> list[tuple[str, str]]:
    """(figure, value) rows of the summary table of the first comparison."""
    return [(label, value) for _, label, value in _summary_entries(document["summary"])]


def summary_table(document: dict) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the summary table: one column per comparison, side by side, headed
    by its name (``value`` when there is one comparison); a figure a comparison does not
    have is "—", its row where the comparisons that have it put it (a stored column has
    no return spread without returns, nor the credit's details)."""
    listed = comparisons(document)
    headers = ["figure", *(comparison["name"] for comparison in listed)] if len(listed) > 1 else ["figure", "value"]
    labels: dict[str, str] = {}
    order: list[str] = []
    values: list[dict[str, str]] = []
    for comparison in listed:
        entries = _summary_entries(comparison["summary"])
        position = 0
        for key, label, _ in entries:
            if key not in labels:
                labels[key] = label
                order.insert(position, key)
            position = order.index(key) + 1
        values.append({key: value for key, _, value in entries})
    rows = [[labels[key], *(column.get(key, "—") for column in values)] for key in order]
    return headers, rows


SUB_ROW_INDENT = "  "
"""What starts the label of a row that details the row above it, once per level (the tables' labels)."""


def nesting(label: str) -> tuple[int, str]:
    """The level of a table label (0: a row of its own; 1: it details the row above) and its
    text without the indentation: ``"  ÷ σ …"`` → ``(1, "÷ σ …")``. Each report shows the
    level its own way (indented on the terminal, ``↳`` in Markdown, a nested cell in HTML)."""
    level = 0
    while label.startswith(SUB_ROW_INDENT * (level + 1)):
        level += 1
    return level, label[len(SUB_ROW_INDENT) * level :]


def verdict(document: dict) -> str:
    """The report's answer in one sentence (of the first comparison): how many samples
    changed, the largest |Δ advantage| (in σ of the new advantages when defined), and what
    masked tails did to the terminal reward: ``52 of 92 samples changed; largest |Δ
    advantage| 0.918 σ; 27 samples end in a masked tail, where the old advantages kept 0.85
    of the terminal reward on average.``"""
    s = document["summary"]
    samples, changed = s["samples"], s["changed_samples"]
    if not changed:
        return f"No sample changed (of {samples:,}, tol {s['tolerance']:g})."
    parts = [f"{changed:,} of {samples:,} samples changed"]
    in_sigma = s["max_abs_delta_advantage_over_std"]
    if in_sigma is not None and math.isfinite(in_sigma):
        parts.append(f"largest |Δ advantage| {in_sigma:.3g} σ")
    else:
        parts.append(f"largest |Δ advantage| {number(s['max_abs_delta_advantage'])}")
    tails = s["masked_tail_samples"]
    if not tails:
        parts.append("no sample ends in a masked tail")
    else:
        ending = f"{tails:,} sample{'s' if tails != 1 else ''} end{'s' if tails == 1 else ''} in a masked tail"
        credit, lost = s["mean_terminal_credit"], s["zero_credit_samples"] or 0
        if credit is not None and lost == tails:
            ending += ", where the old advantages lost the terminal reward"
        elif credit is not None and credit < 1.0:
            ending += f", where the old advantages kept {credit:.2f} of the terminal reward on average"
            ending += f" ({lost:,} kept none of it)" if lost else ""
        elif credit is not None:
            ending += ", where the old advantages kept all of the terminal reward"
        parts.append(ending)
    listed = document.get("comparisons") or []
    if len(listed) > 1:
        parts.append(f"against {listed[0]['name']}, the first of {len(listed)} comparisons")
    return "; ".join(parts) + "."


def top_table(document: dict, comparison: Optional[dict] = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the top-samples table of ``comparison`` (default: the first)."""
    comparison = comparison or comparisons(document)[0]
    grouped = document["group_by"] is not None
    headers = [
        "#",
        "file",
        "row",
        "id",
        *(["group"] if grouped else []),
        "length",
        "masked",
        "tail",
        "max |Δ adv|",
        "mean |Δ adv|",
        "sign flips",
        "credit",
    ]
    rows = []
    for rank, entry in enumerate(comparison["top_samples"], start=1):
        rows.append(
            [
                str(rank),
                entry["file"],
                str(entry["row"]),
                "—" if entry["id"] is None else str(entry["id"]),
                *([str(entry["group"])] if grouped else []),
                f"{entry['length']:,}",
                percent(entry["masked_share"]),
                f"{entry['masked_tail']:,}",
                number(entry["max_abs_delta_advantage"]),
                number(entry["mean_abs_delta_advantage"]),
                f"{entry['sign_flips']:,}",
                number(entry["terminal_credit"]),
            ]
        )
    return headers, rows


def group_table(document: dict, comparison: Optional[dict] = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-group table of ``comparison`` (default: the first): its
    groups hit hardest, largest max |Δ advantage| first; empty without --group-by."""
    comparison = comparison or comparisons(document)[0]
    headers = [
        document["group_by"] or "group",
        "samples",
        "changed",
        "masked tail",
        "credit",
        "mean |Δ adv|",
        "max |Δ adv|",
        "mean |Δ ret|",
        "sign flips",
        "correlation",
    ]
    rows = []
    for group in comparison["groups"] or []:
        rows.append(
            [
                str(group["key"]),
                f"{group['samples']:,}",
                percent(group["changed_share"]),
                f"{group['masked_tail_samples']:,}",
                number(group["mean_terminal_credit"]),
                number(group["mean_abs_delta_advantage"]),
                number(group["max_abs_delta_advantage"]),
                number(group["mean_abs_delta_return"]),
                percent(group["sign_flip_share"]),
                number(group["correlation"]),
            ]
        )
    return headers, rows


def groups_note(document: dict) -> str:
    """What the groups table lists: the groups hit hardest, of how many, and where every
    group's figures are (the ``--groups-out`` file)."""
    shown, total = len(document["groups"] or []), document["group_count"] or 0
    listed = f"All {total:,} groups" if shown == total else f"The {shown:,} of {total:,} groups"
    where = (
        f"every group's figures are in {document['groups_out']}"
        if document["groups_out"] is not None
        else "--groups-out PATH writes every group's figures"
    )
    return f"{listed}, largest max |Δ advantage| first; {where}."


def quantile_note(document: dict) -> str:
    method = document["quantiles"]
    return (
        f"Medians and p99 come from a fixed-bin log histogram: exact in rank, within "
        f"{100 * method['relative_error']:g} % in value; |Δ| ≤ {method['zero_below']:g} counts as 0. "
        f"Means, maxima, counts and the correlation are exact."
    )


def files_note(document: dict, quote: Callable[[str], str] = str) -> str:
    """The report's closing line: the files read (each name through ``quote``), how the
    quantiles were computed, and the version."""
    files = ", ".join(quote(entry["file"]) for entry in document["files"])
    return f"Files: {files}. {quantile_note(document)} gaecli {document['version']}."


NON_FINITE_JSON = {"nan": "nan", "inf": "inf", "-inf": "-inf"}  # str(float) of each: what a JSON document holds


def json_safe(document):
    """``document`` with every non-finite float replaced by the string ``"nan"``, ``"inf"``
    or ``"-inf"`` (JSON has no such numbers; every gaecli JSON document writes them so, as
    docs/reliability.md says). Dicts, lists and tuples are copied; the rest is returned
    as it is."""
    if isinstance(document, float):
        return document if math.isfinite(document) else NON_FINITE_JSON[str(document)]
    if isinstance(document, dict):
        return {key: json_safe(value) for key, value in document.items()}
    if isinstance(document, (list, tuple)):
        return [json_safe(value) for value in document]
    return document


def displayed(document, *, controls: bool = True):
    """``document`` with every string in it (keys too) as :func:`gaecli.display.display`
    shows it: what every renderer shows and every JSON document holds (credentials
    redacted, undecodable bytes and control characters escaped). Dicts, lists and tuples
    are copied; the rest is returned as it is."""
    if isinstance(document, str):
        return display(document, controls=controls)
    if isinstance(document, dict):
        return {
            displayed(key, controls=controls): displayed(value, controls=controls) for key, value in document.items()
        }
    if isinstance(document, (list, tuple)):
        return [displayed(value, controls=controls) for value in document]
    return document


def json_text(document) -> str:
    """The JSON text of a gaecli document (non-finite floats as :func:`json_safe` says; its
    strings :func:`displayed`, control characters left to JSON's own escapes)."""
    import json

    return json.dumps(json_safe(displayed(document, controls=False)), indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_text(path: str, text: str) -> None:
    """Write a report to ``path`` ('-' = stdout; a path or a URI, written whole or not at
    all); an unwritable path is a GAEUsageError."""
    if path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as error:  # a full device; a reader gone ends the gae process by SIGPIPE (gaecli.cli.streams)
            raise GAEUsageError(f"cannot write to standard output: {error.strerror or error}") from error
        return
    try:
        write_whole(path, text.encode("utf-8"))
    except (OSError, pa.ArrowException) as error:
        raise GAEUsageError(f"cannot write {path}: {getattr(error, 'strerror', None) or error}") from error
