"""The torch API's arguments: checks (naming the sample at fault) and packing of the list
form into the packed form (flat ``[N]`` tensors plus ``offsets`` ``[B + 1]``) and back."""

from __future__ import annotations

import torch

from gaecli.errors import GAEInputError


def _sample_of(offsets: torch.Tensor, position: int) -> int:
    return int(torch.searchsorted(offsets, torch.tensor(position, device=offsets.device), right=True)) - 1


def _first_offending(bad: torch.Tensor) -> int | None:
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def as_mask(loss_mask: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
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


def prepare_packed(values, rewards, loss_mask, offsets, terminal_rewards, validate=True):
    """Check and normalise packed arguments: float values, rewards and terminal rewards in
    the values' dtype and device, bool mask, int64 offsets."""
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
    mask = as_mask(loss_mask.to(device), offsets)
    if validate:
        _check_finite("values", values, offsets)
        _check_finite("rewards", rewards, offsets)
        sample = _first_offending(~torch.isfinite(terminal))
        if sample is not None:
            raise GAEInputError(f"sample {sample}: terminal reward is {terminal[sample].item()} (must be finite)")
    return values, rewards, mask, offsets, terminal


def pack_lists(values, rewards, loss_mask, terminal_rewards):
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


def split(flat: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(torch.split(flat, lengths)) if lengths else []
