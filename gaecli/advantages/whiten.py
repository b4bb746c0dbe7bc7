"""Whitening of advantages, ``(A − mean) / sqrt(var + ε)`` over trainable tokens
(docs/semantics.md), the formula written once (:func:`whitening_scale`, :func:`whitened`):
on torch tensors, over the input (:func:`whiten`) or per group of rows
(:func:`whiten_by_group`), the two one path with its statistics taken once; on numpy
buffers, per row from keyed statistics gathered over many files (:func:`whiten_rows`, the
commands' ``--normalize`` and the ``reinforce++`` estimators)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import numba
import numpy as np

from gaecli.advantages.contract import WHITEN_EPSILON
from gaecli.advantages.normalization import rule_center_scale
from gaecli.errors import GAEInputError

if TYPE_CHECKING:
    import pyarrow as pa

    from gaecli.advantages.statistics import Moments


def whitening_scale(variance, sqrt):
    """The divisor of whitening, ``sqrt(var + ε)`` (:data:`WHITEN_EPSILON`), with ``sqrt``
    the array library's (``np.sqrt``, ``torch.sqrt``)."""
    return sqrt(variance + WHITEN_EPSILON)


def whitened(advantage, mean, scale):
    """``(A − mean) / scale``, taken as ``(A − mean) · (1 / scale)`` (:func:`whitened_by`; within
    a float64 ulp of the quotient): numbers, numpy arrays, torch tensors."""
    return whitened_by(advantage, mean, 1.0 / scale)


def whitened_by(advantage, mean, inverse_scale):
    """:func:`whitened` given ``1 / scale``, taken once per group: the compiled loops (one
    token of theirs, :data:`whitened_token`) divide once, not per token (a division per token
    bounded their speed)."""
    return (advantage - mean) * inverse_scale


whitened_token = numba.njit(cache=True, nogil=True)(whitened_by)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def row_moments(values, mask):
    """One row's trainable (``mask != 0``) values: their count, float64 sum, and squares about
    their own mean, in one read of the row, the sums taken about its first trainable value
    (``k``: ``Σ(x − k)``, ``Σ(x − k)²``, then ``sum = n·k + Σ(x − k)``, ``M2 = Σ(x − k)² −
    Σ(x − k)²/n``), which keeps them exact to float64 whatever the row's offset from 0. Sums
    reassociated, so that they run in vector registers: their order is fixed by the row's
    length, the same on every call. Rows merge by :func:`merged_moments`."""
    width = np.uint64(values.shape[0])  # unsigned: no wraparound test
    shift = 0.0
    for j in range(width):
        if mask[j] != 0:
            shift = np.float64(values[j])
            break
    count, total, square = 0, 0.0, 0.0
    for j in range(width):
        trainable = mask[j] != 0
        deviation = np.float64(values[j]) - shift if trainable else 0.0
        total += deviation
        square += deviation * deviation
        count += trainable
    if count == 0:
        return 0, 0.0, 0.0
    return count, count * shift + total, square - total * total / count


def merged_moments(counts: np.ndarray, totals: np.ndarray, squares: np.ndarray) -> tuple[int, float, float]:
    """The rows' :func:`row_moments` as one group's ``(count, mean, Bessel variance)``:
    ``M2 = Σ M2_r + Σ n_r (mean_r − mean)²``, as exact as one pass around the group's mean (one
    token: variance 0; none: count 0, mean and variance 0)."""
    count = int(counts.sum())
    if count == 0:
        return 0, 0.0, 0.0
    mean = float(totals.sum()) / count
    present = counts > 0
    row_means = totals[present] / counts[present]
    spread = float(squares.sum()) + float((counts[present] * (row_means - mean) ** 2).sum())
    return count, mean, spread / (count - 1) if count > 1 else 0.0


def whiten(advantages, loss_mask, rule=None, written: str = "trainable", *, response_mask=None):
    """Whiten advantages over all trainable tokens: ``(A − mean) / sqrt(var + 1e-8)`` with
    the mask-weighted mean and Bessel-corrected variance (statistics in float64).

    ``advantages`` and ``loss_mask`` are both flat tensors or both lists of 1-D tensors;
    the result has the same form and the advantages' dtype. Masked positions stay 0. One
    trainable token whitens to 0 (its variance is taken as 0); no trainable token at all, a
    non-finite advantage (named by its sample and token, or its position in a flat tensor), a
    complex or ``meta`` tensor raise :class:`gaecli.GAEInputError`. ``rule``: a
    :class:`gaecli.advantages.normalization.WhiteningRule` (None: today's; its ``tokens``
    ``response`` takes the statistics over every token, SkyRL's). ``written``: ``trainable``
    (masked positions 0) or ``every`` (every position whitened, as verl's ``masked_whiten``
    leaves them). ``response_mask``: of the loss mask's form (bool, integer or float 0/1;
    None: every token of the response), holding every trainable token: the tokens a rule
    whose ``tokens`` are ``response`` counts (SkyRL's ``response_mask``); checked whenever
    given (:func:`gaecli.advantages.inputs.checked_response_mask`).
    """
    import torch

    from gaecli.advantages.inputs import (
        as_mask,
        check_finite,
        check_has_data,
        check_real,
        checked_response_mask,
        pack_lists,
        packed_response_mask,
        split,
    )

    if isinstance(advantages, torch.Tensor):
        flat_advantages, flat_mask, lengths, sample_offsets = advantages, loss_mask, None, None
        if flat_mask.numel() != flat_advantages.numel():
            raise GAEInputError(f"loss_mask has {flat_mask.numel()} tokens, advantages has {flat_advantages.numel()}")
    else:
        terminal = [0.0] * len(advantages)
        packed = pack_lists(advantages, advantages, loss_mask, terminal)
        flat_advantages, _, flat_mask, sample_offsets, _, lengths = packed
        response_mask = packed_response_mask(response_mask, lengths)
    check_real("advantages", flat_advantages)
    check_has_data("loss_mask", flat_mask)
    check_finite("advantages", flat_advantages, sample_offsets)
    offsets = torch.tensor([0, flat_mask.numel()], device=flat_advantages.device)
    mask = as_mask(flat_mask.to(flat_advantages.device), offsets)
    response = checked_response_mask(response_mask, mask, offsets if sample_offsets is None else sample_offsets)
    result = _whitened_tensor(
        flat_advantages, mask, None, 1, lambda _: "whiten: no trainable token (loss_mask is all zeros)", rule, written,
        response,
    )  # fmt: skip
    return result if lengths is None else split(result, lengths)


def whiten_by_group(advantages, trainable, offsets, keys, rule=None, *, response_mask=None):
    """Whiten flat advantages ``[N]`` per group of rows: rows with equal ``keys`` (``[B]``: a
    tensor or a sequence of scalars) share a mean and a Bessel variance over their trainable
    tokens (``trainable`` bool ``[N]``, ``offsets`` ``[B + 1]``), in float64; masked positions
    stay 0. A group without a trainable token raises :class:`gaecli.GAEInputError`.
    ``rule``: a :class:`gaecli.advantages.normalization.WhiteningRule` (None: today's);
    ``response_mask``: the checked response mask (bool ``[N]``; None: every token), the tokens
    a rule whose ``tokens`` are ``response`` counts."""
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
    token_group = codes.to(advantages.device)[segment_ids(offsets, advantages.numel())]
    return _whitened_tensor(
        advantages,
        trainable,
        token_group,
        len(uniques),
        lambda code: f"cannot normalize: group {uniques[code]!r} has no trainable token",
        rule,
        response=response_mask,
    )


def _whitened_tensor(
    advantages,
    trainable,
    token_group,
    groups: int,
    empty_message: Callable[[int], str],
    rule=None,
    written="trainable",
    response=None,
):
    """The one torch whitening: per group (``token_group``, the group code of each token,
    ``groups`` codes; None: one group, the whole input, reduced by ``sum``) the count, mean and
    Bessel variance in float64 of the advantages at the tokens the rule counts (the trainable
    ones, or with ``tokens="response"`` those of the ``response`` mask, every token without one),
    then :func:`whitened` at the trainable
    positions and 0 elsewhere (``written="every"``: at every position), in the advantages' dtype.
    A group without a counted token raises
    :class:`gaecli.GAEInputError` with ``empty_message(code)``."""
    import torch

    counted = trainable
    if rule is not None and rule.tokens == "response":
        counted = torch.ones_like(trainable) if response is None else response.to(trainable.device)
    if token_group is None and _on_host(advantages, trainable, counted):
        return _whitened_on_host(advantages, trainable, counted, empty_message, rule, written)
    as_double = advantages.double()
    chosen = as_double[counted]
    if token_group is None:
        total, per_token = (lambda numbers: numbers.sum().reshape(1)), (lambda per_group, _: per_group)
    else:
        zeros = torch.zeros(groups, dtype=torch.float64, device=advantages.device)
        counted_group = token_group[counted]
        total = lambda numbers: zeros.clone().index_add_(0, counted_group, numbers)  # noqa: E731
        per_token = lambda per_group, where: per_group[token_group[where]]  # noqa: E731
    counts = total(torch.ones_like(chosen))
    empty = (counts == 0).nonzero().flatten()
    if empty.numel():
        raise GAEInputError(empty_message(int(empty[0])))
    means = total(chosen) / counts
    variances = torch.where(
        counts > 1, total((chosen - per_token(means, counted)) ** 2) / (counts - 1).clamp(min=1), 0.0
    )
    if rule is None or rule.is_default:
        centers, scales = means, whitening_scale(variances, torch.sqrt)
    else:
        batch = None
        if token_group is not None and "batch" in rule.levels_used():  # the whole input's, beside the groups'
            count, mean = float(chosen.numel()), chosen.mean()
            variance = ((chosen - mean) ** 2).sum() / max(count - 1, 1) if count > 1 else mean * 0.0
            batch = tuple(torch.full_like(means, float(value)) for value in (count, mean, variance))
        centers, scales = rule_center_scale(rule, counts, means, variances, torch, batch=batch)
    if written == "every":
        every = torch.ones_like(trainable)
        return whitened(as_double, per_token(centers, every), per_token(scales, every)).to(advantages.dtype)
    result = torch.zeros_like(as_double)
    at_trainable = as_double[trainable]
    result[trainable] = whitened(at_trainable, per_token(centers, trainable), per_token(scales, trainable))
    return result.to(advantages.dtype)


def _on_host(advantages, trainable, counted) -> bool:
    import torch

    return (
        advantages.device.type == "cpu"
        and advantages.dtype in (torch.float32, torch.float64)
        and trainable.dtype == torch.bool
        and counted.dtype == torch.bool
    )


def _whitened_on_host(advantages, trainable, counted, empty_message, rule, written):
    """:func:`_whitened_tensor` of one group on the host, compiled: the count, mean and Bessel
    variance of the counted tokens in two serial float64 passes, the rule's centre and scale,
    then one pass writing :func:`whitened` (no float64 copy, no gathered array)."""
    import torch

    values = advantages.detach().reshape(-1).numpy()
    count, mean, squares = _host_moments(values, counted.numpy())
    if count == 0:
        raise GAEInputError(empty_message(0))
    variance = squares / (count - 1) if count > 1 else 0.0
    if rule is None or rule.is_default:
        center, scale = mean, float(whitening_scale(np.float64(variance), np.sqrt))
    else:
        stats = [np.array([number], dtype=np.float64) for number in (count, mean, variance)]
        centers, scales = rule_center_scale(rule, *stats, np)
        center, scale = float(centers[0]), float(scales[0])
    out = np.empty_like(values)
    _host_whitened(values, trainable.numpy(), center, scale, written == "every", out)
    return torch.from_numpy(out).reshape(advantages.shape)


@numba.njit(cache=True, nogil=True)
def _host_moments(values, counted):
    count, total = 0, 0.0
    for i in range(values.shape[0]):
        if counted[i]:
            total += np.float64(values[i])
            count += 1
    mean = total / count if count else 0.0
    squares = 0.0
    for i in range(values.shape[0]):
        if counted[i]:
            deviation = np.float64(values[i]) - mean
            squares += deviation * deviation
    return count, mean, squares


@numba.njit(cache=True, nogil=True)
def _host_whitened(values, trainable, center, scale, every, out):
    inverse = 1.0 / scale
    for i in range(values.shape[0]):
        out[i] = whitened_token(np.float64(values[i]), center, inverse) if every or trainable[i] else 0.0


def whiten_rows(
    advantages: np.ndarray,
    offsets: np.ndarray,
    moments: "Moments",
    keys: Optional["pa.Array"],
    *,
    trainable: Optional[np.ndarray] = None,
    dtype=np.float64,
    rule=None,
    batch: Optional["Moments"] = None,
) -> np.ndarray:
    """:func:`whitened` at every position of flat ``advantages`` ``[N]``, with each row's
    group mean and :func:`whitening_scale` from ``moments`` (rows grouped by ``keys``, one per
    row, or one group when None), computed in float64 and rounded once to ``dtype``. With
    ``trainable`` (bool ``[N]``), 0 at its masked positions (where the contract says so).
    One pass over the tokens, no temporary array. ``rule``: a
    :class:`gaecli.advantages.normalization.WhiteningRule` (None: today's); ``batch``: the
    moments over the whole input, where the rule reads the batch beside ``keys``' groups."""
    rows = offsets.size - 1
    means, variances = moments.row_stats(keys, rows)
    if rule is None or rule.is_default:
        scales = whitening_scale(variances, np.sqrt)
    else:
        counts = moments.count("counts")[moments.known_codes(keys, rows, "group")].astype(np.float64)
        levels = None
        if batch is not None:
            batch_means, batch_variances = batch.row_stats(None, rows)
            levels = (batch.count("counts")[batch.known_codes(None, rows, "group")] * 1.0, batch_means, batch_variances)
        means, scales = rule_center_scale(rule, counts, means, variances, np, batch=levels)
    result = np.empty(advantages.size, dtype=dtype)
    zero_masked = trainable is not None
    mask = trainable if zero_masked else np.zeros(0, dtype=np.bool_)
    _whiten_rows(advantages, np.asarray(offsets, dtype=np.int64), means, scales, mask, zero_masked, result)
    return result


@numba.njit(cache=True, nogil=True)
def _whiten_rows(advantages, offsets, means, scales, trainable, zero_masked, result):
    for row in range(offsets.shape[0] - 1):
        mean = means[row]
        inverse = 1.0 / scales[row]
        for t in range(offsets[row], offsets[row + 1]):
            if zero_masked and not trainable[t]:
                result[t] = 0.0
            else:
                result[t] = whitened_token(np.float64(advantages[t]), mean, inverse)
