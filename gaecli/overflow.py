"""The overflow bound of a batch: whether inputs that are all finite can still give a NaN or
±Inf advantage or return in the kernels, per row (:func:`overflow_bounds`) or for the whole
batch at once (:func:`cannot_overflow`); the checks' ``overflow`` rule reads it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gaecli.io.format import Columns, numeric_numpy

VALUE_WEIGHT = 3.0  # |returns| <= sum |delta| + |V| and |delta| <= |r| + |V'| + |V|: each value counts 3 times


def overflow_bounds(
    lists: dict[str, tuple[np.ndarray, pa.Array]], columns: Columns, terminal: np.ndarray
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """A bound (float64 ``[B]``) on every |advantage| and |return| of each row, for any
    γ, λ in [0, 1] and either semantics: Σ|rewards| + 3·Σ|values| + |terminal reward| (each
    TD error is at most |r| + |V'| + |V|, an advantage a sum of TD errors discounted by at
    most 1, a return an advantage plus its value). Where the bound stays below the output
    type's largest number the results are finite (what the kernels compute is checked
    too: :func:`gaecli.pipeline.computed_batches`); ``lists``: column name → (offsets,
    flat values). Also the contributors' names and, per row, the index of the largest (the
    column a finding names). KL rewards are not bounded here."""
    parts, names = [], []
    with np.errstate(over="ignore", invalid="ignore"):
        for name, (offsets, flat) in lists.items():
            magnitudes = np.abs(numeric_numpy(flat.fill_null(0.0) if flat.null_count else flat).astype(np.float64))
            padded = np.append(magnitudes, 0.0)  # reduceat needs an index for empty rows at the end
            sums = (
                np.where(np.diff(offsets) > 0, np.add.reduceat(padded, offsets[:-1]), 0.0)
                if offsets.size > 1
                else np.zeros(0)
            )
            parts.append(sums * (VALUE_WEIGHT if name == columns.values else 1.0))
            names.append(name)
        parts.append(np.abs(terminal.astype(np.float64)))
        names.append(columns.terminal_reward)
        stacked = np.stack(parts)
        bounds = stacked.sum(axis=0)
    largest = np.argmax(np.nan_to_num(stacked, nan=np.inf), axis=0)
    return bounds, names, largest


def cannot_overflow(
    numbers: dict[str, np.ndarray | float],
    columns: Columns,
    terminal: np.ndarray,
    lengths: np.ndarray,
    largest_output: float,
) -> bool:
    """Whether no row's :func:`overflow_bounds` can exceed ``largest_output``, from a bound
    on them all: the longest row times the largest |value| (counted VALUE_WEIGHT times) and
    |reward|, plus the largest |terminal reward|, within half of ``largest_output`` (room for
    the rounding of the per-row sums). ``numbers``: column name → its flat numbers (nulls as
    0, as :func:`overflow_bounds` takes them), or their largest |x| when known already (a
    float: :func:`_flag_non_finite`). One read of each flat buffer
    (:func:`gaecli.stats.largest_magnitude`), no temporary array; False (then the per-row
    bounds decide) for NaN or ±Inf, or a bound too large."""
    from gaecli.stats import largest_magnitude

    longest = float(lengths.max()) if lengths.size else 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        bound = float(np.max(np.abs(terminal.astype(np.float64)), initial=0.0))
        for name, flat in numbers.items():
            if isinstance(flat, float) or flat.size:
                magnitude = flat if isinstance(flat, float) else largest_magnitude(flat)
                bound += longest * magnitude * (VALUE_WEIGHT if name == columns.values else 1.0)
        return bool(bound <= largest_output / 2)
