"""The critic-free estimators (grpo, dr-grpo, rloo, opo, gpg, reinforce++-baseline; definitions in
docs/estimators.md): each row's score, the keyed statistics each estimator needs
(:data:`ESTIMATOR_STATISTICS`, a declaration the statistics pass reads: the commands gather
them over every file, :mod:`gaecli.advantages.statistics`), and each row's advantage from them
(:func:`statistics_row_advantages`), which the dispatch writes to the row's trainable tokens.
``reinforce++``'s returns are masked GAE (the kernels); its whitening is
:mod:`gaecli.advantages.whiten`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import GROUP_EPSILON
from gaecli.advantages.statistics import SCORES, TRAINABLE_MOMENTS, KeyedStatistics, Statistic
from gaecli.errors import GAEInputError


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


@dataclass(frozen=True)
class Need:
    """A statistic an estimator needs, declared: the per-row ``quantity`` (a key of
    :data:`gaecli.advantages.statistics.ROW_QUANTITIES`) of ``of`` (``scores``: each row's
    score, read from the inputs; ``advantages``: the side's computed advantages, before
    whitening), keyed by the id column a spec field names (``by``: ``group_by``, ``step_by``;
    None, or a field the spec leaves None: the whole input)."""

    quantity: str
    of: str
    by: Optional[str] = None

    def statistic(self, spec, operand: str) -> Statistic:
        """The statistic of this need for ``spec`` computed as the side ``operand``."""
        key = None if self.by is None else getattr(spec, self.by)
        return Statistic(self.quantity, operand if self.of == "advantages" else SCORES, key)


GROUP_SCORES = Need(SCORES, "scores", "group_by")
STEP_SCORES = Need(SCORES, "scores", "step_by")
STEP_MOMENTS = Need(TRAINABLE_MOMENTS, "advantages", "step_by")

ESTIMATOR_STATISTICS: dict[str, tuple[Need, ...]] = {
    "grpo": (GROUP_SCORES,),
    "dr-grpo": (GROUP_SCORES,),
    "rloo": (GROUP_SCORES,),
    "opo": (GROUP_SCORES,),
    "gpg": (GROUP_SCORES, STEP_SCORES),
    "reinforce++": (STEP_MOMENTS,),
    "reinforce++-baseline": (GROUP_SCORES, STEP_MOMENTS),
}
"""The keyed statistics each estimator needs over the whole input before its advantages can
be computed (an estimator not named needs none): the group statistics of the scores, gpg's
step α, the ``reinforce++`` whitening moments per step. A new estimator declares its needs
here; the statistics pass (:mod:`gaecli.pipeline.passes`) gathers them."""


def declared_statistics(spec, operand: str = "new") -> tuple[Statistic, ...]:
    """The statistics ``spec`` needs when computed as the side ``operand`` (``new``,
    ``old``, ``old:K``)."""
    return tuple(need.statistic(spec, operand) for need in ESTIMATOR_STATISTICS.get(spec.estimator, ()))


def statistics_row_advantages(
    statistics: KeyedStatistics,
    spec,
    scores: np.ndarray,
    group_keys: Optional[pa.Array],
    step_keys: Optional[pa.Array],
) -> np.ndarray:
    """Each row's advantage (float64 ``[B]``) under ``spec``'s estimator from the declared
    score ``statistics`` (:data:`ESTIMATOR_STATISTICS`); the rows' keys must have been added."""
    rows = scores.size
    groups = statistics[GROUP_SCORES.statistic(spec, "new")]
    codes = groups.known_codes(group_keys, rows, "group")
    n, means, stds, baselines = (values[codes] for values in groups.group_statistics())
    alphas = None
    if STEP_SCORES in ESTIMATOR_STATISTICS.get(spec.estimator, ()):
        steps = statistics[STEP_SCORES.statistic(spec, "new")]
        alphas = steps.alphas()[steps.known_codes(step_keys, rows, "step")]
    return row_advantages(spec.estimator, scores, n, means, stds, baselines, alphas)


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
    ``[B]``, as :meth:`gaecli.advantages.statistics.Scores.group_statistics` gives them) and, for gpg, its step's α:
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
    statistics of each row's step (``moments``, :class:`gaecli.advantages.statistics.Moments` over
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
    from gaecli.advantages.contract import GROUPED_ESTIMATORS
    from gaecli.advantages.dispatch import ROW_ADVANTAGE, compute

    needs = declared_statistics(spec)
    keys = {name: ids for name, ids in ((spec.group_by, group_keys), (spec.step_by, step_keys)) if name is not None}
    row_inputs = {}
    if spec.estimator in GROUPED_ESTIMATORS:
        scores, _ = row_scores(rewards, trainable, offsets, terminal_rewards)
        statistics = KeyedStatistics(tuple(need for need in needs if not need.reads_sides))
        statistics.add({SCORES: scores}, trainable, offsets, keys)
        row_inputs[ROW_ADVANTAGE] = statistics_row_advantages(statistics, spec, scores, group_keys, step_keys)
    advantages, returns = compute(
        spec, None, rewards, trainable, offsets, terminal_rewards, kernel=kernel, device=device, row_inputs=row_inputs
    )
    whitening = tuple(need for need in needs if need.reads_sides)
    if whitening:
        moments = KeyedStatistics(whitening)
        moments.add({"new": advantages}, trainable, offsets, keys)
        advantages = whiten_trainable(advantages, trainable, offsets, moments[whitening[0]], step_keys)
        if spec.estimator == "reinforce++-baseline":
            returns = advantages
    return advantages, returns
