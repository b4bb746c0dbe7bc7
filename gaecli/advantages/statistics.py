"""The keyed statistics a run gathers over every input before computing: what a row adds
(:data:`ROW_QUANTITIES`: the moments of a side's trainable advantages, a row's score), one
declared statistic (:class:`Statistic`: a quantity of an operand, keyed by a column), and the
statistics of one pass (:class:`KeyedStatistics`: added batch by batch, merged in input order,
cut down to one file's keys), all on :class:`gaecli.advantages.keyed.KeyedSums`. The
whitening moments (``--normalize``, the ``reinforce++`` estimators) are :class:`Moments`; the
critic-free estimators' group and step statistics are :class:`Scores`
(:data:`gaecli.advantages.estimators.ESTIMATOR_STATISTICS` declares which each needs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Optional

import numba
import numpy as np
import pyarrow as pa

from gaecli.advantages.episodes import TurnRows, turn_row_figures
from gaecli.advantages.keyed import KeyedSums
from gaecli.advantages.token_baseline import PathSums, path_rows


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


class Moments(KeyedSums):
    """Per key: the count, sum and sum of squares of trainable advantages (the whitening
    statistics), from :func:`row_moments`."""

    COUNTS = ("counts",)
    SUMS = ("sums", "squares")

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Each key's sum and sum of squares (float64 ``[keys]``)."""
        return self.total("sums"), self.total("squares")

    def empty_groups(self) -> np.ndarray:
        """The codes of keys without a trainable token."""
        return np.flatnonzero(self.count("counts") == 0)

    def mean_variance(self) -> tuple[np.ndarray, np.ndarray]:
        """Per key: mean and Bessel-corrected variance (0 for one token); a key without a
        trainable token gets a NaN mean (whitening's formula is :mod:`gaecli.advantages.whiten`'s)."""
        return self.derived("mean_variance", self._mean_variance)

    def _mean_variance(self) -> tuple[np.ndarray, np.ndarray]:
        totals, squares = self.totals()
        counts = self.count("counts")
        with np.errstate(invalid="ignore", divide="ignore"):
            means = totals / counts
            spread = np.maximum(squares - totals * means, 0.0)
            variances = np.where(counts > 1, spread / np.maximum(counts - 1, 1), 0.0)
        return means, variances

    def row_stats(self, keys: Optional[pa.Array], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-row mean and variance of the row's key (``keys`` one per row, None: one key)."""
        means, variances = self.mean_variance()
        codes = self.known_codes(keys, rows, "group")
        return means[codes], variances[codes]


class Scores(KeyedSums):
    """Per key (a group id, a step id, or the whole input): rows ``n``, rows with a non-zero
    score, trainable tokens ``ΣK``, the compensated sums ``Σs``, ``Σs²``, ``ΣK·s`` and the
    lowest and highest score (a key whose scores are all equal has an exact mean), from
    :func:`score_rows`."""

    COUNTS = ("rows", "nonzero", "tokens")
    SUMS = ("sums", "squares", "weighted")
    LOWS = ("low",)
    HIGHS = ("high",)

    def group_statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per key: rows ``n``, mean ``μ``, Bessel std ``σ`` and OPO baseline ``ΣK·s / ΣK``
        (float64). A key of one row has μ = 0, σ = 1 and baseline 0 (verl's convention); a key
        whose scores are all equal has μ and the baseline equal to that score exactly and σ = 0;
        a baseline over ``ΣK = 0`` is 0."""
        return self.derived("group_statistics", self._group_statistics)

    def moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per key: rows ``n`` (float64), mean and Bessel variance of the scores, as they are
        (a key of one row: its score and variance 0; a key whose scores are all equal: that
        score exactly and variance 0): what a whitening rule normalises scores by."""
        return self.derived("moments", self._moments)

    def _moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.count("rows")
        totals, squares = self.total("sums"), self.total("squares")
        low, high = self.low("low"), self.high("high")
        equal = low == high
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(equal, low, totals / n)
            spread = np.maximum(squares - totals * means, 0.0)
            variances = np.where(equal, 0.0, spread / np.maximum(n - 1, 1))
        return n.astype(np.float64), means, variances

    def _group_statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n, tokens, weighted = self.count("rows"), self.count("tokens"), self.total("weighted")
        _, means, variances = self.moments()
        low, high = self.low("low"), self.high("high")
        several, equal = n > 1, low == high
        with np.errstate(invalid="ignore", divide="ignore"):
            baselines = np.where(tokens == 0, 0.0, np.where(equal, low, weighted / tokens))
        return (
            n,
            np.where(several, means, 0.0),
            np.where(several, np.sqrt(variances), 1.0),
            np.where(several, baselines, 0.0),
        )

    def alphas(self) -> np.ndarray:
        """Per key: gpg's α = rows / max(1, rows with a non-zero score) (float64)."""
        return self.count("rows") / np.maximum(self.count("nonzero"), 1).astype(np.float64)


class TopScores(KeyedSums):
    """Per key: the highest and second-highest score, a score that came twice counted twice
    (grpo-passk's best sample and its margin), from :func:`top_score_rows`."""

    TOP_TWOS = ("scores",)

    def best_two(self) -> tuple[np.ndarray, np.ndarray]:
        """Per key: the highest score and the second highest (equal to it when tied; −inf in
        a key of one row)."""
        return self.top_two("scores")


def moment_rows(advantages: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """What a row adds to :class:`Moments`: its trainable tokens' count, sum and sum of
    squares (flat ``advantages`` and bool ``trainable`` ``[N]``, ``offsets`` ``[B + 1]``)."""
    counts, sums, squares = row_moments(advantages, trainable, offsets)
    return {"counts": counts, "sums": sums, "squares": squares}


def score_rows(scores: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """What a row adds to :class:`Scores`: its score ``s`` (float64 ``[B]``,
    :func:`gaecli.advantages.estimators.row_scores`) and its trainable token count ``K``."""
    from gaecli.advantages.layout import trainable_counts

    return score_figures(scores, trainable_counts(trainable, offsets))


def score_figures(scores: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """What rows with ``scores`` (float64 ``[B]``) and trainable token ``counts`` (int64
    ``[B]``) add to :class:`Scores`, one row each."""
    return {
        "rows": np.ones(scores.size, dtype=np.int64),
        "nonzero": (scores != 0).astype(np.int64),
        "tokens": counts,
        "sums": scores,
        "squares": scores * scores,
        "weighted": counts * scores,
        "low": scores,
        "high": scores,
    }


def top_score_rows(scores: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """What a row adds to :class:`TopScores`: its score."""
    return {"scores": scores}


class RowQuantity(NamedTuple):
    """What a row adds for one quantity: the per-row function (the operand's values —
    per-token ``[N]`` or per-row ``[B]`` —, the tokens counted ``[N]``, offsets ``[B + 1]`` →
    the accumulator's quantities by name), the accumulator (a :class:`KeyedSums` class) and
    which tokens the function is given as counted (``counted``: ``trainable``, the trainable
    ones; ``response``, those of the response mask, every token of the row without one:
    :func:`counted_tokens`)."""

    rows: Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, np.ndarray]]
    accumulator: type
    counted: str = "trainable"


def counted_tokens(counted: str, trainable: np.ndarray, response: Optional[np.ndarray]) -> np.ndarray:
    """The tokens (bool ``[N]``) a quantity counts (:attr:`RowQuantity.counted`): ``trainable``,
    or for ``response`` the response mask (``--response-mask-col``: SkyRL's ``response_mask``,
    which holds the trainable tokens) or, None, every token."""
    if counted == "trainable":
        return trainable
    return np.ones(trainable.size, dtype=np.bool_) if response is None else response


TRAINABLE_MOMENTS = "trainable-moments"
RESPONSE_MOMENTS = "response-moments"
SCORES = "scores"
RESPONSE_SCORES = "response-scores"
"""The per-row operand of a trainer profile that scores a row by every token's reward and ``z``
(:func:`gaecli.advantages.estimators.response_scores`), where :data:`SCORES` sums the trainable tokens'."""
OUTCOME_SCORES = "outcome-scores"
"""The per-row operand of a trainer profile that scores a row by ``z`` alone (slime's scalar reward)."""
TOP_SCORES = "top-scores"
PATH_BASELINES = "path-baselines"
TURN_ROWS = "turn-rows"
TURNS = "turns"
"""The per-row operand of the turn-row estimators' statistic: each valid turn row's turn index,
turn reward, outcome, row and ids, and the batch's rejected rows (made by the data path)."""
PATHS = "paths"
"""The per-token operand of optimal-token-baseline's statistic: each token's return and
cumulative path weight (:func:`gaecli.advantages.token_baseline.path_operand`), read from the rows."""

ROW_QUANTITIES: dict[str, RowQuantity] = {
    TRAINABLE_MOMENTS: RowQuantity(moment_rows, Moments),
    RESPONSE_MOMENTS: RowQuantity(moment_rows, Moments, "response"),
    SCORES: RowQuantity(score_rows, Scores),
    TOP_SCORES: RowQuantity(top_score_rows, TopScores),
    PATH_BASELINES: RowQuantity(path_rows, PathSums),
    TURN_ROWS: RowQuantity(turn_row_figures, TurnRows),
}
"""What a statistic can gather per row. ``trainable-moments``: count, sum and sum of squares
over the row's trainable tokens of a per-token operand (a side's advantages);
``response-moments``: the same over the tokens of the response mask (every token of the row
without one: SkyRL's whitening statistics); ``scores``: a
per-row operand's values (a row's score, or a reward component) and the row's trainable
count; ``top-scores``: the two highest of a per-row operand; ``path-baselines``: per trainable
token of the ``paths`` operand, its ``G·W`` and ``W`` at its (group, position); ``turn-rows``:
each turn row of the ``turns`` operand, kept row by row with its episode
(:class:`gaecli.advantages.episodes.TurnRows`)."""

COMPONENT = "component:"
"""The prefix of a per-row operand that is a reward component column (``component:NAME``,
gdpo's), read from the rows as float64."""


def is_row_operand(operand: str) -> bool:
    """Whether ``operand`` is read from the rows (the scores, a reward component), not a side."""
    return operand in (SCORES, RESPONSE_SCORES, OUTCOME_SCORES, PATHS, TURNS) or operand.startswith(COMPONENT)


@dataclass(frozen=True)
class Statistic:
    """One keyed statistic: the per-row ``quantity`` (a key of :data:`ROW_QUANTITIES`) of the
    ``operand`` (an array of a computed batch by name: ``new``, ``old``, ``old:K``, each a
    side's advantages; ``scores``, each row's score; ``component:NAME``, a reward
    component's value per row), added per value of the ``key``
    column (None: one key for the whole input). Hashable and picklable: the engines ship it
    to workers, and the statistics of a pass are looked up by it."""

    quantity: str
    operand: str
    key: Optional[str] = None

    def __post_init__(self) -> None:
        if self.quantity not in ROW_QUANTITIES:
            raise ValueError(f"unknown row quantity {self.quantity!r}; known: {', '.join(ROW_QUANTITIES)}")

    @property
    def reads_sides(self) -> bool:
        """Whether its operand is a computed side (not an input of the rows)."""
        return not is_row_operand(self.operand)


def side_operands(sides: int) -> tuple[str, ...]:
    """The operands of a batch's sides: the new one, then each of ``sides`` old sides
    (``old`` the first, then ``old:1``, ``old:2``...)."""
    return ("new", "old", *(f"old:{side}" for side in range(1, sides)))


def whitening_statistics(key: Optional[str], sides: int = 1, tokens: str = "trainable") -> tuple[Statistic, ...]:
    """The ``--normalize`` statistics: moments of the new and every old side's advantages
    over trainable tokens (``tokens="response"``: over the response mask's, every token
    without one), per value of ``key`` (``--normalize-by``) or over the whole input."""
    quantity = TRAINABLE_MOMENTS if tokens == "trainable" else RESPONSE_MOMENTS
    return tuple(Statistic(quantity, operand, key) for operand in side_operands(sides))


class KeyedStatistics:
    """The declared ``statistics`` (distinct :class:`Statistic`) over some rows, each a
    :class:`KeyedSums` of its quantity (``self[statistic]``), and the rows and tokens read
    for them (the pass counts them; the engines report progress with them). :meth:`add` takes
    batches in row order, :meth:`merge` other parts in input order (parts merged in the same
    order give the same bits); :meth:`subset` keeps the keys of one part. Picklable."""

    def __init__(self, statistics: tuple[Statistic, ...]) -> None:
        self.statistics = tuple(dict.fromkeys(statistics))
        self.sums: dict[Statistic, KeyedSums] = {
            statistic: ROW_QUANTITIES[statistic.quantity].accumulator() for statistic in self.statistics
        }
        self.rows = 0
        self.tokens = 0

    def __getitem__(self, statistic: Statistic) -> KeyedSums:
        return self.sums[statistic]

    @property
    def operands(self) -> tuple[str, ...]:
        """The operands the statistics read, each once."""
        return tuple(dict.fromkeys(statistic.operand for statistic in self.statistics))

    @property
    def keys(self) -> tuple[str, ...]:
        """The key columns the statistics read, each once."""
        return tuple(dict.fromkeys(statistic.key for statistic in self.statistics if statistic.key is not None))

    def add(
        self,
        operands: Mapping[str, np.ndarray],
        trainable: np.ndarray,
        offsets: np.ndarray,
        keys: Mapping[str, pa.Array],
        response: Optional[np.ndarray] = None,
    ) -> None:
        """Add one batch: ``operands`` maps each operand to its array (flat ``[N]``, or
        ``[B]`` for ``scores``), ``trainable`` bool ``[N]``, ``offsets`` ``[B + 1]``, ``keys``
        each key column to the batch's ``[B]`` values (an Arrow array), ``response`` the
        response mask (bool ``[N]``; None: every token), read by the quantities that count it."""
        per_row: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        for statistic in self.statistics:
            figures = (statistic.quantity, statistic.operand)
            if figures not in per_row:  # each quantity of an operand once, however many keys
                quantity = ROW_QUANTITIES[statistic.quantity]
                counted = counted_tokens(quantity.counted, trainable, response)
                per_row[figures] = quantity.rows(operands[statistic.operand], counted, offsets)
            self.sums[statistic].add(None if statistic.key is None else keys[statistic.key], per_row[figures])

    def merge(self, other: "KeyedStatistics") -> dict[Statistic, np.ndarray]:
        """Add ``other``'s keys after ours; returns, per statistic, the code here of each of
        its keys."""
        codes = {statistic: self.sums[statistic].merge(other.sums[statistic]) for statistic in self.statistics}
        self.rows += other.rows
        self.tokens += other.tokens
        return codes

    def subset(self, codes: Mapping[Statistic, np.ndarray], part: Optional["KeyedStatistics"] = None):
        """The keys of ``codes`` (as :meth:`merge` returned them) alone; ``part``: the part
        they came from, whose key tables are shared rather than rebuilt."""
        subset = KeyedStatistics(self.statistics)
        for statistic in self.statistics:
            table = None if part is None else part.sums[statistic].table
            subset.sums[statistic] = self.sums[statistic].subset(codes[statistic], table)
        return subset


def merged_in_order(
    statistics: tuple[Statistic, ...], parts: list[KeyedStatistics]
) -> tuple[KeyedStatistics, list[KeyedStatistics]]:
    """The parts merged in the order given (input order), and each part's keys of the merged
    statistics alone (what each file's unit is sent: a few dozen bytes per key of the file,
    not every key)."""
    merged = KeyedStatistics(statistics)
    codes = [merged.merge(part) for part in parts]
    return merged, [merged.subset(code, part) for code, part in zip(codes, parts)]
