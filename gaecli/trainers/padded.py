"""What the drop-ins share: a trainer's padded ``[B, T]`` batch as gaecli's packed rows (views,
no copy), the outcome reward moved to the last trainable token, and the choice of semantics."""

from __future__ import annotations

from typing import Optional

import numpy as np

from gaecli.advantages.contract import MASKED, SEMANTICS
from gaecli.errors import GAEInputError, InvalidOptionError


def check_semantics(semantics: str, allowed: Optional[tuple[str, ...]] = None) -> str:
    """``semantics`` if it is ``masked`` or a profile gaecli knows (``allowed``: the names this
    function takes, by default every GAE semantics); else :class:`InvalidOptionError`."""
    names = allowed if allowed is not None else SEMANTICS
    if semantics not in names:
        raise InvalidOptionError(f"semantics={semantics!r}: choose one of {', '.join(names)}")
    return semantics


def check_batch(what: str, *tensors) -> None:
    """Every tensor ``[B, T]`` of one shape, on one device; else :class:`GAEInputError`."""
    shape, device = tensors[0].shape, tensors[0].device
    if len(shape) != 2:
        raise GAEInputError(f"{what}: expected [batch, response_length] tensors, got shape {tuple(shape)}")
    for tensor in tensors[1:]:
        if tensor.shape != shape:
            raise GAEInputError(f"{what}: shapes {tuple(shape)} and {tuple(tensor.shape)} differ")
        if tensor.device != device:
            raise GAEInputError(f"{what}: tensors on {device} and {tensor.device}")


def row_offsets(batch: int, length: int, device):
    """The offsets ``[B + 1]`` of ``B`` rows of ``length`` tokens each (int64, on ``device``)."""
    import torch

    return torch.arange(batch + 1, device=device, dtype=torch.int64) * length


def outcome_split(rewards, trainable):
    """The rewards of a padded batch as the contract reads them: ``(kept, terminal)``, where
    ``kept`` holds the rewards at trainable tokens (0 elsewhere: a reward at a masked token
    between trainable ones is dropped) and ``terminal`` ``[B]`` the rewards after each row's
    last trainable token summed — the outcome reward, which the trainer's layout puts on the
    response's last token, masked or not (padding holds none). A row with no trainable token
    keeps its outcome in ``terminal`` (the contract then drops it). Tensors, or numpy arrays
    (float32 or float64 rewards, bool ``trainable``), which give numpy."""
    import torch

    if isinstance(rewards, np.ndarray):
        return np.where(trainable, rewards, rewards.dtype.type(0)), _tail_sums(rewards, trainable)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    on_host = rewards.device.type == "cpu" and rewards.dtype in (torch.float32, torch.float64)
    if on_host and trainable.dtype == torch.bool:
        terminal = _tail_sums(rewards.detach().numpy(), trainable.numpy())
        return torch.where(trainable, rewards, zero), torch.from_numpy(terminal)
    length = rewards.shape[1]
    positions = torch.arange(length, device=rewards.device)
    last = torch.where(trainable, positions, -1).amax(dim=1)
    tail = positions.unsqueeze(0) > last.unsqueeze(1)
    kept = torch.where(trainable, rewards, zero)
    terminal = torch.where(tail, rewards, zero).sum(dim=1)
    return kept, terminal


def _tail_sums(rewards: np.ndarray, trainable: np.ndarray) -> np.ndarray:
    """``[B]``: the rewards after each row's last trainable token summed (numpy ``[B, T]``;
    one compiled pass over the tails, :func:`gaecli.advantages.layout.row_tails`)."""
    from gaecli.advantages.layout import row_tails

    offsets = np.arange(rewards.shape[0] + 1, dtype=np.int64) * rewards.shape[1]
    return row_tails(trainable.reshape(-1), rewards.reshape(-1), offsets)[2]


def as_trainable(mask):
    """A 0/1 mask (bool, integer or float) as bool."""
    import torch

    return mask if mask.dtype == torch.bool else mask != 0


def flat_out(out, shape):
    """A drop-in's ``out`` (None, or its ``(advantages, returns)`` buffers ``[B, T]``,
    contiguous) as flat ``[N]`` views; else :class:`GAEInputError`."""
    if out is None:
        return None
    if len(out) != 2 or any(tuple(o.shape) != tuple(shape) or not o.is_contiguous() for o in out):
        raise GAEInputError(f"out: two contiguous {list(shape)} tensors, (advantages, returns)")
    return out[0].view(-1), out[1].view(-1)


def _host_may_write(out, values) -> bool:
    """Whether the compiled host path may write into ``out`` (None: fresh outputs): two
    distinct contiguous buffers of the values' shape, dtype and device."""
    if out is None:
        return True
    return (
        len(out) == 2
        and out[0] is not out[1]
        and all(o.shape == values.shape and o.dtype == values.dtype and o.device == values.device for o in out)
        and all(o.is_contiguous() for o in out)
    )


def packed_gae(
    values, rewards, mask, gamma: float, lambd: float, semantics: str, out=None, moments=None, truncation=None
):
    """GAE of a padded batch ``[B, T]`` under ``semantics``, as ``[B, T]`` advantages and
    returns in the values' dtype and device. ``masked``: the contract on the trainable tokens,
    the outcome reward moved to the last of them (:func:`outcome_split`), 0 at every masked and
    padding position; a profile: that trainer's computation at every position
    (:func:`gaecli.baseline_gae_packed`, the rewards as given, padding as masked tokens).
    ``truncation``: ``(truncated, bootstrap_values)`` ``[B]`` each, the truncation bootstrap
    the semantics takes (docs/variants.md; ``masked``, ``areal``), or None.
    ``out``: ``[B, T]`` buffers to write into (:func:`flat_out`), returned. A float batch on
    the host takes the compiled path of :mod:`gaecli.trainers.host` (the same numbers), which
    fills ``moments`` (float64 ``[3, B]``) with the rows' whitening moments."""
    import torch

    from gaecli.advantages.api import baseline_gae_packed

    if semantics == MASKED and truncation is None and _host_may_write(out, values):
        from gaecli.trainers.host import masked_gae_padded

        computed = masked_gae_padded(values, rewards, mask, float(gamma), float(lambd), out=out, moments=moments)
        if computed is not None:
            return computed
    batch, length = values.shape
    trainable = as_trainable(mask)
    offsets = row_offsets(batch, length, values.device)
    if semantics == MASKED:
        kept, terminal = outcome_split(rewards.to(values.dtype), trainable)
    else:
        kept, terminal = rewards.to(values.dtype), torch.zeros(batch, dtype=values.dtype, device=values.device)
    truncated, bootstrap_values = (None, None) if truncation is None else truncation
    advantages, returns = baseline_gae_packed(
        values.reshape(-1), kept.reshape(-1), trainable.reshape(-1), offsets, terminal,
        gamma=float(gamma), lambd=float(lambd), semantics=semantics, out=flat_out(out, values.shape),
        truncated=truncated, bootstrap_values=bootstrap_values,
    )  # fmt: skip
    if out is not None:
        return out[0], out[1]
    return advantages.reshape(batch, length), returns.reshape(batch, length)
