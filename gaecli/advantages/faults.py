"""Where a ragged batch breaks a rule of the input contract, found once in vectorised numpy:
the rows at fault and the first position at fault in each. The commands' checks
(:mod:`gaecli.checks`, which word a fault as a finding naming file, row and column) and the
API's (:mod:`gaecli.advantages.inputs`, which name the sample) both find faults with these.
Imports no torch."""

from __future__ import annotations

from typing import Optional

import numpy as np

from gaecli.advantages.layout import turn_table


def rows_of_positions(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The row (``offsets`` ``[B + 1]``) holding each flat position."""
    return np.searchsorted(offsets, positions, side="right") - 1


def first_per_row(offsets: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows holding sorted flat ``positions`` (ascending) and, per row, its first such
    position: the first row's is the first position of all."""
    rows, first = np.unique(rows_of_positions(offsets, positions), return_index=True)
    return rows, positions[first]


def all_finite(numbers: np.ndarray) -> bool:
    """Whether a float array holds no NaN or ±Inf; one reduction when it does not (an
    overflowing sum only sends it to the exact check)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(numbers.sum()):
            return True
    return bool(np.isfinite(numbers).all())


def non_finite(numbers: np.ndarray, offsets: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The rows with a NaN or ±Inf among flat ``numbers`` and the first such position in each
    (:func:`first_per_row`), or None when every number is finite."""
    if all_finite(numbers):
        return None
    return first_per_row(offsets, np.flatnonzero(~np.isfinite(numbers)))


def bad_mask_values(mask: np.ndarray, offsets: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The rows with a mask value other than 0 or 1 among flat ``mask`` and the first such
    position in each (:func:`first_per_row`), or None when every value is 0 or 1 (a bool mask,
    or an integer one within [0, 1], without comparing each token)."""
    if mask.dtype == np.bool_ or not mask.size:
        return None
    if mask.dtype.kind in "iu" and mask.min() >= 0 and mask.max() <= 1:
        return None
    bad_positions = np.flatnonzero((mask != 0) & (mask != 1))
    return first_per_row(offsets, bad_positions) if bad_positions.size else None


def turn_counts(trainable: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The number of turns (runs of trainable tokens) of each row ``[B]``: the length a
    turn-rewards list must have."""
    return np.diff(turn_table(trainable, offsets)[2])


def truncated_without_bootstrap(truncated: np.ndarray, bootstrap: np.ndarray) -> np.ndarray:
    """The rows (bool ``[B]``) flagged truncated whose bootstrap value is not finite."""
    return truncated & ~np.isfinite(bootstrap)
