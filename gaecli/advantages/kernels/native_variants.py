"""The native kernel's compiled pass for the GAE variants (docs/variants.md): per-sample λ,
the returns' own λ, turn rewards, turn-level timesteps and the truncation bootstrap, one
float64 pass per sample over flat buffers, spread over the cores like the plain kernel's
(:mod:`gaecli.advantages.kernels.native`), bitwise batch invariant."""

from __future__ import annotations

import numpy as np

from gaecli.advantages.kernels.compiled import AVAILABLE, numba, plan_groups, thread_count
from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel


def _variant_token_sample(buffers, plan_arrays, sample, step):
    """One sample of the variants with ``timestep="token"`` (docs/variants.md): the plain
    recursion with a turn's reward on its last trainable token, the bootstrap value after
    the last trainable token, and the returns' own recursion when ``split``. Arguments: see
    :func:`_variant_batch`."""
    values, rewards, loss_mask, advantages, returns = buffers
    bootstrap, turn_offsets, turn_rewards, has_turn_rewards, _, _ = plan_arrays
    start, end, terminal, gamma, decay, return_decay, split = step
    carry = 0.0
    return_carry = 0.0
    next_value = bootstrap[sample]
    turn = turn_offsets[sample + 1] - 1
    for t in range(end - 1, start - 1, -1):
        if loss_mask[t] == 0:
            advantages[t] = 0.0
            returns[t] = 0.0
            continue
        value = np.float64(values[t])
        reward = np.float64(rewards[t])
        if has_turn_rewards and (t == end - 1 or loss_mask[t + 1] == 0):
            reward = reward + turn_rewards[turn]
            turn -= 1
        delta = reward + terminal + gamma * next_value - value
        carry = delta + decay * carry
        advantages[t] = carry
        if split:
            return_carry = delta + return_decay * return_carry
            returns[t] = return_carry + value
        else:
            returns[t] = carry + value
        next_value = value
        terminal = 0.0


def _variant_turn_sample(buffers, plan_arrays, sample, step):
    """One sample of the variants with ``timestep="turn"`` (docs/variants.md): one timestep
    per turn (its value the value at its first token, its reward its turn reward, plus z for
    the last turn); every trainable token of turn u gets ``A_u + r[t]`` and ``A_u(λ of the
    returns) + V_u`` (a turn of explicit turn ids may span masked tokens); masked positions 0.
    Arguments: see :func:`_variant_batch`."""
    values, rewards, loss_mask, advantages, returns = buffers
    bootstrap, turn_offsets, turn_rewards, has_turn_rewards, turn_starts, turn_ends = plan_arrays
    start, end, terminal, gamma, decay, return_decay, split = step
    for t in range(start, end):
        advantages[t] = 0.0
        returns[t] = 0.0
    carry = 0.0
    return_carry = 0.0
    next_value = bootstrap[sample]
    for turn in range(turn_offsets[sample + 1] - 1, turn_offsets[sample] - 1, -1):
        first = turn_starts[turn]
        value = np.float64(values[first])
        reward = turn_rewards[turn] if has_turn_rewards else 0.0
        delta = reward + terminal + gamma * next_value - value
        carry = delta + decay * carry
        if split:
            return_carry = delta + return_decay * return_carry
            returned = return_carry + value
        else:
            returned = carry + value
        for t in range(first, turn_ends[turn]):
            if loss_mask[t] != 0:
                advantages[t] = carry + np.float64(rewards[t])
                returns[t] = returned
        next_value = value
        terminal = 0.0


def _variant_batch(buffers, offsets, terminal_rewards, gamma, lambdas, plan_arrays, order, group_bounds):
    """Every sample of the batch under the variants; group ``g`` is the samples
    ``order[group_bounds[g]:group_bounds[g + 1]]`` (longest first), the groups run in
    parallel, each sample alone in float64 (so the result does not depend on the grouping).

    ``buffers``: values, rewards, trainable, advantages, returns (flat ``[N]``);
    ``lambdas``: the plan's ``(advantage_lambd, return_lambd, split, turn_mode)``;
    ``plan_arrays``: its ``(bootstrap, turn_offsets, turn_rewards, has_turn_rewards,
    turn_starts, turn_ends)`` (:class:`gaecli.advantages.variants.VariantPlan`). A sample's
    ``step``: its ``(start, end, terminal reward, γ, γλ, γλ of the returns, split)``."""
    advantage_lambd, return_lambd, split, turn_mode = lambdas
    for group in numba.prange(group_bounds.shape[0] - 1):
        for index in range(group_bounds[group], group_bounds[group + 1]):
            sample = order[index]
            terminal = np.float64(terminal_rewards[sample])
            decay = gamma * advantage_lambd[sample]
            return_decay = gamma * return_lambd[sample]
            step = (offsets[sample], offsets[sample + 1], terminal, gamma, decay, return_decay, split)
            if turn_mode:
                _variant_turn_sample(buffers, plan_arrays, sample, step)
            else:
                _variant_token_sample(buffers, plan_arrays, sample, step)


if AVAILABLE:
    _variant_token_sample = numba.njit(nogil=True)(_variant_token_sample)
    _variant_turn_sample = numba.njit(nogil=True)(_variant_turn_sample)
    _variant_compiled = numba.njit(parallel=True, cache=True, nogil=True)(_variant_batch)
else:  # pragma: no cover
    _variant_compiled = None


@flat_kernel
def native_variant_flat(batch: FlatBatch, *, gamma: float, lambd: float, **variants) -> tuple[np.ndarray, np.ndarray]:
    """The GAE variants (docs/variants.md) on flat numpy buffers: arguments as
    :func:`gaecli.advantages.kernels.native.native_gae_flat` plus the keywords of
    :class:`gaecli.advantages.variants.VariantArguments` (per-row inputs as numpy arrays or
    tensors, checked by the caller). The turn table and the per-sample λ are computed
    vectorised (:func:`gaecli.advantages.variants.plan_variants`); one compiled pass per
    sample, in float64, rounded once on output: bitwise batch invariant."""
    from gaecli.advantages.variants import plan_variants

    values, rewards, loss_mask, offsets, terminal_rewards = batch
    trainable = loss_mask if loss_mask.dtype == np.bool_ else loss_mask != 0
    plan = plan_variants(trainable, offsets, lambd=lambd, **variants)
    advantages = np.empty_like(values)
    returns = np.empty_like(values)
    count = offsets.size - 1
    if count <= 0:
        return advantages, returns
    groups = max(1, min(thread_count(), count))
    order, group_bounds = plan_groups(offsets, groups)
    lambdas = (plan.advantage_lambd, plan.return_lambd, plan.split, plan.turn_mode)
    plan_arrays = (
        plan.bootstrap,
        plan.turn_offsets,
        plan.turn_rewards,
        plan.has_turn_rewards,
        plan.turn_starts,
        plan.turn_ends,
    )
    buffers = (values, rewards, trainable, advantages, returns)
    _variant_compiled(buffers, offsets, terminal_rewards, float(gamma), lambdas, plan_arrays, order, group_bounds)
    return advantages, returns
