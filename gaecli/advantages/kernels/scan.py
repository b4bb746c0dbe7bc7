"""Ragged torch kernel: masked GAE on the flat buffer and offsets, with no padding and no
compression, by a log-step (Hillis–Steele) segmented scan. Runs on any torch device; it is
the fast path on CUDA.

The recurrence ``A_t = d_t + c_t · A_{t+1}`` is written once over the whole flat buffer:
at a trainable position ``d_t`` is the TD error against the next trainable value of the same
sample (0 after the last one: zero bootstrap) and ``c_t = γλ`` (0 at the last trainable
token, which stops the carry at the sample's end); at a masked position followed by a
trainable one ``(c_t, d_t) = (1, 0)`` passes the carry through unchanged, so a gap of any
length costs exactly one γλ; a masked position with nothing trainable after it is
``(0, 0)``. ``ceil(log2(max R))`` doubling steps solve it; every step combines position t
with t + 2^k only, so the arithmetic a position sees depends on its sample alone and the
result is bitwise batch invariant (terms from beyond a sample's end are multiplied by an
exact 0).
"""

from __future__ import annotations

import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.layout import next_trainable_index, segment_ids


@flat_kernel
def scan_gae(batch: FlatBatch, *, gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by a segmented log-step scan over the flat buffer.

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`:
    flat ``[N]`` inputs, ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``; masked
    positions 0, fully masked samples all 0 (terminal dropped), empty samples own nothing.
    """
    values, rewards, loss_mask, offsets, terminal_rewards = batch
    total = values.numel()
    if total == 0:
        return torch.zeros_like(values), torch.zeros_like(values)
    following = next_trainable_index(loss_mask, offsets)
    has_next = following >= 0
    next_values = torch.where(has_next, values[following.clamp(min=0)], 0.0)
    is_last_trainable = loss_mask & ~has_next
    sample_of = segment_ids(offsets, total)
    terminal_here = torch.where(is_last_trainable, terminal_rewards[sample_of], 0.0)
    deltas = torch.where(loss_mask, rewards + terminal_here + gamma * next_values - values, 0.0)
    one = torch.ones((), dtype=values.dtype, device=values.device)
    decays = torch.where(has_next, torch.where(loss_mask, one * (gamma * lambd), one), 0.0)
    longest = int((offsets[1:] - offsets[:-1]).max())
    step = 1
    while step < longest:
        deltas[:-step] += decays[:-step] * deltas[step:]
        decays[:-step] = decays[:-step] * decays[step:]
        step *= 2
    advantages = torch.where(loss_mask, deltas, 0.0)
    returns = torch.where(loss_mask, deltas + values, 0.0)
    return advantages, returns
