"""Masked GAE and its baselines as public functions: argument checks, terminal-reward
placement, the ``unmasked`` / ``skip-masked`` / ``zero-masked`` semantics, and whitening.

Two forms of every function:
- packed: flat 1-D tensors ``values``, ``rewards``, ``loss_mask`` of N tokens plus
  ``offsets`` (B + 1 entries, as an Arrow list column's offsets) and ``terminal_rewards``
  (B entries); returns flat ``[N]`` tensors;
- list: one 1-D tensor per sample; a thin wrapper that concatenates, calls the packed form
  and splits (the pieces are views of one flat result).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Union

import torch

from gaecli.errors import GAEInputError
from gaecli.flat import WHITEN_EPSILON, apply_semantics, check_discount
from gaecli.kernels import get_kernel
from gaecli.kernels.layout import next_trainable_index, segment_ids

Semantics = Literal["masked", "unmasked", "skip-masked", "zero-masked"]
TerminalRewards = Union[Sequence[float], torch.Tensor]


# ----------------------------------------------------------------------------- checks


def _sample_of(offsets: torch.Tensor, position: int) -> int:
    return int(torch.searchsorted(offsets, torch.tensor(position, device=offsets.device), right=True)) - 1


def _first_offending(bad: torch.Tensor) -> int | None:
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def _as_mask(loss_mask: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A bool mask from a bool, integer or float 0/1 tensor; other values name their sample."""
    if loss_mask.dtype == torch.bool:
        return loss_mask
    if loss_mask.is_complex():
        raise GAEInputError("loss_mask must be bool, integer or float 0/1, got a complex tensor")
    position = _first_offending((loss_mask != 0) & (loss_mask != 1))
    if position is not None:
        sample = _sample_of(offsets, position)
        within = position - int(offsets[sample])
        raise GAEInputError(
            f"sample {sample}: loss_mask value {loss_mask[position].item()!r} at token {within} is not 0 or 1"
        )
    return loss_mask != 0


def _check_finite(name: str, tensor: torch.Tensor, offsets: torch.Tensor) -> None:
    position = _first_offending(~torch.isfinite(tensor))
    if position is not None:
        sample = _sample_of(offsets, position)
        within = position - int(offsets[sample])
        raise GAEInputError(f"sample {sample}: {name} is {tensor[position].item()} at token {within} (must be finite)")


def _prepare_packed(values, rewards, loss_mask, offsets, terminal_rewards, gamma, lambd, validate=True):
    """Check and normalise packed arguments: float values, rewards and terminal rewards in
    the values' dtype and device, bool mask, int64 offsets."""
    check_discount(gamma, lambd)
    for name, tensor in (("values", values), ("rewards", rewards), ("loss_mask", loss_mask), ("offsets", offsets)):
        if not isinstance(tensor, torch.Tensor):
            raise GAEInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 1:
            raise GAEInputError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    device, dtype = values.device, values.dtype
    if offsets.is_floating_point() or offsets.dtype == torch.bool or offsets.numel() == 0:
        raise GAEInputError("offsets must be a non-empty integer tensor of B + 1 entries")
    offsets = offsets.to(device=device, dtype=torch.int64)
    total = values.numel()
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        raise GAEInputError(f"offsets must start at 0 and end at len(values) = {total}, got {int(offsets[0])} .. {int(offsets[-1])}")
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        sample = int((offsets[1:] < offsets[:-1]).nonzero()[0, 0])
        raise GAEInputError(f"sample {sample}: offsets decrease")
    for name, tensor in (("rewards", rewards), ("loss_mask", loss_mask)):
        if tensor.numel() != total:
            raise GAEInputError(f"{name} has {tensor.numel()} tokens, values has {total}")
    batch = offsets.numel() - 1
    terminal = torch.as_tensor(terminal_rewards, device=device)
    if terminal.dim() != 1 or terminal.numel() != batch:
        raise GAEInputError(f"terminal_rewards must hold one number per sample ({batch}), got shape {tuple(terminal.shape)}")
    rewards = rewards.to(device=device, dtype=dtype)
    terminal = terminal.to(dtype)
    mask = _as_mask(loss_mask.to(device), offsets)
    if validate:
        _check_finite("values", values, offsets)
        _check_finite("rewards", rewards, offsets)
        sample = _first_offending(~torch.isfinite(terminal))
        if sample is not None:
            raise GAEInputError(f"sample {sample}: terminal reward is {terminal[sample].item()} (must be finite)")
    return values, rewards, mask, offsets, terminal


def _pack_lists(values, rewards, loss_mask, terminal_rewards):
    """Concatenate per-sample lists into the packed form, checking lengths per sample."""
    samples = len(values)
    for name, seq in (("rewards", rewards), ("loss_mask", loss_mask)):
        if len(seq) != samples:
            raise GAEInputError(f"{name} has {len(seq)} samples, values has {samples}")
    if len(terminal_rewards) != samples:
        raise GAEInputError(f"terminal_rewards has {len(terminal_rewards)} entries, values has {samples} samples")
    lengths = []
    for index, (value, reward, mask) in enumerate(zip(values, rewards, loss_mask)):
        for name, tensor in (("values", value), ("rewards", reward), ("loss_mask", mask)):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1:
                raise GAEInputError(f"sample {index}: {name} must be a 1-D tensor")
        if not value.numel() == reward.numel() == mask.numel():
            raise GAEInputError(
                f"sample {index}: lengths differ (values {value.numel()}, rewards {reward.numel()}, loss_mask {mask.numel()})"
            )
        lengths.append(value.numel())
    device = values[0].device if samples else torch.device("cpu")
    dtype = values[0].dtype if samples else torch.get_default_dtype()
    offsets = torch.zeros(samples + 1, dtype=torch.int64, device=device)
    if samples:
        offsets[1:] = torch.tensor(lengths, device=device).cumsum(0)
        flat_values = torch.cat(values)
        flat_rewards = torch.cat([r.to(flat_values.dtype) for r in rewards])
        flat_mask = torch.cat([m.to(device) for m in loss_mask])
    else:
        flat_values = torch.zeros(0, dtype=dtype)
        flat_rewards = torch.zeros(0, dtype=dtype)
        flat_mask = torch.zeros(0, dtype=torch.bool)
    if isinstance(terminal_rewards, torch.Tensor):
        terminal = terminal_rewards
    else:
        terminal = torch.tensor([float(z) for z in terminal_rewards], dtype=torch.float64)
    return flat_values, flat_rewards, flat_mask, offsets, terminal, lengths


def _split(flat: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(torch.split(flat, lengths)) if lengths else []


# ----------------------------------------------------------------------------- masked GAE


def masked_gae_packed(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE on packed ragged input (the contract of DESIGN.md).

    Shapes: ``values``, ``rewards``, ``loss_mask`` flat ``[N]`` (mask bool, integer or float
    0/1); ``offsets`` ``[B + 1]`` with ``offsets[0] = 0`` and ``offsets[-1] = N``;
    ``terminal_rewards`` ``[B]`` (ints or floats). Returns flat ``[N]`` ``(advantages,
    returns)`` in the values' dtype and device.

    GAE runs on each sample's trainable tokens as one contiguous sequence: masked tokens are
    no transitions, and the carry crosses a masked gap with one γλ whatever its length. The
    terminal reward is added to the last trainable token; the value after it is 0 (zero
    bootstrap, terminated or truncated). Masked positions get exactly 0; returns =
    advantages + values elsewhere. A fully masked sample is all zeros (its terminal reward
    is dropped); an empty sample owns no position.

    ``validate=False`` skips the finiteness scan (for callers that checked already); mask
    values are always checked. Raises :class:`gaecli.GAEInputError` naming the sample.
    """
    values, rewards, mask, offsets, terminal = _prepare_packed(
        values, rewards, loss_mask, offsets, terminal_rewards, gamma, lambd, validate
    )
    return get_kernel(kernel, values.device)(values, rewards, mask, offsets, terminal, gamma=gamma, lambd=lambd)


def masked_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Masked GAE on a list of samples: one 1-D tensor of length R_i per sample for values,
    rewards and loss_mask, one terminal reward per sample. Returns ``(advantages, returns)``
    as lists of ``[R_i]`` tensors in the values' dtype and device; semantics as in
    :func:`masked_gae_packed` (zeros at masked positions, fully masked → zeros, R = 0 →
    empty tensor, empty batch → empty lists)."""
    flat_values, flat_rewards, flat_mask, offsets, terminal, lengths = _pack_lists(values, rewards, loss_mask, terminal_rewards)
    advantages, returns = masked_gae_packed(
        flat_values, flat_rewards, flat_mask, offsets, terminal, gamma=gamma, lambd=lambd, kernel=kernel
    )
    return _split(advantages, lengths), _split(returns, lengths)


# ----------------------------------------------------------------------------- baselines


def _last_trainable_index(mask: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Flat index of each sample's last trainable token, -1 when it has none. ``[B]``."""
    batch = offsets.numel() - 1
    positions = torch.where(mask, torch.arange(mask.numel(), device=mask.device), -1)
    last = torch.full((batch,), -1, dtype=torch.int64, device=mask.device)
    return last.scatter_reduce(0, segment_ids(offsets, mask.numel()), positions, reduce="amax")


def baseline_gae_packed(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    semantics: Semantics = "unmasked",
    kernel: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE under one of the trainers' semantics, packed form (shapes as
    :func:`masked_gae_packed`). Returns what that semantics computes at every position,
    non-zero at masked positions where it makes them so:

    - ``unmasked`` (pre-fix miles, slime): the mask is ignored; every token is a transition
      and the terminal reward sits on token R-1. A fully masked sample is computed like any
      other.
    - ``skip-masked`` (verl / AReaL token mode): a masked step passes the next value and the
      carry through unchanged and its TD error is dropped; at a masked position the output is
      that step's own ``δ_t + γλ · carry`` (``δ_t = r_t + γ·V_next − V_t``, V_next and carry
      from the next trainable token, 0 after the last), and returns = advantages + values
      everywhere. The terminal reward sits on token R-1, so it is lost when that token is
      masked (it then appears only in that masked position's own output).
    - ``zero-masked`` (OpenRLHF): values and rewards are set to 0 at masked positions, every
      token is a transition, the terminal reward sits on the last trainable token (dropped
      for a fully masked sample). Masked positions inside a sample carry ``γ·V_next`` terms.
    - ``masked``: the contract itself (:func:`masked_gae_packed`).
    """
    values, rewards, mask, offsets, terminal = _prepare_packed(
        values, rewards, loss_mask, offsets, terminal_rewards, gamma, lambd, validate
    )
    gae_kernel = get_kernel(kernel, values.device)

    def run(v, r, m, z):
        return gae_kernel(v, r, m, offsets, z, gamma=gamma, lambd=lambd)

    return apply_semantics(torch, run, values, rewards, mask, offsets, terminal, gamma=gamma, lambd=lambd,
                           semantics=semantics, last_trainable=_last_trainable_index, next_trainable=next_trainable_index)


def baseline_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    semantics: Semantics = "unmasked",
    kernel: str = "auto",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """List form of :func:`baseline_gae_packed` (arguments as :func:`masked_gae`)."""
    flat_values, flat_rewards, flat_mask, offsets, terminal, lengths = _pack_lists(values, rewards, loss_mask, terminal_rewards)
    advantages, returns = baseline_gae_packed(
        flat_values, flat_rewards, flat_mask, offsets, terminal, gamma=gamma, lambd=lambd, semantics=semantics, kernel=kernel
    )
    return _split(advantages, lengths), _split(returns, lengths)


def unmasked_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The old behaviour: ``baseline_gae(..., semantics="unmasked")`` — the mask is ignored,
    every token is a transition, the terminal reward sits on token R-1."""
    return baseline_gae(values, rewards, loss_mask, terminal_rewards, gamma=gamma, lambd=lambd, semantics="unmasked", kernel=kernel)


# ----------------------------------------------------------------------------- whitening


def whiten(advantages, loss_mask):
    """Whiten advantages over all trainable tokens: ``(A − mean) / sqrt(var + 1e-8)`` with
    the mask-weighted mean and Bessel-corrected variance (statistics in float64).

    ``advantages`` and ``loss_mask`` are both flat tensors or both lists of 1-D tensors;
    the result has the same form and the advantages' dtype. Masked positions stay 0. One
    trainable token whitens to 0 (its variance is taken as 0); no trainable token at all
    raises :class:`gaecli.GAEInputError`.
    """
    if isinstance(advantages, torch.Tensor):
        flat_advantages, flat_mask, lengths = advantages, loss_mask, None
        if flat_mask.numel() != flat_advantages.numel():
            raise GAEInputError(f"loss_mask has {flat_mask.numel()} tokens, advantages has {flat_advantages.numel()}")
    else:
        terminal = [0.0] * len(advantages)
        flat_advantages, _, flat_mask, _, _, lengths = _pack_lists(advantages, advantages, loss_mask, terminal)
    offsets = torch.tensor([0, flat_mask.numel()], device=flat_advantages.device)
    mask = _as_mask(flat_mask.to(flat_advantages.device), offsets)
    count = int(mask.sum())
    if count == 0:
        raise GAEInputError("whiten: no trainable token (loss_mask is all zeros)")
    as_double = flat_advantages.double()
    mean = as_double[mask].sum() / count
    variance = ((as_double[mask] - mean) ** 2).sum() / (count - 1) if count > 1 else as_double.new_zeros(())
    whitened = torch.where(mask, (as_double - mean) / torch.sqrt(variance + WHITEN_EPSILON), 0.0).to(flat_advantages.dtype)
    return whitened if lengths is None else _split(whitened, lengths)
