"""The contract's constants and names, defined once (what they mean: docs/semantics.md).
Imports neither torch nor numba."""

from __future__ import annotations

from gaecli.errors import InvalidOptionError

MASKED = "masked"
"""The contract's own semantics: GAE over each sample's trainable tokens (docs/semantics.md)."""

PROFILES: tuple[str, ...] = ("verl", "openrlhf", "slime", "roll", "areal", "nemo-rl", "skyrl")
"""The trainer profiles: what each trainer computed at HEAD, at every position
(docs/semantics.md#the-trainer-profiles), in documentation order."""

PROFILE_SUMMARIES: dict[str, str] = {
    "verl": "verl's PPO: masked steps skipped, z on the last response token (lost when it is masked)",
    "openrlhf": "OpenRLHF: V and r zeroed at masked tokens, GAE over every token, z on the last trainable token",
    "slime": "slime, pre-fix miles: the mask ignored, GAE over every token, z on the last response token",
    "roll": "ROLL: r masked but not V, GAE over every token, then A·m; z lost when the last token is masked",
    "areal": "AReaL: verl's loop (masked steps skipped, z on the last response token), no-EOS bootstrap by "
    "--truncated-col",
    "nemo-rl": "NeMo-RL: masked steps skipped, z on the last trainable token: the contract on trainable tokens",
    "skyrl": "SkyRL: slime's recursion (the mask read nowhere); it whitens: add --normalize --norm-like skyrl",
}
"""What each profile of :data:`PROFILES` computes, in one line (``gae diff --list-baselines``;
the whole table: docs/semantics.md#the-trainer-profiles)."""

PROFILE_VARIANTS: dict[str, tuple[str, ...]] = {"areal": ("truncated", "bootstrap_values")}
"""The GAE variant fields (docs/variants.md) a trainer profile takes, where its trainer computes
them: AReaL's loop starts from ``nextvalues = values[:, T − 1] · seq_no_eos_mask``, the
truncation bootstrap (docs/semantics.md#the-trainer-profiles). Every other profile takes none."""

ALIASES: dict[str, str] = {"unmasked": "slime", "zero-masked": "openrlhf", "skip-masked": "verl"}
"""The generic baseline names of earlier releases, each the profile it now names."""

ALL_PROFILES = "all"
"""In a list of baselines: every profile of :data:`PROFILES`."""

BASELINES: tuple[str, ...] = (*PROFILES, *ALIASES)
"""Every name of what a trainer computed instead of the contract: the profiles, then the aliases."""

SEMANTICS: tuple[str, ...] = (MASKED, *BASELINES)

ESTIMATORS: tuple[str, ...] = (
    "gae",
    "grpo",
    "dr-grpo",
    "rloo",
    "opo",
    "gpg",
    "reinforce++",
    "reinforce++-baseline",
    "maxrl",
    "grpo-passk",
    "remax",
    "gdpo",
    "optimal-token-baseline",
    "opd",
    "agentic-reinforce",
    "gigpo",
    "step-reinforce",
)
"""Advantage estimators implemented: masked GAE, then the critic-free ones (docs/estimators.md)."""

CRITIC_FREE: tuple[str, ...] = ESTIMATORS[1:]
"""The estimators that read no values."""

GROUPED_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "dr-grpo",
    "rloo",
    "opo",
    "gpg",
    "reinforce++-baseline",
    "maxrl",
    "grpo-passk",
    "gdpo",
    "optimal-token-baseline",
    "gigpo",
    "step-reinforce",
)
"""The estimators that compare a sample's score with its prompt group's (they need a group id per row)."""

WHITENED_ESTIMATORS: tuple[str, ...] = ("reinforce++", "reinforce++-baseline", "gdpo")
"""The estimators whose advantages are whitened over the input, or per step."""

ESTIMATOR_INPUTS: dict[str, tuple[str, ...]] = {
    "remax": ("baseline_rewards",),
    "gdpo": ("reward_components", "reward_weights"),
    "optimal-token-baseline": ("log_probs", "sum_pi_squared"),
    "gae": ("episode_by", "turn_by"),
    **{estimator: ("episode_by", "turn_by") for estimator in ("grpo", "dr-grpo", "rloo", "opo", "gpg")},
    "reinforce++": ("episode_by", "turn_by"),
    "reinforce++-baseline": ("episode_by", "turn_by"),
    "gigpo": ("episode_by", "turn_by", "state_by", "episode_weight", "step_weight"),
    "step-reinforce": ("episode_by", "turn_by"),
}
"""The spec fields naming an estimator's own per-row inputs (required, but for ``reward_weights``,
by that estimator and refused by the others): remax's baseline reward column, gdpo's reward
component columns and their weights, optimal-token-baseline's per-token log-probs and Σπ²."""

WHITENED_RETURNS: tuple[str, ...] = ("reinforce++-baseline", "gdpo")
"""The whitened estimators whose returns are their whitened advantages (``reinforce++``'s are
its discounted returns)."""

REQUIRED_INPUTS: tuple[str, ...] = (
    "baseline_rewards",
    "reward_components",
    "log_probs",
    "sum_pi_squared",
    "episode_by",
    "turn_by",
    "state_by",
)
"""The fields of :data:`ESTIMATOR_INPUTS` an estimator cannot do without."""

STEP_ESTIMATORS: tuple[str, ...] = ("gpg", *WHITENED_ESTIMATORS)
"""The estimators with a statistic over the whole input that a step id splits (gpg's α, whitening)."""

TURN_ESTIMATORS: tuple[str, ...] = ("agentic-reinforce",)
"""The critic-free estimators whose timesteps are a row's turns (its maximal runs of
trainable tokens): they read the per-turn rewards of ``--turn-rewards-col`` (the spec's
``turn_rewards``), the one GAE variant input a critic-free estimator takes."""

EPISODE_OUTCOME_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "dr-grpo",
    "rloo",
    "opo",
    "gpg",
    "reinforce++",
    "reinforce++-baseline",
)
"""The critic-free estimators that also score episodes that span rows (docs/episodes.md): an
episode's score over its trainable subsequence, each episode once in its group, its advantage
on every one of its rows."""

EPISODE_ESTIMATORS: tuple[str, ...] = ("gae", *EPISODE_OUTCOME_ESTIMATORS)

CARRIED: tuple[str, ...] = ("gae", "reinforce++")
"""The estimators whose recursion runs over an episode's trainable subsequence
(docs/episodes.md): each row's value settled over the episodes is the terminal reward its own
recursion then runs with (reinforce++ is masked GAE with V = 0 and λ = 1)."""
"""The estimators that also run over episodes that span rows, the episode's trainable tokens in
turn order and token order one trainable subsequence (``episode_by`` and ``turn_by`` set;
docs/episodes.md), and otherwise over each row."""

TURN_ROW_ESTIMATORS: tuple[str, ...] = ("gigpo", "step-reinforce")
"""The estimators of turn rows (docs/episodes.md): one row per turn of an episode, the rows of
one episode sharing its id (the spec's ``episode_by``) and ordered by a turn index
(``turn_by``); each row's ``turn_rewards`` is one number (its turn's reward), its terminal
reward the episode's outcome. They normalise each turn's discounted return (and gigpo the
outcome) within groups of turn rows, ROLL's ``agentic_reward_norm`` by default."""

SCORE_NORMALISED: tuple[str, ...] = ("grpo", "dr-grpo")
"""The estimators whose advantage is the row's score normalised within its group: a
whitening rule given to them (the spec's ``whitening_rule``, the ``--norm-*`` options) replaces
their own, ``(s − μ)/(σ + 1e-6)`` and ``s − μ`` (docs/semantics.md#whitening-rules); a rule
with a batch-level statistic reads the step id as the batch."""

ESTIMATOR_PARAMETERS: dict[str, tuple[str, ...]] = {
    "gae": ("gamma", "lambd"),
    "reinforce++": ("gamma",),
    "agentic-reinforce": ("gamma",),
    "gigpo": ("gamma",),
    "step-reinforce": ("gamma",),
}
"""The discount parameters each estimator reads (none for the others)."""

GROUP_EPSILON = 1e-6
"""ε of grpo: ``(s − μ) / (σ + ε)`` (and of grpo-passk, and of gdpo's components); of maxrl:
``(s − μ) / (μ + ε)``."""

TOKEN_BASELINE_EPSILON = 1e-8
"""ε of optimal-token-baseline: ``b_k = Σ G·W / (Σ W + ε)``."""

TOKEN_INPUTS: tuple[str, ...] = ("log_probs", "sum_pi_squared")
"""The fields of :data:`ESTIMATOR_INPUTS` naming a per-token input (a number per token, read at
trainable tokens): optimal-token-baseline's log-probs and Σπ²."""

TIMESTEPS: tuple[str, ...] = ("token", "turn")
"""Timestep units: ``token`` (every trainable token a timestep) and ``turn`` (every maximal
run of trainable tokens one timestep; docs/variants.md)."""

NORMALIZATIONS: tuple[str, ...] = ("none", "all", "by")
"""Whitening of the advantages: none, over every trainable token of the input, or per group
of rows sharing a key."""

WHITEN_EPSILON = 1e-8
"""ε of whitening: ``(A − mean) / sqrt(var + ε)``."""


def profile_of(semantics: str) -> str:
    """The profile an alias names, or ``semantics`` itself (a profile or ``masked``)."""
    return ALIASES.get(semantics, semantics)


def profile_variants(semantics: str) -> tuple[str, ...]:
    """The GAE variant fields the profile ``semantics`` (or its alias) takes
    (:data:`PROFILE_VARIANTS`; none for another profile or a name gaecli does not know)."""
    return PROFILE_VARIANTS.get(profile_of(semantics), ())


def baseline_names() -> tuple[tuple[str, str], ...]:
    """Every name a list of baselines takes, each with what it names in one line: the
    profiles (:data:`PROFILE_SUMMARIES`), the aliases (:data:`ALIASES`), ``masked`` (the
    contract itself) and ``all``, in that order."""
    return (
        *PROFILE_SUMMARIES.items(),
        *((alias, f"= {profile}, the name of earlier releases") for alias, profile in ALIASES.items()),
        (MASKED, "the contract itself: masked GAE (the old side of a diff of the GAE variants)"),
        (ALL_PROFILES, f"every profile: {', '.join(PROFILES)}"),
    )


def expand_baselines(text: str, option: str = "--baseline", estimator: str = "gae") -> tuple[str, ...]:
    """The baselines of a comma list such as ``verl,openrlhf`` or ``all``: the names in the
    order given, as written, with ``all`` expanded in place to :data:`PROFILES`; ``masked``
    (the contract itself: the old side of a diff of the GAE variants) is accepted too. For a
    critic-free ``estimator`` the names are its trainer profiles
    (:func:`gaecli.advantages.estimator_profiles.profile_names`), ``all`` the newest of each
    trainer.

    Raises :class:`InvalidOptionError` (a usage error, exit 2; the message starts with
    ``option``) for an empty item, an unknown name, a name given twice, or an alias listed
    with its target (``unmasked,slime``, or ``all,skip-masked``; ``verl,verl@2026-08``)."""
    from gaecli.advantages.estimator_profiles import NEWEST, newest_profiles, profile_names

    gae = estimator == "gae"
    if not gae and not profile_names(estimator):
        from gaecli.advantages.estimator_profiles import ESTIMATOR_PROFILES

        raise InvalidOptionError(
            f"{option}: {estimator} has no trainer profiles (the estimators that have: "
            f"{', '.join(ESTIMATOR_PROFILES)}); give --old-estimator NAME or --against COLUMN as the old side"
        )
    known = (*BASELINES, MASKED) if gae else (*profile_names(estimator), MASKED)
    everything = PROFILES if gae else newest_profiles(estimator)
    names: list[str] = []
    for item in str(text).split(","):
        name = item.strip()
        if not name:
            raise InvalidOptionError(f"{option}: empty name in {text!r}; give names separated by commas")
        if name == ALL_PROFILES:
            names.extend(everything)
        elif name in known:
            names.append(name)
        elif gae:
            raise InvalidOptionError(
                f"{option}: unknown baseline {name!r}; choose one of: {ALL_PROFILES}, {MASKED}, {', '.join(BASELINES)}"
            )
        else:
            raise InvalidOptionError(
                f"{option}: {name!r} is no trainer profile of {estimator}; choose one of: {ALL_PROFILES}, "
                f"{', '.join(known)}"
            )
    seen: dict[str, str] = {}
    for name in names:
        profile = profile_of(name) if gae else NEWEST.get(name, name)
        if profile in seen:
            earlier = seen[profile]
            what = f"{name!r} twice" if earlier == name else f"{earlier!r} and {name!r}, which name the same profile"
            raise InvalidOptionError(f"{option}: {what} (profile {profile!r}); give each once")
        seen[profile] = name
    return tuple(names)
