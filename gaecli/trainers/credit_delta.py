"""The mean |Δ advantage| that :func:`gaecli.trainers.credit_metrics` reports, the trainer's profile
against the masked contract (docs/trainers.md#in-training-checks-and-metrics):

- for the profiles of :data:`OUTCOME_ONLY`, over every trainable token of the batch from each
  row's few figures (GAE is linear in the rewards: the two sides differ by what the last
  trainable step's TD error gets, decayed back by γλ a step);
- for the others, both sides computed on a few rows' response ends only (suffix windows: exact,
  as every semantics runs backwards from a response's end), in numpy around the compiled
  kernel on the host (a few thousand tokens, where each torch op would cost more than the
  scan), in torch on an accelerator."""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np

from gaecli.advantages.contract import MASKED, profile_of
from gaecli.errors import InvalidOptionError
from gaecli.trainers.layouts import TrainerBatch

INERT_AFTER_THE_END = ("verl", "areal", "openrlhf")
"""The profiles to which the masked positions after a response's end (no reward there) add
exactly nothing (verl and AReaL skip them; OpenRLHF zeroes their values and rewards): the Δ
window stops at the end. The others read the values there (ROLL, slime, SkyRL run every
position as a transition), so their window runs to the row's end."""

OUTCOME_ONLY = ("verl", "areal", "nemo-rl")
"""The profiles whose recursion skips masked steps and reads the rewards at trainable tokens as
the contract does (docs/semantics.md#the-recursions): at trainable tokens they differ from the
contract only in the last trainable step's TD error — the outcome, which verl and AReaL lose on
a masked tail (:func:`gaecli.trainers.monitor._lost`), and AReaL's truncation bootstrap. GAE
being linear in the rewards, a row's Δ at its k-th trainable token from the end is that
difference times (γλ)^k."""


def mean_abs_delta(batch: TrainerBatch, rows: dict, lost, delta_rows: Optional[int], delta_tokens: Optional[int]):
    """(mean |A_profile − A_masked| over the trainable tokens compared, the rows compared), from
    :func:`gaecli.trainers.monitor._rows_of`'s ``rows`` and the samples whose outcome the profile
    loses (``lost``): for :data:`OUTCOME_ONLY` over every row (:func:`_outcome_only`); else on
    ``delta_rows`` rows spread evenly over the batch (None: every row), the last ``delta_tokens
    / rows`` tokens of each response (None: a 64th of the batch's tokens, at least 4,096; at
    least one a row). Numpy figures give a float64 numpy number, tensors a float64 tensor on
    their device."""
    import torch

    for name, number in (("delta_rows", delta_rows), ("delta_tokens", delta_tokens)):
        if number is not None and number < 0:
            raise InvalidOptionError(f"{name}={number}: give a number ≥ 0, or None")
    ends = rows["ends"]
    host = isinstance(ends, np.ndarray)
    count = len(ends)
    chosen = count if delta_rows is None else min(int(delta_rows), count)
    if chosen == 0 or profile_of(batch.profile) == MASKED:
        return (np.float64(0.0) if host else torch.zeros((), dtype=torch.float64, device=ends.device)), 0
    if profile_of(batch.profile) in OUTCOME_ONLY:
        return _outcome_only(batch, rows, lost, host), count
    budget = max(4096, batch.values.numel() // 64) if delta_tokens is None else int(delta_tokens)
    picked = np.unique(np.round(np.linspace(0, count - 1, chosen)).astype(np.int64))
    window = max(1, budget // picked.size)
    if host:
        masked, old, trainable = _host_windows(batch, ends, picked, window)
        tokens = int(trainable.sum())
        total = np.abs(old - masked, dtype=np.float64)[trainable].sum()
        return (total / tokens if tokens else np.float64(0.0)), int(picked.size)
    masked, old, trainable = _device_windows(batch, ends, torch.as_tensor(picked, device=ends.device), window)
    differences = (old - masked).abs().double()
    tokens = trainable.sum()
    zero = torch.zeros((), dtype=torch.float64, device=ends.device)
    return torch.where(tokens > 0, differences.mul(trainable).sum() / tokens.clamp(min=1), zero), int(picked.size)


def _outcome_only(batch: TrainerBatch, rows: dict, lost, host: bool):
    """The mean |Δ| of a profile of :data:`OUTCOME_ONLY` over every trainable token: row i differs
    by ``a_i = γ·b_i·[truncated_i] − z_i·[lost_i]`` in its last trainable step's TD error (``z``:
    its outcome; ``b``: AReaL's bootstrap value, for the ``areal`` profile with a truncation),
    hence by ``|a_i|·c_i^k`` at its k-th trainable token from the end (``c_i = γλ_i``): in all,
    ``Σ |a_i|·(1 + c_i + … + c_i^(K_i − 1)) / Σ K_i`` over its ``K_i`` trainable tokens. In
    float64; the counts those the drop-in's kernel recorded for this very batch, else one
    compiled pass over the mask on the host."""
    import torch

    from gaecli.advantages.layout import trainable_counts
    from gaecli.trainers.host import seen_batch

    xp = np if host else torch
    mask, offsets = batch.mask, batch.offsets
    seen = seen_batch(batch.values, batch.rewards, mask, batch.rows) if host else None
    if seen is not None and seen.counts is not None:  # the drop-in's kernel counted them a moment ago
        counts = seen.counts
    else:
        counts = trainable_counts(mask.numpy(), offsets.numpy()) if host else trainable_counts(mask != 0, offsets)
    as_float = (lambda x: np.asarray(x, dtype=np.float64)) if host else (lambda x: x.to(torch.float64))
    difference = xp.where(lost, -as_float(rows["outcome"]), 0.0)
    if batch.truncation is not None:  # set for the profiles that take it (AReaL's: layouts._areal)
        truncated, bootstrap = (part.cpu().numpy() if host else part for part in batch.truncation)
        difference = difference + xp.where(truncated != 0, batch.gamma * as_float(bootstrap), 0.0)
    counts = as_float(counts)
    if hasattr(batch.lambd, "numel"):  # a λ per row, its decay in λ's dtype as the row scan takes it
        decay = as_float(batch.gamma * batch.lambd.reshape(-1).to(offsets.device))
        geometric = xp.where(decay == 1, counts, (1 - decay**counts) / xp.where(decay == 1, 2.0, 1 - decay))
    else:
        decay = batch.gamma * float(batch.lambd)
        geometric = counts if decay == 1 else (1 - decay**counts) / (1 - decay)
    tokens, total = counts.sum(), (abs(difference) * geometric).sum()
    if host:
        return total / tokens if tokens > 0 else np.float64(0.0)
    zero = torch.zeros((), dtype=torch.float64, device=total.device)
    return torch.where(tokens > 0, total / tokens.clamp(min=1), zero)


def _bounds(batch: TrainerBatch, ends, picked, window: int, offsets):
    """The windows of the ``picked`` rows: where each starts (``window`` tokens before the
    response's end, not before the row's start), where it ends (the row's end; the response's for
    :data:`INERT_AFTER_THE_END`), their common width, and the responses' ends; numpy or torch
    as ``offsets``."""
    starts, row_ends, picked_ends = offsets[:-1][picked], offsets[1:][picked], ends[picked]
    if profile_of(batch.profile) in INERT_AFTER_THE_END:
        row_ends = picked_ends
    if isinstance(offsets, np.ndarray):
        begins = np.maximum(starts, picked_ends - window)
    else:
        import torch

        begins = torch.maximum(starts, picked_ends - window)
    width = max(1, int((row_ends - begins).max()))
    return begins, row_ends, width, picked_ends


def _host_windows(batch: TrainerBatch, ends: np.ndarray, picked: np.ndarray, window: int):
    """Both sides' advantages ``[k, W]`` (numpy) on the ``picked`` rows' windows, right-aligned
    (a shorter window preceded by masked zeros), and their trainable tokens; a terminal reward
    given apart (miles') is read on the response's last token."""
    begins, row_ends, width, picked_ends = _bounds(batch, ends, picked, window, batch.offsets.numpy())
    flat = [tensor.reshape(-1).numpy() for tensor in (batch.values, batch.rewards, batch.mask)]
    count = picked.size
    values, rewards = (np.zeros((count, width), dtype=flat[0].dtype) for _ in range(2))
    trainable = np.zeros((count, width), dtype=np.bool_)
    _gather_windows(*flat, begins, row_ends, width, values, rewards, trainable)
    if batch.terminal is not None:
        column = picked_ends - 1 - (row_ends - width)  # the response's last token, read as its outcome's
        inside = np.flatnonzero(picked_ends - 1 >= begins)
        rewards[inside, column[inside]] += batch.terminal.numpy()[picked][inside].astype(rewards.dtype)
    lambd = _picked_lambda(batch, picked, len(ends))
    if hasattr(lambd, "numel"):  # a λ per row: the drop-ins' row-λ scan, in torch
        import torch

        sides = _padded_sides(batch, *(torch.from_numpy(array) for array in (values, rewards, trainable)), lambd)
        return sides[0].numpy(), sides[1].numpy(), trainable
    masked, old = _kernel_sides(batch, values, rewards, trainable, float(lambd))
    return masked, old, trainable


def _device_windows(batch: TrainerBatch, ends, picked, window: int):
    """:func:`_host_windows` in torch on the batch's device (``picked`` a tensor there)."""
    import torch

    begins, row_ends, width, picked_ends = _bounds(batch, ends, picked, window, batch.offsets)
    positions = row_ends.unsqueeze(1) - width + torch.arange(width, device=ends.device)
    inside = positions >= begins.unsqueeze(1)
    positions = torch.where(inside, positions, 0)
    zero = torch.zeros((), dtype=batch.values.dtype, device=batch.values.device)
    # torch.take, not flat[positions]: a 2-D index costs 80x as much
    take = lambda flat: torch.where(inside, torch.take(flat, positions), zero)  # noqa: E731
    values, rewards = take(batch.values), take(batch.rewards)
    if batch.terminal is not None:
        last = positions == (picked_ends - 1).unsqueeze(1)
        rewards = rewards + torch.where(last & inside, batch.terminal[picked].unsqueeze(1).to(values.dtype), zero)
    trainable = (torch.take(batch.mask, positions) != 0) & inside
    masked, old = _padded_sides(batch, values, rewards, trainable, _picked_lambda(batch, picked, len(ends)))
    return masked, old, trainable


def _picked_lambda(batch: TrainerBatch, picked, count: int):
    """λ of the picked rows: the batch's number, or its λ per row taken at them."""
    lambd = batch.lambd
    if hasattr(lambd, "numel") and lambd.numel() == count > 1:
        return lambd.reshape(-1)[picked]
    return lambd


@numba.njit(cache=True, nogil=True)
def _gather_windows(values, rewards, mask, begins, row_ends, width, out_values, out_rewards, out_trainable):
    for k in range(begins.shape[0]):
        first = row_ends[k] - width
        for j in range(max(begins[k] - first, 0), width):
            position = first + j
            out_values[k, j] = values[position]
            out_rewards[k, j] = rewards[position]
            out_trainable[k, j] = mask[position] != 0


def _padded_sides(batch: TrainerBatch, values, rewards, trainable, lambd):
    """The advantages ``[k, W]`` (torch) of the masked contract and of the batch's profile, by the
    drop-ins' padded GAE. (The one profile that takes a truncation bootstrap, AReaL's, is of
    :data:`OUTCOME_ONLY`: no window reads one.)"""
    from gaecli.trainers.row_lambda import padded_lambda_gae

    masked, _ = padded_lambda_gae(values, rewards, trainable, batch.gamma, lambd, MASKED)
    old, _ = padded_lambda_gae(values, rewards, trainable, batch.gamma, lambd, batch.profile)
    return masked, old


def _kernel_sides(batch: TrainerBatch, values, rewards, trainable, lambd: float):
    """The advantages ``[k, W]`` (numpy) of the masked contract and of the batch's profile: the
    compiled kernel with the profiles' one definition around it."""
    from gaecli.advantages.baselines import apply_semantics
    from gaecli.advantages.kernels.native import native_gae_flat
    from gaecli.trainers.padded import outcome_split

    count, width = values.shape
    offsets = np.arange(count + 1, dtype=np.int64) * width
    options = {"gamma": batch.gamma, "lambd": lambd}

    def run(values, rewards, trainable, terminal):
        return native_gae_flat(values, rewards, trainable, offsets, terminal, **options)

    kept, outcome = outcome_split(rewards, trainable)
    masked, _ = run(values.reshape(-1), kept.reshape(-1), trainable.reshape(-1), outcome)
    zeros = np.zeros(count, dtype=masked.dtype)
    old, _ = apply_semantics(run, values.reshape(-1), rewards.reshape(-1), trainable.reshape(-1), offsets, zeros,
                             semantics=batch.profile, **options)  # fmt: skip
    return masked.reshape(count, width), old.reshape(count, width)
