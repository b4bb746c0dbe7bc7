"""The checks a rollout file must pass, shared by ``gae validate`` and ``gae recompute``:
file-level schema rules and vectorised per-batch row rules, each finding naming file, row,
column, a stable rule code and a message."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import ESTIMATOR_PARAMETERS
from gaecli.advantages.faults import (
    aligned_turn_ids,
    all_finite,
    bad_mask_values,
    first_per_row,
    non_finite,
    not_flags,
    outside_response,
    rows_of_positions,
    truncated_without_bootstrap,
    turn_counts,
    turn_id_faults,
)
from gaecli.advantages.layout import masked_tail_lengths, trainable_counts
from gaecli.advantages.spec import RowInput
from gaecli.io.format import (
    MASK_ROLES,
    Columns,
    is_list_type,
    is_mask_element_type,
    is_real_type,
    is_scalar_number_type,
    list_parts,
    numeric_numpy,
    output_float_type,
)
from gaecli.overflow import cannot_overflow, overflow_bounds
from gaecli.rules import ERROR, RULES, TAIL_READINGS, Finding, first_error  # noqa: F401 (the checks' findings)


def missing_column(file: str, name: str, names: Sequence[str], label: str = "column", why: str = "") -> Finding:
    """The ``missing-column`` finding of a column ``name`` a file (with columns ``names``)
    lacks; ``label`` says what the column is for, ``why`` what to do about it."""
    return Finding(file, None, name, "missing-column", f"{label} {name!r} is missing (have: {', '.join(names)}){why}")


def check_schema(schema: pa.Schema, columns: Columns, file: str) -> list[Finding]:
    """File-level findings: column names used twice, required columns missing or of the
    wrong type."""
    names, counts = np.unique(np.array(schema.names, dtype=object), return_counts=True) if schema.names else ([], [])
    findings: list[Finding] = [
        Finding(file, None, name, "duplicate-column", f"column {name!r} appears {count} times")
        for name, count in zip(names, counts)
        if count > 1
    ]
    if findings:
        return findings  # a name held twice cannot be looked up

    def require(name: str, ok, expected: str, why: str = "") -> None:
        if name not in schema.names:
            findings.append(missing_column(file, name, schema.names, why=why))
        elif not ok(schema.field(name).type):
            message = f"column {name!r} is {schema.field(name).type}, expected {expected}"
            findings.append(Finding(file, None, name, "wrong-type", message))

    for role, name in columns.token_columns():
        if role in MASK_ROLES:
            require(
                name, lambda t: is_list_type(t) and is_mask_element_type(t.value_type), "a list of bool, int or float"
            )
        else:
            why = NO_VALUES_HINT if role == "values" else ""
            require(name, lambda t: is_list_type(t) and is_real_type(t.value_type), "a list of float32 or float64", why)
    require(columns.terminal_reward, is_scalar_number_type, "a float or int")
    if columns.response_length in schema.names:
        require(columns.response_length, pa.types.is_integer, "an integer")
    return findings


NO_VALUES_HINT = (
    "; GAE needs a critic's values: a critic-free dump takes --estimator NAME (grpo, rloo, …: they read none), "
    "a GAE run without a critic --values-col none (values taken as 0)"
)


def tail_reading(estimator: str) -> str:
    """What a masked tail means under ``estimator`` (a key of :data:`gaecli.rules.TAIL_READINGS`):
    ``gae``; ``discounted``, a critic-free estimator with a discount γ; ``distillation``, ``opd``;
    ``outcome``, the others (a score or return credited to the trainable tokens)."""
    if estimator in ("gae", "opd"):
        return {"gae": "gae", "opd": "distillation"}[estimator]
    return "discounted" if estimator in ESTIMATOR_PARAMETERS else "outcome"


@dataclass
class BatchCheck:
    """Row findings of one batch and which rows are invalid (an error finding).

    ``counts`` holds every finding per rule code, listed in ``findings`` or not (a
    ``max_findings`` cap per rule lists fewer); ``invalid`` is bool ``[B]``. ``flat``: the token
    columns as the checks turned them into numpy (column name → flat numbers ``[N]``, the
    mask as stored), and ``offsets`` the mask's zero-based int64 offsets ``[B + 1]``: the
    one conversion of the batch, which packing reuses when every row is valid; ``trainable``
    the mask's trainable tokens (bool ``[N]``) where the checks made them, else None."""

    findings: list[Finding] = field(default_factory=list)
    invalid: Optional[np.ndarray] = None
    counts: dict[str, int] = field(default_factory=dict)
    flat: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: Optional[np.ndarray] = None
    trainable: Optional[np.ndarray] = None

    @property
    def ok(self) -> bool:
        if self.invalid is not None:
            return not self.invalid.any()
        return not any(f.severity == ERROR for f in self.findings)


class Flagged:
    """The rows each rule flags in one batch (rows in the batch), the invalid rows (those
    with an error) and the count per rule code; messages are built only for the findings
    listed (:meth:`findings`)."""

    def __init__(self, rows: int) -> None:
        self.invalid = np.zeros(rows, dtype=bool)
        self.counts: dict[str, int] = {}
        self.entries: list[tuple[np.ndarray, str, str, object]] = []  # (rows in batch, column, code, message)

    def flag(self, bad_rows: np.ndarray, column: str, code: str, message) -> None:
        """Flag ``bad_rows`` (bool ``[B]`` or row indices) under rule ``code``; ``message``:
        a text, or a function of the row that returns it."""
        bad = np.flatnonzero(bad_rows) if bad_rows.dtype == bool else np.unique(bad_rows)
        if bad.size == 0:
            return
        self.entries.append((bad, column, code, message))
        self.counts[code] = self.counts.get(code, 0) + int(bad.size)
        if RULES[code].severity == ERROR:
            self.invalid[bad] = True

    def findings(self, file: str, first_row: int, ids: Optional[Sequence], max_findings: Optional[int],
                 listed: Optional[Mapping[str, int]] = None) -> list:  # fmt: skip
        """The findings, the lowest row first (at most ``max_findings`` per rule, less what
        ``listed``, code → count, says is listed already), each rule in the order it was
        flagged within a row."""
        if not self.entries:
            return []
        flagged_rows = np.concatenate([bad for bad, _, _, _ in self.entries])
        which = np.repeat(np.arange(len(self.entries)), [bad.size for bad, _, _, _ in self.entries])
        order = np.lexsort((which, flagged_rows))
        if max_findings is not None:
            codes = sorted({code for _, _, code, _ in self.entries})
            entry_codes = np.array([codes.index(code) for _, _, code, _ in self.entries], dtype=np.int64)
            room = np.array([max(max_findings - (listed or {}).get(code, 0), 0) for code in codes], dtype=np.int64)
            order = order[_first_of_each(entry_codes[which[order]], room)]
        findings = []
        for index in order.tolist():
            row = int(flagged_rows[index])
            _, column, code, message = self.entries[which[index]]
            text = message(row) if callable(message) else message
            findings.append(Finding(file, first_row + row, column, code, text, None if ids is None else ids[row]))
        return findings


def _first_of_each(keys: np.ndarray, room: np.ndarray) -> np.ndarray:
    """bool ``[n]``: which of ``keys`` (int ``[n]``, in listing order) are among the first
    ``room[key]`` of their key."""
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    rank = np.empty(keys.size, dtype=np.int64)
    rank[by_key] = np.arange(keys.size) - np.searchsorted(sorted_keys, sorted_keys)
    return rank < room[keys]


def _flag_nulls(flagged: Flagged, batch: pa.RecordBatch, columns: Columns) -> tuple[dict, np.ndarray]:
    """``null`` rule: null lists, nulls in a list, null terminal rewards (from Arrow's null
    counts: no token read where there is none). Returns the token columns' parts (role →
    (array, zero-based offsets, flat values)) and the rows with a null list."""
    lists: dict[str, tuple[pa.Array, np.ndarray, pa.Array]] = {}
    null_rows = np.zeros(batch.num_rows, dtype=bool)
    for role, name in columns.token_columns():
        array = batch.column(name)
        offsets, flat = list_parts(array)
        lists[role] = (array, offsets, flat)
        if array.null_count:
            is_null = np.asarray(array.is_null())
            null_rows |= is_null
            flagged.flag(is_null, name, "null", "the list is null")
        if flat.null_count:
            null_positions = np.flatnonzero(np.asarray(flat.is_null()))
            flagged.flag(rows_of_positions(offsets, null_positions), name, "null", "the list holds a null")
    terminal = batch.column(columns.terminal_reward)
    if terminal.null_count:
        flagged.flag(np.asarray(terminal.is_null()), columns.terminal_reward, "null", "the terminal reward is null")
    return lists, null_rows


def _flag_lengths(
    flagged: Flagged, batch: pa.RecordBatch, columns: Columns, lists: dict, null_rows: np.ndarray
) -> np.ndarray:
    """``length-mismatch`` (a token column's length is not the mask's) and
    ``response-length-mismatch`` (the declared length is not the mask's), rows with a null
    list or a null declared length left out. Returns the mask's lengths ``[B]``."""
    lengths = {role: np.diff(offsets) for role, (_, offsets, _) in lists.items()}
    mask_name = columns.loss_mask
    mask_lengths = lengths["loss_mask"]
    for role, name in columns.token_columns():
        if role != "loss_mask":
            differ = (lengths[role] != mask_lengths) & ~null_rows
            flagged.flag(
                differ,
                name,
                "length-mismatch",
                lambda row, role=role, name=name: (
                    f"{name!r} has {lengths[role][row]} tokens, {mask_name!r} has {mask_lengths[row]}"
                ),
            )
    if columns.response_length in batch.schema.names:
        declared = batch.column(columns.response_length)
        declared_values = numeric_numpy(declared.fill_null(-1) if declared.null_count else declared)
        differ = (declared_values != mask_lengths) & ~null_rows
        if declared.null_count:
            differ &= np.asarray(declared.is_valid())
        flagged.flag(
            differ,
            columns.response_length,
            "response-length-mismatch",
            lambda row: f"response_length is {declared_values[row]} but {mask_name!r} has {mask_lengths[row]} tokens",
        )
    return mask_lengths


def _mask_numbers(mask_flat: pa.Array) -> np.ndarray:
    """The mask's flat values as numpy, as stored (nulls as 0 / False)."""
    mask_fill = False if pa.types.is_boolean(mask_flat.type) else 0  # a bool array takes no int 0
    return numeric_numpy(mask_flat.fill_null(mask_fill) if mask_flat.null_count else mask_flat)


def _mask_trainable(flagged: Flagged, mask: np.ndarray, mask_offsets, mask_name: str, what="loss_mask") -> np.ndarray:
    """The trainable tokens (bool ``[N]``) of the mask as stored, made in the read that
    applies the ``mask-value`` rule (:func:`gaecli.stats.mask_trainable`): a mask value other
    than 0 or 1, the first per row named (``what``: the mask in the message)."""
    if mask.dtype == np.bool_:
        return mask
    from gaecli.stats import mask_trainable

    trainable, binary = mask_trainable(mask)
    if not binary:
        _flag_mask_values(flagged, mask, mask_offsets, mask_name, what)
    return trainable


def _flag_response_mask(flagged: Flagged, lists: dict, mask: np.ndarray, trainable, null_rows: np.ndarray, name: str):
    """The response mask's rules (``--response-mask-col``; its nulls and length are the token
    columns'): ``mask-value``, and ``outside-response``, a trainable token (of the loss mask
    ``mask`` as stored; ``trainable``, None where not made yet) whose response mask is 0, on the
    rows whose lists are the loss mask's length. Returns the response mask as bool ``[N]``."""
    trainable = (mask if mask.dtype == np.bool_ else mask != 0) if trainable is None else trainable
    _, offsets, flat = lists["response_mask"]
    response = _mask_trainable(flagged, _mask_numbers(flat), offsets, name, "response mask")
    mask_offsets = lists["loss_mask"][1]
    aligned = (np.diff(offsets) == np.diff(mask_offsets)) & ~null_rows
    faults = outside_response(trainable, mask_offsets, response, offsets, None if aligned.all() else aligned)
    if faults is not None:
        rows, first = faults

        def outside_message(row: int) -> str:
            token = int(first[np.searchsorted(rows, row)] - mask_offsets[row])
            return f"trainable token {token} has response mask 0 (the loss mask must lie inside {name!r})"

        flagged.flag(rows, name, "outside-response", outside_message)
    return response


def _flag_mask_values(flagged: Flagged, mask: np.ndarray, mask_offsets, mask_name: str, what="loss_mask") -> None:
    """``mask-value`` rule: a mask value other than 0 or 1 (the first per row named)."""
    faults = bad_mask_values(mask, mask_offsets)
    if faults is not None:
        mask_rows, mask_first = faults

        def bad_mask_message(row: int) -> str:
            position = mask_first[np.searchsorted(mask_rows, row)]
            value, token = mask[position].item(), position - mask_offsets[row]
            return f"{what} value {value!r} at token {token} is not 0 or 1"

        flagged.flag(mask_rows, mask_name, "mask-value", bad_mask_message)


def _flag_non_finite(flagged: Flagged, columns: Columns, lists: dict, screened: Collection[str]) -> tuple[dict, dict]:
    """``non-finite`` rule on the token columns other than the mask, but those ``screened``
    (the first NaN or ±Inf per row named). Returns column name → flat numbers (nulls as 0),
    and column name → their largest |x| (:func:`gaecli.stats.largest_magnitude`: NaN or
    ±Inf where the column holds one), the one read of each column that the rule and the
    overflow bound (:func:`gaecli.overflow.cannot_overflow`) share."""
    from gaecli.stats import largest_magnitude

    flat_numbers, magnitudes = {}, {}
    for role, name in columns.token_columns():
        if role in MASK_ROLES:
            continue
        _, offsets, flat = lists[role]
        numbers = numeric_numpy(flat.fill_null(0.0) if flat.null_count else flat)
        flat_numbers[name] = numbers
        magnitudes[name] = largest_magnitude(numbers) if numbers.size else 0.0
        if name in screened or math.isfinite(magnitudes[name]):
            continue
        bad_rows, bad_first = first_per_row(offsets, np.flatnonzero(~np.isfinite(numbers)))

        def non_finite_message(
            row: int, name=name, numbers=numbers, offsets=offsets, bad_rows=bad_rows, bad_first=bad_first
        ) -> str:
            position = bad_first[np.searchsorted(bad_rows, row)]
            return f"{name!r} is {numbers[position].item()} at token {position - offsets[row]}"

        flagged.flag(bad_rows, name, "non-finite", non_finite_message)
    return flat_numbers, magnitudes


def _terminal_numbers(flagged: Flagged, batch: pa.RecordBatch, columns: Columns) -> np.ndarray:
    """The terminal rewards ``[B]`` (nulls as 0), a NaN or ±Inf flagged ``non-finite``."""
    terminal = batch.column(columns.terminal_reward)
    terminal_numbers = numeric_numpy(terminal.fill_null(0) if terminal.null_count else terminal)
    if terminal_numbers.dtype.kind == "f" and not all_finite(terminal_numbers):
        flagged.flag(
            ~np.isfinite(terminal_numbers),
            columns.terminal_reward,
            "non-finite",
            lambda row: f"terminal reward is {terminal_numbers[row].item()}",
        )
    return terminal_numbers


def _flag_overflow(
    flagged: Flagged,
    batch: pa.RecordBatch,
    columns: Columns,
    lists: dict,
    magnitudes: dict,
    terminal_numbers: np.ndarray,
    mask_lengths: np.ndarray,
) -> None:
    """``overflow`` rule (:func:`gaecli.overflow.overflow_bounds`), on rows without another error;
    ``magnitudes``: each column's largest |x| (:func:`_flag_non_finite`)."""
    float_type = output_float_type(batch.schema, columns)
    summed = {name: lists[role][1:] for role, name in columns.token_columns() if role in ("values", "rewards")}
    largest_output = float(np.finfo(float_type.to_pandas_dtype()).max)
    summed_magnitudes = {name: magnitudes[name] for name in summed}
    if cannot_overflow(summed_magnitudes, columns, terminal_numbers, mask_lengths, largest_output):
        return
    bounds, contributors, largest = overflow_bounds(summed, columns, terminal_numbers)
    too_large = ~(bounds <= largest_output) & ~flagged.invalid
    if not too_large.any():
        return
    for index, name in enumerate(contributors):
        flagged.flag(
            too_large & (largest == index),
            name,
            "overflow",
            lambda row: (
                f"|values|, |rewards| and |terminal reward| add up to {bounds[row]:.3g}: "
                f"advantages or returns can overflow {np.dtype(float_type.to_pandas_dtype()).name}"
            ),
        )


def _flag_warnings(
    flagged: Flagged, trainable: np.ndarray, mask_offsets: np.ndarray, mask_lengths: np.ndarray, mask_name: str,
    estimator: str = "gae",
) -> None:
    """The warnings (on rows without an error): empty-response, fully-masked, masked-tail (in the words of
    ``estimator``'s :func:`tail_reading`)."""
    invalid = flagged.invalid.copy()
    any_trainable = trainable_counts(trainable, mask_offsets) > 0
    tails = np.where(any_trainable & ~invalid, masked_tail_lengths(trainable, mask_offsets), 0)
    meaning = TAIL_READINGS[tail_reading(estimator)][0].format(estimator=estimator)
    flagged.flag((mask_lengths == 0) & ~invalid, mask_name, "empty-response", "the response has no token")
    flagged.flag(
        (mask_lengths > 0) & ~any_trainable & ~invalid,
        mask_name,
        "fully-masked",
        "every token is masked: the sample trains nothing and its terminal reward is dropped",
    )
    flagged.flag(
        tails > 0,
        mask_name,
        "masked-tail",
        lambda row: (
            f"the response ends in {tails[row]} masked token{'s' if tails[row] != 1 else ''}: {meaning}"
        ),
    )


def check_batch(
    batch: pa.RecordBatch,
    columns: Columns,
    file: str,
    first_row: int,
    *,
    warnings: bool = False,
    ids: Optional[Sequence] = None,
    max_findings: Optional[int] = None,
    listed: Optional[Mapping[str, int]] = None,
    row_inputs: Sequence[RowInput] = (),
    screened: Collection[str] = (),
    estimator: str = "gae",
) -> BatchCheck:
    """Check every row of ``batch`` (rows numbered from ``first_row`` in the file).

    Errors: null, length-mismatch, response-length-mismatch, mask-value, outside-response
    (``columns.response_mask``: :func:`_flag_response_mask`), non-finite, overflow
    (:func:`gaecli.overflow.overflow_bounds`, on rows without another error).
    ``row_inputs``: the per-row inputs of the GAE variants to check too
    (:func:`check_row_inputs`). With ``warnings``: fully-masked, masked-tail (worded for
    ``estimator``), empty-response too (only on rows without an error). A row with a null
    list is not compared for lengths; a null response_length is not compared. ``ids[row]``
    (row in the batch) labels the findings; it is only looked up for rows with a finding.
    ``max_findings`` lists at most that many findings of each rule (the lowest rows first;
    ``listed``: code → findings listed already, which count against it); ``counts`` and
    ``invalid`` stay exact.
    ``screened``: the columns a kernel screens in its own pass (the mask's ``mask-value``
    rule and the numbers' ``non-finite`` rule are not checked for them here): the check then
    holds only with the kernel's ``clean`` flag, and when that is False, or this check finds
    a fault, the caller checks again without ``screened`` to name the fault
    (:func:`gaecli.pipeline.computed_batches`).
    The schema must have passed :func:`check_schema`. The common case, a clean batch, costs
    a few vectorised passes over the flat buffers; messages are built only for the findings
    listed.
    """
    flagged = Flagged(batch.num_rows)
    lists, null_rows = _flag_nulls(flagged, batch, columns)
    mask_lengths = _flag_lengths(flagged, batch, columns, lists, null_rows)
    mask_name = columns.loss_mask
    _, mask_offsets, mask_flat = lists["loss_mask"]
    mask = _mask_numbers(mask_flat)
    trainable = None  # where the kernel screens the mask, packing makes them (the one read)
    if mask_name not in screened:
        trainable = _mask_trainable(flagged, mask, mask_offsets, mask_name)
    numbers, magnitudes = _flag_non_finite(flagged, columns, lists, screened)
    flat_numbers = {mask_name: mask, **numbers}
    if columns.response_mask is not None:
        response_args = (lists, mask, trainable, null_rows, columns.response_mask)
        flat_numbers[columns.response_mask] = _flag_response_mask(flagged, *response_args)
    terminal_numbers = _terminal_numbers(flagged, batch, columns)
    if row_inputs:
        if trainable is None:
            trainable = mask if mask.dtype == np.bool_ else mask != 0
        for rows_at_fault, column, code, message in check_row_inputs(batch, row_inputs, trainable, mask_offsets):
            flagged.flag(rows_at_fault & ~null_rows, column, code, message)
    _flag_overflow(flagged, batch, columns, lists, magnitudes, terminal_numbers, mask_lengths)
    if warnings:
        if trainable is None:
            trainable = mask if mask.dtype == np.bool_ else mask != 0
        _flag_warnings(flagged, trainable, mask_offsets, mask_lengths, mask_name, estimator)
    findings = flagged.findings(file, first_row, ids, max_findings, listed)
    return BatchCheck(findings, flagged.invalid, flagged.counts, flat_numbers, mask_offsets, trainable)


ROW_INPUT_TYPES: dict[str, str] = {
    "turn_rewards": "a list of float or int",
    "truncated": "bool or an integer",
    "bootstrap_values": "a float or int",
    "turn_ids": "a list of integers",
}
"""The type each per-row input of the GAE variants must have, by role, in words."""


def row_input_type_ok(role: str, arrow_type: pa.DataType) -> bool:
    """Whether a column of ``arrow_type`` can hold the per-row input ``role`` (:data:`ROW_INPUT_TYPES`)."""
    if role == "turn_rewards":
        return is_list_type(arrow_type) and is_scalar_number_type(arrow_type.value_type)
    if role == "turn_ids":
        return is_list_type(arrow_type) and pa.types.is_integer(arrow_type.value_type)
    if role == "truncated":
        return pa.types.is_boolean(arrow_type) or pa.types.is_integer(arrow_type)
    return is_scalar_number_type(arrow_type)


def check_row_input_schema(schema: pa.Schema, row_inputs: Sequence[RowInput], file: str) -> list[Finding]:
    """File-level findings (``missing-column``, ``wrong-type``) of the GAE variants'
    per-row columns."""
    findings = []
    for needed in row_inputs:
        if needed.role not in ROW_INPUT_TYPES:
            continue
        if needed.name not in schema.names:
            findings.append(missing_column(file, needed.name, schema.names))
        elif not row_input_type_ok(needed.role, schema.field(needed.name).type):
            arrow_type = schema.field(needed.name).type
            message = f"column {needed.name!r} is {arrow_type}, expected {ROW_INPUT_TYPES[needed.role]}"
            findings.append(Finding(file, None, needed.name, "wrong-type", message))
    return findings


def check_row_inputs(
    batch: pa.RecordBatch, row_inputs: Sequence[RowInput], trainable: np.ndarray, mask_offsets: np.ndarray
) -> list[tuple[np.ndarray, str, str, object]]:
    """The row rules of the GAE variants' per-row columns (docs/variants.md), vectorised:
    (bool rows ``[B]`` at fault, column, rule code, message or message of a row) per rule
    broken. A turn-rewards list must be non-null, hold no null and no NaN or ±Inf, and hold
    one reward per turn of the row (``trainable``, ``mask_offsets``: the row's mask); a
    truncated flag must be non-null, and 0 or 1 in an integer column; a truncated row's
    bootstrap value must be non-null and finite; turn ids (:func:`_turn_id_rules`), when
    given, are the turns the turn rewards count. The columns' types are checked before
    (:func:`gaecli.pipeline.check_file`)."""
    found: list[tuple[np.ndarray, str, str, object]] = []
    rows = batch.num_rows
    by_role = {needed.role: needed.name for needed in row_inputs}
    ids = None
    if "turn_ids" in by_role:
        ids = _turn_id_rules(batch, by_role["turn_ids"], trainable, mask_offsets, found)
    name = by_role.get("turn_rewards")
    if name is not None:
        array = batch.column(name)
        offsets, flat = list_parts(array)
        null_list = np.asarray(array.is_null()) if array.null_count else np.zeros(rows, dtype=bool)
        found.append((null_list, name, "turn-rewards-null", "the turn-rewards list is null"))
        if flat.null_count:
            null_rows = rows_of_positions(offsets, np.flatnonzero(np.asarray(flat.is_null())))
            at_fault = np.zeros(rows, dtype=bool)
            at_fault[null_rows] = True
            found.append((at_fault, name, "turn-rewards-null", "the turn-rewards list holds a null"))
        turns = turn_counts(trainable, mask_offsets, ids)
        given = np.diff(offsets)
        length_message = lambda row: f"{name!r} has {given[row]} rewards, the row has {turns[row]} turns"  # noqa: E731
        found.append(((given != turns) & ~null_list, name, "turn-rewards-length", length_message))
        numbers = numeric_numpy(flat.fill_null(0.0) if flat.null_count else flat)
        faults = non_finite(numbers, offsets)
        if faults is not None:
            bad_rows, bad_first = faults
            at_fault = np.zeros(rows, dtype=bool)
            at_fault[bad_rows] = True

            def non_finite_turn(row: int) -> str:
                position = bad_first[np.searchsorted(bad_rows, row)]
                return f"{name!r} is {numbers[position].item()} at turn {position - offsets[row]}"

            found.append((at_fault, name, "turn-rewards-non-finite", non_finite_turn))
    flag_name, value_name = by_role.get("truncated"), by_role.get("bootstrap_values")
    if flag_name is not None:
        flags = batch.column(flag_name)
        if flags.null_count:
            found.append((np.asarray(flags.is_null()), flag_name, "truncated-null", "the truncated flag is null"))
        if pa.types.is_integer(flags.type):  # a flag, as the API takes one: 0 or 1
            given = numeric_numpy(flags.fill_null(0) if flags.null_count else flags)
            flag_message = lambda row: f"the truncated flag is {given[row].item()}, not 0 or 1"  # noqa: E731
            found.append((not_flags(given), flag_name, "truncated-value", flag_message))
        truncated = np.asarray(flags.cast(pa.bool_()).fill_null(False))
        values = batch.column(value_name)
        numbers = np.asarray(values.cast(pa.float64()).fill_null(np.nan))
        bad = truncated_without_bootstrap(truncated, numbers)
        bootstrap_message = lambda row: f"the row is truncated but {value_name!r} is {numbers[row]}"  # noqa: E731
        found.append((bad, value_name, "bootstrap-invalid", bootstrap_message))
    return found


def row_reasons(check: BatchCheck) -> dict[int, str]:
    """For each invalid row (0-based in the batch is not kept: rows are file rows), the
    messages of its errors joined by '; '."""
    reasons: dict[int, list[str]] = {}
    for finding in check.findings:
        if finding.severity == ERROR and finding.row is not None:
            reasons.setdefault(finding.row, []).append(f"{finding.column}: {finding.message} [{finding.code}]")
    return {row: "; ".join(messages) for row, messages in reasons.items()}


def _turn_id_rules(batch: pa.RecordBatch, name: str, trainable: np.ndarray, mask_offsets: np.ndarray, found: list):
    """The rules of a turn-ids column (docs/variants.md), added to ``found`` as
    :func:`check_row_inputs` words them: non-null lists without nulls (``turn-ids-null``), one
    id per token (``turn-ids-length``), ≥ 0 and non-decreasing at trainable tokens
    (``turn-ids-order``). Returns the ids laid over the tokens, int64 ``[N]``."""
    array = batch.column(name)
    offsets, flat = list_parts(array)
    null_list = np.asarray(array.is_null()) if array.null_count else np.zeros(batch.num_rows, dtype=bool)
    found.append((null_list, name, "turn-ids-null", "the turn-ids list is null"))
    if flat.null_count:
        at_fault = np.zeros(batch.num_rows, dtype=bool)
        at_fault[rows_of_positions(offsets, np.flatnonzero(np.asarray(flat.is_null())))] = True
        found.append((at_fault, name, "turn-ids-null", "the turn-ids list holds a null"))
    ids, same = aligned_turn_ids(offsets, numeric_numpy(flat.fill_null(0) if flat.null_count else flat), mask_offsets)
    given, lengths = np.diff(offsets), np.diff(mask_offsets)
    message = lambda row: f"{name!r} has {given[row]} ids, the row has {lengths[row]} tokens"  # noqa: E731
    found.append((~same & ~null_list, name, "turn-ids-length", message))
    faults = turn_id_faults(ids, trainable & np.repeat(same, lengths), mask_offsets)
    if faults is not None:
        at_fault = np.zeros(batch.num_rows, dtype=bool)
        at_fault[faults[0]] = True

        def out_of_order(row: int) -> str:
            position = faults[1][np.searchsorted(faults[0], row)]
            return (
                f"{name!r} is {ids[position]} at trainable token {position - mask_offsets[row]} "
                f"(turn ids must be >= 0 and non-decreasing at trainable tokens)"
            )

        found.append((at_fault, name, "turn-ids-order", out_of_order))
    return ids
