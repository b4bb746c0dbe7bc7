"""FLA-style chunked scan over the padded ``[B, T]`` compressed sequences: inside a chunk
the discounted suffix sums are the product with the decay matrix, and a serial carry runs
between chunks.

The decay matrix ``M[i, j] = (γλ)^(j-i)`` (``j >= i``) of one chunk factors into
``log2(C)`` sparse stages ``(I + (γλ)^s S^s)``, s = 1, 2, 4, ... (``S`` shifts by one
column inside the chunk), so the intra-chunk product is applied as that many elementwise
passes rather than one GEMM.

Batch invariance: chunk boundaries sit at fixed columns, padding contributes exact zeros,
and every operation is elementwise on one row, so a sample's result is bitwise the same
whatever else is in the batch. (A BLAS GEMM does not give that: MKL's ``sgemm`` rounds a
row differently depending on how many rows it is called with.)
"""

from __future__ import annotations

import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.layout import compress, pad_compressed, scatter_compressed

DEFAULT_CHUNK_SIZE = 64


def chunked_scan(
    padded_values: torch.Tensor,
    padded_rewards: torch.Tensor,
    gamma: float,
    lambd: float,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """GAE advantages ``[B, T]`` of contiguous padded sequences by a chunked scan."""
    batch, width = padded_values.shape
    if width == 0:
        return padded_values.clone()
    decay = gamma * lambd
    chunks = -(-width // chunk_size)
    padded_width = chunks * chunk_size
    next_values = torch.zeros(batch, padded_width, dtype=padded_values.dtype, device=padded_values.device)
    next_values[:, : width - 1] = padded_values[:, 1:]
    deltas = torch.zeros_like(next_values)
    deltas[:, :width] = padded_rewards + gamma * next_values[:, :width] - padded_values
    # local[b, k, i] = sum_j M[i, j] * delta[b, k, j]: discounted suffix sum inside the chunk,
    # by the log2(C) factors of M (after the pass of shift s, local[i] sums 2s terms).
    local = deltas.view(batch, chunks, chunk_size)
    shift = 1
    while shift < chunk_size:
        local[:, :, :-shift] += (decay**shift) * local[:, :, shift:]
        shift *= 2
    # Carry into chunk k = advantage at the first column of chunk k + 1.
    chunk_decay = decay**chunk_size if chunk_size > 0 else 1.0
    carry_in = torch.zeros(batch, chunks, dtype=local.dtype, device=local.device)
    carry = local.new_zeros(batch)
    for k in range(chunks - 1, -1, -1):
        carry_in[:, k] = carry
        carry = local[:, k, 0] + chunk_decay * carry
    # Decay of the carry from the chunk's end to column i: decay ** (C - i).
    tail_powers = torch.pow(
        torch.tensor(decay, dtype=torch.float64, device=local.device),
        torch.arange(chunk_size, 0, -1, device=local.device, dtype=torch.float64),
    ).to(local.dtype)
    advantages = local + carry_in.unsqueeze(-1) * tail_powers
    return advantages.view(batch, padded_width)[:, :width]


@flat_kernel
def chunked_gae(
    batch: FlatBatch, *, gamma: float, lambd: float, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE: compress, pad to ``[B, max K]``, chunked scan with ``chunk_size``, scatter.

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`.
    """
    values, rewards, loss_mask, offsets, terminal_rewards = batch
    layout = compress(loss_mask, offsets)
    padded_values, padded_rewards = pad_compressed(values, rewards, terminal_rewards, layout, layout.width)
    padded_advantages = chunked_scan(padded_values, padded_rewards, gamma, lambd, chunk_size)
    return scatter_compressed(padded_advantages, values, layout)
