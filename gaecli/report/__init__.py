"""Renderers of what the commands return: ``recompute`` and ``validate`` summaries for the
terminal, and ``gae diff`` reports — terminal (rich), Markdown, self-contained HTML — with
what those share: the rows of the summary, top-samples and groups tables as text, so
that every output shows the same figures. Nothing here computes statistics."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SummaryRow:
    """One row of a comparison's summary table. ``key`` tells apart rows that read the same;
    ``label`` is the row's label (indented when it details the row above, :func:`nesting`);
    ``value`` its cell; ``parts`` the figures the cell holds, each ``(header, text)``: what a
    layout with one column per figure shows (the terminal's comparisons-as-rows tables,
    under ``title``, the figures' name without the list of parts)."""

    key: str
    label: str
    value: str
    parts: tuple[tuple[str, str], ...]
    title: str

    @classmethod
    def single(cls, key: str, label: str, value: str, header: str) -> "SummaryRow":
        """A row of one figure, headed ``header`` where each figure has its own column."""
        return cls(key, label, value, ((header, value),), label.strip())

    @classmethod
    def listed(cls, key: str, label: str, title: str, parts: list[tuple[str, str]], value: str = "") -> "SummaryRow":
        """A row of several figures, its cell the figures joined by `` / `` (or ``value``)."""
        return cls(key, label, value or " / ".join(text for _, text in parts), tuple(parts), title)


QUANTITY_PARTS = ("mean", "median", "p99", "max")


def _four(summary: dict, quantity: str, suffix: str = "") -> list[tuple[str, str]]:
    return [(stat, number(summary[f"{stat}_abs_delta_{quantity}{suffix}"])) for stat in QUANTITY_PARTS]


def _dropped(key: str, label: str, samples: Optional[int], abs_sum: Optional[float], whole: int) -> list[SummaryRow]:
    """The row of the samples whose terminal reward one side drops (it reaches no trainable
    token), with Σ |z| over them; none where that side does not define it (stored
    advantages, a critic-free estimator: no row of dashes)."""
    if samples is None:
        return []
    parts = [("dropped", share(samples, whole)), ("Σ|z|", number(abs_sum))]
    return [SummaryRow.listed(key, label, "terminal reward dropped", parts, f"{parts[0][1]}, Σ|z| {parts[1][1]}")]


def _spread_rows(s: dict) -> list[SummaryRow]:
    """The |Δ advantage| and |Δ return| rows, each with its rows in σ of the new advantages."""
    over_sigma = f"  ÷ σ of the new advantages (σ = {number(s['new_advantage_std'])})"
    listed = " mean / median / p99 / max"
    rows = [
        SummaryRow.listed("advantage", "|Δ advantage|" + listed, "|Δ advantage|", _four(s, "advantage")),
        SummaryRow.listed(
            "advantage_std", over_sigma, "|Δ advantage|" + over_sigma[1:], _four(s, "advantage", "_over_std")
        ),
    ]
    if s["max_abs_delta_return"] is None:  # no old returns: nothing to compare
        return rows
    return rows + [
        SummaryRow.listed("return", "|Δ return|" + listed, "|Δ return|", _four(s, "return")),
        SummaryRow.listed("return_std", over_sigma, "|Δ return|" + over_sigma[1:], _four(s, "return", "_over_std")),
    ]


def _tail_rows(s: dict) -> list[SummaryRow]:
    """The rows that detail the samples with a masked tail: their lengths, the old terminal
    credit (where the old side is a GAE baseline), the tails that kept none of the terminal reward."""
    stats = ("mean_masked_tail_length", "median_masked_tail_length", "p99_masked_tail_length", "longest_masked_tail")
    parts = [(header, number(s[key])) for header, key in zip(QUANTITY_PARTS, stats)]
    rows = [SummaryRow.listed("tail_length", "  tail length mean / median / p99 / max", "tail length", parts)]
    if s["mean_terminal_credit"] is None:  # stored advantages, a critic-free estimator: no GAE credit
        return rows
    label = "  old terminal credit (mean / min)"
    parts = [("mean credit", number(s["mean_terminal_credit"])), ("min credit", number(s["min_terminal_credit"]))]
    kept_none = share(s["zero_credit_samples"], s["masked_tail_samples"])
    return rows + [
        SummaryRow.listed("credit", label, "old terminal credit", parts),
        SummaryRow.single("zero_credit", "  tails that kept none of the terminal reward", kept_none, "kept none"),
    ]


def _summary_entries(s: dict) -> list[SummaryRow]:
    """The rows of one comparison's summary, in the table's order."""
    samples, trainable = s["samples"], s["trainable_tokens"]
    tokens = f"{s['tokens']:,} ({trainable:,}, {percent(s['trainable_share'])})"
    rows = [
        SummaryRow.single("samples", "samples", f"{samples:,}", "samples"),
        SummaryRow.single("tokens", "tokens (trainable)", tokens, "tokens"),
        SummaryRow.single(
            "changed",
            f"samples changed (tol {s['tolerance']:g})",
            share(s["changed_samples"], samples),
            "samples changed",
        ),
        SummaryRow.single(
            "changed_tokens", "trainable tokens changed", share(s["changed_tokens"], trainable), "tokens changed"
        ),
        *_spread_rows(s),
        SummaryRow.single(
            "flips", "tokens whose advantage changed sign", share(s["sign_flip_tokens"], trainable), "sign flips"
        ),
        SummaryRow.single("correlation", "correlation old vs new", number(s["correlation"]), "correlation"),
        SummaryRow.single("tails", "samples with a masked tail", share(s["masked_tail_samples"], samples), "tails"),
    ]
    if s["masked_tail_samples"]:
        rows += _tail_rows(s)
    if s.get("new_lost_terminal_samples") is not None:
        rows += _dropped(
            "lost",
            "terminal reward dropped (reaches no trainable token), old side",
            s["lost_terminal_samples"],
            s["lost_terminal_abs_sum"],
            samples,
        )
        rows += _dropped(
            "new_lost",
            "terminal reward dropped, new side",
            s["new_lost_terminal_samples"],
            s["new_lost_terminal_abs_sum"],
            samples,
        )
    return rows + [
        SummaryRow.single(
            "fully_masked", "fully masked samples", share(s["fully_masked_samples"], samples), "fully masked"
        ),
        SummaryRow.single("empty", "empty samples", share(s["empty_samples"], samples), "empty"),
    ]


def summary_rows(document: dict) -> list[tuple[str, str]]:
    """(figure, value) rows of the summary table of the first comparison."""
    return [(row.label, row.value) for row in _summary_entries(document["summary"])]


def comparison_rows(document: dict) -> list[tuple[str, list[SummaryRow]]]:
    """Each comparison's name and its summary rows (:class:`SummaryRow`), in the order given."""
    return [(comparison["name"], _summary_entries(comparison["summary"])) for comparison in comparisons(document)]


def summary_table(document: dict) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the summary table: one column per comparison, side by side, headed
    by its name (``value`` when there is one comparison); a figure a comparison does not
    have is "—", its row where the comparisons that have it put it (a stored column has
    no return spread without returns, nor the credit's details)."""
    listed = comparison_rows(document)
    headers = ["figure", *(name for name, _ in listed)] if len(listed) > 1 else ["figure", "value"]
    labels: dict[str, str] = {}
    order: list[str] = []
    values: list[dict[str, str]] = []
    for _, entries in listed:
        position = 0
        for entry in entries:
            if entry.key not in labels:
                labels[entry.key] = entry.label
                order.insert(position, entry.key)
            position = order.index(entry.key) + 1
        values.append({entry.key: entry.value for entry in entries})
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


def _details(s: dict) -> list[str]:
    """What the verdict says of one comparison that changed samples: the largest |Δ
    advantage| (in σ of the new advantages when defined), and what masked tails did to the
    terminal reward."""
    in_sigma = s["max_abs_delta_advantage_over_std"]
    if in_sigma is not None and math.isfinite(in_sigma):
        parts = [f"largest |Δ advantage| {in_sigma:.3g} σ"]
    else:
        parts = [f"largest |Δ advantage| {number(s['max_abs_delta_advantage'])}"]
    tails = s["masked_tail_samples"]
    if not tails:
        return parts + ["no sample ends in a masked tail"]
    ending = f"{tails:,} sample{'s' if tails != 1 else ''} end{'s' if tails == 1 else ''} in a masked tail"
    credit, lost = s["mean_terminal_credit"], s["zero_credit_samples"] or 0
    if credit is not None and lost == tails:
        ending += ", where the old advantages kept none of the terminal reward"
    elif credit is not None and credit < 1.0:
        ending += f", where the old advantages kept {number(credit)} of the terminal reward on average"
        ending += f" ({lost:,} kept none of it)" if lost else ""
    elif credit is not None:
        ending += ", where the old advantages kept all of the terminal reward"
    return parts + [ending]


def _severity(s: dict) -> tuple[int, float]:
    """How hard a comparison is hit, for the verdict's worst: samples changed, then the
    largest |Δ advantage| (in σ when defined)."""
    largest = s["max_abs_delta_advantage_over_std"]
    if largest is None or not math.isfinite(largest):
        largest = s["max_abs_delta_advantage"]
    return s["changed_samples"], largest if largest is not None and math.isfinite(largest) else -1.0


def verdict(document: dict) -> str:
    """The report's answer in one sentence: how many samples changed, the largest |Δ
    advantage| (in σ of the new advantages when defined), and what masked tails did to the
    terminal reward: ``52 of 92 samples changed; largest |Δ advantage| 0.918 σ; 27 samples
    end in a masked tail, where the old advantages kept 0.85 of the terminal reward on
    average.`` With several comparisons it names each with its changed samples, then the
    worst (most samples changed, then the largest |Δ advantage|; those tied with it and
    described alike named with it) and its figures: ``Of 92 samples, 8 changed against
    verl, 72 against slime; the most against slime: largest |Δ advantage| …``."""
    listed = document.get("comparisons") or []
    if len(listed) <= 1:
        s = document["summary"]
        samples, changed = s["samples"], s["changed_samples"]
        if not changed:
            return f"No sample changed (of {samples:,}, tol {s['tolerance']:g})."
        return "; ".join([f"{changed:,} of {samples:,} samples changed", *_details(s)]) + "."
    first = listed[0]["summary"]
    if not any(comparison["summary"]["changed_samples"] for comparison in listed):
        return (
            f"No sample changed against any of the {len(listed)} comparisons "
            f"(of {first['samples']:,}, tol {first['tolerance']:g})."
        )
    counts = [f"{comparison['summary']['changed_samples']:,} against {comparison['name']}" for comparison in listed]
    worst = max(listed, key=lambda comparison: _severity(comparison["summary"]))  # the first of the hardest hit
    described = _details(worst["summary"])
    tied = [
        comparison["name"]
        for comparison in listed
        if _severity(comparison["summary"]) == _severity(worst["summary"])
        and _details(comparison["summary"]) == described
    ]
    names = tied[0] if len(tied) == 1 else ", ".join(tied[:-1]) + " and " + tied[-1]
    counts[0] = counts[0].replace(" against ", " changed against ", 1)
    return f"Of {first['samples']:,} samples, {', '.join(counts)}; the most against {names}: {'; '.join(described)}."


def top_table(document: dict, comparison: Optional[dict] = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the top-samples table of ``comparison`` (default: the first)."""
    comparison = comparison or comparisons(document)[0]
    grouped = document["group_by"] is not None
    credited = with_credit(comparison)
    headers = [
        "#",
        "file",
        "row",
        "id",
        *([document["group_by"]] if grouped else []),
        "length",
        "masked",
        "tail",
        "max |Δ adv|",
        "mean |Δ adv|",
        "sign flips",
        *(["credit"] if credited else []),
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
                *([number(entry["terminal_credit"])] if credited else []),
            ]
        )
    return headers, rows


def with_credit(comparison: dict) -> bool:
    """Whether the top samples of ``comparison`` show the old side's terminal credit: only
    where it is defined (a GAE baseline; not stored advantages nor a critic-free estimator)."""
    return any(entry["terminal_credit"] is not None for entry in comparison["top_samples"])


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


def skipped_note(document: dict, quote: Callable[[str], str] = str) -> Optional[str]:
    """Under ``--on-invalid skip``, the rows left out: ``N rows skipped (invalid): file:row, …``
    (the first named, each file through ``quote``), and where they were written; None otherwise."""
    if document.get("on_invalid") != "skip":
        return None
    skipped = document["skipped"]
    count = skipped["count"]
    text = f"{count:,} row{'' if count == 1 else 's'} skipped (invalid)"
    named = [f"{quote(entry['file'])}:{entry['row']}" for entry in skipped["rows"]]
    if named:
        text += ": " + ", ".join(named) + (f" and {count - len(named):,} more" if count > len(named) else "")
    if document.get("rejects"):
        text += f" → {quote(document['rejects'])}"
    return text


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
