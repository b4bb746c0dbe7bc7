"""How far old advantages are from the masked-GAE ones (``gae diff`` as a library): a
streaming accumulator of the figures over trainable tokens (masked positions are 0 by
contract and not compared), figures per group, the top samples, a token sample for plots,
and the run over files that feeds them.

Memory is bounded: exact counts, sums (:class:`gaecli.stats.ExactSum`) and maxima; the
quantiles come from fixed-bin log histograms (:class:`gaecli.stats.SignedLogHistogram`,
relative error :data:`QUANTILE_RELATIVE_ERROR`); the plots' token sample holds at most
:data:`SCATTER_SAMPLE` tokens; the top samples keep their per-token arrays (K × length).
Every figure is independent of the batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from gaecli._version import __version__
from gaecli.checks import masked_tail_lengths
from gaecli.errors import GAEUsageError, InvalidOptionError
from gaecli.flat import BASELINES, check_discount
from gaecli.io.filesystem import to_path, total_size
from gaecli.io.format import Columns
from gaecli.io.paths import check_writes, discover_inputs, report_writes
from gaecli.io.reader import DEFAULT_BATCH_ROWS, RolloutFile
from gaecli.engines import EngineOptions, EngineSession, TaskFailure, map_units
from gaecli.pipeline import (
    Computation, check_device, check_file, check_scalar_column, computed_batches, engine_moments, normalize_label, whiten_rows,
)
from gaecli.options import check_choice, check_count, check_number
from gaecli.progress import NoProgress, Progress
from gaecli.stats import ExactSum, GroupedMoments, SignedLogHistogram, diff_rows, encode_keys, keyed_sample

QUANTILE_RELATIVE_ERROR = 0.005
QUANTILE_ZERO = 1e-12
SCATTER_SAMPLE = 20_000
DEFAULT_TOP = 10
NO_THRESHOLD = np.uint64(2**64 - 1)
QUANTILE_METHOD = {
    "name": "log-histogram",
    "relative_error": QUANTILE_RELATIVE_ERROR,
    "zero_below": QUANTILE_ZERO,
    "rank": "nearest rank (the ceil(q·n)-th smallest), exact",
    "description": "fixed bins (b^(k-1), b^k] with b = (1 + e) / (1 - e) over |Δ|; a quantile is exact in rank "
                   "and within relative error e in value; |Δ| <= zero_below counts as 0; never above the exact max",
}


def terminal_credit(baseline: Optional[str], gamma: float, lambd: float, tail_lengths: np.ndarray) -> np.ndarray:
    """Share of the terminal reward that ``baseline`` delivers to the last trainable token
    of samples whose response ends in ``tail_lengths`` masked tokens (masked GAE: 1).

    ``unmasked``: (γλ)^gap (so 0 when γλ = 0 and gap > 0); ``skip-masked``: 0 whenever the
    last token is masked, else 1; ``zero-masked`` and ``masked``: 1. ``None`` (stored
    advantages, ``--against``): NaN, the credit is not defined.
    """
    tails = np.asarray(tail_lengths, dtype=np.float64)
    if baseline is None:
        return np.full_like(tails, np.nan)
    if baseline == "unmasked":
        return np.power(gamma * lambd, tails)
    if baseline == "skip-masked":
        return np.where(tails > 0, 0.0, 1.0)
    return np.ones_like(tails)


# ----------------------------------------------------------------------------- rows


@dataclass
class RowFigures:
    """The figures of each row of one batch (arrays ``[B]``), over its trainable tokens.

    ``masked_tail``: masked tokens after the last trainable one (0 for fully masked and
    empty rows). ``credit``: terminal credit of the old advantages (NaN without a trainable
    token or under stored advantages). Return figures are NaN when no old returns are known.
    ``sums``: ``[B, 5]`` Σ new, Σ old, Σ new², Σ old², Σ new·old.
    """

    lengths: np.ndarray
    trainable: np.ndarray
    masked_tail: np.ndarray
    max_abs: np.ndarray
    max_relative: np.ndarray
    sum_abs: np.ndarray
    sign_flips: np.ndarray
    max_abs_return: np.ndarray
    sum_abs_return: np.ndarray
    credit: np.ndarray
    changed: np.ndarray
    sums: np.ndarray

    @property
    def fully_masked(self) -> np.ndarray:
        return (self.lengths > 0) & (self.trainable == 0)

    @property
    def with_tail(self) -> np.ndarray:
        return self.masked_tail > 0

    @property
    def mean_abs(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.trainable > 0, self.sum_abs / np.maximum(self.trainable, 1), np.nan)

    @property
    def mean_abs_return(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.trainable > 0, self.sum_abs_return / np.maximum(self.trainable, 1), np.nan)

    @property
    def masked_share(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.lengths > 0, (self.lengths - self.trainable) / np.maximum(self.lengths, 1), np.nan)


def _quantile_from_counts(counts: np.ndarray, q: float) -> Optional[int]:
    """Nearest-rank q-quantile of integers given as counts per value."""
    total = int(counts.sum())
    if total == 0:
        return None
    rank = max(math.ceil(q * total), 1)
    return int(np.searchsorted(np.cumsum(counts), rank))


def _ratio(part, whole) -> Optional[float]:
    if part is None or not whole:
        return None
    return float(part) / float(whole)


def _mean_std(count: int, total: float, squares: float) -> tuple[Optional[float], Optional[float]]:
    """Mean and Bessel-corrected std from exact sums (std None below 2 values)."""
    if count == 0:
        return None, None
    mean = total / count
    if count < 2:
        return mean, None
    return mean, math.sqrt(max(squares - total * mean, 0.0) / (count - 1))


def _correlation(count: float, sums) -> Optional[float]:
    """Pearson correlation from Σx, Σy, Σx², Σy², Σxy (None when a variance is 0)."""
    sum_x, sum_y, sum_xx, sum_yy, sum_xy = sums
    if count < 2:
        return None
    covariance = sum_xy - sum_x * sum_y / count
    variance_x = sum_xx - sum_x * sum_x / count
    variance_y = sum_yy - sum_y * sum_y / count
    if variance_x <= 0.0 or variance_y <= 0.0:
        return None
    return float(max(-1.0, min(1.0, covariance / math.sqrt(variance_x * variance_y))))


RECOMPUTE_SUMMARY_KEYS = (
    "baseline", "tolerance", "samples", "tokens", "trainable_tokens", "changed_samples", "fully_masked_samples",
    "empty_samples", "masked_tail_samples", "mean_masked_tail_length", "longest_masked_tail", "mean_terminal_credit",
    "min_terminal_credit", "mean_abs_delta_advantage", "max_abs_delta_advantage",
)


@dataclass
class DiffAccumulator:
    """Streaming comparison of new (masked) against old advantages, batch by batch.

    Every figure is exact or order independent, so it does not depend on batch sizes.
    ``baseline`` None means stored old advantages (no terminal credit). ``quantiles``
    keeps the log histograms of Δ advantage and Δ return (median, p99; about 15 ns a
    trainable token). :meth:`result` is ``gae recompute``'s summary, :meth:`figures` the
    full ``gae diff`` summary.
    """

    gamma: float
    lambd: float
    baseline: Optional[str] = "unmasked"
    tolerance: float = 1e-6
    quantiles: bool = False
    samples: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    changed_samples: int = 0
    changed_tokens: int = 0
    fully_masked_samples: int = 0
    empty_samples: int = 0
    masked_tail_samples: int = 0
    masked_tail_tokens: int = 0
    longest_masked_tail: int = 0
    max_abs_delta: float = 0.0
    min_terminal_credit: float = 1.0
    zero_credit_samples: int = 0
    sign_flips: int = 0
    returns_compared: bool = False
    max_abs_delta_return: float = 0.0
    _abs_delta_sum: ExactSum = field(default_factory=ExactSum)
    _abs_delta_return_sum: ExactSum = field(default_factory=ExactSum)
    _credit_sum: ExactSum = field(default_factory=ExactSum)
    _sums: list = field(default_factory=lambda: [ExactSum() for _ in range(5)])
    _tail_counts: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    histogram: SignedLogHistogram = field(default_factory=lambda: SignedLogHistogram(QUANTILE_RELATIVE_ERROR, QUANTILE_ZERO))
    return_histogram: SignedLogHistogram = field(default_factory=lambda: SignedLogHistogram(QUANTILE_RELATIVE_ERROR, QUANTILE_ZERO))

    def update(
        self,
        new: np.ndarray,
        old: np.ndarray,
        trainable: np.ndarray,
        offsets: np.ndarray,
        *,
        new_returns: Optional[np.ndarray] = None,
        old_returns: Optional[np.ndarray] = None,
    ) -> RowFigures:
        """Add one batch: flat ``[N]`` new and old advantages (and returns, optional), bool
        ``trainable``, zero-based int64 ``offsets`` ``[B + 1]``. Returns the rows' figures."""
        with_returns = new_returns is not None and old_returns is not None
        if not with_returns:
            new_returns = old_returns = new
        histogram, return_histogram = self.histogram, self.return_histogram
        figures = diff_rows(
            new, old, new_returns, old_returns, with_returns, trainable, offsets, self.tolerance, self.quantiles,
            histogram.counts, return_histogram.counts, histogram.zero, histogram.inverse_log_base,
            histogram.first_exponent, histogram.bins,
        )
        lengths = np.diff(offsets)
        trainable_per_row = figures[:, 11].astype(np.int64)
        tails = np.where(trainable_per_row > 0, masked_tail_lengths(trainable, offsets), 0)
        credit = np.full(lengths.size, np.nan)
        has_trainable = trainable_per_row > 0
        credit[has_trainable] = terminal_credit(self.baseline, self.gamma, self.lambd, tails[has_trainable])
        nan = np.full(lengths.size, np.nan)
        rows = RowFigures(
            lengths=lengths, trainable=trainable_per_row, masked_tail=tails,
            max_abs=figures[:, 0], max_relative=figures[:, 1], sum_abs=figures[:, 2],
            sign_flips=figures[:, 3].astype(np.int64),
            max_abs_return=figures[:, 4] if with_returns else nan, sum_abs_return=figures[:, 5] if with_returns else nan,
            credit=credit, changed=figures[:, 1] > self.tolerance, sums=figures[:, 6:11],
        )
        self.samples += lengths.size
        self.tokens += int(lengths.sum())
        self.trainable_tokens += int(trainable_per_row.sum())
        self.changed_samples += int(rows.changed.sum())
        self.changed_tokens += int(figures[:, 12].sum())
        self.empty_samples += int((lengths == 0).sum())
        self.fully_masked_samples += int(rows.fully_masked.sum())
        self.max_abs_delta = max(self.max_abs_delta, float(rows.max_abs.max(initial=0.0)))
        self._abs_delta_sum.add(rows.sum_abs)
        self.sign_flips += int(rows.sign_flips.sum())
        for total, column in zip(self._sums, rows.sums.T):
            total.add(column)
        if with_returns:
            self.returns_compared = True
            self.max_abs_delta_return = max(self.max_abs_delta_return, float(rows.max_abs_return.max(initial=0.0)))
            self._abs_delta_return_sum.add(rows.sum_abs_return)
        with_tail = rows.with_tail
        tail_lengths = tails[with_tail]
        self.masked_tail_samples += int(with_tail.sum())
        self.masked_tail_tokens += int(tail_lengths.sum())
        self.longest_masked_tail = max(self.longest_masked_tail, int(tail_lengths.max(initial=0)))
        if tail_lengths.size:
            counts = np.bincount(tail_lengths)
            if counts.size > self._tail_counts.size:
                counts[: self._tail_counts.size] += self._tail_counts
                self._tail_counts = counts
            else:
                self._tail_counts[: counts.size] += counts
        if self.baseline is not None:
            credits = credit[with_tail]
            self._credit_sum.add(credits)
            self.min_terminal_credit = min(self.min_terminal_credit, float(credits.min(initial=1.0)))
            self.zero_credit_samples += int((credits == 0.0).sum())
        return rows

    def merge(self, other: "DiffAccumulator") -> None:
        """Add the figures of another partition (another file, another worker): counts add,
        exact sums merge exactly, maxima and minima combine, histograms add — so merging
        partitions in any grouping gives the figures of one pass over all the rows."""
        for name in ("samples", "tokens", "trainable_tokens", "changed_samples", "changed_tokens", "fully_masked_samples",
                     "empty_samples", "masked_tail_samples", "masked_tail_tokens", "zero_credit_samples", "sign_flips"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.longest_masked_tail = max(self.longest_masked_tail, other.longest_masked_tail)
        self.max_abs_delta = max(self.max_abs_delta, other.max_abs_delta)
        self.min_terminal_credit = min(self.min_terminal_credit, other.min_terminal_credit)
        self.returns_compared = self.returns_compared or other.returns_compared
        self.max_abs_delta_return = max(self.max_abs_delta_return, other.max_abs_delta_return)
        self._abs_delta_sum.merge(other._abs_delta_sum)
        self._abs_delta_return_sum.merge(other._abs_delta_return_sum)
        self._credit_sum.merge(other._credit_sum)
        for mine, theirs in zip(self._sums, other._sums):
            mine.merge(theirs)
        size = max(self._tail_counts.size, other._tail_counts.size)
        tail_counts = np.zeros(size, dtype=np.int64)
        tail_counts[: self._tail_counts.size] += self._tail_counts
        tail_counts[: other._tail_counts.size] += other._tail_counts
        self._tail_counts = tail_counts
        self.histogram.counts += other.histogram.counts
        self.return_histogram.counts += other.return_histogram.counts

    def result(self) -> dict:
        """The summary of ``gae recompute`` (its keys are documented in docs/recompute.md): a
        subset of :meth:`figures`, in that document's order."""
        figures = self.figures()
        return {key: figures[key] for key in RECOMPUTE_SUMMARY_KEYS}

    def figures(self) -> dict:
        """Every figure as a JSON-ready dict (the ``summary`` of ``gae diff``, every key
        documented in docs/diff.md)."""
        tail = self.masked_tail_samples
        trainable = self.trainable_tokens
        credit_defined = self.baseline is not None and tail > 0
        sum_new, sum_old, sum_new_sq, sum_old_sq, sum_cross = (total.value() for total in self._sums)
        new_mean, new_std = _mean_std(trainable, sum_new, sum_new_sq)
        old_mean, old_std = _mean_std(trainable, sum_old, sum_old_sq)
        result = {
            "baseline": self.baseline,
            "tolerance": self.tolerance,
            "samples": self.samples,
            "tokens": self.tokens,
            "trainable_tokens": trainable,
            "trainable_share": _ratio(trainable, self.tokens),
            "changed_samples": self.changed_samples,
            "changed_share": _ratio(self.changed_samples, self.samples),
            "changed_tokens": self.changed_tokens,
            "changed_token_share": _ratio(self.changed_tokens, trainable),
            "fully_masked_samples": self.fully_masked_samples,
            "empty_samples": self.empty_samples,
            "masked_tail_samples": tail,
            "mean_masked_tail_length": self.masked_tail_tokens / tail if tail else None,
            "median_masked_tail_length": _quantile_from_counts(self._tail_counts, 0.5),
            "p99_masked_tail_length": _quantile_from_counts(self._tail_counts, 0.99),
            "longest_masked_tail": self.longest_masked_tail,
            "mean_terminal_credit": self._credit_sum.value() / tail if credit_defined else None,
            "min_terminal_credit": self.min_terminal_credit if credit_defined else None,
            "zero_credit_samples": self.zero_credit_samples if self.baseline is not None else None,
            "mean_abs_delta_advantage": self._abs_delta_sum.value() / trainable if trainable else 0.0,
            "median_abs_delta_advantage": self._quantile(self.histogram, 0.5, self.max_abs_delta),
            "p99_abs_delta_advantage": self._quantile(self.histogram, 0.99, self.max_abs_delta),
            "max_abs_delta_advantage": self.max_abs_delta,
        }
        if self.returns_compared:
            result.update({
                "mean_abs_delta_return": self._abs_delta_return_sum.value() / trainable if trainable else 0.0,
                "median_abs_delta_return": self._quantile(self.return_histogram, 0.5, self.max_abs_delta_return),
                "p99_abs_delta_return": self._quantile(self.return_histogram, 0.99, self.max_abs_delta_return),
                "max_abs_delta_return": self.max_abs_delta_return,
            })
        else:
            result.update({f"{stat}_abs_delta_return": None for stat in ("mean", "median", "p99", "max")})
        for quantity in ("advantage", "return"):
            for stat in ("mean", "median", "p99", "max"):
                value = result[f"{stat}_abs_delta_{quantity}"]
                result[f"{stat}_abs_delta_{quantity}_over_std"] = value / new_std if value is not None and new_std else None
        result.update({
            "sign_flip_tokens": self.sign_flips,
            "sign_flip_share": _ratio(self.sign_flips, trainable),
            "correlation": _correlation(trainable, (sum_new, sum_old, sum_new_sq, sum_old_sq, sum_cross)),
            "new_advantage_mean": new_mean,
            "new_advantage_std": new_std,
            "old_advantage_mean": old_mean,
            "old_advantage_std": old_std,
        })
        return result

    def _quantile(self, histogram: SignedLogHistogram, q: float, maximum: float) -> Optional[float]:
        if not self.quantiles or not self.trainable_tokens:
            return None
        return histogram.abs_quantile(q, maximum)


# ----------------------------------------------------------------------------- groups


GROUP_SUMS = (
    "samples", "tokens", "trainable_tokens", "changed_samples", "fully_masked_samples", "masked_tail_samples",
    "credit_sum", "sum_abs", "sum_abs_return", "sign_flips", "sum_new", "sum_old", "sum_new_sq", "sum_old_sq", "sum_cross",
)


class GroupedFigures:
    """The main figures per value of the ``--group-by`` column. Sums are added row by row
    in file order within a file (``np.add.at``), and files' sums in input order
    (:meth:`merge`), so they depend neither on the batch size nor on the engine."""

    def __init__(self, baseline: Optional[str]) -> None:
        self.baseline = baseline
        self.codes: dict[Any, int] = {}
        self.keys: list = []
        self.sums = np.zeros((0, len(GROUP_SUMS)))
        self.maxima = np.zeros((0, 2))  # max |Δ advantage|, max |Δ return|
        self.returns_compared = False

    def update(self, keys: pa.Array, rows: RowFigures) -> np.ndarray:
        """Add one batch's rows under their group keys; returns each row's group code."""
        local, uniques = encode_keys(keys)
        mapping = np.empty(len(uniques), dtype=np.int64)
        for index, key in enumerate(uniques):
            code = self.codes.get(key)
            if code is None:
                code = self.codes[key] = len(self.keys)
                self.keys.append(key)
            mapping[index] = code
        if len(self.keys) > self.sums.shape[0]:
            grow = len(self.keys) - self.sums.shape[0]
            self.sums = np.vstack([self.sums, np.zeros((grow, self.sums.shape[1]))])
            self.maxima = np.vstack([self.maxima, np.zeros((grow, 2))])
        codes = mapping[local]
        with_returns = not np.isnan(rows.max_abs_return).all() if rows.lengths.size else False
        self.returns_compared |= with_returns
        credit = np.where(rows.with_tail & ~np.isnan(rows.credit), rows.credit, 0.0)
        values = np.column_stack([
            np.ones(rows.lengths.size), rows.lengths, rows.trainable, rows.changed, rows.fully_masked, rows.with_tail,
            credit, rows.sum_abs, np.nan_to_num(rows.sum_abs_return), rows.sign_flips, rows.sums,
        ]).astype(np.float64)
        np.add.at(self.sums, codes, values)
        np.maximum.at(self.maxima, codes, np.column_stack([rows.max_abs, np.nan_to_num(rows.max_abs_return)]))
        return codes

    def merge(self, other: "GroupedFigures") -> None:
        """Add another partition's groups (the next file): sums add, maxima combine, new keys
        come after ours in their first-seen order. Files are merged in input order, so the
        figures do not depend on the engine or the number of workers."""
        codes = np.empty(len(other.keys), dtype=np.int64)
        for index, key in enumerate(other.keys):
            code = self.codes.get(key)
            if code is None:
                code = self.codes[key] = len(self.keys)
                self.keys.append(key)
            codes[index] = code
        if len(self.keys) > self.sums.shape[0]:
            grow = len(self.keys) - self.sums.shape[0]
            self.sums = np.vstack([self.sums, np.zeros((grow, self.sums.shape[1]))])
            self.maxima = np.vstack([self.maxima, np.zeros((grow, 2))])
        self.sums[codes] += other.sums
        self.maxima[codes] = np.maximum(self.maxima[codes], other.maxima)
        self.returns_compared |= other.returns_compared

    def result(self) -> list[dict]:
        """One dict per group, in key order (first-seen order when keys do not sort)."""
        order = list(range(len(self.keys)))
        try:
            order.sort(key=lambda code: (self.keys[code] is None, self.keys[code]))
        except TypeError:
            pass
        groups = []
        for code in order:
            row = dict(zip(GROUP_SUMS, self.sums[code].tolist()))
            samples, trainable = int(row["samples"]), int(row["trainable_tokens"])
            tail = int(row["masked_tail_samples"])
            groups.append({
                "key": json_value(self.keys[code]),
                "samples": samples,
                "tokens": int(row["tokens"]),
                "trainable_tokens": trainable,
                "changed_samples": int(row["changed_samples"]),
                "changed_share": _ratio(row["changed_samples"], samples),
                "fully_masked_samples": int(row["fully_masked_samples"]),
                "masked_tail_samples": tail,
                "mean_terminal_credit": row["credit_sum"] / tail if tail and self.baseline is not None else None,
                "mean_abs_delta_advantage": row["sum_abs"] / trainable if trainable else 0.0,
                "max_abs_delta_advantage": float(self.maxima[code, 0]),
                "mean_abs_delta_return": (row["sum_abs_return"] / trainable if trainable else 0.0) if self.returns_compared else None,
                "max_abs_delta_return": float(self.maxima[code, 1]) if self.returns_compared else None,
                "sign_flip_share": _ratio(row["sign_flips"], trainable),
                "correlation": _correlation(trainable, [row[k] for k in ("sum_new", "sum_old", "sum_new_sq", "sum_old_sq", "sum_cross")]),
            })
        return groups


def json_value(value):
    """A key or id as JSON can hold it: numbers and strings as they are, the rest as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)


# ----------------------------------------------------------------------------- top samples


@dataclass
class TopSample:
    """One of the samples with the largest max |Δ advantage|, with its per-token arrays
    (new and old advantages, trainable mask) for the plots."""

    file_index: int
    file: str
    row: int
    id: Any
    group: Any
    length: int
    trainable_tokens: int
    masked_share: float
    masked_tail: int
    max_abs_delta_advantage: float
    mean_abs_delta_advantage: float
    max_abs_delta_return: Optional[float]
    sign_flips: int
    terminal_credit: Optional[float]
    changed: bool
    new: np.ndarray = field(repr=False)
    old: np.ndarray = field(repr=False)
    trainable: np.ndarray = field(repr=False)

    @property
    def order(self) -> tuple:
        """Largest max |Δ| first; ties by file, then row."""
        return (-self.max_abs_delta_advantage, self.file_index, self.row)

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "row": self.row,
            "id": json_value(self.id),
            "group": json_value(self.group),
            "length": self.length,
            "trainable_tokens": self.trainable_tokens,
            "masked_share": self.masked_share,
            "masked_tail": self.masked_tail,
            "max_abs_delta_advantage": self.max_abs_delta_advantage,
            "mean_abs_delta_advantage": self.mean_abs_delta_advantage,
            "max_abs_delta_return": self.max_abs_delta_return,
            "sign_flips": self.sign_flips,
            "terminal_credit": self.terminal_credit,
            "changed": self.changed,
        }


def _finite_or_none(value: float) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


class TopSamples:
    """The K samples with the largest max |Δ advantage| (samples without any difference are
    not listed), ties broken by (file, row): per batch a partition picks at most K
    candidates, which are merged into the kept list only when they beat its last entry."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.entries: list[TopSample] = []

    def candidates(self, max_abs: np.ndarray) -> np.ndarray:
        """Rows of a batch that may enter: at most K, the largest first, ties by row."""
        if self.k == 0:
            return np.zeros(0, dtype=np.int64)
        rows = np.flatnonzero(max_abs > 0.0)
        if rows.size > self.k:
            scores = max_abs[rows]
            kth = np.partition(scores, rows.size - self.k)[rows.size - self.k]
            above, equal = rows[scores > kth], rows[scores == kth]
            rows = np.concatenate([above, equal[: self.k - above.size]])
        if len(self.entries) == self.k:
            worst = self.entries[-1].max_abs_delta_advantage
            rows = rows[max_abs[rows] >= worst]
        return rows

    def offer(self, entries: list[TopSample]) -> None:
        self.entries = sorted(self.entries + entries, key=lambda entry: entry.order)[: self.k]

    def merge(self, other: "TopSamples") -> None:
        """Add another partition's top samples: the K first by the same order key (largest
        max |Δ|, then file, then row), so any partition gives the same list."""
        self.offer(other.entries)


# ----------------------------------------------------------------------------- token sample


class TokenSample:
    """A uniform sample of at most ``capacity`` trainable tokens (new, old advantage) for
    the scatter plot: each token gets a fixed pseudo-random key from (file, position) and
    the ``capacity`` smallest keys are kept (bottom-k sampling), so the sample does not
    depend on the batch size."""

    def __init__(self, capacity: int = SCATTER_SAMPLE) -> None:
        self.capacity = capacity
        self.keys = np.zeros(0, dtype=np.uint64)
        self.new = np.zeros(0)
        self.old = np.zeros(0)

    def threshold(self) -> np.uint64:
        return self.keys.max() if self.keys.size >= self.capacity else NO_THRESHOLD

    def update(self, new: np.ndarray, old: np.ndarray, trainable: np.ndarray, file_index: int, first_token: int) -> None:
        if self.capacity == 0:
            return
        first_key = (file_index << 40) + first_token
        positions, keys = keyed_sample(trainable, np.uint64(first_key), self.threshold())
        if positions.size == 0:
            return
        self.keys = np.concatenate([self.keys, keys])
        self.new = np.concatenate([self.new, new[positions].astype(np.float64)])
        self.old = np.concatenate([self.old, old[positions].astype(np.float64)])
        if self.keys.size > self.capacity:
            kept = np.argpartition(self.keys, self.capacity - 1)[: self.capacity]
            self.keys, self.new, self.old = self.keys[kept], self.new[kept], self.old[kept]

    def merge(self, other: "TokenSample") -> None:
        """Add another partition's sample: the ``capacity`` smallest keys of both (keys are
        fixed per (file, token), so any partition keeps the same tokens)."""
        keys = np.concatenate([self.keys, other.keys])
        new = np.concatenate([self.new, other.new])
        old = np.concatenate([self.old, other.old])
        if keys.size > self.capacity:
            kept = np.argsort(keys, kind="stable")[: self.capacity]
            keys, new, old = keys[kept], new[kept], old[kept]
        self.keys, self.new, self.old = keys, new, old

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """(new, old) in key order."""
        order = np.argsort(self.keys, kind="stable")
        return self.new[order], self.old[order]


# ----------------------------------------------------------------------------- options, report


@dataclass(frozen=True)
class DiffOptions:
    """Everything that shapes a diff (the CLI options, one to one).

    Old advantages: the ``baseline`` semantics recomputed from the same data (None means
    ``unmasked``), or with ``against`` the stored column (and ``against_returns`` the
    stored returns); ``baseline`` and ``against`` together are refused. ``normalize`` /
    ``normalize_by`` whiten new and old the same way, each with its own statistics.
    ``report_paths``: files the caller will write reports to, paths or (role, path) pairs
    (refused when one is an input or another output).
    Every value is checked when the options are made (:meth:`check`).
    """

    gamma: float
    lambd: float
    baseline: Optional[str] = None
    against: Optional[str] = None
    against_returns: Optional[str] = None
    normalize: bool = False
    normalize_by: Optional[str] = None
    group_by: Optional[str] = None
    id_col: Optional[str] = None
    top: int = DEFAULT_TOP
    tolerance: float = 1e-6
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: int = DEFAULT_BATCH_ROWS
    columns: Columns = field(default_factory=Columns)
    per_sample: Optional[str] = None
    report_paths: tuple = ()
    scatter_sample: int = SCATTER_SAMPLE

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) a value out of range or not one of its
        choices, a kernel or device not usable here, and contradicting options."""
        from gaecli.kernels import resolve_kernel

        check_discount(self.gamma, self.lambd, names=("--gamma", "--lambd"))
        if self.against is not None and self.baseline is not None:
            raise InvalidOptionError("--against compares with stored advantages, --baseline with recomputed ones: "
                                     "give one of them")
        if self.against_returns is not None and self.against is None:
            raise InvalidOptionError("--against-returns needs --against (the stored advantages to compare)")
        if self.baseline is not None:
            check_choice("--baseline", self.baseline, BASELINES, "baseline")
        check_count("--batch-rows", self.batch_rows, 1)
        check_count("--top", self.top, 0)
        check_number("--tol", self.tolerance, 0.0)
        check_device(self.device)
        resolve_kernel(self.kernel, self.device)

    @property
    def whitening(self) -> bool:
        return self.normalize or self.normalize_by is not None

    @property
    def old_semantics(self) -> Optional[str]:
        """The baseline recomputed as the old advantages; None under ``against``."""
        if self.against is not None:
            return None
        return self.baseline or "unmasked"


@dataclass
class DiffReport:
    """The result of a diff: the JSON document's parts, plus what the plots need (the Δ
    advantage histogram, the token sample, the top samples' per-token arrays)."""

    options: DiffOptions
    kernel: str
    files: list[dict]
    summary: dict
    groups: Optional[list[dict]]
    top: list[TopSample]
    histogram: SignedLogHistogram
    scatter: tuple[np.ndarray, np.ndarray]

    def to_dict(self) -> dict:
        """The JSON document of ``gae diff --json`` (every key in docs/diff.md)."""
        options = self.options
        return {
            "version": __version__,
            "gamma": options.gamma,
            "lambd": options.lambd,
            "kernel": self.kernel,
            "new": "masked",
            "old": {
                "source": "stored" if options.against is not None else "baseline",
                "baseline": options.old_semantics,
                "advantages_column": options.against,
                "returns_column": options.against_returns,
            },
            "normalize": normalize_label(options),
            "tolerance": options.tolerance,
            "group_by": options.group_by,
            "id_col": options.id_col,
            "top": options.top,
            "files": self.files,
            "quantiles": dict(QUANTILE_METHOD),
            "summary": self.summary,
            "top_samples": [entry.to_dict() for entry in self.top],
            "groups": self.groups,
            "per_sample": options.per_sample,
        }


# ----------------------------------------------------------------------------- per-sample file


PER_SAMPLE_FIGURES = [
    ("length", pa.int64()), ("trainable_tokens", pa.int64()), ("masked_share", pa.float64()),
    ("masked_tail", pa.int64()), ("fully_masked", pa.bool_()), ("changed", pa.bool_()),
    ("max_abs_delta_advantage", pa.float64()), ("mean_abs_delta_advantage", pa.float64()),
    ("max_relative_delta_advantage", pa.float64()), ("max_abs_delta_return", pa.float64()),
    ("mean_abs_delta_return", pa.float64()), ("sign_flips", pa.int64()), ("terminal_credit", pa.float64()),
]


def _nullable(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, arrow_type, mask=np.isnan(values))


def per_sample_schema(first: pa.Schema, options: DiffOptions) -> pa.Schema:
    """``--per-sample``'s schema: file, row, id and group (typed as in the first file,
    dictionaries decoded), then the figures."""
    fields = [pa.field("file", pa.string()), pa.field("row", pa.int64())]
    for name, column in (("id", options.id_col), ("group", options.group_by)):
        if column is not None:
            arrow_type = first.field(column).type
            fields.append(pa.field(name, arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type))
    fields.extend(pa.field(name, arrow_type) for name, arrow_type in PER_SAMPLE_FIGURES)
    return pa.schema(fields)


def per_sample_batch(schema: pa.Schema, file: str, first_row: int, rows: RowFigures, ids: Optional[pa.Array],
                     groups: Optional[pa.Array]) -> pa.RecordBatch:
    """One batch's rows of the ``--per-sample`` file (one row per sample)."""
    count = rows.lengths.size
    arrays = [pa.array([file] * count, pa.string()), pa.array(np.arange(first_row, first_row + count), pa.int64())]
    for name, column in (("id", ids), ("group", groups)):
        if name in schema.names:
            arrow_type = schema.field(name).type
            try:
                arrays.append(column if column.type == arrow_type else column.cast(arrow_type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise GAEUsageError(f"{file}: {name} column has type {column.type}, the first file's is {arrow_type}") from error
    figures = {
        "length": pa.array(rows.lengths, pa.int64()),
        "trainable_tokens": pa.array(rows.trainable, pa.int64()),
        "masked_share": _nullable(rows.masked_share, pa.float64()),
        "masked_tail": pa.array(rows.masked_tail, pa.int64()),
        "fully_masked": pa.array(rows.fully_masked, pa.bool_()),
        "changed": pa.array(rows.changed, pa.bool_()),
        "max_abs_delta_advantage": pa.array(rows.max_abs, pa.float64()),
        "mean_abs_delta_advantage": _nullable(rows.mean_abs, pa.float64()),
        "max_relative_delta_advantage": pa.array(rows.max_relative, pa.float64()),
        "max_abs_delta_return": _nullable(rows.max_abs_return, pa.float64()),
        "mean_abs_delta_return": _nullable(rows.mean_abs_return, pa.float64()),
        "sign_flips": pa.array(rows.sign_flips, pa.int64()),
        "terminal_credit": _nullable(rows.credit, pa.float64()),
    }
    arrays.extend(figures[name] for name, _ in PER_SAMPLE_FIGURES)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ----------------------------------------------------------------------------- one file


def computation_of(options: DiffOptions, kernel: str) -> Computation:
    """The pipeline settings of a diff (``kernel`` resolved)."""
    return Computation(
        gamma=options.gamma, lambd=options.lambd, kernel=kernel, device=options.device,
        batch_rows=options.batch_rows, columns=options.columns, old_semantics=options.old_semantics,
        against=options.against, against_returns=options.against_returns, normalize_by=options.normalize_by,
    )


def _check_file(schema: pa.Schema, file: str, options: DiffOptions, computation: Computation) -> None:
    check_file(schema, file, computation)
    for flag, name in (("--group-by", options.group_by), ("--id-col", options.id_col)):
        check_scalar_column(schema, file, flag, name)


def _read_columns(schema: pa.Schema, options: DiffOptions) -> list[str]:
    columns = options.columns
    wanted = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    wanted |= {name for name in (options.against, options.against_returns, options.normalize_by,
                                 options.group_by, options.id_col) if name is not None}
    return [name for name in schema.names if name in wanted]


@dataclass
class FilePart:
    """What the work unit of one file sends back, merged in input order by the parent:
    the figures (:class:`DiffAccumulator`, with its histograms), the groups, the file's top
    samples and token sample, and its ``--per-sample`` batches (one per read batch)."""

    file: str
    rows: int
    tokens: int
    accumulator: DiffAccumulator
    groups: Optional[GroupedFigures]
    top: TopSamples
    sample: TokenSample
    per_sample: Optional[list[pa.RecordBatch]] = field(default=None, repr=False)


def diff_unit(
    index: int,
    path: str,
    options: DiffOptions,
    kernel: str,
    moments: Optional[tuple[GroupedMoments, GroupedMoments]] = None,
    per_sample: Optional[pa.Schema] = None,
    progress: Optional[Progress] = None,
) -> FilePart:
    """Diff one file (the work unit of every engine; file ``index`` in the input order,
    which keys its top samples and token sample). ``moments``: the merged ``--normalize``
    statistics (new, old); ``per_sample``: the ``--per-sample`` schema, when one is
    written. ``progress`` (optional) is advanced per batch."""
    computation = computation_of(options, kernel)
    part = FilePart(
        file=path, rows=0, tokens=0,
        accumulator=DiffAccumulator(options.gamma, options.lambd, options.old_semantics, options.tolerance, quantiles=True),
        groups=GroupedFigures(options.old_semantics) if options.group_by is not None else None,
        top=TopSamples(options.top), sample=TokenSample(options.scatter_sample),
        per_sample=[] if per_sample is not None else None,
    )
    rollout = RolloutFile(path)
    try:
        _check_file(rollout.schema, path, options, computation)
        for computed in computed_batches(rollout, computation, _read_columns(rollout.schema, options)):
            batch, packed, new, old = computed.batch, computed.packed, computed.new, computed.old
            first_row, first_token = computed.first_row, computed.first_token
            if moments is not None:
                keys = computed.keys(options.normalize_by)
                new = np.where(packed.trainable, whiten_rows(new, packed.offsets, moments[0], keys), 0.0)
                old = whiten_rows(old, packed.offsets, moments[1], keys)
            rows = part.accumulator.update(new, old, packed.trainable, packed.offsets,
                                           new_returns=computed.new_returns, old_returns=computed.old_returns)
            group_keys = computed.keys(options.group_by)
            if part.groups is not None:
                part.groups.update(group_keys, rows)
            _offer_top(part.top, options, index, path, batch, packed, new, old, rows, first_row, group_keys)
            part.sample.update(new, old, packed.trainable, index, first_token)
            if per_sample is not None:
                part.per_sample.append(per_sample_batch(per_sample, path, first_row, rows, computed.keys(options.id_col), group_keys))
            part.rows, part.tokens = first_row + batch.num_rows, first_token + packed.tokens
            if progress is not None:
                progress.advance(batch.num_rows, packed.tokens)
    finally:
        rollout.close()
    return part


def _offer_top(top: TopSamples, options: DiffOptions, index: int, file: str, batch: pa.RecordBatch, packed, new, old,
               rows: RowFigures, first_row: int, group_keys: Optional[pa.Array]) -> None:
    candidates = top.candidates(rows.max_abs)
    if candidates.size == 0:
        return
    entries = []
    for row in candidates.tolist():
        start, end = int(packed.offsets[row]), int(packed.offsets[row + 1])
        entries.append(TopSample(
            file_index=index, file=file, row=first_row + row,
            id=batch.column(options.id_col)[row].as_py() if options.id_col is not None else None,
            group=group_keys[row].as_py() if group_keys is not None else None,
            length=int(rows.lengths[row]), trainable_tokens=int(rows.trainable[row]),
            masked_share=float(rows.masked_share[row]), masked_tail=int(rows.masked_tail[row]),
            max_abs_delta_advantage=float(rows.max_abs[row]), mean_abs_delta_advantage=float(rows.mean_abs[row]),
            max_abs_delta_return=_finite_or_none(rows.max_abs_return[row]), sign_flips=int(rows.sign_flips[row]),
            terminal_credit=_finite_or_none(rows.credit[row]), changed=bool(rows.changed[row]),
            new=np.array(new[start:end], dtype=np.float64), old=np.array(old[start:end], dtype=np.float64),
            trainable=np.array(packed.trainable[start:end], dtype=bool),
        ))
    top.offer(entries)


# ----------------------------------------------------------------------------- the run


def _raise_first_failure(results: list) -> None:
    for result in results:
        if isinstance(result, TaskFailure):
            result.raise_error()


def _run(paths: list[Path], options: DiffOptions, progress: Progress, engine: EngineOptions) -> DiffReport:
    """The diff over ``paths``: every file checked here first, the ``--normalize``
    statistics pass, then one :func:`diff_unit` per file on ``engine``, merged in input
    order (so the report is the same for any engine and worker count)."""
    from gaecli.io.writer import AtomicParquetWriter
    from gaecli.kernels import resolve_kernel

    kernel = resolve_kernel(options.kernel, options.device)
    computation = computation_of(options, kernel)
    files = [str(path) for path in paths]
    total_rows, schema = 0, None
    for file in files:
        rollout = RolloutFile(file)
        try:
            _check_file(rollout.schema, file, options, computation)
            total_rows += rollout.num_rows
            if file == files[0]:
                schema = per_sample_schema(rollout.schema, options) if options.per_sample is not None else None
        finally:
            rollout.close()
    engine = engine.for_inputs(total_size(files))
    writer = AtomicParquetWriter(to_path(options.per_sample), schema) if schema is not None else None
    try:
        with EngineSession() as session:  # one pool (or Ray) for both passes
            moments = None
            if options.whitening:
                moments = engine_moments(files, computation, engine, progress, total_rows, session)
            progress.start("diff", total_rows)
            try:
                results = map_units(diff_unit, [(index, file, options, kernel, moments, schema) for index, file in enumerate(files)],
                                    files, engine, stop_on_failure=True, progress=progress, session=session)
            finally:
                progress.finish()
        _raise_first_failure(results)
        # merged into fresh objects (a Ray result's arrays are read-only), in input order
        accumulator = DiffAccumulator(options.gamma, options.lambd, options.old_semantics, options.tolerance, quantiles=True)
        groups = GroupedFigures(options.old_semantics) if options.group_by is not None else None
        top, sample = TopSamples(options.top), TokenSample(options.scatter_sample)
        for part in results:
            accumulator.merge(part.accumulator)
            if groups is not None:
                groups.merge(part.groups)
            top.merge(part.top)
            sample.merge(part.sample)
        if writer is not None:
            for part in results:
                for batch in part.per_sample:
                    writer.write(batch)
                part.per_sample = None
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return DiffReport(
        options=options, kernel=kernel, files=[{"file": part.file, "rows": part.rows, "tokens": part.tokens} for part in results],
        summary=accumulator.figures(), groups=groups.result() if groups is not None else None,
        top=top.entries, histogram=accumulator.histogram, scatter=sample.points(),
    )


def _input_files(inputs: list[str | Path]) -> list[Path]:
    """Every input file once, in a stable order."""
    paths: list[Path] = []
    seen: set[Path] = set()
    for item in inputs:
        found, _ = discover_inputs([str(item)])
        for path, _root in found:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                paths.append(path)
    return paths


def _check_outputs(paths: list[Path], options: DiffOptions) -> None:
    """The report paths and ``--per-sample`` through the one rule of
    :func:`gaecli.io.paths.check_writes` (none may be an input or another report; no
    directory; a report's directory must exist) — before any work is done."""
    check_writes(paths, [*report_writes(options.report_paths), ("per-sample file", options.per_sample)])


def diff_files(inputs: list[str | Path], options: DiffOptions, progress: Optional[Progress] = None,
               engine: Optional[EngineOptions] = None) -> DiffReport:
    """Compare masked-GAE advantages with old ones over rollout files, streaming.

    ``inputs``: file paths, directories (read recursively for ``*.parquet``) or globs; a
    file named twice is read once. New advantages: masked GAE (the contract). Old: the
    ``options.baseline`` semantics recomputed from the same values, rewards and mask, or the
    stored ``options.against`` column. Only trainable tokens are compared. With
    ``options.per_sample`` one Parquet row per sample is written (atomically).

    ``engine``: where the files are processed, one work unit per file (default: in this
    process, one file after the other; ``gae diff`` defaults to a local worker per core, at
    most one per 256 MB of input).
    The parts are merged in input order with exact merges, so the report, the plots' data
    and the per-sample file are identical for any engine and worker count.

    Raises :class:`GAEUsageError` for a missing column named by an option, a report onto an
    input and unreadable files, and :class:`gaecli.errors.InvalidDataError` for rows that
    break the format. Bad option values raise :class:`gaecli.errors.InvalidOptionError` (a
    :class:`GAEInputError` too) when the options are made, before any work.
    """
    if options.normalize_by is not None and not options.normalize:
        options = replace(options, normalize=True)
    paths = _input_files(list(inputs))
    _check_outputs(paths, options)
    return _run(paths, options, progress or NoProgress(), engine or EngineOptions(workers=1))


def diff_file(input: str | Path, options: DiffOptions, progress: Optional[Progress] = None) -> DiffReport:
    """:func:`diff_files` for one file."""
    return diff_files([input], options, progress)
