"""Compiled CPU kernel (numba): masked GAE straight on the flat buffers and offsets, one
backward pass per sample, samples spread over the cores. The CPU fast path.

Every sample is computed alone, in float64 whatever the input dtype, and rounded once on
output; the result is therefore bitwise batch invariant and float32 outputs are the
correctly rounded float64 results up to float64 round-off.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    import numba
except ImportError:  # pragma: no cover - exercised only without the dependency
    numba = None

AVAILABLE = numba is not None


def _masked_gae_loop(values, rewards, loss_mask, offsets, terminal_rewards, gamma, lambd, advantages, returns):
    decay = gamma * lambd
    for sample in numba.prange(offsets.shape[0] - 1):
        start = offsets[sample]
        end = offsets[sample + 1]
        carry = 0.0
        next_value = 0.0
        terminal = np.float64(terminal_rewards[sample])
        for t in range(end - 1, start - 1, -1):
            if loss_mask[t]:
                value = np.float64(values[t])
                delta = np.float64(rewards[t]) + terminal + gamma * next_value - value
                terminal = 0.0
                carry = delta + decay * carry
                advantages[t] = carry
                returns[t] = carry + value
                next_value = value
            else:
                advantages[t] = 0.0
                returns[t] = 0.0


_compiled = numba.njit(parallel=True, cache=True, nogil=True)(_masked_gae_loop) if AVAILABLE else None


def native_gae(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: torch.Tensor,
    *,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by a compiled serial pass per sample (CPU tensors only).

    Same signature and semantics as :func:`gaecli.kernels.reference.reference_gae`.
    """
    advantages = torch.empty_like(values)
    returns = torch.empty_like(values)
    if values.numel() == 0 and offsets.numel() <= 1:
        return advantages, returns
    _compiled(
        values.numpy(),
        rewards.numpy(),
        loss_mask.numpy(),
        offsets.numpy(),
        terminal_rewards.numpy(),
        float(gamma),
        float(lambd),
        advantages.numpy(),
        returns.numpy(),
    )
    return advantages, returns
