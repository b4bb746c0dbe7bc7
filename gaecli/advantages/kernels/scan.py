"""Ragged torch kernel: masked GAE on the flat buffer and offsets, with no padding and no
compression, by a log-step (Hillis–Steele) segmented scan. Runs on any torch device; it is
the fast path on CUDA.

The recurrence ``A_t = d_t + c_t · A_{t+1}`` is written once over the whole flat buffer
(:func:`carried_advantages`): at a trainable position ``d_t`` is the TD error against the
next trainable value of the same sample (0 after the last one: zero bootstrap; a truncated
sample's bootstrap value with the truncation bootstrap, docs/variants.md) and ``c_t = γλ``
(0 at the last trainable token, which stops the carry at the sample's end); at a masked
position followed by a trainable one ``(c_t, d_t) = (1, 0)`` passes the carry through
unchanged, so a gap of any length costs exactly one γλ; a masked position with nothing
trainable after it is ``(0, 0)``. ``ceil(log2(max R))`` doubling steps solve it; every step
combines position t with t + 2^k only, so the arithmetic a position sees depends on its
sample alone and the result is bitwise batch invariant (terms from beyond a sample's end are
multiplied by an exact 0). The decay may differ per sample (a λ per row: AReaL's and
NeMo-RL's, :mod:`gaecli.trainers.row_lambda`).
"""

from __future__ import annotations

import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.layout import next_trainable_index, segment_ids
from gaecli.advantages.variants import VariantArguments, row_bootstraps


def carried_advantages(batch: FlatBatch, gamma: float, decays, longest: int, after_last=None) -> torch.Tensor:
    """``[N]``: at each trainable position the masked contract's advantage (the rewards at
    trainable tokens, ``terminal_rewards`` on each sample's last trainable token); at a masked
    position the advantage of the sample's next trainable token (0 after the last one) — the
    carry a recursion that skips masked steps holds there. ``batch``: flat tensors as
    :func:`scan_gae` takes them (``loss_mask`` bool); ``decays``: γλ, a number or a tensor
    ``[B]`` of the values' dtype (sample b's decay); ``longest``: at least the longest sample's
    length (the number of doubling steps); ``after_last``: the value after each sample's last
    trainable token, ``[B]`` in the values' dtype (None: 0, zero bootstrap)."""
    values, rewards, loss_mask, offsets, terminal_rewards = batch
    total = values.numel()
    following = next_trainable_index(loss_mask, offsets)
    has_next = following >= 0
    sample_of = segment_ids(offsets, total)
    bootstrap = 0.0 if after_last is None else after_last[sample_of]
    next_values = torch.where(has_next, values[following.clamp(min=0)], bootstrap)
    is_last_trainable = loss_mask & ~has_next
    terminal_here = torch.where(is_last_trainable, terminal_rewards[sample_of], 0.0)
    deltas = torch.where(loss_mask, rewards + terminal_here + gamma * next_values - values, 0.0)
    one = torch.ones((), dtype=values.dtype, device=values.device)
    decay = one * decays if not isinstance(decays, torch.Tensor) else decays[sample_of]
    carries = torch.where(has_next, torch.where(loss_mask, decay, one), 0.0)
    step = 1
    while step < longest:
        deltas[:-step] += carries[:-step] * deltas[step:]
        carries[:-step] = carries[:-step] * carries[step:]
        step *= 2
    return deltas


@flat_kernel
def scan_gae(batch: FlatBatch, *, gamma: float, lambd: float, **variants) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by a segmented log-step scan over the flat buffer.

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`:
    flat ``[N]`` inputs, ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``; masked
    positions 0, fully masked samples all 0 (terminal dropped), empty samples own nothing.
    Of the GAE variants' keywords (:class:`gaecli.advantages.variants.VariantArguments`) it
    reads the truncation bootstrap (``truncated`` ``[B]`` with ``bootstrap_values`` ``[B]``,
    numpy or tensors), the one variant its kernel entry supports.
    """
    values, loss_mask, offsets = batch.values, batch.loss_mask, batch.offsets
    if values.numel() == 0:
        return torch.zeros_like(values), torch.zeros_like(values)
    longest = int((offsets[1:] - offsets[:-1]).max())
    arguments = VariantArguments(**variants)
    after_last = None
    if arguments.truncated is not None:
        after_last = row_bootstraps(arguments.truncated, arguments.bootstrap_values, like=values)
    carried = carried_advantages(batch, gamma, gamma * lambd, longest, after_last)
    return torch.where(loss_mask, carried, 0.0), torch.where(loss_mask, carried + values, 0.0)

