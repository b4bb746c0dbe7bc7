"""The ragged layout, written once: where samples start and end, which token is the last
trainable one, which trainable token follows a position, and the padded ``[B, T]`` layout of
the compressed (trainable-only) sequences, all vectorised over the flat buffer.

Conventions used throughout gaecli: a batch of B samples is flat 1-D arrays of N tokens
(values, rewards, a bool trainable mask) plus ``offsets`` (int64, B + 1 entries,
``offsets[0] == 0``, ``offsets[-1] == N``; an Arrow list column's offsets, FLA's
``cu_seqlens``). Every helper that both paths use takes numpy arrays (the commands' CPU path,
which never imports torch) or torch tensors (the Python API, any device) and answers in the
same kind; the two implementations sit side by side and give the same integers. The padded
layout (:func:`compress` and what follows) is torch only: the padded kernels use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np

if TYPE_CHECKING:
    import torch


def array_module(array):
    """``numpy`` for a numpy array, ``torch`` for a tensor (imported only then)."""
    if isinstance(array, np.ndarray):
        return np
    import torch

    return torch


def segment_ids(offsets, total: int):
    """Sample index of every flat position: int64 ``[N]``; empty samples own no position."""
    if isinstance(offsets, np.ndarray):
        return np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))
    import torch

    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total)


def trainable_counts(trainable, offsets):
    """Trainable (nonzero) tokens per sample of a flat mask ``[N]``. int64 ``[B]``. On a device
    nothing is read back (a sum per segment, no ``nonzero``)."""
    if isinstance(trainable, np.ndarray):
        _good_neighbour()
        return _trainable_counts(trainable, np.asarray(offsets, dtype=np.int64))
    import torch

    counts = torch.zeros(offsets.numel() - 1, dtype=torch.int64, device=trainable.device)
    return counts.index_add_(0, segment_ids(offsets, trainable.numel()), (trainable != 0).to(torch.int64))


def trainable_sums(rewards: np.ndarray, trainable, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's sum of ``rewards`` over its trainable tokens, added in token order in
    float64, and its trainable token count: ``(float64 [B], int64 [B])``; ``trainable`` None:
    every token. One compiled pass (flat numpy ``rewards`` ``[N]``, bool ``trainable``)."""
    every = trainable is None
    flags = np.ones(1, dtype=np.bool_) if every else trainable
    _good_neighbour()
    return _trainable_sums(rewards, flags, np.asarray(offsets, dtype=np.int64), every)


@numba.njit(cache=True, nogil=True, parallel=True)
def _trainable_sums(rewards, trainable, offsets, every):
    rows = offsets.shape[0] - 1
    sums = np.zeros(rows, dtype=np.float64)
    counts = np.zeros(rows, dtype=np.int64)
    for row in numba.prange(rows):  # each row's sum in its own token order
        total = 0.0
        count = 0
        for t in range(offsets[row], offsets[row + 1]):
            if every or trainable[t]:
                total += np.float64(rewards[t])
                count += 1
        sums[row] = total
        counts[row] = count
    return sums, counts


def spread_to_trainable(row_values: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, dtype) -> np.ndarray:
    """Each sample's value (float64 ``[B]``) at its trainable tokens, 0 elsewhere: flat ``[N]``
    in ``dtype``, rounded once from float64. One compiled pass."""
    out = np.empty(trainable.shape[0], dtype=dtype)
    _good_neighbour()
    _spread(np.asarray(row_values, dtype=np.float64), trainable, np.asarray(offsets, dtype=np.int64), out)
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def _spread(row_values, trainable, offsets, out):
    for row in numba.prange(offsets.shape[0] - 1):
        value = row_values[row]
        start = np.uint64(offsets[row])  # unsigned: no wraparound test, the loop vectorises
        for j in range(np.uint64(offsets[row + 1] - offsets[row])):
            out[start + j] = value if trainable[start + j] != 0 else 0.0


def _good_neighbour() -> None:
    """numba's thread pool started as a good neighbour to torch, before a parallel pass."""
    from gaecli.advantages.kernels.compiled import thread_count

    thread_count()


@numba.njit(cache=True, nogil=True, parallel=True)
def _trainable_counts(trainable, offsets):
    rows = offsets.shape[0] - 1
    counts = np.zeros(rows, dtype=np.int64)
    for row in numba.prange(rows):
        count = 0
        start = np.uint64(offsets[row])  # unsigned: no wraparound test, the loop vectorises
        for j in range(np.uint64(offsets[row + 1] - offsets[row])):
            count += np.int64(trainable[start + j] != 0)
        counts[row] = count
    return counts


def last_trainable_index(trainable, offsets):
    """Flat index of each sample's last trainable token, -1 when it has none. int64 ``[B]``."""
    if isinstance(trainable, np.ndarray):
        return _last_trainable(trainable, np.asarray(offsets, dtype=np.int64))
    import torch

    batch = offsets.numel() - 1
    positions = torch.where(trainable, torch.arange(trainable.numel(), device=trainable.device), -1)
    last = torch.full((batch,), -1, dtype=torch.int64, device=trainable.device)
    return last.scatter_reduce(0, segment_ids(offsets, trainable.numel()), positions, reduce="amax")


@numba.njit(cache=True, nogil=True)
def _last_trainable(trainable, offsets):
    # Each sample scanned backwards from its end to its last trainable token: the work is
    # the masked tails, not the tokens (a fully masked sample is read whole).
    rows = offsets.shape[0] - 1
    last = np.full(rows, -1, dtype=np.int64)
    for row in range(rows):
        for t in range(offsets[row + 1] - 1, offsets[row] - 1, -1):
            if trainable[t]:
                last[row] = t
                break
    return last


def row_tails(mask, rewards, offsets):
    """Per sample of a flat batch: ``(last, last_reward, tail_sum)``, int64 ``[B]`` the flat
    index of its last trainable token (``mask != 0``; -1: none) and of its last non-zero reward
    at or after that token (-1: none), and ``[B]`` in the rewards' dtype the rewards after its last
    trainable token summed. numpy (a compiled pass over the tails only) or torch (on the tensors' device)."""
    if isinstance(mask, np.ndarray):
        from gaecli.advantages.kernels.compiled import thread_count

        thread_count()  # numba's pool started as a good neighbour to torch
        return _row_tails(mask, rewards, np.asarray(offsets, dtype=np.int64))
    import torch

    last = last_trainable_index(mask != 0, offsets)
    sample = segment_ids(offsets, rewards.numel())
    position = torch.arange(rewards.numel(), device=rewards.device)
    after = position > last[sample]
    last_reward = last_trainable_index((position >= last[sample]) & (rewards != 0), offsets)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    tail = torch.zeros(offsets.numel() - 1, dtype=rewards.dtype, device=rewards.device)
    return last, last_reward, tail.index_add(0, sample, torch.where(after, rewards, zero))


TAIL_BLOCK = 16
"""Tokens :func:`read_tail` tests at once for a block of padding (every mask entry and reward 0)."""


@numba.njit(cache=True, nogil=True)
def read_tail(mask, rewards, start, end, last, last_reward, tail, row):
    """One sample's tail, read backwards from its ``end`` to its last trainable token, into
    ``last[row]``, ``last_reward[row]`` and ``tail[row]`` (compiled code calls this). A block
    of :data:`TAIL_BLOCK` tokens whose mask entries and rewards are all 0 is passed over in one
    branch-free test; the others are read token by token (a zero reward adds nothing: the sum
    starts at +0, so the tail's sum is that of the token-by-token loop)."""
    found, total = last_reward[row], tail[row]  # in registers: the loops store nothing
    position = end
    while position > start:
        if position - start >= TAIL_BLOCK:
            base = np.uint64(position - TAIL_BLOCK)
            busy = 0
            for k in range(np.uint64(TAIL_BLOCK)):
                busy |= np.int32(mask[base + k] != 0) | np.int32(rewards[base + k] != 0)
            if busy == 0:
                position -= TAIL_BLOCK
                continue
        stop = max(position - TAIL_BLOCK, start)
        for t in range(position - 1, stop - 1, -1):
            reward = rewards[t]
            if mask[t] != 0:
                if found < 0 and reward != 0:
                    found = t
                last[row], last_reward[row], tail[row] = t, found, total
                return
            if reward != 0:
                total += reward
                if found < 0:
                    found = t
        position = stop
    last_reward[row], tail[row] = found, total


@numba.njit(cache=True, nogil=True, parallel=True)
def _row_tails(mask, rewards, offsets):
    rows = offsets.shape[0] - 1
    last = np.full(rows, -1, dtype=np.int64)
    last_reward = np.full(rows, -1, dtype=np.int64)
    tail = np.zeros(rows, dtype=rewards.dtype)
    for row in numba.prange(rows):
        read_tail(mask, rewards, offsets[row], offsets[row + 1], last, last_reward, tail, row)
    return last, last_reward, tail


def next_trainable_index(trainable, offsets):
    """For every flat position t, the index of the first trainable position after t in the
    same sample, or -1 when there is none. int64 ``[N]``."""
    if isinstance(trainable, np.ndarray):
        return _next_trainable(trainable, np.asarray(offsets, dtype=np.int64))
    import torch

    total = trainable.numel()
    positions = torch.arange(total, device=trainable.device)
    candidates = torch.where(trainable, positions, total)
    # Minimum over candidates[t:]: a reverse cumulative minimum; shifted by one for "after t".
    suffix_min = candidates.flip(0).cummin(0).values.flip(0)
    following = torch.cat([suffix_min[1:], suffix_min.new_full((1,), total)])
    sample_end = offsets[1:][segment_ids(offsets, total)]
    return torch.where(following < sample_end, following, -1)


@numba.njit(cache=True, nogil=True)
def _next_trainable(trainable, offsets):
    # Each sample scanned once backwards, carrying the last trainable position seen: one
    # read of the mask, one write of the result.
    following = np.empty(trainable.shape[0], dtype=np.int64)
    for row in range(offsets.shape[0] - 1):
        carried = -1
        for t in range(offsets[row + 1] - 1, offsets[row] - 1, -1):
            following[t] = carried
            if trainable[t]:
                carried = t
    return following


def masked_tail_lengths(trainable: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Masked tokens after each sample's last trainable token (its whole length when fully
    masked, 0 when empty). int64 ``[B]``; numpy only (the checks use it)."""
    last = last_trainable_index(trainable, offsets)
    starts, ends = offsets[:-1], offsets[1:]
    return np.where(last >= 0, ends - 1 - last, ends - starts)


def ends_trainable(trainable, offsets):
    """Whether each sample's last token (token R−1) is trainable; False for an empty sample.
    bool ``[B]``, numpy or torch as the mask."""
    last_position = offsets[1:] - 1
    nonempty = offsets[1:] > offsets[:-1]
    xp = array_module(trainable)
    ends = xp.zeros_like(nonempty)
    ends[nonempty] = trainable[last_position[nonempty]]
    return ends


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
    import torch

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
    import torch

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
    import torch

    advantages = torch.zeros_like(values)
    returns = torch.zeros_like(values)
    trainable_advantages = padded_advantages[layout.row, layout.col]
    advantages[layout.flat_index] = trainable_advantages
    returns[layout.flat_index] = trainable_advantages + values[layout.flat_index]
    return advantages, returns


def turn_table(trainable, offsets):
    """The turns of every sample: maximal runs of trainable tokens inside one sample
    (docs/variants.md). Returns ``(starts, ends, turn_offsets)``: int64 ``[U]`` flat
    position of each turn's first token and one past its last token, in order, and int64
    ``[B + 1]`` ``turn_offsets`` (the turns of sample i are ``turn_offsets[i]`` up to
    ``turn_offsets[i + 1]``; ``diff`` is each sample's number of turns). ``trainable``:
    bool, numpy or torch (the result is of the same kind); vectorised."""
    if isinstance(trainable, np.ndarray):
        return _turn_table_numpy(trainable, np.asarray(offsets, dtype=np.int64))
    xp = array_module(trainable)
    total = trainable.shape[0]
    nonempty = offsets[1:] > offsets[:-1]
    first_of_sample = xp.zeros_like(trainable)
    last_of_sample = xp.zeros_like(trainable)
    first_of_sample[offsets[:-1][nonempty]] = True
    last_of_sample[offsets[1:][nonempty] - 1] = True
    previous = xp.zeros_like(trainable)
    following = xp.zeros_like(trainable)
    if total:
        previous[1:] = trainable[:-1]
        following[:-1] = trainable[1:]
    begins = trainable & (~previous | first_of_sample)
    finishes = trainable & (~following | last_of_sample)
    starts, ends = begins.nonzero().flatten(), finishes.nonzero().flatten() + 1
    return starts, ends, xp.searchsorted(starts, offsets)


def run_rewards(rewards: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, turn_rewards=None):
    """Each turn's reward (float64 ``[U]``, the turns of :func:`turn_table`): the rewards at
    its trainable tokens, added in token order, plus its entry of ``turn_rewards`` (a pair of
    flat values ``[U]`` and offsets ``[B + 1]``, one reward per turn: checked by the callers;
    None: none), and the ``turn_offsets`` ``[B + 1]``. numpy, vectorised."""
    starts, _, turn_offsets = turn_table(trainable, offsets)
    positions = np.flatnonzero(trainable)
    turns = np.searchsorted(starts, positions, side="right") - 1
    sums = np.bincount(turns, weights=rewards[positions].astype(np.float64), minlength=starts.size)
    if turn_rewards is not None:
        sums = sums + np.asarray(turn_rewards[0], dtype=np.float64)[: starts.size]
    return sums, turn_offsets


def id_turn_table(trainable: np.ndarray, offsets: np.ndarray, turn_ids: np.ndarray):
    """The turns of every sample given by explicit turn ids (docs/variants.md; int ``[N]``,
    one per token, read at trainable tokens only, non-decreasing there: checked by the
    callers): a turn is the trainable tokens of one sample with one id, so two turns may
    touch and one turn may span masked tokens (which are not its). Returns what
    :func:`turn_table` returns: each turn's first trainable position, one past its last
    trainable position, and ``turn_offsets`` ``[B + 1]``. numpy, vectorised."""
    positions = np.flatnonzero(trainable)
    rows = np.searchsorted(offsets, positions, side="right") - 1
    ids = np.asarray(turn_ids)[positions]
    begins = np.ones(positions.size, dtype=bool)
    begins[1:] = (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, positions.size - 1) if first.size else first
    starts = positions[first].astype(np.int64, copy=False)
    ends = (positions[last] + 1).astype(np.int64, copy=False)
    return starts, ends, np.searchsorted(starts, np.asarray(offsets, dtype=np.int64)).astype(np.int64)


def _turn_table_numpy(trainable: np.ndarray, offsets: np.ndarray):
    """:func:`turn_table` of a numpy mask in one pass over the tokens: the positions where
    the mask changes (a turn begins or ends there), then the sample boundaries that cut a
    trainable run in two (each is both an end and a start). A few turns per sample make the
    rest of the work small."""
    if trainable.dtype != np.bool_:  # positions are picked by the mask's truth below
        trainable = trainable != 0
    total = trainable.shape[0]
    changes = np.flatnonzero(trainable[1:] != trainable[:-1]) + 1
    begins = trainable[changes]
    starts, ends = changes[begins], changes[~begins]
    if total and trainable[0]:
        starts = np.concatenate(([0], starts))
    if total and trainable[-1]:
        ends = np.append(ends, total)
    inner = np.unique(offsets[(offsets > 0) & (offsets < total)])
    cuts = inner[trainable[inner] & trainable[inner - 1]]
    if cuts.size:
        starts = np.sort(np.concatenate((starts, cuts)))
        ends = np.sort(np.concatenate((ends, cuts)))
    return (
        starts.astype(np.int64, copy=False),
        ends.astype(np.int64, copy=False),
        np.searchsorted(starts, offsets).astype(np.int64),
    )
