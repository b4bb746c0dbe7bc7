"""Whitening of advantages, ``(A − mean) / sqrt(var + ε)`` over trainable tokens
(docs/semantics.md): over a torch input (:func:`whiten`), per group of rows in a torch input
(:func:`whiten_by_group`), and per row from grouped statistics gathered over many files
(:func:`whiten_rows`, the commands' ``--normalize``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numba
import numpy as np

from gaecli.advantages.contract import WHITEN_EPSILON
from gaecli.errors import GAEInputError

if TYPE_CHECKING:
    import pyarrow as pa

    from gaecli.advantages.statistics import Moments


def whiten(advantages, loss_mask):
    """Whiten advantages over all trainable tokens: ``(A − mean) / sqrt(var + 1e-8)`` with
    the mask-weighted mean and Bessel-corrected variance (statistics in float64).

    ``advantages`` and ``loss_mask`` are both flat tensors or both lists of 1-D tensors;
    the result has the same form and the advantages' dtype. Masked positions stay 0. One
    trainable token whitens to 0 (its variance is taken as 0); no trainable token at all, a
    non-finite advantage (named by its sample and token, or its position in a flat tensor), a
    complex or ``meta`` tensor raise :class:`gaecli.GAEInputError`.
    """
    import torch

    from gaecli.advantages.inputs import as_mask, check_finite, check_has_data, check_real, pack_lists, split

    if isinstance(advantages, torch.Tensor):
        flat_advantages, flat_mask, lengths, sample_offsets = advantages, loss_mask, None, None
        if flat_mask.numel() != flat_advantages.numel():
            raise GAEInputError(f"loss_mask has {flat_mask.numel()} tokens, advantages has {flat_advantages.numel()}")
    else:
        terminal = [0.0] * len(advantages)
        packed = pack_lists(advantages, advantages, loss_mask, terminal)
        flat_advantages, _, flat_mask, sample_offsets, _, lengths = packed
    check_real("advantages", flat_advantages)
    check_has_data("loss_mask", flat_mask)
    check_finite("advantages", flat_advantages, sample_offsets)
    offsets = torch.tensor([0, flat_mask.numel()], device=flat_advantages.device)
    mask = as_mask(flat_mask.to(flat_advantages.device), offsets)
    count = int(mask.sum())
    if count == 0:
        raise GAEInputError("whiten: no trainable token (loss_mask is all zeros)")
    as_double = flat_advantages.double()
    mean = as_double[mask].sum() / count
    variance = ((as_double[mask] - mean) ** 2).sum() / (count - 1) if count > 1 else as_double.new_zeros(())
    whitened = torch.where(mask, (as_double - mean) / torch.sqrt(variance + WHITEN_EPSILON), 0.0).to(
        flat_advantages.dtype
    )
    return whitened if lengths is None else split(whitened, lengths)


def whiten_by_group(advantages, trainable, offsets, keys):
    """Whiten flat advantages ``[N]`` per group of rows: rows with equal ``keys`` (``[B]``: a
    tensor or a sequence of scalars) share a mean and a Bessel variance over their trainable
    tokens (``trainable`` bool ``[N]``, ``offsets`` ``[B + 1]``), in float64; masked positions
    stay 0. A group without a trainable token raises :class:`gaecli.GAEInputError`."""
    import torch

    from gaecli.advantages.layout import segment_ids

    batch = offsets.numel() - 1
    if isinstance(keys, torch.Tensor):
        if keys.dim() != 1 or keys.numel() != batch:
            raise GAEInputError(f"group keys must hold one key per sample ({batch}), got shape {tuple(keys.shape)}")
        uniques, codes = torch.unique(keys.cpu(), return_inverse=True)
        uniques = uniques.tolist()
    else:
        if len(keys) != batch:
            raise GAEInputError(f"group keys must hold one key per sample ({batch}), got {len(keys)}")
        uniques, codes = np.unique(np.asarray(keys), return_inverse=True)
        uniques, codes = uniques.tolist(), torch.from_numpy(codes.reshape(-1).astype(np.int64))
    groups = len(uniques)
    token_group = codes.to(advantages.device)[segment_ids(offsets, advantages.numel())][trainable]
    as_double = advantages.double()
    chosen = as_double[trainable]
    counts = torch.zeros(groups, dtype=torch.float64, device=advantages.device).index_add_(
        0, token_group, torch.ones_like(chosen)
    )
    empty = (counts == 0).nonzero().flatten()
    if empty.numel():
        raise GAEInputError(f"cannot normalize: group {uniques[int(empty[0])]!r} has no trainable token")
    means = torch.zeros_like(counts).index_add_(0, token_group, chosen) / counts
    squares = torch.zeros_like(counts).index_add_(0, token_group, (chosen - means[token_group]) ** 2)
    variances = torch.where(counts > 1, squares / (counts - 1).clamp(min=1), 0.0)
    whitened = torch.zeros_like(as_double)
    whitened[trainable] = (chosen - means[token_group]) / torch.sqrt(variances[token_group] + WHITEN_EPSILON)
    return whitened.to(advantages.dtype)


def whiten_rows(
    advantages: np.ndarray,
    offsets: np.ndarray,
    moments: "Moments",
    keys: Optional["pa.Array"],
    *,
    trainable: Optional[np.ndarray] = None,
    dtype=np.float64,
) -> np.ndarray:
    """``(A − mean) / sqrt(var + ε)`` at every position of flat ``advantages`` ``[N]``, with
    each row's group statistics from ``moments`` (rows grouped by ``keys``, one per row, or
    one group when None), computed in float64 and rounded once to ``dtype``. With
    ``trainable`` (bool ``[N]``), 0 at its masked positions (where the contract says so).
    One pass over the tokens, no temporary array."""
    means, stds = moments.row_stats(keys, offsets.size - 1, WHITEN_EPSILON)
    whitened = np.empty(advantages.size, dtype=dtype)
    zero_masked = trainable is not None
    mask = trainable if zero_masked else np.zeros(0, dtype=np.bool_)
    _whiten_rows(advantages, np.asarray(offsets, dtype=np.int64), means, stds, mask, zero_masked, whitened)
    return whitened


@numba.njit(cache=True, nogil=True)
def _whiten_rows(advantages, offsets, means, stds, trainable, zero_masked, whitened):
    for row in range(offsets.shape[0] - 1):
        mean = means[row]
        std = stds[row]
        for t in range(offsets[row], offsets[row + 1]):
            if zero_masked and not trainable[t]:
                whitened[t] = 0.0
            else:
                whitened[t] = (np.float64(advantages[t]) - mean) / std
