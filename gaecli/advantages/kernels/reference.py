"""The in-project oracle: masked GAE as a plain float64 loop, one sample at a time.

Obviously correct and slow; every other kernel is held against it.
"""

from __future__ import annotations

import torch


def reference_gae(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: torch.Tensor,
    *,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by a serial float64 loop over each sample's trainable tokens.

    Shapes: flat ``[N]`` values / rewards / bool loss_mask, ``offsets`` ``[B + 1]``,
    ``terminal_rewards`` ``[B]``. Returns flat ``[N]`` (advantages, returns) in the values'
    dtype and device. Masked positions are 0; a fully masked sample is all 0 and its terminal
    reward is dropped; an empty sample owns no position.
    """
    all_values = values.detach().double().cpu().tolist()
    all_rewards = rewards.detach().double().cpu().tolist()
    all_mask = loss_mask.detach().cpu().tolist()
    bounds = offsets.cpu().tolist()
    terminals = terminal_rewards.detach().double().cpu().tolist()
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
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.float64).to(values.dtype).to(values.device)  # noqa: E731
    return as_tensor(advantages), as_tensor(returns)
