"""Ragged-layout helpers shared by the kernels: segment ids, compression to the trainable
subsequence, padding to ``[B, T]`` and scattering back, all vectorised over the flat buffer.

Conventions used throughout gaecli:
- a batch of B samples is three flat 1-D tensors of N tokens (values, rewards, loss_mask)
  plus ``offsets`` (int64, B + 1 entries, ``offsets[0] == 0``, ``offsets[-1] == N``), the
  same thing as an Arrow list column's offsets or FLA's ``cu_seqlens``;
- ``loss_mask`` here is already a ``torch.bool`` tensor (the public API converts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def segment_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Sample index of every flat position: int64 ``[N]``; empty samples own no position."""
    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total
    )


def next_trainable_index(loss_mask: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """For every flat position t, the index of the first trainable position after t in the
    same sample, or -1 when there is none. int64 ``[N]``."""
    total = loss_mask.numel()
    positions = torch.arange(total, device=loss_mask.device)
    candidates = torch.where(loss_mask, positions, total)
    # Minimum over candidates[t:]: a reverse cumulative minimum; shifted by one for "after t".
    suffix_min = candidates.flip(0).cummin(0).values.flip(0)
    following = torch.cat([suffix_min[1:], suffix_min.new_full((1,), total)])
    sample_end = offsets[1:][segment_ids(offsets, total)]
    return torch.where(following < sample_end, following, -1)


@dataclass(frozen=True)
class CompressedLayout:
    """Where each trainable token sits in the padded ``[B, T]`` layout of the compressed
    (trainable-only) sequences.

    ``flat_index``: int64 ``[K_total]`` flat positions of the trainable tokens;
    ``row``, ``col``: their row and column in the padded layout;
    ``trainable_lengths``: int64 ``[B]`` (K per sample); ``width``: T = max K (0 if none).
    """

    flat_index: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    trainable_lengths: torch.Tensor
    width: int


def compress(loss_mask: torch.Tensor, offsets: torch.Tensor) -> CompressedLayout:
    """Locate every sample's trainable tokens in a padded ``[B, max K]`` layout."""
    total = loss_mask.numel()
    batch = offsets.numel() - 1
    flat_index = loss_mask.nonzero().flatten()
    row = segment_ids(offsets, total)[flat_index]
    trainable_lengths = torch.bincount(row, minlength=batch)
    compressed_offsets = torch.zeros(batch + 1, dtype=torch.int64, device=offsets.device)
    torch.cumsum(trainable_lengths, 0, out=compressed_offsets[1:])
    col = torch.arange(flat_index.numel(), device=offsets.device) - compressed_offsets[row]
    width = int(trainable_lengths.max()) if batch > 0 and flat_index.numel() > 0 else 0
    return CompressedLayout(flat_index, row, col, trainable_lengths, width)


def pad_compressed(
    values: torch.Tensor,
    rewards: torch.Tensor,
    terminal_rewards: torch.Tensor,
    layout: CompressedLayout,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``[B, width]`` values and rewards of the compressed sequences, terminal reward
    added to the last trainable token of each sample, zeros in the padding. A fully masked
    sample is a row of zeros (its terminal reward is dropped)."""
    batch = terminal_rewards.numel()
    padded_values = values.new_zeros(batch, width)
    padded_rewards = values.new_zeros(batch, width)
    padded_values[layout.row, layout.col] = values[layout.flat_index]
    padded_rewards[layout.row, layout.col] = rewards[layout.flat_index]
    has_trainable = layout.trainable_lengths > 0
    rows = torch.arange(batch, device=values.device)[has_trainable]
    last_cols = layout.trainable_lengths[has_trainable] - 1
    padded_rewards[rows, last_cols] += terminal_rewards[has_trainable]
    return padded_values, padded_rewards


def scatter_compressed(
    padded_advantages: torch.Tensor,
    values: torch.Tensor,
    layout: CompressedLayout,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``[N]`` advantages and returns from padded compressed advantages; exactly 0 at
    masked positions, returns = advantages + values at trainable positions."""
    advantages = torch.zeros_like(values)
    returns = torch.zeros_like(values)
    trainable_advantages = padded_advantages[layout.row, layout.col]
    advantages[layout.flat_index] = trainable_advantages
    returns[layout.flat_index] = trainable_advantages + values[layout.flat_index]
    return advantages, returns
