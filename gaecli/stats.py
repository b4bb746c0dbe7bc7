"""Order-independent statistics for streaming work: exact sums (so that results do not
depend on batch size, partitioning or engine), per-row moments and comparisons, and the
whitening statistics of ``--normalize``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PARTIALS_CAPACITY = 256


@numba.njit(cache=True, nogil=True)
def _grow_partials(partials, count, numbers):
    # Shewchuk's exact summation: partials hold non-overlapping float64 pieces whose exact
    # sum is the exact sum of every number added so far.
    for k in range(numbers.shape[0]):
        x = numbers[k]
        used = 0
        for j in range(count):
            y = partials[j]
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low != 0.0:
                partials[used] = low
                used += 1
            x = high
        partials[used] = x
        count = used + 1
    return count


class ExactSum:
    """The exact sum of float64 numbers added in any order and any grouping; :meth:`value`
    is that sum correctly rounded. Numbers must be finite."""

    def __init__(self) -> None:
        self._partials = np.zeros(PARTIALS_CAPACITY, dtype=np.float64)
        self._count = 0

    def add(self, numbers: np.ndarray) -> None:
        numbers = np.ascontiguousarray(numbers, dtype=np.float64)
        if numbers.size:
            self._count = _grow_partials(self._partials, self._count, numbers.ravel())

    def value(self) -> float:
        return math.fsum(self._partials[: self._count])


@numba.njit(cache=True, nogil=True)
def row_moments(advantages, trainable, offsets):
    """Per row: trainable-token count, sum and sum of squares of the advantages (float64,
    summed serially in token order, so a row's figures depend on the row alone)."""
    rows = offsets.shape[0] - 1
    counts = np.zeros(rows, dtype=np.int64)
    sums = np.zeros(rows, dtype=np.float64)
    squares = np.zeros(rows, dtype=np.float64)
    for row in range(rows):
        total = 0.0
        total_sq = 0.0
        n = 0
        for t in range(offsets[row], offsets[row + 1]):
            if trainable[t]:
                a = np.float64(advantages[t])
                total += a
                total_sq += a * a
                n += 1
        counts[row] = n
        sums[row] = total
        squares[row] = total_sq
    return counts, sums, squares


@numba.njit(cache=True, nogil=True)
def compare_rows(new, old, trainable, offsets):
    """Per row, over trainable tokens: max |new − old|, max |new − old| / (1 + |new|), and
    the sum of |new − old| (float64, serial in token order)."""
    rows = offsets.shape[0] - 1
    max_abs = np.zeros(rows, dtype=np.float64)
    max_relative = np.zeros(rows, dtype=np.float64)
    sum_abs = np.zeros(rows, dtype=np.float64)
    for row in range(rows):
        for t in range(offsets[row], offsets[row + 1]):
            if trainable[t]:
                a = np.float64(new[t])
                delta = abs(a - np.float64(old[t]))
                sum_abs[row] += delta
                if delta > max_abs[row]:
                    max_abs[row] = delta
                relative = delta / (1.0 + abs(a))
                if relative > max_relative[row]:
                    max_relative[row] = relative
    return max_abs, max_relative, sum_abs


@dataclass
class Moments:
    """Exact running count, sum and sum of squares of one group's trainable advantages."""

    count: int = 0
    total: ExactSum = field(default_factory=ExactSum)
    squares: ExactSum = field(default_factory=ExactSum)

    def mean_std(self, epsilon: float) -> tuple[float, float]:
        """Mean and ``sqrt(var + epsilon)`` with the Bessel-corrected variance (0 for one
        token). Raises ValueError for an empty group."""
        if self.count == 0:
            raise ValueError("no trainable token")
        mean = self.total.value() / self.count
        if self.count > 1:
            variance = max(self.squares.value() - self.total.value() * mean, 0.0) / (self.count - 1)
        else:
            variance = 0.0
        return mean, math.sqrt(variance + epsilon)


class GroupedMoments:
    """Moments per group key (one key, ``None``, for whole-input whitening)."""

    def __init__(self) -> None:
        self.groups: dict[Hashable, Moments] = {}

    def add(self, keys: pa.Array | None, counts: np.ndarray, sums: np.ndarray, squares: np.ndarray) -> None:
        """Add per-row moments; ``keys`` is an Arrow array of one group key per row (None: one group)."""
        if keys is None:
            self._add_group(None, counts, sums, squares)
            return
        codes, uniques = _encode(keys)
        for code, key in enumerate(uniques):
            rows = codes == code
            self._add_group(key, counts[rows], sums[rows], squares[rows])

    def _add_group(self, key, counts, sums, squares) -> None:
        moments = self.groups.setdefault(key, Moments())
        moments.count += int(counts.sum())
        moments.total.add(sums)
        moments.squares.add(squares)

    def row_stats(self, keys: pa.Array | None, rows: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """Per-row mean and std of the row's group."""
        if keys is None:
            mean, std = self.groups[None].mean_std(epsilon)
            return np.full(rows, mean), np.full(rows, std)
        codes, uniques = _encode(keys)
        means = np.empty(len(uniques))
        stds = np.empty(len(uniques))
        for code, key in enumerate(uniques):
            means[code], stds[code] = self.groups[key].mean_std(epsilon)
        return means[codes], stds[codes]


def _encode(keys: pa.Array) -> tuple[np.ndarray, list]:
    """Row codes into the list of distinct keys (nulls are a key of their own, None)."""
    encoded = pc.dictionary_encode(keys, null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()
