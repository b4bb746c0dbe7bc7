"""The critic-free estimators (grpo, dr-grpo, rloo, opo, gpg, reinforce++-baseline; definitions in
docs/estimators.md): each row's score, the group and step statistics of those scores
(:class:`ScoreStatistics`, order-fixed and mergeable over many files like the ``--normalize``
moments), each row's advantage from them (:func:`row_advantages`), and the per-token pass that
writes it to the row's trainable tokens (:func:`spread_rows`). ``reinforce++``'s returns are
masked GAE (the kernels); its whitening is :mod:`gaecli.advantages.whiten`'s."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import GROUP_EPSILON
from gaecli.errors import GAEInputError
from gaecli.grouping import KeyTable, _compensated_add, _grown

SCORE_FIELDS = (
    "rows",
    "nonzero",
    "tokens",
    "sums",
    "sum_errors",
    "squares",
    "square_errors",
    "weighted",
    "weighted_errors",
    "low",
    "high",
)
_INTEGER_FIELDS = ("rows", "nonzero", "tokens")


def row_scores(rewards: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, terminal_rewards: np.ndarray):
    """Each row's score ``s = z + Σ r`` over its trainable tokens (float64 ``[B]``: the rewards
    added in token order, then ``z``; a fully masked or empty row scores ``z``) and its trainable
    token count ``K`` (int64 ``[B]``). Flat ``rewards`` and bool ``trainable`` ``[N]``,
    ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``."""
    rows = offsets.size - 1
    segments = np.repeat(np.arange(rows, dtype=np.int64), np.diff(offsets))
    kept = np.where(trainable, rewards.astype(np.float64, copy=False), 0.0)
    sums = np.bincount(segments, weights=kept, minlength=rows)  # added serially in token order
    counts = np.bincount(segments[trainable], minlength=rows).astype(np.int64)
    return terminal_rewards.astype(np.float64) + sums, counts


class GroupedScores:
    """Per key (a group id, a step id, or one key for the whole input): rows, rows with a
    non-zero score, trainable tokens ``ΣK``, and the compensated sums ``Σs``, ``Σs²``,
    ``ΣK·s``, with the lowest and highest score (a group whose scores are all equal has an
    exact mean). Rows are added in the order given and parts merged in the order called, as
    :class:`gaecli.stats.GroupedMoments` does, so the statistics are the same bits for any
    batch size, engine and worker count. Picklable."""

    def __init__(self) -> None:
        self.table: Optional[KeyTable] = None  # None: one key (the whole input)
        self.size = 0
        for name in SCORE_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.int64 if name in _INTEGER_FIELDS else np.float64))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in SCORE_FIELDS:
            state[name] = state[name][: self.size].copy()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in SCORE_FIELDS:
            setattr(self, name, np.array(getattr(self, name)))  # writable

    def codes(self, keys: Optional[pa.Array], rows: int, insert: bool = True) -> np.ndarray:
        """The code of each row's key (``keys`` None: one key); unknown keys get −1 unless
        ``insert``."""
        if keys is None:
            if insert and self.size == 0:
                self._resize(1)
            return np.zeros(rows, dtype=np.int64)
        if self.table is None:
            self.table = KeyTable()
        codes = self.table.encode(keys, insert)
        if insert and self.table.size > self.size:
            self._resize(self.table.size)
        return codes

    def _resize(self, size: int) -> None:
        if self.rows.size < size:
            old = self.rows.size
            for name in SCORE_FIELDS:
                setattr(self, name, _grown(getattr(self, name), size))
            self.low[old:] = np.inf
            self.high[old:] = -np.inf
        self.size = size

    def _add(self, codes, rows, nonzero, tokens, sums, squares, weighted, low, high) -> None:
        np.add.at(self.rows, codes, rows)
        np.add.at(self.nonzero, codes, nonzero)
        np.add.at(self.tokens, codes, tokens)
        _compensated_add(self.sums, self.sum_errors, codes, np.ascontiguousarray(sums, dtype=np.float64))
        _compensated_add(self.squares, self.square_errors, codes, np.ascontiguousarray(squares, dtype=np.float64))
        _compensated_add(self.weighted, self.weighted_errors, codes, np.ascontiguousarray(weighted, dtype=np.float64))
        np.minimum.at(self.low, codes, low)
        np.maximum.at(self.high, codes, high)

    def add(self, keys: Optional[pa.Array], scores: np.ndarray, counts: np.ndarray) -> None:
        """Add rows in row order: their keys (an Arrow array, or None for one key), scores
        (float64 ``[B]``) and trainable counts (``[B]``)."""
        codes = self.codes(keys, scores.size)
        ones = np.ones(scores.size, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        self._add(
            codes,
            ones,
            (scores != 0).astype(np.int64),
            counts,
            scores,
            scores * scores,
            counts * scores,
            scores,
            scores,
        )

    def merge(self, other: "GroupedScores") -> np.ndarray:
        """Add another part's keys (new keys after ours, in its order); returns the code here of
        each of its keys."""
        if other.size == 0:
            return np.zeros(0, dtype=np.int64)
        size = other.size
        keys = None if other.table is None else other.table.keys()
        codes = self.codes(keys, size)
        part = {name: getattr(other, name)[:size] for name in SCORE_FIELDS}
        self._add(codes, *(part[name] for name in ("rows", "nonzero", "tokens", "sums", "squares", "weighted")),
                  part["low"], part["high"])  # fmt: skip
        for name in ("sum_errors", "square_errors", "weighted_errors"):
            np.add.at(getattr(self, name), codes, part[name])
        return codes

    def subset(self, codes: np.ndarray) -> "GroupedScores":
        """The keys ``codes`` (distinct) alone, in that order: what one file's unit needs."""
        part = GroupedScores()
        if self.table is not None:
            part.table = KeyTable()
            part.table.encode(self.table.keys().take(pa.array(codes, type=pa.int64())))
        part.size = codes.size
        for name in SCORE_FIELDS:
            setattr(part, name, getattr(self, name)[codes].copy())
        return part

    def group_statistics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per key: rows ``n``, mean ``μ``, Bessel std ``σ`` and OPO baseline ``ΣK·s / ΣK``
        (float64). A key of one row has μ = 0, σ = 1 and baseline 0 (verl's convention); a key
        whose scores are all equal has μ and the baseline equal to that score exactly and σ = 0;
        a baseline over ``ΣK = 0`` is 0."""
        size = self.size
        n = self.rows[:size]
        totals = self.sums[:size] + self.sum_errors[:size]
        squares = self.squares[:size] + self.square_errors[:size]
        weighted = self.weighted[:size] + self.weighted_errors[:size]
        tokens = self.tokens[:size]
        low, high = self.low[:size], self.high[:size]
        several, equal = n > 1, low == high
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(equal, low, totals / n)
            spread = np.maximum(squares - totals * means, 0.0)
            variances = np.where(equal, 0.0, spread / np.maximum(n - 1, 1))
            baselines = np.where(tokens == 0, 0.0, np.where(equal, low, weighted / tokens))
        return (
            n,
            np.where(several, means, 0.0),
            np.where(several, np.sqrt(variances), 1.0),
            np.where(several, baselines, 0.0),
        )

    def alphas(self) -> np.ndarray:
        """Per key: gpg's α = rows / max(1, rows with a non-zero score) (float64)."""
        size = self.size
        return self.rows[:size] / np.maximum(self.nonzero[:size], 1).astype(np.float64)


class ScoreStatistics:
    """The statistics of the critic-free estimators over some rows: :class:`GroupedScores` per
    group id (``groups``; None when the estimator has no groups) and per step id or the whole
    input (``steps``). :meth:`add` takes rows in row order, :meth:`merge` other parts in input
    order; :meth:`subset` keeps the keys of one file. ``rows`` and ``tokens``: what the pass
    read for them (the engines report progress with them)."""

    def __init__(self, grouped: bool = True) -> None:
        self.groups: Optional[GroupedScores] = GroupedScores() if grouped else None
        self.steps = GroupedScores()
        self.rows = 0
        self.tokens = 0

    def add(self, group_keys: Optional[pa.Array], step_keys: Optional[pa.Array], scores, counts) -> None:
        """Add rows: their group ids (an Arrow array; None without groups), step ids (None: the
        whole input), scores and trainable counts ``[B]``."""
        if self.groups is not None:
            if group_keys is None:
                raise ValueError("score statistics: group ids needed")
            self.groups.add(group_keys, scores, counts)
        self.steps.add(step_keys, scores, counts)

    def merge(self, other: "ScoreStatistics") -> tuple[Optional[np.ndarray], np.ndarray]:
        """Add ``other``'s keys after ours; returns the codes here of its groups and steps."""
        groups = None if self.groups is None else self.groups.merge(other.groups)
        self.rows += other.rows
        self.tokens += other.tokens
        return groups, self.steps.merge(other.steps)

    def subset(self, codes: tuple[Optional[np.ndarray], np.ndarray]) -> "ScoreStatistics":
        """The groups and steps of ``codes`` (as :meth:`merge` returned them) alone."""
        part = ScoreStatistics(self.groups is not None)
        if self.groups is not None:
            part.groups = self.groups.subset(codes[0])
        part.steps = self.steps.subset(codes[1])
        return part

    def row_advantages(
        self, estimator: str, scores: np.ndarray, group_keys: Optional[pa.Array], step_keys: Optional[pa.Array]
    ) -> np.ndarray:
        """Each row's advantage (float64 ``[B]``) under ``estimator`` from these statistics
        (:func:`row_advantages`); the rows' keys must have been added."""
        rows = scores.size
        if self.groups is None:
            raise ValueError(f"estimator {estimator!r}: no group statistics")
        codes = _known(self.groups, group_keys, rows, "group")
        n, means, stds, baselines = (values[codes] for values in self.groups.group_statistics())
        alphas = self.steps.alphas()[_known(self.steps, step_keys, rows, "step")]
        return row_advantages(estimator, scores, n, means, stds, baselines, alphas)


def _known(grouped: GroupedScores, keys: Optional[pa.Array], rows: int, what: str) -> np.ndarray:
    codes = grouped.codes(keys, rows, insert=False)
    if rows and (codes < 0).any():
        key = keys[int(np.flatnonzero(codes < 0)[0])].as_py()
        raise GAEInputError(f"{what} {key!r} has no score statistics")
    return codes


def row_advantages(
    estimator: str,
    scores: np.ndarray,
    n: np.ndarray,
    means: np.ndarray,
    stds: np.ndarray,
    baselines: np.ndarray,
    alphas: np.ndarray,
) -> np.ndarray:
    """Each row's advantage (float64 ``[B]``) from its score and its group's statistics (each
    ``[B]``, as :meth:`GroupedScores.group_statistics` gives them) and, for gpg, its step's α:
    grpo ``(s − μ)/(σ + 1e-6)``, dr-grpo and reinforce++-baseline ``s − μ``, rloo
    ``n/(n − 1)·(s − μ)`` (``s`` for a group of one), opo ``s − baseline``, gpg ``α·(s − μ)``."""
    centred = scores - means
    if estimator == "grpo":
        return centred / (stds + GROUP_EPSILON)
    if estimator in ("dr-grpo", "reinforce++-baseline"):
        return centred
    if estimator == "rloo":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n > 1, n / np.maximum(n - 1, 1) * centred, scores)
    if estimator == "opo":
        return scores - baselines
    if estimator == "gpg":
        return alphas * centred
    raise ValueError(f"estimator {estimator!r} has no per-row advantage")


def spread_rows(row_values: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, dtype) -> np.ndarray:
    """The per-token pass of the outcome estimators: each row's value at its trainable tokens,
    0 at masked positions; flat ``[N]`` in ``dtype``."""
    per_token = np.repeat(row_values.astype(np.float64, copy=False), np.diff(offsets))
    return np.where(trainable, per_token, 0.0).astype(dtype, copy=False)


def keys_array(keys, rows: int, what: str) -> pa.Array:
    """Per-row ids given to the Python API (a tensor, numpy array, Arrow array or sequence) as
    an Arrow array of ``rows`` values; a null id, or the wrong count, raises
    :class:`GAEInputError` naming the sample."""
    if hasattr(keys, "detach"):  # a torch tensor
        keys = keys.detach().cpu().numpy()
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    array = keys if isinstance(keys, pa.Array) else pa.array(keys if isinstance(keys, np.ndarray) else list(keys))
    if len(array) != rows:
        raise GAEInputError(f"{what} must hold one id per sample ({rows}), got {len(array)}")
    if array.null_count:
        raise GAEInputError(f"sample {int(np.flatnonzero(np.asarray(array.is_null()))[0])}: the {what} is null")
    return array


def whiten_trainable(
    advantages: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, moments, keys: Optional[pa.Array]
) -> np.ndarray:
    """The ``reinforce++`` estimators' whitening: ``(A − mean) / sqrt(var + ε)`` with the
    statistics of each row's step (``moments``, :class:`gaecli.grouping.GroupedMoments` over
    trainable tokens, per ``keys`` or the whole input), 0 at masked positions, in the
    advantages' dtype (:func:`gaecli.advantages.whiten.whiten_rows`)."""
    from gaecli.advantages.whiten import whiten_rows

    # a step without a trainable token has no statistics (NaN) and no position that reads them
    return whiten_rows(advantages, offsets, moments, keys, trainable=trainable, dtype=advantages.dtype)


def critic_free_batch(
    spec,
    rewards: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    terminal_rewards: np.ndarray,
    group_keys: Optional[pa.Array],
    step_keys: Optional[pa.Array],
    *,
    kernel: str = "auto",
    device=None,
) -> tuple[np.ndarray, np.ndarray]:
    """A critic-free ``spec`` on one batch that is the whole input (the Python API): its
    statistics from these rows alone, the per-token pass by the dispatch, then the whitening
    of the ``reinforce++`` estimators. Flat numpy arrays as :func:`row_scores` takes them, the
    rows' group and step ids as Arrow arrays (None where the spec has none); returns flat
    ``(advantages, returns)`` in the rewards' dtype. The commands run the same steps with
    statistics gathered over every file (:mod:`gaecli.pipeline`)."""
    from gaecli.advantages.contract import GROUPED_ESTIMATORS, WHITENED_ESTIMATORS
    from gaecli.advantages.dispatch import ROW_ADVANTAGE, compute
    from gaecli.grouping import GroupedMoments
    from gaecli.stats import row_moments

    row_inputs = {}
    if spec.estimator in GROUPED_ESTIMATORS:
        scores, counts = row_scores(rewards, trainable, offsets, terminal_rewards)
        statistics = ScoreStatistics()
        statistics.add(group_keys, step_keys, scores, counts)
        row_inputs[ROW_ADVANTAGE] = statistics.row_advantages(spec.estimator, scores, group_keys, step_keys)
    advantages, returns = compute(
        spec, None, rewards, trainable, offsets, terminal_rewards, kernel=kernel, device=device, row_inputs=row_inputs
    )
    if spec.estimator in WHITENED_ESTIMATORS:
        moments = GroupedMoments()
        moments.add(step_keys, *row_moments(advantages, trainable, offsets))
        advantages = whiten_trainable(advantages, trainable, offsets, moments, step_keys)
        if spec.estimator == "reinforce++-baseline":
            returns = advantages
    return advantages, returns
