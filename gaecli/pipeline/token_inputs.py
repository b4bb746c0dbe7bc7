"""The estimators' own per-token columns in a run (optimal-token-baseline's log-probs and Σπ²,
:meth:`gaecli.pipeline.description.Computation.estimator_token_columns`): their types before
a file's rows are read (:func:`check_token_columns`), their invalid rows
(:func:`token_input_findings`), and a batch's return and path weight of every token
(:func:`batch_paths`, the operand of the (group, position) statistics)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gaecli.checks import Finding
from gaecli.errors import GAEUsageError
from gaecli.io.format import is_list_type, is_scalar_number_type, list_parts, numeric_numpy


def check_token_columns(schema: pa.Schema, file: str, named: tuple[tuple[str, str], ...]) -> None:
    """Each ``(option, column)`` of ``named`` present and a list of numbers; otherwise
    :class:`GAEUsageError` naming the file, the option and the column."""
    for flag, name in named:
        if name not in schema.names:
            raise GAEUsageError(f"{file}: {flag} column {name!r} is missing (have: {', '.join(schema.names)})")
        arrow_type = schema.field(name).type
        if not (is_list_type(arrow_type) and is_scalar_number_type(arrow_type.value_type)):
            raise GAEUsageError(f"{file}: {flag} column {name!r} is {arrow_type}, expected a list of numbers per row")


def _token_floats(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zero-based offsets ``[B + 1]``, the flat values of a list column as float64 (a null
    value as NaN) and which values are null (bool ``[N]``)."""
    offsets, flat = list_parts(column)
    nulls = np.asarray(flat.is_null()) if flat.null_count else np.zeros(len(flat), dtype=bool)
    flat = flat.cast(pa.float64())
    return offsets, numeric_numpy(flat.fill_null(np.nan) if flat.null_count else flat), nulls


def token_input_findings(
    batch: pa.RecordBatch, named: tuple[tuple[str, str], ...], mask_name: str, file: str, first_row: int
) -> list[Finding]:
    """One finding per invalid row (the lowest row first; the first column and token of a
    row named): a null list (``null``), a list whose length is not the mask's
    (``length-mismatch``), a null (``null``) or NaN / ±Inf (``non-finite``) value at a
    trainable token. Values at masked tokens are not read."""
    if not named:
        return []
    mask_offsets, mask_flat = list_parts(batch.column(mask_name))
    mask = numeric_numpy(mask_flat.fill_null(0) if mask_flat.null_count else mask_flat)
    lengths = np.diff(mask_offsets)
    found: dict[int, Finding] = {}
    for flag, name in named:
        column = batch.column(name)
        offsets, numbers, nulls = _token_floats(column)
        null_rows = np.asarray(column.is_null()) if column.null_count else np.zeros(batch.num_rows, dtype=bool)
        wrong = (np.diff(offsets) != lengths) & ~null_rows
        for row in np.flatnonzero(null_rows).tolist():
            found.setdefault(row, Finding(file, first_row + row, name, "null", f"the {flag} list is null"))
        for row in np.flatnonzero(wrong).tolist():
            message = f"{name!r} has {int(offsets[row + 1] - offsets[row])} tokens, {mask_name!r} has {lengths[row]}"
            found.setdefault(row, Finding(file, first_row + row, name, "length-mismatch", message))
        tokens = np.flatnonzero((mask != 0) & np.repeat(~(null_rows | wrong), lengths))
        rows = np.searchsorted(mask_offsets, tokens, side="right") - 1
        aligned = tokens - mask_offsets[rows] + offsets[rows]  # the same token in this column
        bad = np.flatnonzero(~np.isfinite(numbers[aligned]))
        bad = bad[np.unique(rows[bad], return_index=True)[1]]  # the first of each row
        for token, row, at in zip(tokens[bad].tolist(), rows[bad].tolist(), aligned[bad].tolist()):
            if row in found:
                continue
            code, text = ("null", "null") if nulls[at] else ("non-finite", numbers[at].item())
            message = f"{name!r} ({flag}) is {text} at trainable token {token - int(mask_offsets[row])}"
            found[row] = Finding(file, first_row + row, name, code, message)
    return [found[row] for row in sorted(found)]


def token_numbers(valid: pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` of a checked batch (its lists as long as the mask's), flat float64 ``[N]``."""
    return _token_floats(valid.column(name))[1]


def batch_paths(valid: pa.RecordBatch, packed, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The returns and path weights of a checked, packed batch (float64 ``[2, N]``,
    :func:`gaecli.advantages.token_baseline.path_operand`; ``names``: the log-probs and Σπ²
    columns) and the rows where one did not stay finite (bool ``[B]``)."""
    from gaecli.advantages.token_baseline import path_operand

    log_probs, sum_pi_squared = (token_numbers(valid, name) for name in names)
    with np.errstate(over="ignore", invalid="ignore"):
        paths = path_operand(
            packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards, log_probs, sum_pi_squared
        )
    broken = ~np.isfinite(paths).all(axis=0)
    rows = packed.offsets.size - 1
    bad = np.zeros(rows, dtype=bool)
    if broken.any():
        bad[np.searchsorted(packed.offsets, np.flatnonzero(broken), side="right") - 1] = True
    return paths, bad
