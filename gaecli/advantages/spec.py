"""What is computed, as one small immutable object: :class:`AdvantageSpec`. The dispatch
(:mod:`gaecli.advantages.dispatch`) runs a spec on a batch; kernels declare which of its
features they support. Definitions: docs/semantics.md; how later estimators and variants
extend it: docs/architecture.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Optional

from gaecli.advantages.contract import (
    BASELINES,
    CRITIC_FREE,
    EPISODE_ESTIMATORS,
    ESTIMATOR_INPUTS,
    ESTIMATOR_PARAMETERS,
    ESTIMATORS,
    GROUPED_ESTIMATORS,
    MASKED,
    NORMALIZATIONS,
    REQUIRED_INPUTS,
    SCORE_NORMALISED,
    SEMANTICS,
    STEP_ESTIMATORS,
    TIMESTEPS,
    TOKEN_INPUTS,
    TURN_ESTIMATORS,
    TURN_ROW_ESTIMATORS,
    profile_variants,
)
from gaecli.advantages.normalization import WhiteningRule
from gaecli.errors import InvalidOptionError
from gaecli.options import check_choice, check_number

VARIANT_INPUTS: dict[str, str] = {
    "turn_rewards": "list",
    "truncated": "scalar",
    "bootstrap_values": "scalar",
    "turn_ids": "list",
}
"""The per-row inputs of the GAE variants: field (and role) → kind."""

VARIANT_FIELDS: tuple[str, ...] = ("lambd_critic", "lambd_alpha", "lambd_schedule", "lambd_q", *VARIANT_INPUTS)

LAMBD_SCHEDULES: tuple[str, ...] = ("relative-position",)
"""The per-sample λ schedules of ``lambd_schedule`` (docs/variants.md), each with its
parameter: ``relative-position`` (AReaL's) with ``lambd_q``."""

ESTIMATOR_FIELDS: tuple[str, ...] = (
    "gamma",
    "lambd",
    "group_by",
    "step_by",
    "baseline_rewards",
    "reward_components",
    "reward_weights",
    "log_probs",
    "sum_pi_squared",
    "episode_by",
    "turn_by",
    "state_by",
    "episode_weight",
    "step_weight",
)
"""The spec fields an estimator reads or refuses (:func:`check_estimator_values`): the discount
parameters, the group and step ids and the estimators' own inputs."""
"""The GAE variant fields that are off when None; each set one is a feature of its own
(``timestep`` is ``timestep:<unit>``)."""


def refuse(message: str) -> None:
    """Raise the error of a spec value that cannot be computed (one place to change its class)."""
    raise InvalidOptionError(message)


@dataclass(frozen=True)
class RowInput:
    """An extra per-row input a spec reads besides values, rewards, mask and terminal reward:
    ``name`` (the column in the commands, the key of ``row_inputs`` in Python), what it is
    for (``role``) and its ``kind`` (``scalar``: one value per row; ``list``: a list per row)."""

    name: str
    role: str
    kind: str


@dataclass(frozen=True)
class AdvantageSpec:
    """What is computed (hashable, picklable; checked on construction).

    - ``gamma``, ``lambd``: γ and λ, numbers in [0, 1]: both required by ``gae``, γ alone by
      ``reinforce++``, and refused (left None) by the other estimators, which read neither.
    - ``semantics``: ``"masked"`` (the contract) or a name of
      :data:`gaecli.advantages.contract.BASELINES` (what a trainer computed): a trainer
      profile (``verl``, ``openrlhf``, ``slime``, ``roll``, ``areal``, ``nemo-rl``, ``skyrl``) or an
      alias of one (``unmasked``, ``skip-masked``, ``zero-masked``), kept as given; with a
      critic-free estimator that has trainer profiles, one of them
      (:data:`gaecli.advantages.estimator_profiles.ESTIMATOR_PROFILES`: ``reinforce++``'s
      ``verl``, ``verl@2026-08``, ``verl@2026-07``, ``slime``, ``skyrl``; grpo's and dr-grpo's
      ``verl``, ``slime`` and ``skyrl``; rloo's ``verl`` and ``skyrl``; maxrl's ``skyrl``;
      reinforce++-baseline's ``slime``).
    - ``normalize``: ``"none"``, ``"all"`` (whiten over every trainable token of the input) or
      ``"by"`` (per group of rows with equal ``normalize_by`` key; ``normalize_by`` names that
      per-row input); ``whitening_rule`` (a
      :class:`~gaecli.advantages.normalization.WhiteningRule`, or None for today's rule) how.
    - ``advantage_clip``: None, or C > 0: the advantages, of any estimator, clipped to
      ``[−C, C]`` after every normalisation (ROLL's ``advantage_clip``); the returns are not.
    - ``estimator``: ``"gae"`` or a critic-free estimator of
      :data:`gaecli.advantages.contract.CRITIC_FREE` (docs/estimators.md), which needs the
      masked semantics and no ``normalize``. ``group_by`` names the per-row prompt-group id
      (required by the estimators of :data:`~gaecli.advantages.contract.GROUPED_ESTIMATORS`,
      refused by the others); ``step_by`` the per-row step id that splits gpg's α and the
      whitening of the ``reinforce++`` estimators and gdpo (None: the whole input; refused
      where unused). An estimator's own per-row inputs
      (:data:`gaecli.advantages.contract.ESTIMATOR_INPUTS`), refused by the others:
      ``baseline_rewards`` names remax's per-row baseline reward (the greedy rollout's);
      ``reward_components`` names gdpo's reward components (one or more per-row scalar
      inputs, a tuple), and ``reward_weights`` their weights (a tuple of as many finite
      numbers; None: all 1). ``log_probs`` and ``sum_pi_squared`` name optimal-token-baseline's
      per-token inputs (a number per token each: the policy's log-prob of the token and
      ``Σπ²`` over the vocabulary).
    - Turn rows (the estimators of :data:`~gaecli.advantages.contract.TURN_ROW_ESTIMATORS`,
      docs/episodes.md): ``episode_by`` names the per-row episode id (the rows of one episode
      are its turns), ``turn_by`` the per-row turn index (an integer, unique within the
      episode), ``state_by`` gigpo's per-row anchor-state id; ``turn_rewards`` then names a
      per-row number, the turn's own reward; ``episode_weight`` and ``step_weight`` (None: 1)
      weigh gigpo's episode and step advantages.
    - The GAE variants (docs/variants.md), each off by default; they apply to the masked
      contract only (``semantics="masked"``, ``estimator="gae"``), but for the truncation
      bootstrap, which the ``areal`` profile takes too (AReaL's no-EOS bootstrap):

      - ``timestep``: ``"token"`` (every trainable token a timestep) or ``"turn"`` (every
        maximal run of trainable tokens one timestep, AReaL's turn-level GAE);
      - ``lambd_critic``: λ of the returns (decoupled GAE), in [0, 1];
      - ``lambd_alpha``: α of the length-adaptive λ of the advantages, finite and > 0;
      - ``lambd_schedule`` with ``lambd_q``: the relative-position λ of the advantages
        (``"relative-position"``, λ = q^(1/(L−1)); q finite in (0, 1]; set both or
        neither; not with ``lambd_alpha``);
      - ``turn_rewards``: the name of a per-row list input, one reward per turn;
      - ``truncated`` and ``bootstrap_values``: the names of two per-row scalar inputs (set
        both or neither): a truncated row's value after its last trainable token (or turn)
        is its bootstrap value instead of 0;
      - ``turn_ids``: the name of a per-row list input, one turn id per token (−1 at masked
        tokens): with ``timestep="turn"`` (only), the turns are its ids instead of the
        mask's runs.

      The four names are the columns in the commands and the keys of ``row_inputs`` in
      Python (:attr:`row_inputs`).
    """

    gamma: Optional[float] = None
    lambd: Optional[float] = None
    semantics: str = MASKED
    normalize: str = "none"
    normalize_by: Optional[str] = None
    estimator: str = "gae"
    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    lambd_schedule: Optional[str] = None
    lambd_q: Optional[float] = None
    turn_rewards: Optional[str] = None
    truncated: Optional[str] = None
    bootstrap_values: Optional[str] = None
    turn_ids: Optional[str] = None
    group_by: Optional[str] = None
    step_by: Optional[str] = None
    baseline_rewards: Optional[str] = None
    reward_components: Optional[tuple[str, ...]] = None
    reward_weights: Optional[tuple[float, ...]] = None
    whitening_rule: Optional[WhiteningRule] = None
    log_probs: Optional[str] = None
    sum_pi_squared: Optional[str] = None
    advantage_clip: Optional[float] = None
    episode_by: Optional[str] = None
    turn_by: Optional[str] = None
    state_by: Optional[str] = None
    episode_weight: Optional[float] = None
    step_weight: Optional[float] = None

    def __post_init__(self) -> None:
        for field in ("reward_components", "reward_weights"):  # a list given is kept as a tuple (hashable)
            if isinstance(getattr(self, field), list):
                object.__setattr__(self, field, tuple(getattr(self, field)))
        self._check_estimator()
        if self.semantics not in SEMANTICS and not self.critic_free:
            refuse(f"unknown semantics {self.semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")
        if self.normalize not in NORMALIZATIONS:
            refuse(f"unknown normalize {self.normalize!r}; choose one of: {', '.join(NORMALIZATIONS)}")
        if (self.normalize == "by") != (self.normalize_by is not None):
            refuse("normalize='by' needs normalize_by (the per-row group key), and normalize_by needs normalize='by'")
        check_whitening_rule(self.whitening_rule, self.normalize, estimator=self.estimator)
        check_advantage_clip(self.advantage_clip)
        check_variant_values({name: getattr(self, name) for name in ("timestep", *VARIANT_FIELDS)})
        self._check_variants()
        if self.estimator in TURN_ROW_ESTIMATORS and self.turn_rewards is None:
            refuse(f"estimator {self.estimator!r} needs turn_rewards (the per-row input of each turn's own reward)")
        if self.over_episodes:
            self._check_episodes()

    @property
    def over_episodes(self) -> bool:
        """Whether rows are the turns of episodes (``episode_by`` set): a turn-row estimator, or
        masked GAE over each episode's trainable subsequence (docs/episodes.md)."""
        return self.episode_by is not None

    def _check_episodes(self) -> None:
        """Masked GAE over episodes: the masked contract, no GAE variant but a turn row's reward."""
        if self.estimator not in EPISODE_ESTIMATORS:
            return
        if self.semantics != MASKED:
            refuse(f"episodes over rows (episode_by) are computed under the masked contract, not {self.semantics!r}")
        if self.variants:
            refuse(f"the GAE variants ({', '.join(self.variants)}) do not run over episodes (episode_by) yet")
        if self.critic_free and self.turn_rewards is not None:
            refuse(f"estimator {self.estimator!r} scores an episode by its outcome and token rewards: "
                   "leave turn_rewards None (gigpo and step-reinforce read a turn's reward)")  # fmt: skip

    def _check_variants(self) -> None:
        """The GAE variants apply to the masked contract of GAE only (docs/variants.md), but
        for the turn rewards a turn estimator reads (:data:`TURN_ESTIMATORS`) and the variants
        a trainer profile takes (:data:`gaecli.advantages.contract.PROFILE_VARIANTS`: ``areal``'s
        truncation bootstrap)."""
        variants = self.variants
        if self.estimator in TURN_ESTIMATORS:
            variants = tuple(name for name in variants if name != "turn_rewards")
        if variants and self.estimator != "gae":
            turns = f" (turn_rewards: or {', '.join(map(repr, TURN_ESTIMATORS))})" if "turn_rewards" in variants else ""
            refuse(f"the GAE variants ({', '.join(variants)}) need estimator 'gae'{turns}, got {self.estimator!r}")
        if variants and self.semantics != MASKED:
            taken = profile_variants(self.semantics)
            others = [name for name in variants if name not in taken]
            if others:
                takes = f" (which takes {' and '.join(taken)} only)" if taken else ""
                refuse(
                    f"the GAE variants ({', '.join(others)}) apply to the masked contract only, "
                    f"not to the {self.semantics!r} baseline{takes}"
                )

    @cached_property  # a frozen spec: computed once (the list API reads it on every call)
    def variants(self) -> tuple[str, ...]:
        """The names of the GAE variant fields set away from their defaults (empty: plain GAE)."""
        names = [name for name in VARIANT_FIELDS if getattr(self, name) is not None]
        if self.episode_by is not None:  # a turn row's reward is a number per row, not a variant
            names = [name for name in names if name != "turn_rewards"]
        return (("timestep",) if self.timestep != "token" else ()) + tuple(names)

    def _check_estimator(self) -> None:
        """The estimator, the discount parameters it reads, its per-row inputs and scaling
        (:func:`check_estimator_values`), and the contract a critic-free estimator runs under."""
        values = {name: getattr(self, name) for name in (*ESTIMATOR_FIELDS, "whitening_rule")}
        check_estimator_values((self.estimator,), values, self.normalize != "none")
        if self.estimator in CRITIC_FREE and self.semantics != MASKED:
            from gaecli.advantages.estimator_profiles import profile_names

            profiles = profile_names(self.estimator)
            if self.semantics not in profiles:
                choices = f"the masked contract or a trainer profile: {MASKED}, {', '.join(profiles)}"
                refuse(
                    f"estimator {self.estimator!r} runs under "
                    f"{choices if profiles else 'the masked contract only'} (semantics {self.semantics!r})"
                )

    @property
    def critic_free(self) -> bool:
        """Whether the estimator reads no values (docs/estimators.md)."""
        return self.estimator in CRITIC_FREE

    @cached_property  # a frozen spec: computed once (kernels are resolved against it on every call)
    def features(self) -> frozenset[str]:
        """What a kernel must support to run this spec (``estimator:…``, ``timestep:…``, and
        one name per variant field set). Semantics and normalisation run around the kernel,
        so every kernel of the estimator supports them. A critic-free estimator asks for what
        masked GAE asks for: the kernel runs only ``reinforce++``'s discounted return (masked
        GAE with V = 0, λ = 1); the outcome estimators' per-token pass needs no kernel."""
        estimator = "gae" if self.critic_free else self.estimator
        timestep = "turn" if self.estimator in TURN_ESTIMATORS else self.timestep
        required = {f"estimator:{estimator}", f"timestep:{timestep}"}
        if self.estimator in TURN_ESTIMATORS:
            required.add("turn_rewards")  # the runs' rewards go to the kernel as turn rewards
        required |= {name for name in self.variants if name != "timestep"}
        return frozenset(required)

    @property
    def row_inputs(self) -> tuple[RowInput, ...]:
        """The extra per-row inputs this spec reads: the ``normalize_by`` key, the group and
        step ids of the critic-free estimators, remax's baseline reward and gdpo's reward
        components (each a number per row), then the variants' inputs, each with its
        field's name as its role (``turn_rewards``: a list per row; ``truncated``,
        ``bootstrap_values``: a scalar per row)."""
        named = (
            ("normalize-key", self.normalize_by),
            ("group-id", self.group_by),
            ("step-id", self.step_by),
            ("baseline-reward", self.baseline_rewards),
            *(("reward-component", name) for name in self.reward_components or ()),
        )
        inputs = [RowInput(name, role, "scalar") for role, name in named if name is not None]
        tokens = (("log-probs", self.log_probs), ("sum-pi-squared", self.sum_pi_squared))
        inputs += [RowInput(name, role, "tokens") for role, name in tokens if name is not None]
        turn_rows = (("episode-id", self.episode_by), ("turn-index", self.turn_by), ("state-id", self.state_by))
        inputs += [RowInput(name, role, "scalar") for role, name in turn_rows if name is not None]
        for role, kind in VARIANT_INPUTS.items():
            name = getattr(self, role)
            if name is not None:
                turn_row = role == "turn_rewards" and self.episode_by is not None
                inputs.append(RowInput(name, role, "scalar" if turn_row else kind))
        return tuple(inputs)

    @property
    def normalize_label(self) -> str:
        """``none``, ``all`` or ``by:KEY``: the ``gaecli.normalize`` metadata value."""
        return f"by:{self.normalize_by}" if self.normalize == "by" else self.normalize

    def to_dict(self) -> dict:
        """Every field by name (for metadata and JSON reports; the whitening rule as its
        fields, or None)."""
        record = {field.name: getattr(self, field.name) for field in fields(self)}
        if self.whitening_rule is not None:
            record["whitening_rule"] = asdict(self.whitening_rule)
        return record


INPUT_MEANINGS = {
    "baseline_rewards": "a baseline reward per row, the greedy rollout's",
    "reward_components": "the reward components, a number per row each",
    "log_probs": "the policy's log-prob of each token",
    "sum_pi_squared": "Σπ² over the vocabulary at each token",
    "episode_by": "the episode id of each turn row",
    "turn_by": "the turn index of each turn row",
    "state_by": "the anchor-state id of each turn row",
}
"""What each required estimator input is, for the messages."""


class SpecWords:
    """How :func:`check_estimator_values` words a refusal for the API: by the spec's fields."""

    def name(self, field: str) -> str:
        return field

    def unknown(self, estimator: str) -> None:
        refuse(f"unknown estimator {estimator!r}; implemented: {', '.join(ESTIMATORS)}")

    def needs(self, field: str, estimator: str) -> str:
        if field == "group_by":
            return f"estimator {estimator!r} needs group_by (the per-row prompt-group id)"
        if field in INPUT_MEANINGS:
            return f"estimator {estimator!r} needs {field} ({INPUT_MEANINGS[field]})"
        return f"estimator {estimator!r} needs {field}"

    def weights(self, components: int, weights: int) -> str:
        return f"reward_weights holds {weights} weights for {components} reward_components; give one per component"

    def unused(self, field: str, estimators: tuple[str, ...]) -> str:
        estimator = estimators[0]
        if field in ("group_by", "step_by") and estimator not in CRITIC_FREE:
            return f"{field} is for the critic-free estimators; estimator 'gae' does not use it"
        if field == "group_by":
            return f"estimator {estimator!r} has no groups; leave group_by None"
        if field == "step_by":
            return f"estimator {estimator!r} has no statistic per step; leave step_by None"
        return f"estimator {estimator!r} does not use {field}; leave it None"

    def scaling(self, estimator: str) -> str:
        return f"estimator {estimator!r} defines its own scaling; normalize must be 'none'"


def check_estimator_values(
    estimators: tuple[str, ...], values: dict, normalize: bool, words: Optional[SpecWords] = None
) -> None:
    """Refuse (:class:`InvalidOptionError`) the values of the estimators computed together
    (``estimators``: a spec's one, or a command's sides, ``gae`` standing for a GAE
    baseline): an unknown estimator; γ / λ (``values``' ``gamma``, ``lambd``) missing where an
    estimator reads them, given where none does, or out of [0, 1]; whitening (``normalize``)
    with a critic-free estimator; the group id (``group_by``) missing where an estimator
    groups or given where none does; the step id (``step_by``) given where none has a
    statistic per step (:func:`reads_steps`; ``values``' ``whitening_rule`` is the first
    estimator's, docs/estimators.md). The one check of the spec and of the commands'
    options; ``words`` says how the caller names them (the spec's fields; the commands: their
    options)."""
    words = words or SpecWords()
    for estimator in estimators:
        if estimator not in ESTIMATORS:
            words.unknown(estimator)
    for field in ("gamma", "lambd"):
        used = [estimator for estimator in estimators if field in ESTIMATOR_PARAMETERS.get(estimator, ())]
        if used and values[field] is None:
            refuse(words.needs(field, used[0]))
        if not used and values[field] is not None:
            refuse(words.unused(field, estimators))
        check_number(words.name(field), values[field], 0.0, 1.0)
    critic_free = [estimator for estimator in estimators if estimator in CRITIC_FREE]
    if critic_free and normalize:
        refuse(words.scaling(critic_free[0]))
    grouped = [estimator for estimator in estimators if estimator in GROUPED_ESTIMATORS]
    if grouped and values["group_by"] is None:
        refuse(words.needs("group_by", grouped[0]))
    if not grouped and values["group_by"] is not None:
        refuse(words.unused("group_by", estimators))
    rule = values.get("whitening_rule")
    reading = [reads_steps(estimator, rule if index == 0 else None) for index, estimator in enumerate(estimators)]
    if values["step_by"] is not None and not any(reading):
        refuse(words.unused("step_by", estimators))
    _check_estimator_inputs(estimators, values, words)


def _check_estimator_inputs(estimators: tuple[str, ...], values: dict, words: SpecWords) -> None:
    """The estimators' own inputs (:data:`ESTIMATOR_INPUTS`): required by their estimator (the
    weights excepted), refused where no estimator reads them; gdpo's components distinct
    non-empty names and their weights as many finite numbers."""
    for field in (name for inputs in ESTIMATOR_INPUTS.values() for name in inputs):
        used = [estimator for estimator in estimators if field in ESTIMATOR_INPUTS.get(estimator, ())]
        optional = field in ("episode_by", "turn_by") and all(estimator in EPISODE_ESTIMATORS for estimator in used)
        if used and field in REQUIRED_INPUTS and values[field] is None and not optional:
            refuse(words.needs(field, used[0]))
        if not used and values[field] is not None:
            refuse(words.unused(field, estimators))
    baseline = values["baseline_rewards"]
    if baseline is not None and (not isinstance(baseline, str) or not baseline):
        refuse(f"{words.name('baseline_rewards')} names a per-row input: a non-empty string, got {baseline!r}")
    components, weights = values["reward_components"], values["reward_weights"]
    if components is not None:
        if not components or any(not isinstance(name, str) or not name for name in components):
            refuse(f"{words.name('reward_components')} names one or more per-row inputs, got {components!r}")
        if len(set(components)) != len(components):
            refuse(f"{words.name('reward_components')} names a component twice: {', '.join(components)}")
    _check_turn_row_inputs(values, words)
    if weights is not None:
        if components is not None and len(weights) != len(components):
            refuse(words.weights(len(components), len(weights)))
        for weight in weights:
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                refuse(f"{words.name('reward_weights')} must be finite numbers, got {weight!r}")
    _check_token_inputs(values, words)


def _check_turn_row_inputs(values: dict, words: SpecWords) -> None:
    """The turn rows' inputs: the ids' names non-empty, gigpo's weights finite numbers."""
    for field in ("episode_weight", "step_weight"):
        weight = values.get(field)
        if weight is not None and (
            isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
        ):
            refuse(f"{words.name(field)} must be a finite number, got {weight!r}")
    for field in ("episode_by", "turn_by", "state_by"):
        name = values.get(field)
        if name is not None and (not isinstance(name, str) or not name):
            refuse(f"{words.name(field)} names a per-row input: a non-empty string, got {name!r}")
    if (values.get("episode_by") is None) != (values.get("turn_by") is None):
        given, missing = ("episode_by", "turn_by") if values.get("turn_by") is None else ("turn_by", "episode_by")
        refuse(f"{words.name(given)} needs {words.name(missing)} too (the episode id and the turn index of each row)")


def _check_token_inputs(values: dict, words: SpecWords) -> None:
    """optimal-token-baseline's per-token inputs: each a non-empty name."""
    for field in TOKEN_INPUTS:
        name = values[field]
        if name is not None and (not isinstance(name, str) or not name):
            refuse(f"{words.name(field)} names a per-token input: a non-empty string, got {name!r}")


def check_advantage_clip(limit, name: str = "advantage_clip") -> None:
    """Refuse (:class:`InvalidOptionError`) an advantage clip that is not None or a finite
    number above 0 (``name``: how the caller names it)."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        refuse(f"{name} must be a finite number above 0 (advantages are clipped to [-C, C]), got {limit!r}")


def reads_steps(estimator: str, rule=None) -> bool:
    """Whether ``estimator`` (with ``rule``, its whitening rule or None) has a statistic per
    step, which the step id splits: gpg's α, the whitening of the ``reinforce++`` estimators
    and gdpo, and a batch-level statistic of a score-normalised estimator's rule."""
    if estimator in STEP_ESTIMATORS:
        return True
    normalised = estimator in SCORE_NORMALISED or estimator in TURN_ROW_ESTIMATORS
    return normalised and isinstance(rule, WhiteningRule) and "batch" in rule.levels_used()


def check_whitening_rule(rule, normalize: str, words: Optional[dict] = None, estimator: str = "gae") -> None:
    """Refuse (:class:`InvalidOptionError`) a whitening rule that is not a
    :class:`~gaecli.advantages.normalization.WhiteningRule`, one with a critic-free
    ``estimator`` whose scores it cannot normalise (one outside
    :data:`~gaecli.advantages.contract.SCORE_NORMALISED`), one without whitening to say how
    to do (GAE, ``normalize`` ``none``), and a std of each row's others where no scores are
    normalised. ``words``: how the caller names the whitening, the rule and the estimator
    (the commands: their options)."""
    if rule is None:
        return
    named = {"normalize": "normalize", "rule": "whitening_rule", "estimator": "estimator", **(words or {})}
    if not isinstance(rule, WhiteningRule):
        refuse(f"{named['rule']} must be a gaecli WhiteningRule or None, got {type(rule).__name__}")
    if rule.tokens != "trainable" and estimator in CRITIC_FREE:
        refuse(f"{named['rule']}: whitening over every token of the response is for the whitening of GAE advantages")
    if estimator in SCORE_NORMALISED or estimator in TURN_ROW_ESTIMATORS:
        return
    if estimator in CRITIC_FREE:
        refuse(
            f"{named['rule']} says how {named['normalize']} whitens and how {' and '.join(SCORE_NORMALISED)} "
            f"normalise their scores; {named['estimator']} {estimator!r} has its own rule: leave it out"
        )
    if rule.std_of_others:
        refuse(f"{named['rule']}: the std of each row's others is for the scores of {' and '.join(SCORE_NORMALISED)}")
    if normalize == "none":
        refuse(f"{named['rule']} says how {named['normalize']} whitens; turn {named['normalize']} on, or leave it out")


def check_variant_values(values: dict, flags: Optional[dict] = None) -> None:
    """Refuse (:class:`InvalidOptionError`) a GAE variant value (docs/variants.md; ``values``:
    spec field → value, those absent unset): the one check of the spec's fields and of the
    commands' options. ``flags``: spec field → the option a command names it by, named in
    the messages (None: the spec's fields, as the API names them)."""
    named = flags or {}

    def name(field: str) -> str:
        return named.get(field, field)

    timestep = values.get("timestep", "token")
    if timestep not in TIMESTEPS:
        if flags:
            check_choice(name("timestep"), timestep, TIMESTEPS, "timestep")
        refuse(f"unknown timestep {timestep!r}; implemented: {', '.join(TIMESTEPS)}")
    for field, bounds in (("lambd_critic", (0.0, 1.0)), ("lambd_alpha", ())):
        value = values.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (flags or math.isfinite(value)):
            refuse(f"{name(field)} must be a finite number or None, got {value!r}")
        check_number(name(field), value, *bounds)
        if field == "lambd_alpha" and not value > 0:
            refuse(f"{name(field)} must be > 0, got {value:g}")
    _check_lambd_schedule(values, name, bool(flags))
    for field in VARIANT_INPUTS:
        value = values.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            refuse(f"{name(field)} names a per-row input: a non-empty string or None, got {value!r}")
    if (values.get("truncated") is None) != (values.get("bootstrap_values") is None):
        how = "give both or neither" if flags else "set both (the flag and the value) or neither"
        refuse(f"{name('truncated')} and {name('bootstrap_values')} go together: {how}")
    if values.get("turn_ids") is not None and timestep != "turn":
        value = "turn" if flags else "'turn'"
        refuse(f"{name('turn_ids')} gives the turns of {name('timestep')} {value}: set {name('timestep')} {value} too")


def _check_lambd_schedule(values: dict, name, options: bool) -> None:
    """The per-sample λ schedule (``lambd_schedule``) and its parameter ``lambd_q``: a known
    schedule, q a finite number in (0, 1], both or neither, and not with ``lambd_alpha`` (two
    λ of the advantages). ``name``: how the caller names a field; ``options``: the commands'."""
    schedule, q = values.get("lambd_schedule"), values.get("lambd_q")
    if schedule is not None and schedule not in LAMBD_SCHEDULES:
        if options:
            check_choice(name("lambd_schedule"), schedule, LAMBD_SCHEDULES, "λ schedule")
        refuse(f"unknown lambd_schedule {schedule!r}; implemented: {', '.join(LAMBD_SCHEDULES)}")
    if q is not None:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or not 0 < q <= 1:
            refuse(f"{name('lambd_q')} must be a finite number in (0, 1], got {q!r}")
    if (schedule is None) != (q is None):
        how = "give both or neither" if options else "set both or neither"
        refuse(f"{name('lambd_schedule')} relative-position and {name('lambd_q')} go together: {how}")
    if schedule is not None and values.get("lambd_alpha") is not None:
        refuse(
            f"{name('lambd_schedule')} and {name('lambd_alpha')} each set the λ of the advantages: give one of them"
        )


def estimator_spec(
    estimator: str,
    gamma: Optional[float],
    lambd: Optional[float],
    group_by: Optional[str] = None,
    step_by: Optional[str] = None,
    **fields_: object,
) -> AdvantageSpec:
    """The spec of ``estimator`` under the masked contract with γ, λ, the per-row ids and the
    estimator inputs (``baseline_rewards``, ``reward_components``, ``reward_weights`` among
    ``fields_``) it reads and no others (one set of options serves every side of a
    comparison), plus the other ``fields_`` (normalisation, GAE variants)."""
    used = ESTIMATOR_PARAMETERS.get(estimator, ())
    inputs = ESTIMATOR_INPUTS.get(estimator, ())
    own = {name: fields_.pop(name) for name in [name for name in fields_ if name in ESTIMATOR_FIELDS]}
    return AdvantageSpec(
        gamma if "gamma" in used else None,
        lambd if "lambd" in used else None,
        estimator=estimator,
        group_by=group_by if estimator in GROUPED_ESTIMATORS else None,
        step_by=step_by if reads_steps(estimator, fields_.get("whitening_rule")) else None,
        **{name: value for name, value in own.items() if name in inputs},
        **fields_,
    )
