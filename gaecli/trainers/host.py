"""The padded drop-ins' compiled path on the host: a float32 or float64 ``[B, T]`` batch on the
CPU computed by compiled passes alone, without a torch op between them (a torch op wakes
torch's thread pool, which then holds the cores the next compiled pass runs on).

- masked GAE: the screened native kernel, which first sums the rewards after each row's last
  trainable token (its outcome, :func:`gaecli.advantages.layout.read_tail`), then runs on the
  rewards as given (a reward at a masked token is only screened, so the rewards at masked
  tokens between trainable ones are dropped, as :func:`gaecli.trainers.padded.outcome_split`
  drops them) and the mask in its own dtype, and records each row's whitening moments;
- whitening in place: the count, mean and Bessel variance of the trainable tokens' advantages
  in float64, row by row over the threads, then :func:`gaecli.advantages.whiten.whitened` at
  the trainable positions (or at every one, as verl's ``masked_whiten``).

Where a function does not apply (another device or dtype, a non-contiguous tensor, input the
kernel's screen found not clean: a non-finite value or reward, a mask value other than 0 and
1), it says so (None, False) and the drop-in takes its general path, which names any fault."""

from __future__ import annotations

import weakref
from typing import Optional

import numba
import numpy as np

from gaecli.advantages.contract import MASKED, WHITEN_EPSILON
from gaecli.advantages.kernels.compiled import thread_count
from gaecli.advantages.whiten import row_moments, whitened_token

FLOATS = ("float32", "float64")


def host_arrays(*tensors) -> list | None:
    """The tensors as numpy views of their flat buffers, or None unless every one is a
    contiguous CPU tensor (the first two float32 or float64 of one dtype; the rest may be
    bool, integer or float masks)."""
    import torch

    first = tensors[0]
    if str(first.dtype).removeprefix("torch.") not in FLOATS or tensors[1].dtype != first.dtype:
        return None
    if any(t.device.type != "cpu" or not t.is_contiguous() or t.dtype.is_complex for t in tensors):
        return None
    if any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors[2:]):
        return None
    return [t.detach().reshape(-1).numpy() for t in tensors]


def _padded_rows(*tensors):
    """``(flat numpy views, offsets)`` of a padded ``[B, T]`` batch (:func:`host_arrays`, rows
    of ``T`` tokens each), or None where the host path does not apply."""
    arrays = host_arrays(*tensors)
    if arrays is None:
        return None
    batch, length = tensors[0].shape
    return arrays, np.arange(batch + 1, dtype=np.int64) * length


def masked_gae_padded(values, rewards, mask, gamma: float, lambd: float, out=None, moments=None):
    """The masked contract on a padded batch ``[B, T]`` (rows of ``T`` tokens): ``(advantages,
    returns)`` ``[B, T]`` in the values' dtype (``out``: the caller's two contiguous buffers,
    written), 0 at masked and padding positions; None where this path does not apply.
    ``moments``: float64 ``[3, B]``, filled with the rows' whitening moments by the kernel as
    each row ends (:func:`gaecli.advantages.whiten.row_moments`, for :func:`whiten_in_place`);
    left as it was where this path does not apply."""
    import torch

    from gaecli.advantages.kernels.native import native_gae_screened

    padded = _padded_rows(values, rewards, mask)
    if padded is None:
        return None
    (flat_values, flat_rewards, flat_mask), offsets = padded
    batch, length = values.shape
    last, last_reward = np.full(batch, -1, dtype=np.int64), np.full(batch, -1, dtype=np.int64)
    terminal = np.zeros(batch, dtype=flat_rewards.dtype)  # the tails' sums: the kernel reads each row's tail first
    buffers = None if out is None else tuple(o.view(-1).numpy() for o in out)
    found = None if moments is None else np.zeros_like(moments)
    advantages, returns, clean = native_gae_screened(
        flat_values, flat_rewards, flat_mask, offsets, terminal, gamma=gamma, lambd=lambd, out=buffers, moments=found,
        tails=(last, last_reward, terminal),
    )  # fmt: skip
    if not clean or not np.isfinite(terminal).all():
        return None
    starts = offsets[:-1]
    tails = (np.where(last >= 0, last + starts, -1), np.where(last_reward >= 0, last_reward + starts, -1), terminal)
    if moments is not None:
        moments[...] = found
    _SEEN[:] = [_Seen((values, rewards, mask), tails, None if moments is None else found[0].astype(np.int64))]
    if out is not None:
        return out[0], out[1]
    return torch.from_numpy(advantages).view(batch, length), torch.from_numpy(returns).view(batch, length)


class _Seen:
    """What the kernel's pass saw of the last batch it screened clean: its rows' tails
    (:func:`gaecli.advantages.layout.row_tails`), their trainable counts where it recorded the
    moments (else None), and the tensors as they were then (weak references: a tensor freed, or
    changed in place since, is not the one seen)."""

    def __init__(self, tensors, tails, counts) -> None:
        self.tensors = [weakref.ref(tensor) for tensor in tensors]
        self.places = [_place(tensor) for tensor in tensors]
        self.rows = tuple(tensors[0].shape)
        self.tails = tails
        self.counts = counts

    def matches(self, tensors, rows) -> bool:
        if len(tensors) != len(self.tensors) or rows is None or tuple(rows) != self.rows:
            return False
        for reference, place, tensor in zip(self.tensors, self.places, tensors):
            seen = reference()
            if seen is None or _place(seen) != place or _place(tensor) != place:
                return False
        return True


def _place(tensor) -> tuple:
    """Where a tensor's data lie and what they are: the same while the tensor seen is alive
    (its memory then holds no other tensor) and unchanged in place (the version counter, which
    a view shares with its base: a write through numpy is not counted)."""
    return (tensor.data_ptr(), tensor.numel(), tensor.dtype, tensor.is_contiguous(), tensor._version)


_SEEN: list = []
"""The last batch the compiled path screened clean (:class:`_Seen`), at most one."""


def seen_tails(values, rewards, mask, rows) -> tuple | None:
    """The rows' tails (numpy) of a batch the compiled path last screened clean — ``values``,
    ``rewards`` and ``mask`` the tensors it took or flat views of them, unchanged since, its
    ``rows`` ``(B, T)`` — else None: what :func:`gaecli.trainers.check` and
    :func:`gaecli.trainers.credit_metrics` then need not read again (the batch's mask values 0
    or 1, its values and rewards finite)."""
    seen = seen_batch(values, rewards, mask, rows)
    return None if seen is None else seen.tails


def seen_batch(values, rewards, mask, rows) -> Optional[_Seen]:
    """What the compiled path saw of the batch :func:`seen_tails` describes (its tails, and its
    rows' trainable counts where it recorded them), or None."""
    if _SEEN and _SEEN[0].matches((values, rewards, mask), rows):
        return _SEEN[0]
    return None


def outcome_padded(spec, rewards, mask, row_inputs: dict):
    """An outcome estimator's advantages ``[B, T]`` (``spec``: grpo, dr-grpo or rloo under the
    masked contract or verl's profile, each row's advantage written at its trainable tokens, 0
    elsewhere) from compiled passes: one that screens the batch and reads its tails
    (:func:`gaecli.advantages.faults.screen_rows`), the rows' scores
    (:func:`gaecli.advantages.estimators.row_scores`: the rewards at trainable tokens and the
    outcome; verl's profile: every token's, ``response_scores``), the estimator on the ``B``
    scores alone (:func:`gaecli.compute_advantages_packed` on one token a row: the same
    definition and checks), and one write. None where this path does not apply or the screen
    flags a row (the general path then names the fault)."""
    import torch

    from gaecli.advantages.api import compute_advantages_packed
    from gaecli.advantages.estimators import response_scores, row_scores
    from gaecli.advantages.faults import screen_rows
    from gaecli.advantages.layout import spread_to_trainable

    padded = _padded_rows(rewards, rewards, mask)
    if padded is None:
        return None
    (flat_rewards, _, flat_mask), offsets = padded
    batch, length = rewards.shape
    bad_mask, _, bad_rewards, _, _, terminal = screen_rows(flat_mask, flat_rewards, flat_rewards, offsets)
    if bad_mask.any() or bad_rewards.any() or not np.isfinite(terminal).all():
        return None
    if spec.semantics == MASKED:
        scores, _ = row_scores(flat_rewards, flat_mask, offsets, terminal)
    else:  # a trainer profile's score: every token's reward (verl's)
        scores = response_scores(flat_rewards, offsets, np.zeros(batch, dtype=flat_rewards.dtype))
    one_each = torch.arange(batch + 1, dtype=torch.int64)
    per_row, _ = compute_advantages_packed(
        None, torch.from_numpy(scores), torch.ones(batch, dtype=torch.bool), one_each,
        torch.zeros(batch, dtype=torch.float64), spec=spec, row_inputs=row_inputs,
    )  # fmt: skip
    advantages = spread_to_trainable(per_row.numpy(), flat_mask, offsets, flat_rewards.dtype)
    return torch.from_numpy(advantages).view(batch, length)


def whiten_in_place(advantages, mask, every: bool, moments=None) -> bool:
    """Whiten the ``[B, T]`` advantages in place over the mask's trainable tokens (``mask !=
    0``): ``(A − mean)/sqrt(var + ε)``, the float64 mean and Bessel variance (one trainable
    token: variance 0), at the trainable positions (0 elsewhere) or, ``every``, at each one.
    False, the advantages untouched, where this path does not apply or the figures are not
    finite or no token is trainable (the general :func:`gaecli.advantages.whiten.whiten`
    then says why).

    The moments are taken row by row (:func:`gaecli.advantages.whiten.row_moments`), or given
    (``moments`` float64 ``[3, B]`` as the kernel fills them, :func:`masked_gae_padded`; NaN
    where not filled), then merged (:func:`gaecli.advantages.whiten.merged_moments`)."""
    from gaecli.advantages.whiten import merged_moments

    arrays = host_arrays(advantages, advantages, mask)
    if arrays is None or advantages.dim() != 2:
        return False
    flat, _, flat_mask = arrays
    rows, length = advantages.shape
    thread_count()  # numba's pool started as a good neighbour to torch
    if moments is None or not np.isfinite(moments).all():
        moments = np.stack(_row_moments(flat, flat_mask, rows, length))
    count, mean, variance = merged_moments(moments[0], moments[1], moments[2])
    if count == 0 or not (np.isfinite(mean) and np.isfinite(variance)):
        return False
    _write_whitened(flat, flat_mask, rows, length, mean, float(np.sqrt(variance + WHITEN_EPSILON)), every)
    return True


@numba.njit(cache=True, nogil=True, parallel=True)
def _row_moments(values, mask, rows, length):
    """:func:`gaecli.advantages.whiten.row_moments` of every row, over the threads."""
    counts = np.zeros(rows, dtype=np.float64)
    totals = np.zeros(rows, dtype=np.float64)
    squares = np.zeros(rows, dtype=np.float64)
    for row in numba.prange(rows):
        start = row * length
        row_values, row_mask = values[start : start + length], mask[start : start + length]
        counts[row], totals[row], squares[row] = row_moments(row_values, row_mask)
    return counts, totals, squares


@numba.njit(cache=True, nogil=True, parallel=True)
def _write_whitened(values, mask, rows, length, mean, scale, every):
    width = np.uint64(length)
    inverse = 1.0 / scale
    for row in numba.prange(rows):
        start = np.uint64(row) * width
        for j in range(width):
            whitened = whitened_token(np.float64(values[start + j]), mean, inverse)
            values[start + j] = whitened if every or mask[start + j] != 0 else 0.0
