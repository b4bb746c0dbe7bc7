"""Statistics for streaming work that do not depend on batch size or engine: exact sums,
the all-finite screen, and the per-row comparison, histograms and token sampling of ``gae diff``.
Group codes and keyed statistics: :mod:`gaecli.advantages.keyed`, :mod:`gaecli.advantages.statistics`."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numba
import numpy as np

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

    def merge(self, other: "ExactSum") -> None:
        """Add ``other``'s exact sum: its partials are added as numbers, so the result is
        the exact sum of both (merging partial sums in any order gives the same value)."""
        if other._count:
            self._count = _grow_partials(self._partials, self._count, other._partials[: other._count].copy())


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def all_finite(numbers) -> bool:
    """Whether every number of a flat float array is finite, in one read at the array's own
    width (no float64 copy): ``x · 0`` is 0 for a finite ``x`` and NaN for ±Inf or NaN, and
    a sum of zeros is 0. Reassociating the sum (so that it runs in vector lanes) changes no
    NaN into a number."""
    total = numbers.dtype.type(0.0)
    for position in range(numbers.shape[0]):
        total += numbers[position] * 0
    return total == 0


def largest_magnitude(numbers: np.ndarray) -> float:
    """The largest |x| of a flat float array (0.0 when empty; NaN when it holds a NaN), in
    one read at the array's own width: |x| orders as the integer of x's bits without the
    sign bit, and a NaN's is above every other's (±Inf's, the largest of the rest), so one
    integer maximum, which runs in vector lanes, gives both."""
    bits = _SIGNED_BITS[numbers.dtype.itemsize]
    largest = _largest_bits(np.ascontiguousarray(numbers).view(bits), bits.type(np.iinfo(bits).max))
    return float(np.array(largest, dtype=bits).view(numbers.dtype))


_SIGNED_BITS = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}  # by a float's width


@numba.njit(cache=True, nogil=True)
def _largest_bits(bits, magnitude):
    # the largest of bits & magnitude (each number's bits without its sign bit: a signed
    # integer of the float's width, never negative)
    largest = bits.dtype.type(0)
    for position in range(bits.shape[0]):
        largest = max(largest, bits[position] & magnitude)
    return largest


def mask_trainable(mask: np.ndarray) -> tuple[np.ndarray, bool]:
    """The trainable tokens (``mask != 0``, bool ``[N]``) of a flat integer or float mask
    and whether every value is 0 or 1, in one read."""
    trainable = np.empty(mask.shape[0], dtype=np.bool_)
    return trainable, _mask_trainable(mask, trainable)


@numba.njit(cache=True, nogil=True)
def _mask_trainable(mask, trainable):
    # trainable = mask != 0, and whether no value is other than 0 or 1 (a NaN is)
    other = False
    for position in range(mask.shape[0]):
        value = mask[position]
        nonzero = value != 0
        trainable[position] = nonzero
        other |= nonzero & (value != 1)
    return not other


# ----------------------------------------------------------------------------- gae diff


class SignedLogHistogram:
    """A fixed-bin histogram of signed numbers on a logarithmic scale, for quantiles in
    bounded memory with a stated error (the ``gae diff`` quantiles).

    |x| ≤ ``zero`` counts as 0. Otherwise |x| falls in the bin ``(b^(k-1), b^k]`` with
    ``b = (1 + α) / (1 − α)``; the bin's representative ``2 b^k / (b + 1)`` is within
    relative error α of every number in it. Magnitudes above ``largest`` share the last
    bin. Counts are exact integers, so a histogram does not depend on batch order or size.

    ``counts`` is ascending in value: negative bins (largest magnitude first), the zero
    bin at index ``bins``, then positive bins.
    """

    def __init__(self, relative_error: float = 0.005, zero: float = 1e-12, largest: float = 1e15) -> None:
        self.relative_error = relative_error
        self.zero = zero
        self.base = (1.0 + relative_error) / (1.0 - relative_error)
        self.inverse_log_base = 1.0 / math.log(self.base)
        self.first_exponent = math.ceil(math.log(zero) * self.inverse_log_base)
        self.bins = math.ceil(math.log(largest) * self.inverse_log_base) - self.first_exponent + 1
        self.counts = np.zeros(2 * self.bins + 1, dtype=np.int64)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def representatives(self) -> np.ndarray:
        """The representative magnitude of each bin ``[bins]`` (ascending)."""
        exponents = np.arange(self.bins) + self.first_exponent
        return 2.0 * np.power(self.base, exponents) / (self.base + 1.0)

    def magnitude_counts(self) -> tuple[int, np.ndarray]:
        """Counts of |x|: the zero bin, and per magnitude bin ``[bins]``."""
        center = self.bins
        return int(self.counts[center]), self.counts[center + 1 :] + self.counts[:center][::-1]

    def abs_quantile(self, q: float, maximum: float) -> float | None:
        """The nearest-rank q-quantile of |x| (the ⌈q·n⌉-th smallest, at least the 1st):
        exact in rank, within relative error α in value (0 for the zero bin), and never above
        ``maximum`` (the exact largest |x|). None when empty."""
        zeros, counts = self.magnitude_counts()
        total = zeros + int(counts.sum())
        if total == 0:
            return None
        rank = max(math.ceil(q * total), 1)
        if rank <= zeros:
            return 0.0
        index = int(np.searchsorted(np.cumsum(counts), rank - zeros))
        return min(float(self.representatives()[index]), maximum)

    def signed_bins(self) -> tuple[np.ndarray, np.ndarray]:
        """Nonzero bins as (signed representative, count), ascending; the zero bin left out."""
        reps = self.representatives()
        center = self.bins
        values = np.concatenate([-reps[::-1], reps])
        counts = np.concatenate([self.counts[:center], self.counts[center + 1 :]])
        kept = counts > 0
        return values[kept], counts[kept]


@numba.njit(cache=True, nogil=True)
def _log_bin(delta, histogram, zero, inverse_log_base, first_exponent, bins):
    magnitude = abs(delta)
    if magnitude <= zero:
        histogram[bins] += 1
        return
    k = np.int64(math.ceil(math.log(magnitude) * inverse_log_base)) - first_exponent
    if k < 0:
        k = 0
    elif k >= bins:
        k = bins - 1
    if delta > 0.0:
        histogram[bins + 1 + k] += 1
    else:
        histogram[bins - 1 - k] += 1


class RowDiff(NamedTuple):
    """The ``gae diff`` figures of each row of a batch (arrays ``[B]``), over its trainable
    tokens only; Δ = new − old. Return figures are 0 unless returns were compared."""

    max_abs: np.ndarray  # max |Δ|
    max_relative: np.ndarray  # max |Δ| / (1 + |new|)
    sum_abs: np.ndarray  # Σ |Δ|
    sign_flips: np.ndarray  # int64: tokens with new · old < 0
    max_abs_return: np.ndarray  # max |Δ return|
    sum_abs_return: np.ndarray  # Σ |Δ return|
    sum_new: np.ndarray  # Σ new
    sum_old: np.ndarray  # Σ old
    sum_new_sq: np.ndarray  # Σ new²
    sum_old_sq: np.ndarray  # Σ old²
    sum_cross: np.ndarray  # Σ new · old
    trainable_tokens: np.ndarray  # int64
    changed_tokens: np.ndarray  # int64: tokens with |Δ| / (1 + |new|) > tolerance


class DeltaHistograms(NamedTuple):
    """Where :func:`diff_rows` counts each trainable token's Δ advantage and Δ return: two
    :class:`SignedLogHistogram` of the same bins."""

    advantages: SignedLogHistogram
    returns: SignedLogHistogram


def diff_rows(
    new: np.ndarray,
    old: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    tolerance: float,
    *,
    returns: Optional[tuple[np.ndarray, np.ndarray]] = None,
    histograms: Optional[DeltaHistograms] = None,
) -> RowDiff:
    """Per row, over trainable tokens only (float64, serial in token order, so a row's
    figures depend on the row alone), the figures of ``gae diff`` (:class:`RowDiff`).

    Flat ``[N]`` ``new`` and ``old`` advantages and bool ``trainable``, zero-based int64
    ``offsets`` ``[B + 1]``; ``returns``: (new returns, old returns), flat ``[N]``, or None
    (return figures 0). With ``histograms``, each trainable token's Δ (and Δ return) is
    counted into them, in place.
    """
    new_returns, old_returns = returns if returns is not None else (None, None)
    counts, bins = None, (0.0, 1.0, 0, 0)  # the bins are not read without counts
    if histograms is not None:
        first, second = histograms
        bins = (first.zero, first.inverse_log_base, first.first_exponent, first.bins)
        if (second.zero, second.inverse_log_base, second.first_exponent, second.bins) != bins:
            raise ValueError("the Δ advantage and Δ return histograms must have the same bins")
        counts = (first.counts, second.counts)
    floats, integers, _ = _diff_rows(
        new, old, new_returns, old_returns, trainable, offsets, tolerance, counts, bins, False
    )
    return RowDiff(*floats[:3], integers[0], *floats[3:], integers[1], integers[2])


def screened_diff_rows(
    new: np.ndarray, old: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, tolerance: float
) -> Optional[RowDiff]:
    """:func:`diff_rows` (no returns, no histograms) in the same read as the all-finite
    screen of ``new`` and ``old`` (every token, trainable or not: as
    :func:`all_finite` of each): the figures, or None when a number of either is NaN or ±Inf."""
    floats, integers, finite = _diff_rows(
        new, old, None, None, trainable, offsets, tolerance, None, (0.0, 1.0, 0, 0), True
    )
    if not finite:
        return None
    return RowDiff(*floats[:3], integers[0], *floats[3:], integers[1], integers[2])


@numba.njit(cache=True, nogil=True)
def _diff_rows(new, old, new_returns, old_returns, trainable, offsets, tolerance, counts, bins, screened):
    # the loop of diff_rows: RowDiff's float figures [10, B] and its integer ones [3, B]
    # (sign flips, trainable tokens, changed tokens), in RowDiff's order; with screened,
    # whether every number of new and old is finite (else True). Returns and counts None:
    # not compared, not counted (each a type of its own, so the loop is compiled without
    # them)
    rows = offsets.shape[0] - 1
    floats = np.zeros((10, rows), dtype=np.float64)
    integers = np.zeros((3, rows), dtype=np.int64)
    finite = True
    for row in range(rows):
        start, end = offsets[row], offsets[row + 1]
        figures = _diff_row(
            new, old, new_returns, old_returns, trainable, start, end, tolerance, counts, bins, screened
        )
        for index in range(10):
            floats[index, row] = figures[0][index]
        for index in range(3):
            integers[index, row] = figures[1][index]
        finite = finite and figures[2]
    return floats, integers, finite


@numba.njit(cache=True, nogil=True)
def _diff_row(new, old, new_returns, old_returns, trainable, start, end, tolerance, counts, bins, screened):
    # one pass over a row's tokens (start to end), serial in token order: its float figures
    # and its integer ones, as _diff_rows orders them, and with screened whether new and old
    # are finite on every token: the masked tokens' by a sum of x · 0 (0 for a finite x, NaN
    # for NaN and ±Inf), the trainable ones' by Σ |Δ| (finite only when every Δ is, and a Δ
    # of a NaN or ±Inf is not; an overflow of finite numbers only says "not finite", which
    # the caller's exact check then corrects); maxima and counts as selects, not branches
    zero, inverse_log_base, first_exponent, bin_count = bins
    max_abs = max_relative = sum_abs = max_abs_return = sum_abs_return = 0.0
    sum_new = sum_old = sum_new_sq = sum_old_sq = sum_cross = 0.0
    masked_zeros = 0.0  # Σ (new · 0 + old · 0) over masked tokens: 0 unless one is NaN or ±Inf
    flips = count = changed = 0
    for t in range(start, end):
        a = np.float64(new[t])
        b = np.float64(old[t])
        if not trainable[t]:
            if screened:
                masked_zeros += a * 0.0 + b * 0.0
            continue
        delta = a - b
        magnitude = abs(delta)
        sum_abs += magnitude
        max_abs = magnitude if magnitude > max_abs else max_abs
        relative = magnitude / (1.0 + abs(a))
        max_relative = relative if relative > max_relative else max_relative
        changed += relative > tolerance
        flips += a * b < 0.0
        sum_new += a
        sum_old += b
        sum_new_sq += a * a
        sum_old_sq += b * b
        sum_cross += a * b
        count += 1
        if counts is not None:
            _log_bin(delta, counts[0], zero, inverse_log_base, first_exponent, bin_count)
        if new_returns is not None:
            return_delta = np.float64(new_returns[t]) - np.float64(old_returns[t])
            return_magnitude = abs(return_delta)
            sum_abs_return += return_magnitude
            max_abs_return = return_magnitude if return_magnitude > max_abs_return else max_abs_return
            if counts is not None:
                _log_bin(return_delta, counts[1], zero, inverse_log_base, first_exponent, bin_count)
    sums = (sum_new, sum_old, sum_new_sq, sum_old_sq, sum_cross)
    figures = (max_abs, max_relative, sum_abs, max_abs_return, sum_abs_return) + sums
    return figures, (flips, count, changed), masked_zeros == 0.0 and np.isfinite(sum_abs)


@numba.njit(cache=True, nogil=True)
def _splitmix64(x):
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def keyed_sample(trainable, first_key, threshold):
    """Positions and keys of the trainable tokens whose key is below ``threshold``: token
    ``t`` of the batch has key ``splitmix64(first_key + t)`` (uint64), so with
    ``first_key`` = a stream's salt plus the batch's first position in it, every token's
    key is fixed whatever the batching. Keeping the k smallest keys seen is a uniform
    sample of k tokens without replacement (bottom-k sampling)."""
    count = 0
    positions = np.empty(trainable.shape[0], dtype=np.int64)
    keys = np.empty(trainable.shape[0], dtype=np.uint64)
    base = np.uint64(first_key)
    for t in range(trainable.shape[0]):
        if trainable[t]:
            key = _splitmix64(base + np.uint64(t))
            if key < threshold:
                positions[count] = t
                keys[count] = key
                count += 1
    return positions[:count], keys[:count]
