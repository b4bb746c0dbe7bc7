"""verl's advantage functions with verl's signatures (``verl/trainer/ppo/core_algos.py``,
volcengine/verl ``b178a3c``; docs/trainers.md#verl): padded ``[B, T]`` tensors, the masked
contract by default or verl's own profile with ``semantics="verl"``; plus :func:`register`,
which adds gaecli's GAE to verl's registry under a new name, and :func:`patch` /
:func:`unpatch`, which swap verl's ``compute_gae_advantage_return`` (what verl's trainer calls
for GAE) for the drop-in and back. Importing this module does not import verl."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from gaecli.advantages.contract import MASKED
from gaecli.trainers.padded import as_trainable, check_batch, check_semantics, outcome_split, packed_gae, row_offsets

CORE_ALGOS = "verl.trainer.ppo.core_algos"
"""The module of verl's estimators and registry."""

_SAVED: dict[str, Any] = {}


def compute_gae_advantage_return(
    token_level_rewards, values, response_mask, gamma, lam, *, semantics: str = MASKED, out=None
):
    """verl's ``compute_gae_advantage_return``: ``(advantages, returns)`` ``[B, T]``, the
    advantages whitened as verl whitens them (``masked_whiten`` over ``response_mask``: the
    mean and Bessel variance of its tokens, ``(A − mean)·rsqrt(var + 1e-8)``).

    ``semantics="masked"`` (the default): the masked contract over each row's trainable tokens
    (``response_mask`` 1), the outcome reward (verl puts it on the response's last token, masked
    or not) on the last trainable token, the rewards at masked tokens between trainable ones
    dropped; advantages (whitened) and returns exactly 0 at every masked and padding position.
    ``semantics="verl"`` (or another profile): that computation at every position, as
    :func:`gaecli.baseline_gae_packed` gives it, then verl's whitening, written everywhere as
    verl leaves it. Tensors stay on their device, in the values' dtype. ``out``: two contiguous
    ``[B, T]`` tensors of the values' dtype (a trainer's reused buffers), written and returned."""
    from gaecli.advantages.whiten import whiten
    from gaecli.trainers.host import whiten_in_place

    check_batch("compute_gae_advantage_return", token_level_rewards, values, response_mask)
    check_semantics(semantics)
    moments = np.full((3, values.shape[0]), np.nan)  # the kernel's, where it runs on the host
    advantages, returns = packed_gae(
        values, token_level_rewards, response_mask, gamma, lam, semantics, out=out, moments=moments
    )
    if whiten_in_place(advantages, response_mask, every=semantics != MASKED, moments=moments):  # ours to change
        return advantages, returns
    flat, mask = advantages.reshape(-1), as_trainable(response_mask).reshape(-1)
    written = "trainable" if semantics == MASKED else "every"
    whitened = whiten(flat, mask, written=written).reshape(advantages.shape)
    return (advantages.copy_(whitened), returns) if out is not None else (whitened, returns)


def compute_grpo_outcome_advantage(
    token_level_rewards,
    response_mask,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    *,
    semantics: str = MASKED,
):
    """verl's ``compute_grpo_outcome_advantage``: ``(advantages, advantages)`` ``[B, T]``, each
    row's ``(s − μ)/(σ + epsilon)`` over its ``index`` group (``norm_adv_by_std_in_grpo=False``:
    ``s − μ``, dr-grpo; a group of one: μ = 0, σ = 1). ``semantics="masked"``: the score is the
    contract's (the rewards at trainable tokens and the outcome, :func:`gaecli.trainers.padded.outcome_split`),
    written at trainable tokens; ``"verl"``: verl's (every token's reward), written through
    ``response_mask`` (docs/estimators.md#trainer-profiles-of-the-estimators)."""
    estimator = "grpo" if norm_adv_by_std_in_grpo else "dr-grpo"
    return _outcome(estimator, token_level_rewards, response_mask, index, semantics, epsilon)


def compute_rloo_outcome_advantage(
    token_level_rewards, response_mask, index, epsilon: float = 1e-6, config=None, *, semantics: str = MASKED, **kwargs
):
    """verl's ``compute_rloo_outcome_advantage``: ``n/(n − 1)·(s − μ)`` over each ``index``
    group (a group of one: ``s``); ``semantics`` as :func:`compute_grpo_outcome_advantage`."""
    return _outcome("rloo", token_level_rewards, response_mask, index, semantics, None)


def _outcome(estimator: str, token_level_rewards, response_mask, index, semantics: str, epsilon):
    import torch

    from gaecli.advantages.api import compute_advantages_packed
    from gaecli.advantages.normalization import SCORE_RULE
    from gaecli.advantages.spec import AdvantageSpec

    check_batch(f"compute_{estimator.replace('-', '_')}_outcome_advantage", token_level_rewards, response_mask)
    check_semantics(semantics, (MASKED, "verl"))
    batch, length = token_level_rewards.shape
    rule = None
    if estimator == "grpo" and epsilon is not None and epsilon != SCORE_RULE.eps:
        from dataclasses import replace

        rule = replace(SCORE_RULE, eps=float(epsilon))
    spec = AdvantageSpec(estimator=estimator, group_by="index", semantics=semantics, whitening_rule=rule)
    from gaecli.trainers.host import outcome_padded

    advantages = outcome_padded(spec, token_level_rewards, response_mask, {"index": index})
    if advantages is not None:
        return advantages, advantages
    trainable = as_trainable(response_mask)
    if semantics == MASKED:
        rewards, terminal = outcome_split(token_level_rewards, trainable)
    else:
        rewards = token_level_rewards
        terminal = torch.zeros(batch, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    advantages, _ = compute_advantages_packed(
        None, rewards.reshape(-1), trainable.reshape(-1), row_offsets(batch, length, rewards.device), terminal,
        spec=spec, row_inputs={"index": index},
    )  # fmt: skip
    advantages = advantages.reshape(batch, length)
    return advantages, advantages


def _core_algos():
    """verl's ``core_algos`` module; :class:`ImportError` with the fix when verl is missing."""
    import importlib

    try:
        return importlib.import_module(CORE_ALGOS)
    except ImportError as error:
        raise ImportError(f"gaecli.trainers.verl needs verl for this ({error}); pip install verl") from None


def _registered(semantics: str):
    """The drop-in in the form verl's registry calls an estimator: keywords, γ and λ from ``config``."""

    def gaecli_gae(token_level_rewards, response_mask, values=None, config=None, **kwargs):
        gamma = getattr(config, "gamma", kwargs.get("gamma", 1.0))
        lam = getattr(config, "lam", kwargs.get("lam", 1.0))
        return compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, semantics=semantics)

    return gaecli_gae


def register(name: str = "gaecli_gae", semantics: str = MASKED):
    """Register gaecli's GAE in verl's registry (``register_adv_est``) under ``name`` (verl
    refuses a name taken already: ``ValueError``); returns the registered function."""
    check_semantics(semantics)
    return _core_algos().register_adv_est(name)(_registered(semantics))


def patch(semantics: str = MASKED) -> None:
    """Swap verl's ``core_algos.compute_gae_advantage_return`` for the drop-in (with
    ``semantics``); :func:`unpatch` restores verl's. Patching twice keeps verl's original."""
    check_semantics(semantics)
    module = _core_algos()
    _SAVED.setdefault("compute_gae_advantage_return", module.compute_gae_advantage_return)

    def patched(token_level_rewards, values, response_mask, gamma, lam):
        return compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, semantics=semantics)

    patched.__doc__ = compute_gae_advantage_return.__doc__
    module.compute_gae_advantage_return = patched


def unpatch() -> None:
    """Restore verl's own ``compute_gae_advantage_return`` (nothing when not patched)."""
    if "compute_gae_advantage_return" in _SAVED:
        _core_algos().compute_gae_advantage_return = _SAVED.pop("compute_gae_advantage_return")
