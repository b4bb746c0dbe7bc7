"""The torch API's arguments: checks (naming the sample at fault) and packing of the list
form into the packed form (flat ``[N]`` tensors plus ``offsets`` ``[B + 1]``) and back."""

from __future__ import annotations

import functools
import operator
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from gaecli.errors import GAEInputError


def _sample_of(offsets: torch.Tensor, position: int) -> int:
    return int(torch.searchsorted(offsets, torch.tensor(position, device=offsets.device), right=True)) - 1


def _first_offending(bad: torch.Tensor) -> int | None:
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def _first_fault(tensor: torch.Tensor, find, bad) -> int | None:
    """The first flat position of ``tensor`` that breaks a rule: on the CPU found by the
    commands' numpy finder ``find`` (:mod:`gaecli.advantages.faults`) on the tensor's own
    memory, on a device (or in bfloat16, which numpy lacks) from the torch test ``bad``."""
    if tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 or tensor.is_complex():
        return _first_offending(bad(tensor))
    faults = find(tensor.detach().resolve_neg().numpy(), np.array([0, tensor.numel()]))
    return None if faults is None else int(faults[1][0])


def as_mask(loss_mask: torch.Tensor, offsets: torch.Tensor, name: str = "loss_mask") -> torch.Tensor:
    """A bool mask from a bool, integer or float 0/1 tensor; other values name their sample
    (``name``: the argument, in the message)."""
    from gaecli.advantages.faults import bad_mask_values

    if loss_mask.dtype == torch.bool:
        return loss_mask
    if loss_mask.is_complex():
        raise GAEInputError(f"{name} must be bool, integer or float 0/1, got a complex tensor")
    position = _first_fault(loss_mask, bad_mask_values, lambda mask: (mask != 0) & (mask != 1))
    if position is not None:
        sample = _sample_of(offsets, position)
        within = position - int(offsets[sample])
        raise GAEInputError(
            f"sample {sample}: {name} value {loss_mask[position].item()!r} at token {within} is not 0 or 1"
        )
    return loss_mask != 0


def checked_response_mask(response_mask, trainable: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor | None:
    """The response mask given to the API (``response_mask=``: flat ``[N]``, a tensor or an
    array of bool, integer or float 0/1; None: every token, returned as None) as a bool tensor
    on the device of ``trainable`` (the loss mask's trainable tokens, bool ``[N]``), checked as
    the commands check ``--response-mask-col``: the loss mask's length, values 0 or 1, and
    every trainable token inside it (SkyRL's loss mask lies inside its response mask); a
    fault raises :class:`GAEInputError` naming the sample and token (``offsets`` ``[B + 1]``)."""
    if response_mask is None:
        return None
    response_mask = as_sample_tensor(response_mask)
    check_has_data("response_mask", response_mask)
    if response_mask.dim() != 1 or response_mask.numel() != trainable.numel():
        raise GAEInputError(
            f"response_mask must be flat with the loss mask's {trainable.numel()} tokens, "
            f"got shape {tuple(response_mask.shape)}"
        )
    response = as_mask(response_mask.to(trainable.device), offsets, "response_mask")
    outside = _first_offending(trainable & ~response)
    if outside is not None:
        sample = _sample_of(offsets, outside)
        raise GAEInputError(
            f"sample {sample}: trainable token {outside - int(offsets[sample])} has response_mask 0 "
            "(the loss mask must lie inside the response mask)"
        )
    return response


def packed_response_mask(response_mask, lengths: list[int]):
    """The list form's response mask (one 1-D tensor or array per sample, each as long as its
    sample: ``lengths``; None stays None) as one flat tensor for :func:`checked_response_mask`;
    a sample of another length raises :class:`GAEInputError` naming it."""
    if response_mask is None:
        return None
    if len(response_mask) != len(lengths):
        raise GAEInputError(f"response_mask has {len(response_mask)} samples, loss_mask has {len(lengths)}")
    tensors = _as_tensors("response_mask", response_mask)
    for index, (tensor, length) in enumerate(zip(tensors, lengths)):
        if tensor.dim() != 1 or tensor.numel() != length:
            raise GAEInputError(f"sample {index}: response_mask has {tensor.numel()} tokens, loss_mask has {length}")
    if not tensors:
        return torch.zeros(0, dtype=torch.bool)
    return _concatenate(tensors, _promoted(tensors), tensors[0].device)


def _first_non_finite(tensor: torch.Tensor) -> int | None:
    """The first flat position of a NaN or ±Inf in ``tensor`` (:func:`_first_fault`)."""
    from gaecli.advantages.faults import non_finite

    return _first_fault(tensor, non_finite, lambda numbers: ~torch.isfinite(numbers))


def check_finite(name: str, tensor: torch.Tensor, offsets: torch.Tensor | None) -> None:
    """The first non-finite entry of ``tensor`` named by its sample and token (``offsets``
    None: one flat tensor, named by its position alone)."""
    position = _first_non_finite(tensor)
    if position is not None and offsets is None:
        raise GAEInputError(f"{name} is {tensor[position].item()} at position {position} (must be finite)")
    if position is not None:
        sample = _sample_of(offsets, position)
        within = position - int(offsets[sample])
        raise GAEInputError(f"sample {sample}: {name} is {tensor[position].item()} at token {within} (must be finite)")


HALF_DTYPES = (torch.float16, torch.bfloat16)


def half_precision(tensor) -> torch.dtype | None:
    """The dtype of a float16 or bfloat16 tensor, else None. The API computes such input in
    float32 and returns its results in the input's dtype (:func:`widened`, :func:`narrowed`)."""
    return tensor.dtype if isinstance(tensor, torch.Tensor) and tensor.dtype in HALF_DTYPES else None


def widened(tensor):
    """``tensor`` in float32 when it is float16 or bfloat16; anything else as given."""
    return tensor.float() if half_precision(tensor) is not None else tensor


def narrowed(outputs: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype | None) -> tuple:
    """Advantages and returns in ``dtype`` (None: as they are); one tensor stays one."""
    if dtype is None:
        return outputs
    advantages, returns = outputs
    narrow = advantages.to(dtype)
    return narrow, narrow if returns is advantages else returns.to(dtype)


def check_has_data(name: str, tensor: torch.Tensor) -> None:
    """A ``meta`` tensor (a shape without numbers) raises :class:`GAEInputError` naming the argument."""
    if tensor.device.type == "meta":
        raise GAEInputError(f"{name} is a meta tensor (a shape without data); pass a tensor that holds numbers")


def check_real(name: str, tensor: torch.Tensor) -> None:
    """A tensor of real numbers that hold data: a ``meta`` tensor or a complex one raises
    :class:`GAEInputError` naming the argument (never a cast that drops the imaginary part)."""
    check_has_data(name, tensor)
    if tensor.is_complex():
        raise GAEInputError(f"{name} must hold real numbers, got a {tensor.dtype} tensor")


def _checked_offsets(offsets: torch.Tensor, total: int, device) -> torch.Tensor:
    """``offsets`` as int64 on ``device``: integers from 0 to ``total`` that never decrease,
    else :class:`GAEInputError`."""
    if offsets.is_floating_point() or offsets.dtype == torch.bool or offsets.numel() == 0:
        raise GAEInputError("offsets must be a non-empty integer tensor of B + 1 entries")
    offsets = offsets.to(device=device, dtype=torch.int64)
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        raise GAEInputError(
            f"offsets must start at 0 and end at len(values) = {total}, got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        sample = int((offsets[1:] < offsets[:-1]).nonzero()[0, 0])
        raise GAEInputError(f"sample {sample}: offsets decrease")
    return offsets


def check_packed(values, rewards, loss_mask, offsets, terminal_rewards):
    """The structural checks of packed arguments (types, shapes, real numbers with data,
    offsets, lengths), none that reads every token. Returns float values, rewards and
    terminal rewards in the values' dtype and device, the mask as given (on that device)
    and int64 offsets."""
    for name, tensor in (("values", values), ("rewards", rewards), ("loss_mask", loss_mask), ("offsets", offsets)):
        if not isinstance(tensor, torch.Tensor):
            raise GAEInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 1:
            raise GAEInputError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
        check_has_data(name, tensor)
    check_real("values", values)
    check_real("rewards", rewards)
    if isinstance(terminal_rewards, torch.Tensor):
        check_real("terminal_rewards", terminal_rewards)
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    device, dtype = values.device, values.dtype
    offsets = _checked_offsets(offsets, values.numel(), device)
    total = values.numel()
    for name, tensor in (("rewards", rewards), ("loss_mask", loss_mask)):
        if tensor.numel() != total:
            raise GAEInputError(f"{name} has {tensor.numel()} tokens, values has {total}")
    batch = offsets.numel() - 1
    terminal = torch.as_tensor(terminal_rewards, device=device)
    check_real("terminal_rewards", terminal)
    if terminal.dim() != 1 or terminal.numel() != batch:
        raise GAEInputError(
            f"terminal_rewards must hold one number per sample ({batch}), got shape {tuple(terminal.shape)}"
        )
    if loss_mask.is_complex():
        raise GAEInputError("loss_mask must be bool, integer or float 0/1, got a complex tensor")
    return values, rewards.to(device=device, dtype=dtype), loss_mask.to(device), offsets, terminal.to(dtype)


def check_contents(values, rewards, loss_mask, offsets, terminal, validate=True) -> torch.Tensor:
    """The checks that read every token, in this order: mask values 0/1 (always), then with
    ``validate`` finite values, rewards and terminal rewards; the first failure names its
    sample and token. Returns the bool mask. Arguments as :func:`check_packed` returns them."""
    mask = as_mask(loss_mask, offsets)
    if validate:
        check_finite("values", values, offsets)
        check_finite("rewards", rewards, offsets)
        check_terminal(terminal)
    return mask


def check_terminal(terminal: torch.Tensor) -> None:
    """Terminal rewards ``[B]`` must be finite; the first that is not names its sample."""
    sample = _first_non_finite(terminal)
    if sample is not None:
        raise GAEInputError(f"sample {sample}: terminal reward is {terminal[sample].item()} (must be finite)")


def prepare_packed(values, rewards, loss_mask, offsets, terminal_rewards, validate=True):
    """Check and normalise packed arguments: float values, rewards and terminal rewards in
    the values' dtype and device, bool mask, int64 offsets (:func:`check_packed`, then
    :func:`check_contents`)."""
    values, rewards, loss_mask, offsets, terminal = check_packed(values, rewards, loss_mask, offsets, terminal_rewards)
    mask = check_contents(values, rewards, loss_mask, offsets, terminal, validate)
    return values, rewards, mask, offsets, terminal


def as_sample_tensor(array) -> torch.Tensor:
    """A tensor as given; a numpy array or another array-like as a tensor (sharing memory
    where torch can)."""
    if isinstance(array, torch.Tensor):
        return array
    with warnings.catch_warnings():  # a read-only array (from Arrow, pandas) is only read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        try:
            return torch.as_tensor(array)
        except ValueError:
            if not isinstance(array, np.ndarray) or all(stride >= 0 for stride in array.strides):
                raise
            return torch.from_numpy(np.ascontiguousarray(array))  # a view with a negative stride (x[::-1])


def _concatenate(tensors: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One flat tensor of ``dtype`` on ``device``, each tensor copied once into its place. On
    the CPU numpy copies (one thread: torch's thread pool would compete with the kernel's;
    numpy has no bfloat16: torch copies those); a
    tensor with its negative bit set (``Tensor.is_neg``) goes through ``resolve_neg`` first."""
    if device.type == "cpu" and dtype != torch.bfloat16 and all(t.dtype == dtype and t.is_cpu for t in tensors):
        try:
            return torch.from_numpy(np.concatenate([t.detach().resolve_neg().numpy() for t in tensors]))
        except RuntimeError:  # a tensor numpy cannot take (torch's ZeroTensor, which has no memory)
            pass
    return torch.cat([t.to(device=device, dtype=dtype) for t in tensors])


def _as_tensors(name: str, seq) -> list[torch.Tensor]:
    tensors = []
    for index, array in enumerate(seq):
        try:
            tensors.append(as_sample_tensor(array))
        except (TypeError, ValueError, RuntimeError):
            raise GAEInputError(f"sample {index}: {name} must be a 1-D tensor or array") from None
    return tensors


def _promoted(tensors: list[torch.Tensor]) -> torch.dtype:
    """The dtype ``torch.cat`` gives the tensors (type promotion over distinct dtypes)."""
    return functools.reduce(torch.promote_types, {tensor.dtype for tensor in tensors})


def _check_samples(name: str, tensors: list[torch.Tensor]) -> None:
    """Before any cast or copy: no sample a ``meta`` tensor, no values or rewards complex
    (:func:`check_real`, naming the sample)."""
    real = name != "loss_mask"
    for index, tensor in enumerate(tensors):
        if tensor.device.type == "meta" or real and tensor.is_complex():
            check_real(f"sample {index}: {name}", tensor)


def pack_lists(values, rewards, loss_mask, terminal_rewards):
    """Concatenate per-sample lists into the packed form, checking lengths per sample. Each
    entry may be a tensor, a numpy array or another array-like."""
    samples = len(values)
    for name, seq in (("rewards", rewards), ("loss_mask", loss_mask)):
        if len(seq) != samples:
            raise GAEInputError(f"{name} has {len(seq)} samples, values has {samples}")
    if len(terminal_rewards) != samples:
        raise GAEInputError(f"terminal_rewards has {len(terminal_rewards)} entries, values has {samples} samples")
    columns = {
        name: [as_sample_tensor(array) for array in seq]
        if all(isinstance(a, torch.Tensor) for a in seq)
        else _as_tensors(name, seq)
        for name, seq in (("values", values), ("rewards", rewards), ("loss_mask", loss_mask))
    }
    sizes = {}
    for name, tensors in columns.items():
        dims = [tensor.dim() for tensor in tensors]
        if any(dim != 1 for dim in dims):
            index = next(index for index, dim in enumerate(dims) if dim != 1)
            raise GAEInputError(f"sample {index}: {name} must be a 1-D tensor or array")
        sizes[name] = [tensor.numel() for tensor in tensors]
        _check_samples(name, tensors)
    lengths = sizes["values"]
    if not lengths == sizes["rewards"] == sizes["loss_mask"]:
        index = next(i for i, n in enumerate(lengths) if not n == sizes["rewards"][i] == sizes["loss_mask"][i])
        raise GAEInputError(
            f"sample {index}: lengths differ (values {lengths[index]}, rewards {sizes['rewards'][index]}, "
            f"loss_mask {sizes['loss_mask'][index]})"
        )
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    if samples:
        device = columns["values"][0].device
        offsets[1:] = torch.tensor(lengths).cumsum(0)
        offsets = offsets.to(device)
        flat_values = _concatenate(columns["values"], _promoted(columns["values"]), device)
        flat_rewards = _concatenate(columns["rewards"], flat_values.dtype, device)
        flat_mask = _concatenate(columns["loss_mask"], _promoted(columns["loss_mask"]), device)
    else:
        flat_values = torch.zeros(0, dtype=torch.get_default_dtype())
        flat_rewards = torch.zeros(0, dtype=torch.get_default_dtype())
        flat_mask = torch.zeros(0, dtype=torch.bool)
    return flat_values, flat_rewards, flat_mask, offsets, _terminal_tensor(terminal_rewards), lengths


def _terminal_tensor(terminal_rewards) -> torch.Tensor:
    """The list form's terminal rewards as a tensor (a sequence of numbers: float64)."""
    if isinstance(terminal_rewards, torch.Tensor):
        return terminal_rewards
    try:
        return torch.tensor([float(z) for z in terminal_rewards], dtype=torch.float64)
    except (TypeError, ValueError):  # a complex number, a string...
        raise GAEInputError("terminal_rewards must hold one real number per sample") from None


@dataclass(frozen=True)
class SampleBuffers:
    """The list form's samples where they lie, for a kernel that reads each in place (no
    concatenation): ``addresses`` int64 ``[5, B]``, where each sample's values, rewards and
    mask start (rows 0 to 2, each buffer contiguous), rows 3 and 4 left for where its
    advantages and returns go (:func:`gaecli.advantages.dispatch.compute_screened_samples`
    fills them); ``offsets`` int64 ``[B + 1]``, the lengths as offsets (the packed output's
    layout); ``lengths`` the same as a list; ``terminal`` numpy ``[B]`` in the values' dtype
    and checked finite; the values' (rewards') and mask's dtypes; ``keep`` the tensors read,
    alive as long as this object."""

    addresses: np.ndarray
    offsets: np.ndarray
    lengths: list[int]
    terminal: np.ndarray
    dtype: torch.dtype
    mask_dtype: torch.dtype
    keep: tuple


def _in_place_samples(seq, allowed) -> list[torch.Tensor] | None:
    """One argument's samples as CPU tensors of one dtype among ``allowed``, each 1-D and
    contiguous with its negative bit resolved (a copy of those that are not), or None when
    they do not fit :class:`SampleBuffers`."""
    tensors = seq if set(map(type, seq)) == _TENSORS_ONLY else _as_tensors("", seq)
    kinds = set(map(_DTYPE, tensors))
    if len(kinds) != 1 or str(next(iter(kinds))) not in allowed or not all(map(_IS_CPU, tensors)):
        return None
    # A bool mask reads the same negated or not (nonzero stays nonzero); bool has no resolve_neg.
    if kinds != _BOOL and any(map(torch.Tensor.is_neg, tensors)):
        tensors = [tensor.resolve_neg() for tensor in tensors]
    strides = set(map(torch.Tensor.stride, tensors))
    if strides != _UNIT_STRIDE:
        if any(len(stride) != 1 for stride in strides):
            return None
        tensors = [tensor.contiguous() for tensor in tensors]
    return tensors


def sample_buffers(values, rewards, loss_mask, terminal_rewards, dtypes, mask_dtypes) -> SampleBuffers | None:
    """The list form's samples as :class:`SampleBuffers`, or None when they do not fit that
    form: B = 0, a sample not a CPU tensor (or a numpy array: taken as a tensor) of 1-D,
    values not all of one dtype among ``dtypes`` (names, e.g. ``"torch.float32"``), rewards
    not of that dtype, masks not all of one dtype among ``mask_dtypes``, lengths or counts
    that differ, a terminal reward that is not finite, a non-empty tensor without memory
    (address 0: torch's ZeroTensor). None sends the caller to the general path
    (:func:`pack_lists`), which names any fault. Reads no token: costs a few attribute reads
    per sample. A tensor that is not contiguous is copied (it alone); so is one with its
    negative bit set (``Tensor.is_neg``: its memory holds the numbers negated)."""
    columns = []
    try:
        samples = len(values)
        if not samples or not len(rewards) == len(loss_mask) == len(terminal_rewards) == samples:
            return None
        addresses = np.empty((5, samples), dtype=np.int64)
        for row, (seq, allowed) in enumerate(((values, dtypes), (rewards, dtypes), (loss_mask, mask_dtypes))):
            tensors = _in_place_samples(seq, allowed)
            if tensors is None:
                return None
            addresses[row] = np.fromiter(map(torch.Tensor.data_ptr, tensors), np.int64, count=samples)
            columns.append(tensors)
    except (GAEInputError, RuntimeError, TypeError):  # e.g. a sparse tensor (no strides), a 0-d tensor (no len)
        return None
    dtype, mask_dtype = columns[0][0].dtype, columns[2][0].dtype
    if columns[1][0].dtype != dtype:
        return None
    lengths = list(map(torch.Tensor.numel, columns[0]))
    if not lengths == list(map(torch.Tensor.numel, columns[1])) == list(map(torch.Tensor.numel, columns[2])):
        return None
    terminal = _terminal_tensor(terminal_rewards)
    if terminal.dim() != 1 or terminal.numel() != samples or terminal.is_complex():
        return None
    terminal = terminal.detach()
    if terminal.dtype != dtype or not terminal.is_cpu:
        terminal = terminal.to(device="cpu", dtype=dtype)
    terminal = terminal.resolve_neg().numpy()
    if not np.isfinite(terminal).all():
        return None
    offsets = np.zeros(samples + 1, dtype=np.int64)
    np.cumsum(np.fromiter(lengths, np.int64, count=samples), out=offsets[1:])
    if not addresses[:3, offsets[1:] != offsets[:-1]].all():  # a tensor without memory (torch's ZeroTensor)
        return None
    return SampleBuffers(addresses, offsets, lengths, terminal, dtype, mask_dtype, tuple(columns))


_TENSORS_ONLY = {torch.Tensor}
_UNIT_STRIDE = {(1,)}
_BOOL = {torch.bool}
_DTYPE = operator.attrgetter("dtype")
_IS_CPU = operator.attrgetter("is_cpu")


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype that numpy has (float32, int64, bool...)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def flat_outputs(total: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two empty flat ``[total]`` CPU tensors of ``dtype`` for a kernel's advantages and
    returns, allocated by numpy as the packed form's kernel allocates its own (large buffers
    then get huge pages where the system gives them on request: fewer page faults)."""
    advantages = np.empty(total, dtype=numpy_dtype(dtype))
    return torch.from_numpy(advantages), torch.from_numpy(np.empty_like(advantages))


def checked_outputs(out, like: torch.Tensor, total: int):
    """``out`` (None, or the caller's ``(advantages, returns)`` buffers) checked: two distinct
    ``[N]`` tensors on ``like``'s device; else :class:`GAEInputError` naming the fault."""
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(o, torch.Tensor) for o in out):
        raise GAEInputError("out must be two tensors, (advantages, returns)")
    for name, tensor in zip(("out[0]", "out[1]"), out):
        if tuple(tensor.shape) != (total,):
            raise GAEInputError(f"{name} has shape {tuple(tensor.shape)}, expected ({total},)")
        if tensor.device != like.device:
            raise GAEInputError(f"{name} is on {tensor.device}, the inputs on {like.device}")
    if total and out[0].data_ptr() == out[1].data_ptr():
        raise GAEInputError("out[0] and out[1] are one buffer: give two")
    return tuple(out)


def written_into(out, advantages: torch.Tensor, returns: torch.Tensor):
    """``(advantages, returns)``, or with ``out`` given those buffers holding them (copied in
    unless the kernel wrote there); :class:`GAEInputError` when a buffer's dtype is not the
    output's."""
    if out is None:
        return advantages, returns
    for name, buffer, result in (("out[0]", out[0], advantages), ("out[1]", out[1], returns)):
        if buffer.dtype != result.dtype:
            raise GAEInputError(f"{name} is {buffer.dtype}, the outputs {result.dtype}")
        if buffer.data_ptr() != result.data_ptr() or buffer.stride() != result.stride():
            buffer.copy_(result)
    return out


def split(flat: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Pieces of ``flat`` ``[sum(lengths)]``, one per length, in order, sharing its memory.
    Not tracked by autograd as views of ``flat`` (``unsafe_split_with_sizes``, a quarter
    cheaper per piece): nothing else holds ``flat``, the pieces do not overlap and need no
    gradient, so an in-place change to one piece has nothing else to invalidate."""
    return list(flat.unsafe_split_with_sizes(lengths)) if lengths else []
