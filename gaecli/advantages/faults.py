"""Where a ragged batch breaks a rule of the input contract, found once in vectorised numpy:
the rows at fault and the first position at fault in each. The commands' checks
(:mod:`gaecli.checks`, which word a fault as a finding naming file, row and column) and the
API's (:mod:`gaecli.advantages.inputs`, which name the sample) both find faults with these.
Imports no torch."""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np

from gaecli.advantages.layout import array_module, id_turn_table, read_tail, turn_table


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


def all_binary(mask: np.ndarray) -> bool:
    """Whether every value of a flat mask is 0 or 1 (one compiled pass for a float mask)."""
    if mask.dtype == np.bool_ or not mask.size:
        return True
    if mask.dtype.kind in "iu":
        return bool(mask.min() >= 0 and mask.max() <= 1)
    return bool(_all_binary(mask))


@numba.njit(cache=True, nogil=True)
def _all_binary(mask):
    # integer flags, no early exit: the loop vectorises (4x a boolean one)
    bad = 0
    for i in range(mask.shape[0]):
        value = mask[i]
        bad |= np.int32(value != 0) & np.int32(value != 1)
    return bad == 0


def outside_response(
    trainable: np.ndarray, offsets: np.ndarray, response: np.ndarray, response_offsets: np.ndarray, rows=None
) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The rows with a trainable token (bool ``trainable`` ``[N]``, ``offsets`` ``[B + 1]``)
    whose response mask (bool ``response``, its own ``response_offsets``) is 0, and the first
    such trainable position in each (:func:`first_per_row`), or None. Only the rows ``rows``
    (bool ``[B]``; None: every row) are read, each as long as its response mask."""
    lengths = np.diff(offsets)
    if rows is None and np.array_equal(offsets, response_offsets):
        bad = np.flatnonzero(trainable & ~response)
    else:
        kept = trainable if rows is None else trainable & np.repeat(rows, lengths)
        candidates = np.flatnonzero(kept)
        shift = np.repeat(response_offsets[:-1] - offsets[:-1], lengths)[candidates]
        bad = candidates[~response[candidates + shift]]
    return first_per_row(offsets, bad) if bad.size else None


def turn_counts(trainable: np.ndarray, offsets: np.ndarray, turn_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """The number of turns (runs of trainable tokens, or the distinct ids of ``turn_ids``
    ``[N]`` at trainable tokens) of each row ``[B]``: the length a turn-rewards list must have."""
    if turn_ids is not None:
        return np.diff(id_turn_table(trainable, offsets, turn_ids)[2])
    return np.diff(turn_table(trainable, offsets)[2])


def aligned_turn_ids(id_offsets: np.ndarray, ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Turn-id lists (flat int ``ids`` with their ``id_offsets`` ``[B + 1]``) laid over the
    tokens (``offsets`` ``[B + 1]``): int64 ``[N]`` (0 in the rows whose list is not of the
    row's length) and those rows' bool ``[B]`` (True: the lengths agree)."""
    lengths = np.diff(offsets)
    same = np.diff(id_offsets) == lengths
    if same.all():
        return np.asarray(ids, dtype=np.int64)[: int(offsets[-1])], same
    rows = np.repeat(np.arange(lengths.size), lengths)
    index = id_offsets[rows] + (np.arange(int(offsets[-1])) - offsets[rows])
    kept = same[rows] & (index < ids.size)
    aligned = np.zeros(int(offsets[-1]), dtype=np.int64)
    aligned[kept] = np.asarray(ids, dtype=np.int64)[index[kept]]
    return aligned, same


def turn_id_faults(
    turn_ids: np.ndarray, trainable: np.ndarray, offsets: np.ndarray
) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The rows whose turn ids (int ``[N]``) break the order rule at a trainable token (an id
    below 0, or below the previous trainable token's of the row) and the first such position
    in each (:func:`first_per_row`), or None."""
    positions = np.flatnonzero(trainable)
    ids = turn_ids[positions]
    rows = rows_of_positions(offsets, positions)
    bad = ids < 0
    bad[1:] |= (ids[1:] < ids[:-1]) & (rows[1:] == rows[:-1])
    return first_per_row(offsets, positions[bad]) if bad.any() else None


def truncated_without_bootstrap(truncated, bootstrap):
    """The rows (bool ``[B]``) flagged truncated whose bootstrap value is not finite (numpy
    arrays or tensors, where they are)."""
    xp = array_module(truncated)
    return truncated & ~xp.isfinite(bootstrap)


def not_flags(values):
    """The rows (bool ``[B]``) whose truncated flag is neither 0 nor 1 (numbers of any kind, numpy
    arrays or tensors, where they are): the API's rule and the commands' ``truncated-value``."""
    return (values != 0) & (values != 1)


def screen_rows(mask: np.ndarray, values: np.ndarray, rewards: np.ndarray, offsets: np.ndarray):
    """One parallel pass over a batch held to the contract's errors and tails, per row ``[B]``:
    whether a mask value is neither 0 nor 1, whether a value or a reward is NaN or ±Inf, the
    flat index of the last trainable token (-1: none), that of the last nonzero reward at or
    after it (-1: none) and the sum of the rewards after it (added from the row's end backwards, as
    :func:`gaecli.advantages.layout.row_tails` adds them). Flat ``mask`` (any real dtype),
    ``values`` and ``rewards`` ``[N]``, ``offsets`` ``[B + 1]``. Where a row is flagged, which
    token is at fault is for the caller to find (the slow path runs only then)."""
    from gaecli.advantages.kernels.compiled import thread_count

    thread_count()  # numba's pool started as a good neighbour to torch
    return _screen_rows(mask, values, rewards, np.asarray(offsets, dtype=np.int64))


@numba.njit(cache=True, nogil=True, parallel=True)
def _screen_rows(mask, values, rewards, offsets):
    rows = offsets.shape[0] - 1
    bad_mask = np.zeros(rows, dtype=np.bool_)
    bad_values = np.zeros(rows, dtype=np.bool_)
    bad_rewards = np.zeros(rows, dtype=np.bool_)
    last = np.full(rows, -1, dtype=np.int64)
    last_reward = np.full(rows, -1, dtype=np.int64)
    tail = np.zeros(rows, dtype=rewards.dtype)
    for row in numba.prange(rows):
        flags_mask, flags_values, flags_rewards = 0, 0, 0
        start = np.uint64(offsets[row])  # unsigned: no wraparound test, no branch: the loop vectorises
        for j in range(np.uint64(offsets[row + 1] - offsets[row])):
            marked = mask[start + j]
            flags_mask |= np.int32(marked != 0) & np.int32(marked != 1)
            flags_values |= np.int32((values[start + j] - values[start + j]) != 0)  # NaN, or Inf − Inf
            flags_rewards |= np.int32((rewards[start + j] - rewards[start + j]) != 0)
        bad_mask[row], bad_values[row], bad_rewards[row] = flags_mask != 0, flags_values != 0, flags_rewards != 0
        read_tail(mask, rewards, offsets[row], offsets[row + 1], last, last_reward, tail, row)
    return bad_mask, bad_values, bad_rewards, last, last_reward, tail
