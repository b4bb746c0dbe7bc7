"""The critic-free estimators (grpo, dr-grpo, rloo, opo, gpg, reinforce++-baseline, maxrl,
grpo-passk, gdpo; definitions in docs/estimators.md): each row's score, the keyed statistics
each estimator needs (:data:`ESTIMATOR_STATISTICS`, a declaration the statistics pass reads:
the commands gather them over every file, :mod:`gaecli.advantages.statistics`), and each
row's advantage from them (:func:`statistics_row_advantages`), which the dispatch writes to
the row's trainable tokens. The returns of ``reinforce++`` and remax are masked GAE (the
kernels); the whitening is :mod:`gaecli.advantages.whiten`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import GROUP_EPSILON, SCORE_NORMALISED, WHITENED_RETURNS
from gaecli.advantages.statistics import (
    COMPONENT,
    OUTCOME_SCORES,
    PATH_BASELINES,
    PATHS,
    RESPONSE_MOMENTS,
    RESPONSE_SCORES,
    SCORES,
    TOP_SCORES,
    TRAINABLE_MOMENTS,
    TURN_ROWS,
    TURNS,
    KeyedStatistics,
    Statistic,
)
from gaecli.errors import GAEInputError


def row_scores(rewards: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, terminal_rewards: np.ndarray):
    """Each row's score ``s = z + Σ r`` over its trainable tokens (float64 ``[B]``: the rewards
    added in token order, then ``z``; a fully masked or empty row scores ``z``) and its trainable
    token count ``K`` (int64 ``[B]``). Flat ``rewards`` and bool ``trainable`` ``[N]``,
    ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``."""
    from gaecli.advantages.layout import trainable_sums

    sums, counts = trainable_sums(rewards, trainable, offsets)
    return terminal_rewards.astype(np.float64) + sums, counts


def response_scores(rewards: np.ndarray, offsets: np.ndarray, terminal_rewards: np.ndarray) -> np.ndarray:
    """Each row's score over every token, ``z + Σ r`` with the rewards at masked tokens too
    (float64 ``[B]``): what verl and SkyRL sum (:data:`gaecli.advantages.statistics.RESPONSE_SCORES`)."""
    from gaecli.advantages.layout import trainable_sums

    return terminal_rewards.astype(np.float64) + trainable_sums(rewards, None, offsets)[0]


SCORE_OPERANDS: dict[str, str] = {"trainable": SCORES, "every": RESPONSE_SCORES, "outcome": OUTCOME_SCORES}
"""The per-row operand of each score a trainer profile reads
(:attr:`gaecli.advantages.estimator_profiles.EstimatorProfile.scores`): the contract's, every
token's, ``z`` alone."""


def side_scores(spec, scores: np.ndarray, rewards, offsets, terminal_rewards) -> np.ndarray:
    """The scores ``spec``'s estimator reads (:func:`operand_scores` of its profile's operand):
    ``scores`` (the contract's, over trainable tokens), or those its trainer profile takes."""
    return operand_scores(group_scores_need(spec).of, scores, rewards, offsets, terminal_rewards)


def operand_scores(operand: str, scores: np.ndarray, rewards, offsets, terminal_rewards) -> np.ndarray:
    """The rows' scores (float64 ``[B]``) of a score ``operand`` (:data:`SCORE_OPERANDS`):
    ``scores`` as given (the contract's, :func:`row_scores`), every token's
    (:func:`response_scores`), or ``z`` alone."""
    if operand == RESPONSE_SCORES:
        return response_scores(rewards, offsets, terminal_rewards)
    if operand == OUTCOME_SCORES:
        return np.asarray(terminal_rewards, dtype=np.float64)
    return scores


@dataclass(frozen=True)
class Need:
    """A statistic an estimator needs, declared: the per-row ``quantity`` (a key of
    :data:`gaecli.advantages.statistics.ROW_QUANTITIES`) of ``of`` (``scores``: each row's
    score, read from the inputs, or another score operand of :data:`SCORE_OPERANDS`;
    ``components``: each of the spec's reward components, one statistic apiece; ``advantages``:
    the side's computed advantages, before whitening),
    keyed by the id column a spec field names (``by``: ``group_by``, ``step_by``; None, or a
    field the spec leaves None: the whole input)."""

    quantity: str
    of: str
    by: Optional[str] = None

    def statistics(self, spec, operand: str) -> tuple[Statistic, ...]:
        """The statistics of this need for ``spec`` computed as the side ``operand``."""
        key = None if self.by is None else getattr(spec, self.by)
        if self.of == "components":
            return tuple(Statistic(self.quantity, COMPONENT + name, key) for name in spec.reward_components)
        if self.of == "paths":
            return (Statistic(self.quantity, PATHS, key),)
        if self.of == "turns":
            return (Statistic(self.quantity, TURNS, key),)
        if self.of in (RESPONSE_SCORES, OUTCOME_SCORES):
            return (Statistic(self.quantity, self.of, key),)
        return (Statistic(self.quantity, operand if self.of == "advantages" else SCORES, key),)

    def statistic(self, spec, operand: str = "new") -> Statistic:
        """The one statistic of this need (not ``components``) for ``spec``."""
        return self.statistics(spec, operand)[0]


GROUP_SCORES = Need(SCORES, "scores", "group_by")
GROUP_TOP_SCORES = Need(TOP_SCORES, "scores", "group_by")
GROUP_COMPONENTS = Need(SCORES, "components", "group_by")
STEP_SCORES = Need(SCORES, "scores", "step_by")
STEP_MOMENTS = Need(TRAINABLE_MOMENTS, "advantages", "step_by")
STEP_RESPONSE_MOMENTS = Need(RESPONSE_MOMENTS, "advantages", "step_by")
GROUP_PATHS = Need(PATH_BASELINES, "paths", "group_by")
EPISODE_TURNS = Need(TURN_ROWS, "turns", "episode_by")

ESTIMATOR_STATISTICS: dict[str, tuple[Need, ...]] = {
    "grpo": (GROUP_SCORES,),
    "dr-grpo": (GROUP_SCORES,),
    "rloo": (GROUP_SCORES,),
    "opo": (GROUP_SCORES,),
    "gpg": (GROUP_SCORES, STEP_SCORES),
    "reinforce++": (STEP_MOMENTS,),
    "reinforce++-baseline": (GROUP_SCORES, STEP_MOMENTS),
    "maxrl": (GROUP_SCORES,),
    "grpo-passk": (GROUP_SCORES, GROUP_TOP_SCORES),
    "gdpo": (GROUP_COMPONENTS, STEP_MOMENTS),
    "optimal-token-baseline": (GROUP_PATHS,),
    "gigpo": (EPISODE_TURNS,),
    "step-reinforce": (EPISODE_TURNS,),
}
"""The keyed statistics each estimator needs over the whole input before its advantages can
be computed (an estimator not named needs none): the group statistics of the scores (and
grpo-passk's two best), gpg's step α, gdpo's group statistics of each reward component, the
whitening moments per step of the ``reinforce++`` estimators and gdpo. A new estimator declares its needs
here; the statistics pass (:mod:`gaecli.pipeline.passes`) gathers them."""


def estimator_needs(spec) -> tuple[Need, ...]:
    """The needs of ``spec``'s estimator (:data:`ESTIMATOR_STATISTICS`), with the batch's
    scores (per step) where its whitening rule normalises the scores by a batch statistic, and
    the turn rows over episodes (``episode_by``: in place of the rows' own statistics of the
    scores, which an outcome estimator then takes over the episodes)."""
    needs = row_needs(spec)
    if spec.over_episodes and EPISODE_TURNS not in needs:  # the rows' statistics are the episodes'
        needs = (EPISODE_TURNS, *(need for need in needs if need.of == "advantages"))
    return needs


def row_needs(spec) -> tuple[Need, ...]:
    """The needs of ``spec``'s estimator over its units (rows, or an outcome estimator's
    episodes: :func:`gaecli.advantages.episodes.episode_advantages` gathers these over the
    episodes), with the batch's scores where its rule normalises by a batch statistic."""
    from gaecli.advantages.spec import reads_steps

    needs = ESTIMATOR_STATISTICS.get(spec.estimator, ())
    profile = trainer_profile(spec)
    if profile is not None and profile.statistics == "response":  # whitened over every token
        needs = tuple(STEP_RESPONSE_MOMENTS if need == STEP_MOMENTS else need for need in needs)
    needs = tuple(group_scores_need(spec) if need == GROUP_SCORES else need for need in needs)  # its profile's score
    if spec.estimator in SCORE_NORMALISED and reads_steps(spec.estimator, spec.whitening_rule):
        needs = (*needs, STEP_SCORES)
    return needs


def trainer_profile(spec):
    """The trainer profile ``spec``'s estimator runs under
    (:class:`gaecli.advantages.estimator_profiles.EstimatorProfile`), None under the masked contract."""
    from gaecli.advantages.contract import MASKED

    if not spec.critic_free or spec.semantics == MASKED:
        return None
    from gaecli.advantages.estimator_profiles import estimator_profile

    return estimator_profile(spec.estimator, spec.semantics)


def declared_statistics(spec, operand: str = "new") -> tuple[Statistic, ...]:
    """The statistics ``spec`` needs when computed as the side ``operand`` (``new``,
    ``old``, ``old:K``)."""
    return tuple(statistic for need in estimator_needs(spec) for statistic in need.statistics(spec, operand))


def statistics_row_advantages(
    statistics: KeyedStatistics,
    spec,
    scores: np.ndarray,
    group_keys: Optional[pa.Array],
    step_keys: Optional[pa.Array],
    inputs: Optional[Mapping[str, np.ndarray]] = None,
) -> np.ndarray:
    """Each row's advantage (float64 ``[B]``) under ``spec``'s estimator from the declared
    ``statistics`` (:data:`ESTIMATOR_STATISTICS`; the rows' keys must have been added):
    gdpo's from each reward component's group statistics (``inputs``: each component's
    values ``[B]`` by column), the others' from the group statistics of the ``scores``."""
    rows = scores.size
    if spec.estimator == "gdpo":
        return component_row_values(statistics, spec, inputs, group_keys, rows)
    groups = statistics[group_scores_need(spec).statistic(spec)]
    codes = groups.known_codes(group_keys, rows, "group")
    if spec.estimator in SCORE_NORMALISED and spec.whitening_rule is not None:
        return rule_normalized_scores(statistics, spec, scores, codes, step_keys)
    n, means, stds, baselines = (values[codes] for values in groups.group_statistics())
    profile = trainer_profile(spec)
    if profile is not None and profile.single == "zero":  # a group of one gives 0
        return np.where(n > 1, row_advantages(spec.estimator, scores, n, means, stds, baselines, None), 0.0)
    if spec.estimator == "grpo-passk":
        best, second = (values[codes] for values in statistics[GROUP_TOP_SCORES.statistic(spec)].best_two())
        return passk_advantages(scores, n, stds, best, second)
    alphas = None
    if STEP_SCORES in estimator_needs(spec):
        steps = statistics[STEP_SCORES.statistic(spec)]
        alphas = steps.alphas()[steps.known_codes(step_keys, rows, "step")]
    return row_advantages(spec.estimator, scores, n, means, stds, baselines, alphas)


def group_scores_need(spec) -> Need:
    """The need of ``spec``'s group statistics of the scores: the contract's, or the score its
    trainer profile reads (:data:`SCORE_OPERANDS`)."""
    profile = trainer_profile(spec)
    if profile is None:
        return GROUP_SCORES
    return Need(SCORES, SCORE_OPERANDS[profile.scores], "group_by")


def whitens_returns(spec) -> bool:
    """Whether ``spec``'s returns are its whitened advantages: an estimator of
    :data:`gaecli.advantages.contract.WHITENED_RETURNS`, unless its trainer profile keeps them
    as computed (:attr:`gaecli.advantages.estimator_profiles.EstimatorProfile.whitened_returns`)."""
    profile = trainer_profile(spec)
    return spec.estimator in WHITENED_RETURNS and (profile is None or profile.whitened_returns)


def rule_normalized_scores(statistics: KeyedStatistics, spec, scores: np.ndarray, codes: np.ndarray, step_keys):
    """The scores normalised by ``spec.whitening_rule`` (float64 ``[B]``,
    :func:`gaecli.advantages.normalization.rule_center_scale`): the group's moments by the
    rows' group ``codes``, the batch's by their step (the whole input without a step id). A
    std at or below the rule's floor gives 0."""
    from gaecli.advantages.normalization import rule_center_scale

    rows = scores.size
    group = tuple(values[codes] for values in statistics[group_scores_need(spec).statistic(spec)].moments())
    batch = None
    if STEP_SCORES in estimator_needs(spec):
        steps = statistics[STEP_SCORES.statistic(spec)]
        batch = tuple(values[steps.known_codes(step_keys, rows, "step")] for values in steps.moments())
    with np.errstate(divide="ignore", invalid="ignore"):
        centers, scales = rule_center_scale(spec.whitening_rule, *group, np, batch=batch, values=scores)
        return (scores - centers) / scales


def token_baseline_inputs(
    statistics: KeyedStatistics, spec, paths: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, group_keys
) -> dict[str, np.ndarray]:
    """optimal-token-baseline's per-token inputs of the dispatch (each token's advantage and
    return, float64 ``[N]``) from the rows' ``paths`` (:func:`gaecli.advantages.token_baseline.path_operand`)
    and the declared (group, position) statistics of the input."""
    from gaecli.advantages.dispatch import TOKEN_ADVANTAGE, TOKEN_RETURN
    from gaecli.advantages.token_baseline import token_baseline_advantages

    sums = statistics[GROUP_PATHS.statistic(spec)]
    advantages, returns = token_baseline_advantages(sums, paths, trainable, offsets, group_keys)
    return {TOKEN_ADVANTAGE: advantages, TOKEN_RETURN: returns}


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
    ``n/(n − 1)·(s − μ)`` (``s`` for a group of one), opo ``s − baseline``, gpg ``α·(s − μ)``,
    maxrl ``(s − μ)/(μ + 1e-6)`` (``s`` for a group of one)."""
    centred = scores - means
    if estimator == "grpo":
        return centred / (stds + GROUP_EPSILON)
    if estimator in ("dr-grpo", "reinforce++-baseline"):
        return centred
    with np.errstate(divide="ignore", invalid="ignore"):
        if estimator == "rloo":
            return np.where(n > 1, n / np.maximum(n - 1, 1) * centred, scores)
        if estimator == "maxrl":  # μ + ε = 0 gives ±inf, as the trainer's does (docs/estimators.md)
            return np.where(n > 1, centred / (means + GROUP_EPSILON), scores)
    if estimator == "opo":
        return scores - baselines
    if estimator == "gpg":
        return alphas * centred
    raise ValueError(f"estimator {estimator!r} has no per-row advantage")


def passk_advantages(
    scores: np.ndarray, n: np.ndarray, stds: np.ndarray, best: np.ndarray, second: np.ndarray
) -> np.ndarray:
    """grpo-passk (float64 ``[B]``): the one row of a group of two or more whose score is the
    group's highest, ahead of the second highest, gets ``(best − second)/(σ + 1e-6)``; every
    other row 0 (a tied best gives the whole group 0; a group of one is 0)."""
    ahead = (n > 1) & (scores == best) & (best > second)
    with np.errstate(invalid="ignore"):
        return np.where(ahead, (best - second) / (stds + GROUP_EPSILON), 0.0)


def component_row_values(
    statistics: KeyedStatistics,
    spec,
    inputs: Optional[Mapping[str, np.ndarray]],
    group_keys: Optional[pa.Array],
    rows: int,
) -> np.ndarray:
    """gdpo's value of each row before its whitening (float64 ``[B]``): the weighted sum, in
    the order of ``spec.reward_components``, of each component normalised in its group,
    ``(c − μ)/(σ + 1e-6)`` (a group of one: ``c/(1 + 1e-6)``; a group that scored the same:
    exactly 0). ``inputs``: each component's values ``[B]`` by column."""
    if inputs is None:
        raise ValueError("estimator 'gdpo': the reward components' values are needed")
    weights = spec.reward_weights or (1.0,) * len(spec.reward_components)
    total = np.zeros(rows, dtype=np.float64)
    for need, name, weight in zip(GROUP_COMPONENTS.statistics(spec, "new"), spec.reward_components, weights):
        groups = statistics[need]
        codes = groups.known_codes(group_keys, rows, "group")
        _, means, stds, _ = (values[codes] for values in groups.group_statistics())
        total += float(weight) * ((inputs[name] - means) / (stds + GROUP_EPSILON))
    return total


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
    advantages: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    moments,
    keys: Optional[pa.Array],
    spec=None,
    response: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The ``reinforce++`` estimators' whitening: ``(A − mean) / sqrt(var + ε)`` with the
    statistics of each row's step (``moments``, :class:`gaecli.advantages.statistics.Moments` over
    trainable tokens, per ``keys`` or the whole input; over the response's tokens where ``spec``'s
    trainer profile takes them so), 0 at masked positions (at every position where the
    profile writes them there; a profile whose statistics are the response's writes them
    through the ``response`` mask, bool ``[N]``, as SkyRL's ``advantages * response_mask``
    does: 0 outside it, every position without one), in the advantages' dtype
    (:func:`gaecli.advantages.whiten.whiten_rows`)."""
    from gaecli.advantages.whiten import whiten_rows

    profile = None if spec is None else trainer_profile(spec)
    zeroed = trainable if profile is None or profile.written == "trainable" else None
    if writes_through_response(profile):
        zeroed = response
    # a step without a trainable token has no statistics (NaN) and no position that reads them
    return whiten_rows(advantages, offsets, moments, keys, trainable=zeroed, dtype=advantages.dtype)


def writes_through_response(profile) -> bool:
    """Whether a trainer profile (:class:`gaecli.advantages.estimator_profiles.EstimatorProfile`,
    None: the contract) writes its whitened advantages through the response mask, 0 outside it:
    its statistics the response's and its advantages written beyond the trainable tokens
    (SkyRL's ``reinforce++``, ``advantages * response_mask``)."""
    return profile is not None and profile.statistics == "response" and profile.written != "trainable"


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
    inputs: Optional[Mapping[str, np.ndarray]] = None,
    response: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A critic-free ``spec`` on one batch that is the whole input (the Python API): its
    statistics from these rows alone, the per-token pass by the dispatch, then the whitening
    of the ``reinforce++`` estimators and gdpo. Flat numpy arrays as :func:`row_scores` takes
    them, the rows' group and step ids as Arrow arrays (None where the spec has none), the
    estimator's own per-row inputs (``inputs``: remax's baseline rewards, gdpo's components,
    float64 ``[B]`` by name, checked; a turn-row estimator's episode and state ids as Arrow
    arrays, turn indices int64 and turn rewards float64); returns flat
    ``(advantages, returns)`` in the rewards' dtype; ``response``: the response mask (bool
    ``[N]``; None: every token), read by the trainer profiles that take it (SkyRL's reinforce++).
    The commands run the same steps with statistics gathered over every file (:mod:`gaecli.pipeline`)."""
    from gaecli.advantages.contract import GROUPED_ESTIMATORS
    from gaecli.advantages.dispatch import RESPONSE_MASK, ROW_ADVANTAGE, compute

    needs = declared_statistics(spec)
    keys = {name: ids for name, ids in ((spec.group_by, group_keys), (spec.step_by, step_keys)) if name is not None}
    inputs = dict(inputs or {})
    row_inputs = dict(inputs)
    if GROUP_PATHS.statistic(spec) in needs:
        from gaecli.advantages.token_baseline import path_operand

        token_inputs = (inputs[spec.log_probs], inputs[spec.sum_pi_squared])
        paths = path_operand(rewards, trainable, offsets, terminal_rewards, *token_inputs)
        statistics = KeyedStatistics(needs)
        statistics.add({PATHS: paths}, trainable, offsets, keys)
        row_inputs = token_baseline_inputs(statistics, spec, paths, trainable, offsets, group_keys)
    elif spec.over_episodes:
        spec, row_inputs, terminal_rewards = _episodes_batch(
            spec, rewards, trainable, offsets, terminal_rewards, group_keys, step_keys, inputs, kernel
        )
    elif spec.estimator in GROUPED_ESTIMATORS:
        scores, _ = row_scores(rewards, trainable, offsets, terminal_rewards)
        scores = side_scores(spec, scores, rewards, offsets, terminal_rewards)
        statistics = KeyedStatistics(tuple(need for need in needs if not need.reads_sides))
        operands = {
            **dict.fromkeys(SCORE_OPERANDS.values(), scores),
            **{COMPONENT + name: values for name, values in inputs.items()},
        }
        statistics.add(operands, trainable, offsets, keys)
        row_inputs[ROW_ADVANTAGE] = statistics_row_advantages(statistics, spec, scores, group_keys, step_keys, inputs)
    if response is not None:
        row_inputs[RESPONSE_MASK] = response
    advantages, returns = compute(
        spec, None, rewards, trainable, offsets, terminal_rewards, kernel=kernel, device=device, row_inputs=row_inputs
    )
    whitening = tuple(need for need in needs if need.reads_sides)
    if whitening:
        moments = KeyedStatistics(whitening)
        moments.add({"new": advantages}, trainable, offsets, keys, response=response)
        advantages = whiten_trainable(advantages, trainable, offsets, moments[whitening[0]], step_keys, spec, response)
        if whitens_returns(spec):
            returns = advantages
    return advantages, returns


def _episodes_batch(spec, rewards, trainable, offsets, terminal_rewards, group_keys, step_keys, inputs, kernel):
    """A critic-free ``spec`` over the episodes of one batch that is the whole input (the
    Python API; docs/episodes.md): the rows' figures settled over their episodes
    (:func:`gaecli.advantages.episodes.batch_turn_row_advantages`). Returns the spec each row is
    then computed by, its row inputs (each row's advantage) and the terminal rewards (reinforce++'s
    carries)."""
    from gaecli.advantages.contract import CARRIED, TURN_ROW_ESTIMATORS
    from gaecli.advantages.dispatch import ROW_ADVANTAGE, compute
    from gaecli.advantages.episodes import batch_turn_row_advantages, carry_figures, row_spec
    from gaecli.advantages.row_inputs import TURN_REWARDS

    ids = {"episode": inputs.pop(spec.episode_by), "group": group_keys, "step": step_keys}
    ids["state"] = inputs.pop(spec.state_by) if spec.state_by is not None else None
    turns, turn_rewards = inputs.pop(spec.turn_by), inputs.pop(TURN_REWARDS)
    if spec.estimator in TURN_ROW_ESTIMATORS:
        return spec, {ROW_ADVANTAGE: batch_turn_row_advantages(spec, terminal_rewards, ids, turns, turn_rewards)}, (
            terminal_rewards
        )  # fmt: skip
    zeros = np.zeros(offsets.size - 1)
    part, tokens = row_scores(rewards, trainable, offsets, zeros)
    figures, per_row = {"score_part": part, "tokens": tokens}, row_spec(spec)
    if spec.estimator in CARRIED:  # reinforce++: each row's own return, its carry to come
        own, _ = compute(per_row, None, rewards, trainable, offsets, zeros.astype(rewards.dtype), kernel=kernel)
        figures.update(carry_figures(own, None, trainable, offsets))
    settled = batch_turn_row_advantages(spec, terminal_rewards, ids, turns, turn_rewards, figures)
    if spec.estimator in CARRIED:
        return per_row, {}, settled.astype(terminal_rewards.dtype)
    return per_row, {ROW_ADVANTAGE: settled}, terminal_rewards
