"""The figures of a comparison of new (masked-GAE) against old advantages over trainable
tokens (masked positions are 0 by contract and not compared): each row's figures, the
terminal credit, and the streaming accumulator whose summary ``gae recompute`` and
``gae diff`` report.

Memory is bounded: exact counts, sums (:class:`gaecli.stats.ExactSum`) and maxima; the
quantiles come from fixed-bin log histograms (:class:`gaecli.stats.SignedLogHistogram`,
relative error :data:`QUANTILE_RELATIVE_ERROR`). Every figure is independent of the batch
size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from gaecli.advantages.baselines import lost_terminal_samples
from gaecli.advantages.contract import MASKED
from gaecli.checks import masked_tail_lengths
from gaecli.stats import DeltaHistograms, ExactSum, RowDiff, SignedLogHistogram, diff_rows

QUANTILE_RELATIVE_ERROR = 0.005
QUANTILE_ZERO = 1e-12
# the sums of products kept per row and in total: Σ new, Σ old, Σ new², Σ old², Σ new·old
PRODUCT_SUMS = ("sum_new", "sum_old", "sum_new_sq", "sum_old_sq", "sum_cross")
QUANTILE_METHOD = {
    "name": "log-histogram",
    "relative_error": QUANTILE_RELATIVE_ERROR,
    "zero_below": QUANTILE_ZERO,
    "rank": "nearest rank (the ceil(q·n)-th smallest), exact",
    "description": "fixed bins (b^(k-1), b^k] with b = (1 + e) / (1 - e) over |Δ|; a quantile is exact in rank "
    "and within relative error e in value; |Δ| <= zero_below counts as 0; never above the exact max",
}


def terminal_credit(
    semantics: Optional[str], gamma: float, lambd: float, trainable: np.ndarray, offsets: np.ndarray
) -> np.ndarray:
    """Per sample, the share of the terminal reward z that ``semantics`` (``masked``, a
    profile or an alias) delivers to the sample's last trainable token: ∂A[last trainable]/∂z,
    read from the semantics' own outputs. Every semantics is linear in (V, r, z), so that
    derivative is the advantage there with V = 0, r = 0 and z = 1, computed in float64 by the
    one dispatch (``native`` kernel). float64 ``[B]``; NaN for a sample without a trainable
    token, and everywhere for ``None`` (stored advantages: the credit is not defined).

    (For the record: ``slime`` gives (γλ)^gap for a tail of gap masked tokens; ``verl``,
    ``areal`` and ``roll`` 0 when the last token is masked; ``openrlhf``, ``nemo-rl`` and
    ``masked`` 1; every semantics 1 without a masked tail. docs/diff.md#terminal-credit)
    """
    from gaecli.advantages.dispatch import compute
    from gaecli.advantages.layout import last_trainable_index
    from gaecli.advantages.spec import AdvantageSpec

    last = last_trainable_index(trainable, offsets)
    credit = np.full(last.size, np.nan)
    has_trainable = last >= 0
    if semantics is None or not has_trainable.any():
        return credit
    # Every semantics runs backwards along a sample, so the advantage at the last trainable
    # token depends on that token and the ones after it alone: the probe runs on those
    # suffixes (a few tokens a sample), not on whole samples.
    starts = last[has_trainable]
    lengths = offsets[1:][has_trainable] - starts
    suffix_offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=suffix_offsets[1:])
    positions = np.repeat(starts - suffix_offsets[:-1], lengths) + np.arange(suffix_offsets[-1])
    zeros = np.zeros(positions.size, dtype=np.float64)
    probe, _ = compute(
        AdvantageSpec(gamma, lambd, semantics),
        zeros,
        zeros,
        trainable[positions],
        suffix_offsets,
        np.ones(lengths.size, dtype=np.float64),
        kernel="native",
        device="cpu",
    )
    credit[has_trainable] = probe[suffix_offsets[:-1]]
    return credit


# ----------------------------------------------------------------------------- rows


@dataclass
class RowFigures:
    """The figures of each row of one batch (arrays ``[B]``), over its trainable tokens.

    ``masked_tail``: masked tokens after the last trainable one (0 for fully masked and
    empty rows). ``credit``: terminal credit of the old advantages (NaN without a trainable
    token or under stored advantages). Return figures are NaN when no old returns are known.
    ``sums``: ``[B, 5]``, the :data:`PRODUCT_SUMS` in that order. ``lost_terminal``: whether
    the old side loses the row's terminal reward
    (:func:`gaecli.advantages.baselines.lost_terminal_samples`; None when not known).
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
    lost_terminal: Optional[np.ndarray] = None

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


def ratio(part, whole) -> Optional[float]:
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


def correlation(count: float, sums) -> Optional[float]:
    """Pearson correlation from Σx, Σy, Σx², Σy², Σxy (None when a variance is 0): one
    value of :func:`correlations`."""
    value = correlations(np.array([count], dtype=np.float64), np.array([sums], dtype=np.float64))[0]
    return None if np.isnan(value) else float(value)


def correlations(counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Pearson correlations ``[G]`` from ``counts [G]`` and the :data:`PRODUCT_SUMS`
    ``[G, 5]`` (Σx, Σy, Σx², Σy², Σxy) of ``G`` sets; NaN where undefined (fewer than two
    values, or a variance of 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    sum_x, sum_y, sum_xx, sum_yy, sum_xy = np.asarray(sums, dtype=np.float64).T
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # overflow: the figure is inf or NaN
        covariance = sum_xy - sum_x * sum_y / counts
        variance_x = sum_xx - sum_x * sum_x / counts
        variance_y = sum_yy - sum_y * sum_y / counts
        defined = (counts >= 2) & (variance_x > 0.0) & (variance_y > 0.0)
        value = np.clip(covariance / np.sqrt(variance_x * variance_y), -1.0, 1.0)
    return np.where(defined, value, np.nan)


def _delta_histogram() -> SignedLogHistogram:
    """An empty histogram of Δ with the stated quantile error (:data:`QUANTILE_METHOD`)."""
    return SignedLogHistogram(QUANTILE_RELATIVE_ERROR, QUANTILE_ZERO)


RECOMPUTE_SUMMARY_KEYS = (
    "baseline",
    "tolerance",
    "samples",
    "tokens",
    "trainable_tokens",
    "changed_samples",
    "fully_masked_samples",
    "empty_samples",
    "masked_tail_samples",
    "mean_masked_tail_length",
    "longest_masked_tail",
    "mean_terminal_credit",
    "min_terminal_credit",
    "mean_abs_delta_advantage",
    "max_abs_delta_advantage",
)


@dataclass
class DiffAccumulator:
    """Streaming comparison of new (masked) against old advantages, batch by batch.

    Every figure is exact or order independent, so it does not depend on batch sizes.
    ``baseline``: the semantics of the old side; None means stored old advantages (no
    terminal credit, no lost terminal rewards). ``new_semantics``: the new side's. ``quantiles``
    keeps the log histograms of Δ advantage and Δ return (median, p99; about 15 ns a
    trainable token). :meth:`result` is ``gae recompute``'s summary, :meth:`figures` the
    full ``gae diff`` summary.
    """

    gamma: float
    lambd: float
    baseline: Optional[str] = "unmasked"
    tolerance: float = 1e-6
    quantiles: bool = False
    new_semantics: str = MASKED
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
    terminal_compared: bool = False
    lost_terminal_samples: int = 0
    new_lost_terminal_samples: int = 0
    _lost_terminal_abs: ExactSum = field(default_factory=ExactSum)
    _new_lost_terminal_abs: ExactSum = field(default_factory=ExactSum)
    _abs_delta_sum: ExactSum = field(default_factory=ExactSum)
    _abs_delta_return_sum: ExactSum = field(default_factory=ExactSum)
    _credit_sum: ExactSum = field(default_factory=ExactSum)
    _sums: list = field(default_factory=lambda: [ExactSum() for _ in PRODUCT_SUMS])
    _tail_counts: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    histogram: SignedLogHistogram = field(default_factory=_delta_histogram)
    return_histogram: SignedLogHistogram = field(default_factory=_delta_histogram)

    def update(
        self,
        new: np.ndarray,
        old: np.ndarray,
        trainable: np.ndarray,
        offsets: np.ndarray,
        *,
        new_returns: Optional[np.ndarray] = None,
        old_returns: Optional[np.ndarray] = None,
        terminal_rewards: Optional[np.ndarray] = None,
        row_diff: Optional[RowDiff] = None,
    ) -> RowFigures:
        """Add one batch: flat ``[N]`` new and old advantages (and returns, optional), bool
        ``trainable``, zero-based int64 ``offsets`` ``[B + 1]``, and the terminal rewards
        ``[B]`` (optional: the lost terminal rewards are counted only with them). Returns
        the rows' figures. ``row_diff``: the :func:`gaecli.stats.diff_rows` of these
        advantages at this tolerance, made already (:attr:`gaecli.pipeline.ComputedBatch.row_diff`;
        only without returns and quantiles), not made again."""
        with_returns = new_returns is not None and old_returns is not None
        histograms = DeltaHistograms(self.histogram, self.return_histogram) if self.quantiles else None
        if row_diff is not None and (with_returns or histograms is not None):
            raise ValueError("figures made before hold no returns nor histograms")
        diff = row_diff
        if diff is None:
            diff = diff_rows(
                new,
                old,
                trainable,
                offsets,
                self.tolerance,
                returns=(new_returns, old_returns) if with_returns else None,
                histograms=histograms,
            )
        lengths = np.diff(offsets)
        trainable_per_row = diff.trainable_tokens
        tails = np.where(trainable_per_row > 0, masked_tail_lengths(trainable, offsets), 0)
        credit = terminal_credit(self.baseline, self.gamma, self.lambd, trainable, offsets)
        nan = np.full(lengths.size, np.nan)
        lost = None
        if terminal_rewards is not None:
            self.terminal_compared = True
            discount = {"gamma": self.gamma, "lambd": self.lambd}
            new_lost = lost_terminal_samples(self.new_semantics, trainable, offsets, terminal_rewards, **discount)
            self.new_lost_terminal_samples += int(new_lost.sum())
            self._new_lost_terminal_abs.add(np.abs(terminal_rewards[new_lost].astype(np.float64)))
            if self.baseline is not None:
                lost = lost_terminal_samples(self.baseline, trainable, offsets, terminal_rewards, **discount)
                self.lost_terminal_samples += int(lost.sum())
                self._lost_terminal_abs.add(np.abs(terminal_rewards[lost].astype(np.float64)))
        rows = RowFigures(
            lengths=lengths,
            trainable=trainable_per_row,
            masked_tail=tails,
            max_abs=diff.max_abs,
            max_relative=diff.max_relative,
            sum_abs=diff.sum_abs,
            sign_flips=diff.sign_flips,
            max_abs_return=diff.max_abs_return if with_returns else nan,
            sum_abs_return=diff.sum_abs_return if with_returns else nan,
            credit=credit,
            changed=diff.max_relative > self.tolerance,
            sums=np.column_stack([getattr(diff, name) for name in PRODUCT_SUMS]),
            lost_terminal=lost,
        )
        self.samples += lengths.size
        self.tokens += int(lengths.sum())
        self.trainable_tokens += int(trainable_per_row.sum())
        self.changed_samples += int(rows.changed.sum())
        self.changed_tokens += int(diff.changed_tokens.sum())
        self.empty_samples += int((lengths == 0).sum())
        self.fully_masked_samples += int(rows.fully_masked.sum())
        self.max_abs_delta = max(self.max_abs_delta, float(rows.max_abs.max(initial=0.0)))
        self._abs_delta_sum.add(rows.sum_abs)
        self.sign_flips += int(rows.sign_flips.sum())
        for total, column in zip(self._sums, rows.sums.T, strict=True):
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
        for name in (
            "samples",
            "tokens",
            "trainable_tokens",
            "changed_samples",
            "changed_tokens",
            "fully_masked_samples",
            "empty_samples",
            "masked_tail_samples",
            "masked_tail_tokens",
            "zero_credit_samples",
            "sign_flips",
            "lost_terminal_samples",
            "new_lost_terminal_samples",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.longest_masked_tail = max(self.longest_masked_tail, other.longest_masked_tail)
        self.max_abs_delta = max(self.max_abs_delta, other.max_abs_delta)
        self.min_terminal_credit = min(self.min_terminal_credit, other.min_terminal_credit)
        self.returns_compared = self.returns_compared or other.returns_compared
        self.terminal_compared = self.terminal_compared or other.terminal_compared
        self._lost_terminal_abs.merge(other._lost_terminal_abs)
        self._new_lost_terminal_abs.merge(other._new_lost_terminal_abs)
        self.max_abs_delta_return = max(self.max_abs_delta_return, other.max_abs_delta_return)
        self._abs_delta_sum.merge(other._abs_delta_sum)
        self._abs_delta_return_sum.merge(other._abs_delta_return_sum)
        self._credit_sum.merge(other._credit_sum)
        for mine, theirs in zip(self._sums, other._sums, strict=True):
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
            "trainable_share": ratio(trainable, self.tokens),
            "changed_samples": self.changed_samples,
            "changed_share": ratio(self.changed_samples, self.samples),
            "changed_tokens": self.changed_tokens,
            "changed_token_share": ratio(self.changed_tokens, trainable),
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
            **self._lost_terminal_figures(),
            "mean_abs_delta_advantage": self._abs_delta_sum.value() / trainable if trainable else 0.0,
            "median_abs_delta_advantage": self._quantile(self.histogram, 0.5, self.max_abs_delta),
            "p99_abs_delta_advantage": self._quantile(self.histogram, 0.99, self.max_abs_delta),
            "max_abs_delta_advantage": self.max_abs_delta,
        }
        if self.returns_compared:
            result.update(
                {
                    "mean_abs_delta_return": self._abs_delta_return_sum.value() / trainable if trainable else 0.0,
                    "median_abs_delta_return": self._quantile(self.return_histogram, 0.5, self.max_abs_delta_return),
                    "p99_abs_delta_return": self._quantile(self.return_histogram, 0.99, self.max_abs_delta_return),
                    "max_abs_delta_return": self.max_abs_delta_return,
                }
            )
        else:
            result.update({f"{stat}_abs_delta_return": None for stat in ("mean", "median", "p99", "max")})
        for quantity in ("advantage", "return"):
            for stat in ("mean", "median", "p99", "max"):
                value = result[f"{stat}_abs_delta_{quantity}"]
                over_std = value / new_std if value is not None and new_std else None
                result[f"{stat}_abs_delta_{quantity}_over_std"] = over_std
        result.update(
            {
                "sign_flip_tokens": self.sign_flips,
                "sign_flip_share": ratio(self.sign_flips, trainable),
                "correlation": correlation(trainable, (sum_new, sum_old, sum_new_sq, sum_old_sq, sum_cross)),
                "new_advantage_mean": new_mean,
                "new_advantage_std": new_std,
                "old_advantage_mean": old_mean,
                "old_advantage_std": old_std,
            }
        )
        return result

    def _lost_terminal_figures(self) -> dict:
        """The samples whose terminal reward reaches no trainable token, and Σ |z| over them:
        under the old side (None for stored advantages) and under the new side; None when
        the terminal rewards were not given."""
        old_known = self.terminal_compared and self.baseline is not None
        return {
            "lost_terminal_samples": self.lost_terminal_samples if old_known else None,
            "lost_terminal_abs_sum": self._lost_terminal_abs.value() if old_known else None,
            "new_lost_terminal_samples": self.new_lost_terminal_samples if self.terminal_compared else None,
            "new_lost_terminal_abs_sum": self._new_lost_terminal_abs.value() if self.terminal_compared else None,
        }

    def _quantile(self, histogram: SignedLogHistogram, q: float, maximum: float) -> Optional[float]:
        if not self.quantiles or not self.trainable_tokens:
            return None
        return histogram.abs_quantile(q, maximum)
