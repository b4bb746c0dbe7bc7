"""FLA-style chunked scan over the padded ``[B, T]`` compressed sequences: inside a chunk
the discounted suffix sums are one matrix product with the decay matrix, and a serial carry
runs between chunks.

Batch invariance: chunk boundaries sit at fixed columns and padding contributes exact
zeros, so a sample's result depends on the rest of the batch only through the GEMM that
applies the decay matrix. Each output element is a dot product over one chunk; the CPU BLAS
used by torch keeps that reduction order whatever the number of rows, which the test grid
pins bitwise. A BLAS that changed its blocking with the row count would break this, which
is why ``auto`` never picks this kernel.
"""

from __future__ import annotations

import torch

from gaecli.kernels.layout import compress, pad_compressed, scatter_compressed

DEFAULT_CHUNK_SIZE = 64


def decay_matrix(chunk_size: int, decay: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``M[i, j] = decay ** (j - i)`` for ``j >= i``, else 0 (``0 ** 0 == 1``). ``[C, C]``."""
    index = torch.arange(chunk_size, device=device)
    exponent = (index[None, :] - index[:, None]).to(torch.float64)
    powers = torch.pow(torch.tensor(decay, dtype=torch.float64, device=device), exponent.clamp(min=0))
    return torch.where(exponent >= 0, powers, 0.0).to(dtype)


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
    deltas = deltas.view(batch, chunks, chunk_size)
    matrix = decay_matrix(chunk_size, decay, padded_values.dtype, padded_values.device)
    # local[b, k, i] = sum_j M[i, j] * delta[b, k, j]: discounted suffix sum inside the chunk.
    local = deltas @ matrix.T
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


def chunked_gae(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: torch.Tensor,
    *,
    gamma: float,
    lambd: float,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE: compress, pad to ``[B, max K]``, chunked scan with ``chunk_size``, scatter.

    Same signature and semantics as :func:`gaecli.kernels.reference.reference_gae`.
    """
    layout = compress(loss_mask, offsets)
    padded_values, padded_rewards = pad_compressed(values, rewards, terminal_rewards, layout, layout.width)
    padded_advantages = chunked_scan(padded_values, padded_rewards, gamma, lambd, chunk_size)
    return scatter_compressed(padded_advantages, values, layout)
