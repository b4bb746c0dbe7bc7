"""The trainer profiles of the critic-free estimators: what each trainer's own estimator
computes at every position (docs/estimators.md#trainer-profiles-of-the-estimators), declared
here and read by the estimators' statistics and per-token pass; ``reinforce++``'s returns on
flat numpy buffers, through the masked-GAE kernel on rearranged inputs. The names load nothing
heavy (numpy is imported where the returns are computed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class EstimatorProfile:
    """How one trainer computes an estimator: ``reinforce++``'s returns (``returns``: the
    recursion, read by :func:`reinforce_returns`; None for an outcome estimator), the tokens
    its whitening statistics are taken over (``trainable``, or ``response``: every token), where
    the advantages are written (``trainable``: 0 elsewhere; ``every``: every position, as the
    trainer leaves them), an outcome estimator's score (``scores``: ``trainable``, the rewards
    at trainable tokens and ``z``, the contract's; ``every``, every token's reward and ``z``;
    ``outcome``, ``z`` alone, the per-token rewards left out), its value for a group of one
    (``single``: None, the estimator's own; ``zero``), whether each written token's own reward
    is added to the row's advantage there (``token_rewards``: slime's reinforce++-baseline,
    ``(z − μ) − kl_coef·kl_t``) and whether the returns of an estimator that whitens them with
    its advantages (:data:`gaecli.advantages.contract.WHITENED_RETURNS`) are whitened
    (``whitened_returns``; False: the advantages before the whitening, as the trainer keeps them)."""

    returns: Optional[str]
    summary: str
    statistics: str = "trainable"
    written: str = "trainable"
    scores: str = "trainable"
    single: Optional[str] = None
    token_rewards: bool = False
    whitened_returns: bool = True


REINFORCE_PROFILES: dict[str, EstimatorProfile] = {
    "verl@2026-08": EstimatorProfile(
        "skip-masked-lose-last", "verl after #7300: masked steps skipped, z lost when the last token is masked"
    ),
    "verl@2026-07": EstimatorProfile(
        "reset-at-masked", "verl before #7300: the return reset at every masked token (each run its own)"
    ),
    "slime": EstimatorProfile(
        "every-token-to-last-trainable",
        "slime: masked rewards zeroed, z on the last trainable token, γ over every token, whitened everywhere",
        written="every",
    ),
    "skyrl": EstimatorProfile(
        "every-token",
        "SkyRL: every token's reward, z on the last token, whitened over every token and written everywhere",
        statistics="response",
        written="every",
    ),
}
"""``reinforce++`` as each trainer computes it (every name a ``--baseline`` takes with
``--estimator reinforce++``; the sources: docs/estimators.md#trainer-profiles-of-the-estimators):

- ``verl@2026-08`` (verl ``verl/trainer/ppo/core_algos.py``
  ``compute_reinforce_plus_plus_outcome_advantage`` after #7300): masked tokens skipped
  (their reward dropped, the running return carried past them undiscounted), the outcome
  reward on the response's last token and lost when that token is masked; whitened over the
  trainable tokens, 0 at masked positions;
- ``verl@2026-07`` (the same function before #7300): the running return reset to 0 at every
  masked token, so a trainable run sees only the rewards of its own run (and the outcome
  reward only in the last run, when the response ends trainable); whitened as above;
- ``slime`` (``slime/utils/ppo_utils.py`` ``get_reinforce_plus_plus_returns``, whitened by
  ``distributed_masked_whiten``): the rewards at masked tokens zeroed, the outcome reward on
  the last trainable token, the return discounted over every token up to it (a masked token
  is a step of γ); whitened over the trainable tokens and written at every position;
- ``skyrl`` (``skyrl/backends/skyrl_train/utils/ppo_utils.py``
  ``compute_reinforce_plus_plus_outcome_advantage``): every token's reward, the outcome reward
  on the response's last token, discounted over every token; whitened over every token of the
  response (its ``response_mask``) and written at every position."""

_VERL_OUTCOME = EstimatorProfile(
    None, "verl: the score sums every token's reward and z; written at trainable tokens", scores="every"
)
_SKYRL_OUTCOME = EstimatorProfile(
    None, "SkyRL: the score sums every token's reward and z; written at every token", scores="every", written="every"
)
_SLIME_OUTCOME = EstimatorProfile(
    None, "slime: the score is z alone; a group of one gives 0; written at every token", scores="outcome",
    written="every", single="zero",
)  # fmt: skip
OUTCOME_PROFILES: dict[str, dict[str, EstimatorProfile]] = {
    "grpo": {"verl": _VERL_OUTCOME, "slime": _SLIME_OUTCOME, "skyrl": _SKYRL_OUTCOME},
    "dr-grpo": {"verl": _VERL_OUTCOME, "slime": _SLIME_OUTCOME, "skyrl": _SKYRL_OUTCOME},
    "rloo": {
        "verl": _VERL_OUTCOME,
        "skyrl": EstimatorProfile(
            None,
            "SkyRL: the score sums every token's reward and z; a group of one gives 0; written at every token",
            scores="every",
            written="every",
            single="zero",
        ),
    },
    "maxrl": {"skyrl": _SKYRL_OUTCOME},
    "reinforce++-baseline": {
        "slime": EstimatorProfile(
            None,
            "slime: z less its group's mean (one: 0) plus each token's reward, at every token; whitened over "
            "trainable tokens, the returns not",
            written="every",
            scores="outcome",
            single="zero",
            token_rewards=True,
            whitened_returns=False,
        ),
    },
}
"""The outcome estimators as verl, slime and SkyRL compute them (the sources:
docs/estimators.md#trainer-profiles-of-the-estimators): verl's ``compute_grpo_outcome_advantage``
(``norm_adv_by_std_in_grpo=False`` for dr-grpo) and ``compute_rloo_outcome_advantage``
(``verl/trainer/ppo/core_algos.py``) sum the response's token rewards, every token, and write
the row's advantage through its ``response_mask``, the trainable tokens; slime's
``_post_process_rewards`` (``slime/ray/rollout.py``: the scalar reward centred in its group and,
for grpo, divided by ``σ + 1e-6``; ``--disable-grpo-std-normalization`` for dr-grpo, which
``n_samples_per_prompt = 1`` sets, so a group of one gives 0) scores ``z`` alone, and its
``get_grpo_returns`` (``slime/utils/ppo_utils.py``) writes it at every token of the response;
its ``get_reinforce_plus_plus_baseline_advantages`` writes the centred ``z`` plus each token's
reward (its KL term, ``−kl_coef·kl``) at every token, then ``normalize_advantages`` whitens it over the loss mask
(``slime/backends/megatron_utils/loss.py`` ``compute_advantages_and_returns``, which keeps
the returns unwhitened); SkyRL's ``compute_grpo_outcome_advantage`` (``grpo_norm_by_std=False``
for dr-grpo), ``compute_rloo_outcome_advantage`` (a group of one: 0) and
``compute_maxrl_advantage`` (``skyrl/backends/skyrl_train/utils/ppo_utils.py``) sum every
token's reward and write through its ``response_mask``, every token of the response. Their
normalisations are the estimators' own (verl's and SkyRL's grpo rule is gaecli's default,
slime's is it with a group of one 0: ``SCORE_NORM_LIKE``)."""

ESTIMATOR_PROFILES: dict[str, dict[str, EstimatorProfile]] = {"reinforce++": REINFORCE_PROFILES, **OUTCOME_PROFILES}
"""The estimators with trainer profiles, each its profiles by name."""

NEWEST: dict[str, str] = {"verl": "verl@2026-08"}
"""A bare trainer name where a profile carries versions: its newest."""


def profile_listing() -> tuple[str, ...]:
    """The lines ``gae diff --list-baselines`` prints for the estimators' profiles: each
    estimator, then each of its names with what it computes."""
    lines = []
    for estimator, profiles in ESTIMATOR_PROFILES.items():
        names = profile_names(estimator)
        width = max(len(name) for name in names)
        lines.append(f"with --estimator {estimator} (or --old-estimator {estimator}):")
        for name in names:
            summary = profiles[name].summary if name in profiles else f"= {NEWEST[name]}, the newest"
            lines.append(f"  {name:<{width}}  {summary}")
        lines.append(f"  {'all':<{width}}  the newest of each trainer: {', '.join(newest_profiles(estimator))}")
    return tuple(lines)


def estimator_profile(estimator: str, semantics: str) -> EstimatorProfile:
    """The profile ``semantics`` (a name of :data:`ESTIMATOR_PROFILES`, or a bare name of
    :data:`NEWEST`) of ``estimator``."""
    profiles = ESTIMATOR_PROFILES[estimator]
    return profiles[semantics] if semantics in profiles else profiles[NEWEST[semantics]]


def profile_names(estimator: str) -> tuple[str, ...]:
    """Every name the profiles of ``estimator`` take: each profile, then the bare names of
    :data:`NEWEST` that name one of them."""
    profiles = tuple(ESTIMATOR_PROFILES.get(estimator, {}))
    return (*profiles, *(bare for bare, newest in NEWEST.items() if newest in profiles))


def newest_profiles(estimator: str) -> tuple[str, ...]:
    """The newest profile of each trainer of ``estimator`` (what ``--baseline all`` names),
    by its bare name where the trainer's profiles carry versions."""
    bare = {newest: name for name, newest in NEWEST.items()}
    profiles = ESTIMATOR_PROFILES.get(estimator, {})
    return tuple(bare.get(name, name) for name in profiles if "@" not in name or name in bare)


def reinforce_returns(semantics: str, rewards, trainable, offsets, terminal_rewards, gamma: float, response=None):
    """The returns of ``reinforce++`` under the trainer profile ``semantics``, before its
    whitening, at every position (flat ``[N]`` in the rewards' dtype): masked GAE with V = 0
    and λ = 1 (the ``native`` kernel) on inputs laid out so that its recursion is the
    trainer's (:data:`REINFORCE_PROFILES`). Shapes as :func:`gaecli.advantages.dispatch.compute`.
    ``response``: the response mask (bool ``[N]``, ``--response-mask-col``; None: every token),
    which SkyRL's recursion reads (``G = G·response_mask_t``: a token outside it starts a new
    sum, so the tokens before it see none of the rewards after it)."""
    import numpy as np

    from gaecli.advantages.contract import MASKED
    from gaecli.advantages.dispatch import gae_flat
    from gaecli.advantages.layout import ends_trainable, last_trainable_index

    kind = estimator_profile("reinforce++", semantics).returns
    offsets = np.asarray(offsets, dtype=np.int64)
    zeros = np.zeros_like(rewards)
    if kind == "skip-masked-lose-last":
        kept = np.where(ends_trainable(trainable, offsets), terminal_rewards, 0).astype(rewards.dtype)
        return gae_flat(zeros, rewards, trainable, offsets, kept, gamma=gamma, lambd=1.0, semantics=MASKED)[0]
    if kind == "reset-at-masked":
        return _run_returns(rewards, trainable, offsets, terminal_rewards, gamma)
    every = np.ones(rewards.size, dtype=bool)
    shaped = rewards.copy()
    rows = offsets.size - 1
    nonempty = offsets[1:] > offsets[:-1]
    if kind == "every-token":
        np.add.at(shaped, offsets[1:][nonempty] - 1, terminal_rewards[nonempty].astype(rewards.dtype))
    else:  # every-token-to-last-trainable
        shaped = np.where(trainable, rewards, 0).astype(rewards.dtype)
        last = last_trainable_index(trainable, offsets)
        np.add.at(shaped, last[last >= 0], terminal_rewards[last >= 0].astype(rewards.dtype))
    if kind == "every-token" and response is not None:  # a sum of its own from each token outside the response
        offsets = np.union1d(offsets, np.flatnonzero(~np.asarray(response, dtype=bool))).astype(np.int64)
        rows = offsets.size - 1
    no_terminal = np.zeros(rows, dtype=rewards.dtype)
    return gae_flat(zeros, shaped, every, offsets, no_terminal, gamma=gamma, lambd=1.0, semantics=MASKED)[0]


def _run_returns(rewards, trainable, offsets, terminal_rewards, gamma):
    """verl's returns before #7300 at trainable tokens (0 elsewhere: the trainer's values
    there are masked out after its whitening): each maximal run of trainable tokens its own
    discounted sum, the outcome reward in the run that ends the response."""
    import numpy as np

    from gaecli.advantages.dispatch import gae_flat

    positions = np.flatnonzero(trainable)
    rows = np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))[positions]
    breaks = (np.diff(positions) != 1) | (np.diff(rows) != 0)
    starts = np.concatenate(([0], np.flatnonzero(breaks) + 1)) if positions.size else np.zeros(0, np.int64)
    run_offsets = np.append(starts, positions.size).astype(np.int64)
    run_ends = positions[run_offsets[1:] - 1]
    ends_response = run_ends == offsets[1:][rows[run_offsets[1:] - 1]] - 1
    run_terminal = np.where(ends_response, terminal_rewards[rows[run_offsets[1:] - 1]], 0).astype(rewards.dtype)
    values = np.zeros(positions.size, dtype=rewards.dtype)
    every = np.ones(positions.size, dtype=bool)
    returns = gae_flat(values, rewards[positions], every, run_offsets, run_terminal, gamma=gamma, lambd=1.0)[0]
    result = np.zeros_like(rewards)
    result[positions] = returns
    return result
