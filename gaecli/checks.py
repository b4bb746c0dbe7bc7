"""The checks a rollout file must pass, shared by ``gae validate`` and ``gae recompute``:
file-level schema rules and vectorised per-batch row rules, each finding naming file, row,
column, a stable rule code and a message."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.io.format import (
    Columns,
    is_list_type,
    is_mask_element_type,
    is_real_type,
    is_scalar_number_type,
    list_parts,
    numeric_numpy,
)

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Rule:
    """A validation rule: stable code, severity, what it finds and how to fix it."""

    code: str
    severity: str
    summary: str
    hint: str


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule("missing-column", ERROR, "a required column is absent",
             "rename it with --values-col/--rewards-col/--mask-col/--terminal-col, or pass 'none' for values or rewards"),
        Rule("wrong-type", ERROR, "a column has a type other than the documented one",
             "cast it: lists of float32/float64 for values and rewards, lists of bool/int/float for the mask, a number for the terminal reward"),
        Rule("null", ERROR, "a null list, a null inside a list, or a null terminal reward",
             "drop the row or fill the nulls before training on it"),
        Rule("length-mismatch", ERROR, "values, rewards and loss_mask lists of a row differ in length",
             "the mask was cut or padded apart from the response: rebuild it to the response length"),
        Rule("response-length-mismatch", ERROR, "response_length disagrees with the list lengths",
             "trainers cut a longer mask and drop trailing tokens of a shorter one: align the lists with the response"),
        Rule("mask-value", ERROR, "a loss_mask value other than 0 or 1",
             "masks must be 0/1 (bool, int or float); threshold or rebuild the mask"),
        Rule("non-finite", ERROR, "NaN or ±Inf in values, rewards or the terminal reward",
             "find the step that produced it (critic divergence, log-prob of an impossible token) and drop the row"),
        Rule("fully-masked", WARNING, "every response token is masked",
             "the sample trains nothing and its terminal reward is dropped; check the mask builder"),
        Rule("masked-tail", WARNING, "the response ends in masked tokens",
             "the old GAE decayed this sample's terminal reward over the tail; recompute with gae recompute"),
        Rule("empty-response", WARNING, "the response has no token", "check the rollout that produced it"),
        Rule("duplicate-id", WARNING, "the id appears more than once in the file",
             "deduplicate the rows or name the right id column with --id-col"),
    )
}


@dataclass
class Finding:
    """One fault: ``row`` is 0-based in the file, None for file-level findings."""

    file: str
    row: Optional[int]
    column: Optional[str]
    code: str
    message: str
    id: Optional[object] = None

    @property
    def severity(self) -> str:
        return RULES[self.code].severity

    def to_dict(self) -> dict:
        document = asdict(self)
        document["severity"] = self.severity
        return {key: document[key] for key in ("file", "row", "id", "column", "code", "severity", "message")}

    def line(self) -> str:
        """One line for a human: ``file, row N, column C: message``."""
        where = [self.file]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        return f"{', '.join(where)}: {self.message} [{self.code}]"


def check_schema(schema: pa.Schema, columns: Columns, file: str) -> list[Finding]:
    """File-level findings: required columns missing or of the wrong type."""
    findings: list[Finding] = []

    def require(name: str, ok, expected: str) -> None:
        if name not in schema.names:
            findings.append(Finding(file, None, name, "missing-column", f"column {name!r} is missing (have: {', '.join(schema.names)})"))
        elif not ok(schema.field(name).type):
            findings.append(Finding(file, None, name, "wrong-type", f"column {name!r} is {schema.field(name).type}, expected {expected}"))

    for role, name in columns.token_columns():
        if role == "loss_mask":
            require(name, lambda t: is_list_type(t) and is_mask_element_type(t.value_type), "a list of bool, int or float")
        else:
            require(name, lambda t: is_list_type(t) and is_real_type(t.value_type), "a list of float32 or float64")
    require(columns.terminal_reward, is_scalar_number_type, "a float or int")
    if columns.response_length in schema.names and not pa.types.is_integer(schema.field(columns.response_length).type):
        findings.append(Finding(file, None, columns.response_length, "wrong-type",
                                f"column {columns.response_length!r} is {schema.field(columns.response_length).type}, expected an integer"))
    return findings


@dataclass
class BatchCheck:
    """Row findings of one batch and which rows are invalid (an error finding)."""

    findings: list[Finding] = field(default_factory=list)
    invalid: Optional[np.ndarray] = None

    @property
    def ok(self) -> bool:
        return not self.findings or not any(f.severity == ERROR for f in self.findings)


def _rows_of_flat_positions(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return np.searchsorted(offsets, positions, side="right") - 1


def trainable_counts(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    cumulative = np.zeros(mask.size + 1, dtype=np.int64)
    np.cumsum(mask, out=cumulative[1:])
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


def check_batch(
    batch: pa.RecordBatch,
    columns: Columns,
    file: str,
    first_row: int,
    *,
    warnings: bool = False,
    ids: Optional[list] = None,
) -> BatchCheck:
    """Check every row of ``batch`` (rows numbered from ``first_row`` in the file).

    Errors: null, length-mismatch, response-length-mismatch, mask-value, non-finite.
    With ``warnings``: fully-masked, masked-tail, empty-response too. ``ids`` (one per row)
    labels the findings. The schema must have passed :func:`check_schema`.
    The common case, a clean batch, costs a few vectorised passes over the flat buffers.
    """
    rows = batch.num_rows
    invalid = np.zeros(rows, dtype=bool)
    found: list[tuple[int, str, str, str]] = []  # (row in batch, column, code, message)

    def flag(bad_rows: np.ndarray, column: str, code: str, message) -> None:
        for row in np.flatnonzero(bad_rows) if bad_rows.dtype == bool else np.unique(bad_rows):
            found.append((int(row), column, code, message(int(row)) if callable(message) else message))
            if RULES[code].severity == ERROR:
                invalid[row] = True

    lists: dict[str, tuple[pa.Array, np.ndarray, pa.Array]] = {}
    for role, name in columns.token_columns():
        array = batch.column(name)
        offsets, flat = list_parts(array)
        lists[role] = (array, offsets, flat)
        if array.null_count:
            flag(np.asarray(array.is_null()), name, "null", "the list is null")
        if flat.null_count:
            null_rows = _rows_of_flat_positions(offsets, np.flatnonzero(np.asarray(flat.is_null())))
            flag(null_rows, name, "null", "the list holds a null")
    terminal = batch.column(columns.terminal_reward)
    if terminal.null_count:
        flag(np.asarray(terminal.is_null()), columns.terminal_reward, "null", "the terminal reward is null")

    lengths = {role: np.diff(offsets) for role, (_, offsets, _) in lists.items()}
    mask_name = columns.loss_mask
    mask_lengths = lengths["loss_mask"]
    for role, name in columns.token_columns():
        if role != "loss_mask":
            differ = lengths[role] != mask_lengths
            flag(differ, name, "length-mismatch",
                 lambda row, role=role, name=name: f"{name!r} has {lengths[role][row]} tokens, {mask_name!r} has {mask_lengths[row]}")
    if columns.response_length in batch.schema.names:
        declared = batch.column(columns.response_length)
        declared_values = np.asarray(declared.fill_null(-1))
        differ = declared_values != mask_lengths
        flag(differ, columns.response_length, "response-length-mismatch",
             lambda row: f"response_length is {declared_values[row]} but {mask_name!r} has {mask_lengths[row]} tokens")

    _, mask_offsets, mask_flat = lists["loss_mask"]
    mask = numeric_numpy(mask_flat.fill_null(0) if mask_flat.null_count else mask_flat)
    if mask.dtype != np.bool_:
        bad_positions = np.flatnonzero((mask != 0) & (mask != 1))
        if bad_positions.size:
            first_bad = {}
            for position, row in zip(bad_positions, _rows_of_flat_positions(mask_offsets, bad_positions)):
                first_bad.setdefault(int(row), int(position))
            flag(np.array(sorted(first_bad), dtype=np.int64), mask_name, "mask-value",
                 lambda row: f"loss_mask value {mask[first_bad[row]]!r} at token {first_bad[row] - mask_offsets[row]} is not 0 or 1")
    for role, name in columns.token_columns():
        if role == "loss_mask":
            continue
        _, offsets, flat = lists[role]
        numbers = numeric_numpy(flat.fill_null(0.0) if flat.null_count else flat)
        if not np.isfinite(numbers).all():
            bad_positions = np.flatnonzero(~np.isfinite(numbers))
            first_bad = {}
            for position, row in zip(bad_positions, _rows_of_flat_positions(offsets, bad_positions)):
                first_bad.setdefault(int(row), int(position))
            flag(np.array(sorted(first_bad), dtype=np.int64), name, "non-finite",
                 lambda row, numbers=numbers, offsets=offsets, first_bad=first_bad:
                 f"{numbers[first_bad[row]]} at token {first_bad[row] - offsets[row]}")
    terminal_numbers = np.asarray(terminal.fill_null(0)) if terminal.null_count else np.asarray(terminal)
    if terminal_numbers.dtype.kind == "f":
        flag(~np.isfinite(terminal_numbers), columns.terminal_reward, "non-finite",
             lambda row: f"terminal reward is {terminal_numbers[row]}")

    if warnings:
        trainable_mask = mask != 0
        trainable = trainable_counts(trainable_mask, mask_offsets)
        flag((mask_lengths == 0) & ~invalid, mask_name, "empty-response", "the response has no token")
        flag((mask_lengths > 0) & (trainable == 0) & ~invalid, mask_name, "fully-masked",
             "every token is masked: the sample trains nothing and its terminal reward is dropped")
        tails = masked_tail_lengths(trainable_mask, mask_offsets)
        flag((tails > 0) & (trainable > 0) & ~invalid, mask_name, "masked-tail",
             lambda row: f"the response ends in {tails[row]} masked token{'s' if tails[row] != 1 else ''}: "
             f"the old GAE decayed the terminal reward over them")

    findings = [
        Finding(file, first_row + row, column, code, message, None if ids is None else ids[row])
        for row, column, code, message in sorted(found, key=lambda item: item[0])
    ]
    return BatchCheck(findings, invalid)


def masked_tail_lengths(trainable: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Masked tokens after each row's last trainable token (its whole length when fully
    masked, 0 when empty). int64 ``[B]``."""
    positions = np.where(trainable, np.arange(trainable.size), -1)
    ends = offsets[1:]
    nonempty = ends > offsets[:-1]
    last = np.full(ends.size, -1, dtype=np.int64)
    if nonempty.any():
        last[nonempty] = np.maximum.reduceat(positions, offsets[:-1][nonempty])
    starts_minus_one = offsets[:-1] - 1
    last = np.where(last >= 0, last, starts_minus_one)
    return np.where(nonempty, ends - 1 - last, 0)


def first_error(findings: list[Finding]) -> Optional[Finding]:
    """The error with the lowest row (file-level errors first), or None."""
    errors = [f for f in findings if f.severity == ERROR]
    return min(errors, key=lambda f: -1 if f.row is None else f.row) if errors else None


def row_reasons(check: BatchCheck) -> dict[int, str]:
    """For each invalid row (0-based in the batch is not kept: rows are file rows), the
    messages of its errors joined by '; '."""
    reasons: dict[int, list[str]] = {}
    for finding in check.findings:
        if finding.severity == ERROR and finding.row is not None:
            reasons.setdefault(finding.row, []).append(f"{finding.column}: {finding.message} [{finding.code}]")
    return {row: "; ".join(messages) for row, messages in reasons.items()}

