"""The trainers' batched serial scan: compressed sequences padded to ``[B, T]``, one
vectorised step per column from right to left.

Kept as a baseline and for devices where nothing better runs; its loop over time is its
nature (it is not the fast path).
"""

from __future__ import annotations

import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.layout import compress, pad_compressed, scatter_compressed


def vanilla_scan(padded_values: torch.Tensor, padded_rewards: torch.Tensor, gamma: float, lambd: float) -> torch.Tensor:
    """GAE advantages ``[B, T]`` of contiguous padded sequences (zero bootstrap at the end;
    zero padding contributes exactly zero)."""
    batch, width = padded_values.shape
    advantages = torch.zeros_like(padded_values)
    carry = padded_values.new_zeros(batch)
    next_value = padded_values.new_zeros(batch)
    for t in range(width - 1, -1, -1):
        delta = padded_rewards[:, t] + gamma * next_value - padded_values[:, t]
        carry = delta + (gamma * lambd) * carry
        advantages[:, t] = carry
        next_value = padded_values[:, t]
    return advantages


@flat_kernel
def vanilla_gae(batch: FlatBatch, *, gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE: compress to trainable tokens, pad to ``[B, max K]``, serial scan, scatter.

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`
    (masked positions 0, fully masked samples all 0, empty samples own no position).
    """
    values, rewards, loss_mask, offsets, terminal_rewards = batch
    layout = compress(loss_mask, offsets)
    padded_values, padded_rewards = pad_compressed(values, rewards, terminal_rewards, layout, layout.width)
    padded_advantages = vanilla_scan(padded_values, padded_rewards, gamma, lambd)
    return scatter_compressed(padded_advantages, values, layout)
