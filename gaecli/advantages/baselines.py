"""The trainer profiles: what each trainer computed instead of the masked contract, written
once around any masked-GAE kernel for numpy and torch alike, and which samples' terminal
reward each one loses (definitions: docs/semantics.md#the-trainer-profiles)."""

from __future__ import annotations

import math

import numba
import numpy as np

from gaecli.advantages.contract import BASELINES, MASKED, profile_of
from gaecli.advantages.layout import (
    array_module,
    ends_trainable,
    last_trainable_index,
    next_trainable_index,
)
from gaecli.errors import InvalidOptionError


def apply_semantics(
    run,
    values,
    rewards,
    trainable,
    offsets,
    terminal_rewards,
    *,
    gamma: float,
    lambd: float,
    semantics: str,
):
    """The one implementation of the semantics around a masked-GAE kernel, for numpy arrays
    and torch tensors alike: only operations both spell the same way (``where``,
    ``zeros_like``, ``ones_like``, indexing), element-wise and in the same order, so both give
    the same bits for the same kernel (the carry of a skip recursion: :func:`carried_outputs`).

    ``run(values, rewards, trainable, terminal_rewards)`` is the masked-GAE kernel on this
    batch, with the spec's GAE variants bound (the dispatch's ``variant_keywords``): for
    ``areal`` (the one profile that takes one, :data:`gaecli.advantages.contract.PROFILE_VARIANTS`)
    the truncation bootstrap, which the kernel puts after each truncated sample's last trainable
    token, the step AReaL's loop reads its initial ``nextvalues`` at; the carry stored at the
    masked positions after it is 0, as AReaL's is. Shapes: flat ``[N]`` values, rewards (one
    float dtype, which the outputs take) and bool ``trainable``, ``offsets`` ``[B + 1]``,
    ``terminal_rewards`` ``[B]``. Returns flat ``(advantages, returns)``: what ``semantics``
    (``masked``, a profile or an alias) computes at every position
    (docs/semantics.md#the-trainer-profiles).
    """
    xp = array_module(values)
    if semantics == MASKED:
        return run(values, rewards, trainable, terminal_rewards)
    profile = profile_of(semantics)
    everywhere = xp.ones_like(trainable) if profile in ("slime", "skyrl", "openrlhf", "roll") else None
    if profile in ("slime", "skyrl"):  # every token a transition, z on token R−1
        return run(values, rewards, everywhere, terminal_rewards)
    if profile == "openrlhf":  # V·m, r·m, z on the last trainable token, plain GAE everywhere
        zeroed_values = xp.where(trainable, values, 0.0)
        zeroed_rewards = xp.where(trainable, rewards, 0.0)
        last = last_trainable_index(trainable, offsets)
        has_trainable = last >= 0
        zeroed_rewards[last[has_trainable]] += terminal_rewards[has_trainable]
        return run(zeroed_values, zeroed_rewards, everywhere, xp.zeros_like(terminal_rewards))
    # z on token R−1 and then r·m (ROLL) or skipped as a masked step's TD error (verl, AReaL):
    # either way it survives only when token R−1 is trainable.
    kept_terminal = xp.where(ends_trainable(trainable, offsets), terminal_rewards, 0.0)
    if profile == "roll":  # r·m, V unmasked, plain GAE everywhere, then A·m; returns before A·m
        advantages, returns = run(values, xp.where(trainable, rewards, 0.0), everywhere, kept_terminal)
        return xp.where(trainable, advantages, 0.0), returns
    if profile in ("verl", "areal"):  # skip recursion; a masked step stores the carry
        advantages, returns = run(values, rewards, trainable, kept_terminal)
        return carried_outputs(advantages, returns, values, trainable, offsets, carry_advantages=True)
    if profile == "nemo-rl":  # z on the last trainable token, skip recursion, then A·m
        advantages, returns = run(values, rewards, trainable, terminal_rewards)
        return carried_outputs(advantages, returns, values, trainable, offsets, carry_advantages=False)
    raise InvalidOptionError(f"unknown semantics {semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")


def carried_outputs(advantages, returns, values, trainable, offsets, *, carry_advantages: bool):
    """What a skip recursion stores at a masked position: the carry, the advantage of the
    next trainable token after it in the same sample (0 when there is none), as its
    advantage when ``carry_advantages`` (else the kernel's is kept), and the carry plus the
    value as its return; trainable positions keep the kernel's advantages and returns.
    Flat ``[N]`` (advantages, returns). numpy: one backward pass over each sample; torch:
    the carry gathered at :func:`gaecli.advantages.layout.next_trainable_index`. Both give
    the same bits."""
    if isinstance(advantages, np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)
        return _carried(advantages, returns, values, trainable, offsets, carry_advantages)
    import torch

    following = next_trainable_index(trainable, offsets)
    has_next = following >= 0
    carry = torch.where(has_next, advantages[torch.where(has_next, following, 0)], 0.0)
    carried = torch.where(trainable, advantages, carry) if carry_advantages else advantages
    return carried, torch.where(trainable, returns, carry + values)


@numba.njit(cache=True, nogil=True)
def _carried(advantages, returns, values, trainable, offsets, carry_advantages):
    # each sample read once backwards, holding the advantage of the last trainable token seen
    carried_advantages = advantages.copy() if carry_advantages else advantages
    carried_returns = returns.copy()
    zero = advantages.dtype.type(0.0)
    for row in range(offsets.shape[0] - 1):
        carry = zero
        for t in range(offsets[row + 1] - 1, offsets[row] - 1, -1):
            if trainable[t]:
                carry = advantages[t]
            else:
                if carry_advantages:
                    carried_advantages[t] = carry
                carried_returns[t] = carry + values[t]
    return carried_advantages, carried_returns


def lost_terminal_samples(semantics: str, trainable, offsets, terminal_rewards, *, gamma: float, lambd: float):
    """Which samples' terminal reward z reaches no trainable token under ``semantics``
    (``masked``, a profile or an alias): bool ``[B]``, numpy or torch as the mask.

    A non-empty sample loses z by its shape alone: ``verl``, ``areal``, ``roll`` when token
    R−1 is masked (a fully masked sample included); ``openrlhf``, ``nemo-rl`` and ``masked``
    when nothing is trainable; ``slime`` and ``skyrl`` when nothing is trainable or, with γλ = 0, when the
    response ends in masked tokens. An empty sample counts as lost when its z ≠ 0.
    (docs/semantics.md#what-each-profile-loses)
    """
    profile = profile_of(semantics)
    nonempty = offsets[1:] > offsets[:-1]
    last_masked = nonempty & ~ends_trainable(trainable, offsets)
    nothing_trainable = nonempty & (last_trainable_index(trainable, offsets) < 0)  # reads the masked tails only
    if profile in ("verl", "areal", "roll"):
        lost = last_masked
    elif profile in (MASKED, "openrlhf", "nemo-rl"):
        lost = nothing_trainable
    elif profile in ("slime", "skyrl"):
        lost = last_masked if gamma * lambd == 0 else nothing_trainable
    else:
        raise InvalidOptionError(f"unknown semantics {semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")
    return lost | (~nonempty & (terminal_rewards != 0))


def lost_terminal_abs_sum(semantics: str, trainable, offsets, terminal_rewards, *, gamma: float, lambd: float) -> float:
    """Σ |z| over the samples of :func:`lost_terminal_samples`, in float64, correctly rounded
    (``math.fsum``), so that it does not depend on the order of the samples."""
    lost = lost_terminal_samples(semantics, trainable, offsets, terminal_rewards, gamma=gamma, lambd=lambd)
    chosen = terminal_rewards[lost]
    if not isinstance(chosen, np.ndarray):
        chosen = chosen.detach().double().cpu().numpy()
    return math.fsum(np.abs(chosen.astype(np.float64, copy=False)))
