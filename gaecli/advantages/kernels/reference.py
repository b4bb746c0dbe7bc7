"""The in-project oracle: masked GAE as a plain float64 loop, one sample at a time.

Obviously correct and slow; every other kernel is held against it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.variants import VariantArguments, as_numpy, per_sample_lambd, sample_lambd


@flat_kernel
def reference_gae(batch: FlatBatch, *, gamma: float, lambd: float, **variants) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by a serial float64 loop over each sample's trainable tokens.

    Shapes: flat ``[N]`` values / rewards / bool loss_mask, ``offsets`` ``[B + 1]``,
    ``terminal_rewards`` ``[B]``. Returns flat ``[N]`` (advantages, returns) in the values'
    dtype and device. Masked positions are 0; a fully masked sample is all 0 and its terminal
    reward is dropped; an empty sample owns no position. The keywords of the GAE variants
    (``variants``), when given, go to :func:`reference_variant_gae`.
    """
    if variants:
        return reference_variant_gae(*batch, gamma=gamma, lambd=lambd, **variants)
    all_values, all_rewards, all_mask, bounds, terminals = _as_lists(batch)
    advantages = [0.0] * len(all_values)
    returns = [0.0] * len(all_values)
    for sample, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        trainable = [t for t in range(start, end) if all_mask[t]]
        carry = 0.0
        next_value = 0.0  # zero bootstrap after the last trainable token
        for position_from_end, t in enumerate(reversed(trainable)):
            reward = all_rewards[t] + (terminals[sample] if position_from_end == 0 else 0.0)
            delta = reward + gamma * next_value - all_values[t]
            carry = delta + gamma * lambd * carry
            advantages[t] = carry
            returns[t] = carry + all_values[t]
            next_value = all_values[t]
    return _as_outputs(batch, advantages, returns)


def _as_lists(batch: FlatBatch) -> tuple[list, list, list, list, list]:
    """The batch as Python lists: float64 values, rewards and terminal rewards, the mask and
    the offsets."""
    return (
        batch.values.detach().double().cpu().tolist(),
        batch.rewards.detach().double().cpu().tolist(),
        batch.loss_mask.detach().cpu().tolist(),
        batch.offsets.cpu().tolist(),
        batch.terminal_rewards.detach().double().cpu().tolist(),
    )


def _as_outputs(batch: FlatBatch, advantages: list, returns: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs as tensors of the values' dtype and device."""
    values = batch.values
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.float64).to(values.dtype).to(values.device)  # noqa: E731
    return as_tensor(advantages), as_tensor(returns)


def _turns(mask: list, start: int, end: int, ids: Optional[list] = None) -> list[list[int]]:
    """The turns of one sample: the positions of each maximal run of trainable tokens, in
    order; with turn ids (``ids``, flat), the trainable positions of each id instead."""
    turns: list[list[int]] = []
    for t in range(start, end):
        if not mask[t]:
            continue
        same_turn = turns and (turns[-1][-1] == t - 1 if ids is None else ids[turns[-1][-1]] == ids[t])
        if same_turn:
            turns[-1].append(t)
        else:
            turns.append([t])
    return turns


@flat_kernel
def reference_variant_gae(
    batch: FlatBatch, *, gamma: float, lambd: float, **variants
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GAE variants (docs/variants.md) by a serial float64 loop per sample, turn by turn:
    arguments as :func:`reference_gae` plus the variants' keywords (per-row inputs as
    tensors, numpy arrays or sequences, checked by the caller: ``turn_rewards`` flat with
    its ``turn_offsets`` ``[B + 1]``, ``truncated`` and ``bootstrap_values`` ``[B]``,
    ``turn_ids`` ``[N]``)."""
    arguments = VariantArguments(**variants)
    timestep, lambd_critic, _, turn_rewards, turn_offsets, truncated, boot, *_ = arguments
    ids = None if arguments.turn_ids is None or timestep != "turn" else as_numpy(arguments.turn_ids).tolist()
    all_values, all_rewards, all_mask, bounds, terminals = _as_lists(batch)
    flat_turn_rewards = None if turn_rewards is None else as_numpy(turn_rewards).astype(np.float64).tolist()
    turn_bounds = None if turn_offsets is None else as_numpy(turn_offsets).tolist()
    flags = None if truncated is None else as_numpy(truncated).astype(bool).tolist()
    boots = None if boot is None else as_numpy(boot).astype(np.float64).tolist()
    advantages = [0.0] * len(all_values)
    returns = [0.0] * len(all_values)
    split = lambd_critic is not None or per_sample_lambd(**variants)
    return_lambd = lambd if lambd_critic is None else lambd_critic
    for sample, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        turns = _turns(all_mask, start, end, ids)
        steps = len(turns) if timestep == "turn" else sum(len(turn) for turn in turns)
        own_lambd = float(sample_lambd(lambd, np.array([steps]), **variants)[0])
        decay, return_decay = gamma * own_lambd, gamma * return_lambd
        # Each timestep: (positions it covers, its value, its reward before z).
        if timestep == "turn":
            per_turn = [0.0] * len(turns) if flat_turn_rewards is None else None
            if per_turn is None:
                per_turn = flat_turn_rewards[turn_bounds[sample] : turn_bounds[sample + 1]]
            timesteps = [(turn, all_values[turn[0]], per_turn[u]) for u, turn in enumerate(turns)]
        else:
            last_of_turn = {turn[-1]: u for u, turn in enumerate(turns)}
            timesteps = []
            for turn in turns:
                for t in turn:
                    reward = all_rewards[t]
                    if flat_turn_rewards is not None and t in last_of_turn:
                        reward = reward + flat_turn_rewards[turn_bounds[sample] + last_of_turn[t]]
                    timesteps.append((range(t, t + 1), all_values[t], reward))
        next_value = boots[sample] if flags is not None and flags[sample] else 0.0
        carry = return_carry = 0.0
        for position_from_end, (positions, value, reward) in enumerate(reversed(timesteps)):
            terminal = terminals[sample] if position_from_end == 0 else 0.0
            delta = reward + terminal + gamma * next_value - value
            carry = delta + decay * carry
            return_carry = delta + return_decay * return_carry
            returned = (return_carry if split else carry) + value
            for t in positions:
                advantages[t] = carry + all_rewards[t] if timestep == "turn" else carry
                returns[t] = returned
            next_value = value
    return _as_outputs(batch, advantages, returns)
