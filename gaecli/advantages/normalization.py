"""How whitening and the group estimators' score normalisation normalise
(docs/semantics.md#whitening-rules): the choices the trainers use, as one small object
(:class:`WhiteningRule`, the spec's ``whitening_rule``), the trainers' own for each use
(:data:`NORM_LIKE`: whitening; :data:`SCORE_NORM_LIKE`: grpo's scores; ``--norm-like``), and
its formula written once for numpy and torch (:func:`rule_center_scale`: each unit's centre
and divisor from the count, mean and Bessel variance of its group and of its batch). Unset,
every field keeps today's rule: ``(A − mean) / sqrt(var + 1e-8)``, the Bessel variance, a
group of one token whitened to 0; grpo keeps ``(s − μ)/(σ + 1e-6)``."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

import numpy as np

from gaecli.advantages.contract import GROUP_EPSILON, WHITEN_EPSILON
from gaecli.errors import InvalidOptionError
from gaecli.options import check_choice, check_number

LEVELS: tuple[str, ...] = ("group", "batch", "none")
"""Where a statistic is taken: over the groups (whitening: ``--normalize-by``'s, or the whole
input under ``--normalize``; scores: ``--group-col``'s), over the batch (the whole input, or
each ``--step-col`` value for scores), or not at all (no centring; no scaling)."""

USES: tuple[str, ...] = ("whitening", "scores", "turn-scores")
"""What a rule normalises: the advantages' trainable tokens (``--normalize``), the per-row
scores of the estimators in :data:`gaecli.advantages.contract.SCORE_NORMALISED` (their own
rule replaced), or the turn rows' outcomes and discounted returns of the estimators in
:data:`gaecli.advantages.contract.TURN_ROW_ESTIMATORS` (ROLL's rule, :data:`TURN_ROW_RULE`, the
base)."""

EPSILON_PLACES: tuple[str, ...] = ("sqrt", "std", "floor")
"""Where ε goes: ``sqrt(var + ε)`` (gaecli's, verl's ``masked_whiten``, slime's), ``std + ε``
(AReaL's ``Normalization``), ``sqrt(max(var, ε))`` (OpenRLHF's)."""

TOKEN_SETS: tuple[str, ...] = ("trainable", "response")
"""Which tokens whitening's statistics are taken over: the trainable ones (every trainer but
SkyRL, and the default), or every token of the response, loss-masked ones included (SkyRL passes
its ``response_mask`` to ``masked_whiten``). Either way the whitened advantages are written at the
trainable tokens only."""

BELOW_FLOOR: tuple[str, ...] = ("zero", "undivided")
"""What a std at or below the rule's floor gives: 0 (ROLL's ``agentic_reward_norm``), or the
centred value left undivided (NeMo-RL divides only where the std is above 0)."""

ONE_TOKEN: tuple[str, ...] = ("zero", "keep", "unit")
"""A group of at most one unit (a trainable token when whitening, a row when normalising
scores): normalised as any other (its variance 0: centred, it gives 0), left as it is (ROLL's
``masked_whiten`` turns whitening off), or given mean 0 and std 1, ε applied as ever (verl's
group of one)."""


@dataclass(frozen=True)
class WhiteningRule:
    """The normalisation choices (hashable): the centre's and the divisor's level
    (:data:`LEVELS`), the Bessel (``unbiased``) or biased variance, ε and its place
    (:data:`EPSILON_PLACES`), a group of at most one unit (:data:`ONE_TOKEN`), leave-one-out
    centring (each unit centred on its group's others, the std taken about those centres;
    ``std_of_others``: the std of the others instead, per row, for scores only), and a std
    floor (``std_floor``: a std at or below it gives what ``below_floor`` says,
    :data:`BELOW_FLOOR`; None: none), the tokens whitening's statistics are taken over
    (``tokens``, :data:`TOKEN_SETS`), and an ε added to the count ``n`` where the mean and the
    variance divide by it (``count_eps``: NeMo-RL's ``masked_mean``, ``Σ/(n + 1e-8)``; 0: none;
    not with leave-one-out). The default is today's whitening rule. Checked on construction
    (:class:`InvalidOptionError`, naming the option)."""

    mean: str = "group"
    std: str = "group"
    unbiased: bool = True
    eps: float = WHITEN_EPSILON
    eps_in: str = "sqrt"
    one_token: str = "zero"
    leave_one_out: bool = False
    std_of_others: bool = False
    std_floor: Optional[float] = None
    below_floor: str = "zero"
    tokens: str = "trainable"
    count_eps: float = 0.0

    def __post_init__(self) -> None:
        check_choice("--norm-mean", self.mean, LEVELS, "level")
        check_choice("--norm-std", self.std, LEVELS, "level")
        check_choice("--norm-eps-in", self.eps_in, EPSILON_PLACES, "place")
        check_choice("--norm-one-token", self.one_token, ONE_TOKEN, "choice")
        check_choice("--norm-below-floor", self.below_floor, BELOW_FLOOR, "choice")
        check_choice("--norm-tokens", self.tokens, TOKEN_SETS, "token set")
        numbers = (("--norm-eps", self.eps, False), ("--norm-std-floor", self.std_floor, True),
                   ("--norm-count-eps", self.count_eps, False))  # fmt: skip
        for flag, value, optional in numbers:
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidOptionError(f"{flag} must be a number, got {value!r}")
            check_number(flag, value, 0.0)
        if self.std_of_others and not (self.leave_one_out and self.std == self.mean):
            raise InvalidOptionError(
                "--norm-std-of-others takes the std of each row's leave-one-out others: it needs "
                "--norm-leave-one-out and the std at the centre's level"
            )
        if self.leave_one_out and self.count_eps:
            raise InvalidOptionError(
                "--norm-count-eps adds ε to the count of the mean's and the variance's denominators: it takes no "
                "--norm-leave-one-out"
            )
        if self.leave_one_out and self.mean == "none":
            raise InvalidOptionError(
                "--norm-leave-one-out centres on the others' mean: it needs --norm-mean group or batch"
            )

    @property
    def is_default(self) -> bool:
        """Whether this is today's rule (whose bits the default path keeps)."""
        return self == WhiteningRule()

    def levels_used(self) -> tuple[str, ...]:
        """The levels whose statistics the rule reads (centre, divisor), each once."""
        return tuple(dict.fromkeys(level for level in (self.mean, self.std) if level != "none"))


NEMO_RL_COUNT_EPSILON = 1e-8
"""NeMo-RL's ε on the count in ``masked_mean`` and ``masked_var`` (``nemo_rl/algorithms/utils.py``):
the mean ``Σ/(n + 1e-8)`` — another ε than the variance's ``rsqrt(var + 1e-8)``, of the same size."""

NORM_LIKE: dict[str, WhiteningRule] = {
    "verl": WhiteningRule(),
    "slime": WhiteningRule(),
    "nemo-rl": WhiteningRule(count_eps=NEMO_RL_COUNT_EPSILON),
    "roll": WhiteningRule(one_token="keep"),
    "areal": WhiteningRule(eps=1e-5, eps_in="std"),
    "openrlhf": WhiteningRule(unbiased=False, eps=1e-8, eps_in="floor"),
    "skyrl": WhiteningRule(tokens="response"),
}
"""Each trainer's whitening of the advantages (``--norm-like``; docs/semantics.md#whitening-rules):
verl ``verl/utils/torch_functional.py`` ``masked_whiten``, slime ``slime/utils/distributed_utils.py``
``distributed_masked_whiten``, NeMo-RL's GAE whitening and ROLL's ``masked_whiten`` are all
``(A − mean) · rsqrt(var + 1e-8)`` with the Bessel variance, ROLL leaving a batch of at most one
token as it is; NeMo-RL's (``nemo_rl/algorithms/advantage_estimator.py``,
``GeneralizedAdvantageEstimator._reward_whiten``, with ``masked_mean`` and ``masked_var`` of
``nemo_rl/algorithms/utils.py``) divides the masked sums of its mean and of its variance by
``n + 1e-8`` (``count_eps``), the variance then times ``n/(n − 1)``; AReaL's ``Normalization``
(``NormConfig`` defaults) divides by ``std + 1e-5``; OpenRLHF's experience maker by
``rsqrt(max(var, 1e-8))`` of the biased variance; SkyRL's
``masked_whiten`` (``skyrl/backends/skyrl_train/utils/ppo_utils.py``) is verl's formula over its
``response_mask``, every token of the response (``tokens="response"``)."""


SCORE_RULE = WhiteningRule(eps=GROUP_EPSILON, eps_in="std", one_token="unit")
"""The rule of grpo's own score normalisation, ``(s − μ)/(σ + 1e-6)`` with the Bessel σ and
verl's group of one (μ = 0, σ = 1): the base the explicit ``--norm-*`` options change for
scores. dr-grpo's own is this with ``std="none"``."""

SCORE_NORM_LIKE: dict[str, WhiteningRule] = {
    "verl": SCORE_RULE,
    "slime": replace(SCORE_RULE, one_token="zero"),
    "nemo-rl": replace(SCORE_RULE, one_token="zero", leave_one_out=True, std_of_others=True, std_floor=0.0,
                       below_floor="undivided"),  # fmt: skip
    "roll": replace(SCORE_RULE, one_token="zero", std_floor=GROUP_EPSILON),
    "areal": WhiteningRule(mean="batch", std="batch", eps=1e-5, eps_in="std"),
    "openrlhf": replace(SCORE_RULE, eps=1e-9, one_token="zero"),
    "skyrl": SCORE_RULE,
}
"""Each trainer's normalisation of grpo's scores (``--norm-like`` with a score-normalised
estimator; docs/semantics.md#score-normalisation): verl ``compute_grpo_outcome_advantage``
(``(s − μ)/(σ + 1e-6)``, a group of one μ = 0, σ = 1); slime ``_post_process_rewards`` (the
same, a group of one 0); NeMo-RL ``calculate_baseline_and_std_per_prompt`` with
``GRPOAdvantageEstimator`` (the others' mean and the others' Bessel std, dividing only where
it is above 0); ROLL ``agentic_reward_norm`` (a std at or below 1e-6 gives 0); AReaL
``Normalization`` with ``NormConfig``'s defaults (batch mean and std, ``std + 1e-5``); OpenRLHF's
``group_norm`` (``σ + 1e-9``); SkyRL ``compute_grpo_outcome_advantage`` (verl's: ``σ + 1e-6``, a
group of one μ = 0, σ = 1)."""


TURN_ROW_RULE = SCORE_NORM_LIKE["roll"]
"""The rule of the turn-row estimators (gigpo, step-reinforce) when none is given, and the base
the ``--norm-*`` options change for them: ROLL's ``agentic_reward_norm`` ``mean_std``
(``roll/pipeline/agentic/utils.py`` ``get_score_normalize_fn``): ``(x − μ)/(σ + 1e-6)``, a group of
one or a σ at or below 1e-6 giving 0. Its ``mean`` method is this rule with ``std="none"``."""


def rule_use(estimator: str) -> str:
    """What a rule given with ``estimator`` normalises (:data:`USES`): its scores when it is
    score-normalised, a turn row's figures for a turn-row estimator, the whitening otherwise."""
    from gaecli.advantages.contract import SCORE_NORMALISED, TURN_ROW_ESTIMATORS

    if estimator in TURN_ROW_ESTIMATORS:
        return "turn-scores"
    return "scores" if estimator in SCORE_NORMALISED else "whitening"


def whitening_rule(like: Optional[str] = None, use: str = "whitening", **explicit) -> Optional[WhiteningRule]:
    """The rule of ``--norm-like`` (a trainer) for ``use`` (:data:`USES`: its whitening,
    :data:`NORM_LIKE`, or its scores' normalisation, :data:`SCORE_NORM_LIKE`) with the
    explicit choices (``explicit``: the :class:`WhiteningRule` fields given, None for those
    not) over it, or over the use's own rule (today's whitening, :data:`SCORE_RULE`); None
    when nothing is given (the estimator's or whitening's own rule). The turn rows' figures
    (``turn-scores``) take the presets of the scores, over ROLL's rule."""
    given = {name: value for name, value in explicit.items() if value is not None}
    if like is None and not given:
        return None
    check_choice("use", use, USES, "use")
    presets = NORM_LIKE if use == "whitening" else SCORE_NORM_LIKE
    if like is not None:
        check_choice("--norm-like", like, presets, "trainer")
    own = {"whitening": WhiteningRule(), "scores": SCORE_RULE, "turn-scores": TURN_ROW_RULE}[use]
    base = presets[like] if like is not None else own
    unknown = set(given) - {field.name for field in fields(WhiteningRule)}
    if unknown:
        raise InvalidOptionError(f"unknown whitening choice {sorted(unknown)[0]!r}")
    return replace(base, **given)


def rule_center_scale(rule: WhiteningRule, counts, means, variances, xp, batch=None, values=None):
    """Each unit's centre and divisor under ``rule`` (``(x − centre) / divisor`` normalises
    it), from the count ``n``, mean and Bessel variance (0 for one unit) of its group
    (``counts``, ``means``, ``variances``) and of its batch (``batch``, the same three; None:
    the group's), all of one shape, in the array library ``xp`` (numpy or torch, float64);
    ``values``, the units themselves, only for ``std_of_others``.

    The centre is the mean at ``rule.mean``'s level (0 at ``none``). The variance is taken at
    ``rule.std``'s level about that level's mean, or about 0 when the centre is 0
    (``var + n·mean²/(n − 1)``), biased when asked (×(n − 1)/n). With ``count_eps`` δ (a level
    of more than one unit) both divide their sums by ``n + δ``: the mean is ``mean·n/(n + δ)``,
    the variance is taken about that mean and times ``n/(n + δ)`` (the Bessel variance
    ``Σ(x − c)²/(n + δ) · n/(n − 1)``, NeMo-RL's; biased: ``Σ(x − c)²/(n + δ)``); one unit
    keeps its own mean, and so whitens to 0 (NeMo-RL's ``n/(n − 1)`` makes its variance
    infinite). The divisor is ``sqrt(var + ε)``, ``std + ε`` or ``sqrt(max(var, ε))`` (1 at
    ``none``). Leave-one-out centres each
    unit on the mean of its group's others, ``x − (Σ − x)/(n − 1) = k·(x − μ)`` with
    ``k = n/(n − 1)``, and takes the std about those centres, ``k·std``, or with
    ``std_of_others`` the std of the others (their squared deviations
    ``(n − 1)·var − k·(x − μ)²`` over ``n − 2``, or ``n − 1`` biased; 0 for ``n ≤ 2``): the
    divisor returned is over ``k``. A group of at most one unit (at the centre's level) under
    ``keep`` gets centre 0 and divisor 1, under ``unit`` centre 0 and std 1; a std at or below
    ``std_floor`` gives an infinite divisor (the unit normalises to 0) or, ``undivided``, 1."""
    batch = (counts, means, variances) if batch is None else batch
    levels = {"group": (counts, means, variances), "batch": batch}
    center_counts, center_means, _ = levels["group" if rule.mean == "none" else rule.mean]
    several = center_counts > 1
    centers = center_means if rule.mean != "none" else center_means * 0.0
    if rule.count_eps and rule.mean != "none":
        centers = xp.where(several, centers * _count_share(rule, center_counts), centers)
    factor = None
    if rule.leave_one_out:
        factor = xp.where(several, center_counts / xp.where(several, center_counts - 1, 1), 1.0)
    if rule.std == "none":
        scales = centers * 0.0 + 1.0
    else:
        std_counts, std_means, std_variances = levels[rule.std]
        spread = _rule_variance(rule, std_counts, std_means, std_variances, factor, values, xp)
        if rule.one_token == "unit":
            spread = xp.where(several, spread, 1.0)
        scales = _divisor(rule, spread, xp)
        if rule.std_floor is not None:
            below = 1.0 if rule.below_floor == "undivided" else float("inf")
            scales = xp.where(xp.sqrt(spread) <= rule.std_floor, spread * 0.0 + below, scales)
    if factor is not None:
        scales = scales / factor
    if rule.one_token != "zero":
        centers = xp.where(several, centers, 0.0)
    if rule.one_token == "keep":
        scales = xp.where(several, scales, 1.0)
    return centers, scales


def _rule_variance(rule: WhiteningRule, counts, means, variances, factor, values, xp):
    """The variance the divisor is taken of (:func:`rule_center_scale`): at the std's level,
    about the centre used, biased when asked; under leave-one-out about each unit's centre
    (``factor`` k: k² times) or, ``std_of_others``, of the unit's others."""
    several = counts > 1
    spare = xp.where(several, counts - 1, 1) * 1.0
    if rule.std_of_others:
        deviations = values - means
        squares = xp.maximum(variances * spare - factor * deviations * deviations, 0.0)
        others = counts - 1 if rule.unbiased else counts
        return xp.where(counts > 2, squares / xp.where(counts > 2, others - 1, 1), 0.0)
    spread = variances
    if rule.mean == "none" or rule.count_eps:  # about 0, or about the mean·n/(n + δ): mean·δ/(n + δ) off
        offsets = means if rule.mean == "none" else means * (rule.count_eps / (counts + rule.count_eps))
        spread = spread + xp.where(several, counts * offsets * offsets / spare, 0.0)
    if not rule.unbiased:
        spread = xp.where(several, spread * spare / counts, 0.0)
    if rule.count_eps:
        spread = spread * _count_share(rule, counts)
    return spread if factor is None else spread * factor * factor


def _count_share(rule: WhiteningRule, counts):
    """``n/(n + δ)``, δ the rule's ``count_eps``: a sum over ``n + δ`` is its mean times it."""
    return counts / (counts + rule.count_eps)


def _divisor(rule: WhiteningRule, spread, xp):
    """The divisor of a variance ``spread`` with ε in its place (:data:`EPSILON_PLACES`)."""
    if rule.eps_in == "sqrt":
        return xp.sqrt(spread + rule.eps)
    if rule.eps_in == "std":
        return xp.sqrt(spread) + rule.eps
    return xp.sqrt(xp.maximum(spread, spread * 0.0 + rule.eps))


def clipped(advantages, limit: Optional[float]):
    """``advantages`` clipped to ``[−limit, limit]`` (the spec's ``advantage_clip``; None: as
    they are), a new numpy array or tensor of their dtype; masked positions hold 0 and keep it."""
    if limit is None:
        return advantages
    if isinstance(advantages, np.ndarray):
        return np.clip(advantages, -limit, limit).astype(advantages.dtype, copy=False)
    return advantages.clamp(-limit, limit)
