"""slime's batched GAE with slime's signature (``slime/utils/ppo_utils.py``,
``get_advantages_and_returns_batch``, THUDM/slime ``624b824``; docs/trainers.md#slime-and-miles):
lists of per-sample response tensors in, lists out, the masked contract by default or slime's
own profile with ``semantics="slime"``; plus :func:`list_gae`, the packing of such lists that
:mod:`gaecli.trainers.miles` shares. Importing this module imports neither slime nor Megatron."""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

from gaecli.advantages.contract import MASKED
from gaecli.errors import GAEInputError
from gaecli.trainers.padded import check_semantics

CP_HINT = (
    "with context parallelism, gather each sample's response first (the trainer's all_gather_with_cp) "
    "and slice the outputs back (slice_log_prob_with_cp)"
)
"""What to do when a sample's tensor is shorter than its response: it is one rank's shard."""


def get_advantages_and_returns_batch(
    total_lengths,
    response_lengths,
    values_list,
    rewards_list,
    gamma,
    lambd,
    chunked: bool = True,
    *,
    loss_masks=None,
    terminal_rewards=None,
    semantics: str = MASKED,
):
    """slime's ``get_advantages_and_returns_batch``: ``(advantages_list, returns_list)``, one
    1-D tensor ``[R_i]`` per sample (``R_i = response_lengths[i]``) on the values' device and in
    their dtype, not whitened (slime whitens later). ``values_list``, ``rewards_list``: one
    ``[R_i]`` tensor per sample, the outcome reward in the rewards on the response's last token
    (slime's ``token_level_rewards[-1] += reward``); ``loss_masks``: one ``[R_i]`` 0/1 mask per
    sample (slime's ``rollout_data["loss_masks"]``; None: every token trainable). Given
    ``terminal_rewards`` (``[B]``), the rewards hold no outcome and it is taken from there.

    ``semantics="masked"`` (the default): the masked contract over each sample's trainable
    tokens, the outcome (the rewards after the last trainable token, summed) on the last
    trainable token, the other rewards at masked tokens dropped; advantages and returns exactly
    0 at masked positions, a fully masked sample all 0. ``semantics="slime"`` (or another
    profile): that computation at every position, as :func:`gaecli.baseline_gae_packed` gives
    it (``slime``: plain GAE over every response token, the mask read nowhere).

    ``total_lengths`` and ``chunked`` are accepted and change nothing: slime's chunked scan and
    its loop give the same numbers, and gaecli picks its own kernel. No collective: the tensors
    are the whole responses (see :data:`CP_HINT`); a shorter one raises
    :class:`gaecli.GAEInputError` naming the sample."""
    check_semantics(semantics)
    return list_gae(
        "get_advantages_and_returns_batch", response_lengths, values_list, rewards_list, loss_masks,
        terminal_rewards, gamma, lambd, semantics,
    )  # fmt: skip


def list_gae(
    what: str,
    response_lengths: Sequence[int],
    values_list,
    rewards_list,
    loss_masks,
    terminal_rewards,
    gamma: float,
    lambd: float,
    semantics: str,
):
    """GAE of per-sample lists under ``semantics`` (arguments as
    :func:`get_advantages_and_returns_batch`): the lists packed with ``torch.cat`` and offsets
    from ``response_lengths``, one call of :func:`gaecli.baseline_gae_packed`, the outputs split
    back with ``torch.split`` (views of one flat tensor). ``terminal_rewards`` None: the outcome
    is in the rewards (``masked``: the rewards after each sample's last trainable token move to
    it; a profile: the rewards as given). An empty batch gives two empty lists."""
    import torch

    from gaecli.advantages.api import baseline_gae_packed

    lengths = [int(length) for length in response_lengths]
    _check_counts(what, len(lengths), values_list=values_list, rewards_list=rewards_list, loss_masks=loss_masks)
    if not lengths:
        return [], []
    with torch.no_grad():
        values, rewards, mask, offsets, terminal = packed_lists(
            what, lengths, values_list, rewards_list, loss_masks, terminal_rewards
        )
        if terminal is None and semantics == MASKED:
            rewards, terminal = outcome_moved(rewards, mask != 0, lengths)
        elif terminal is None:
            terminal = torch.zeros(len(lengths), dtype=values.dtype, device=values.device)
        advantages, returns = baseline_gae_packed(
            values, rewards, mask, offsets, terminal, gamma=float(gamma), lambd=float(lambd), semantics=semantics
        )
    return list(torch.split(advantages, lengths)), list(torch.split(returns, lengths))


def outcome_moved(rewards, trainable, lengths: Sequence[int]):
    """Packed rewards ``[N]`` as the contract reads them: ``(kept, terminal)``, ``kept`` the
    rewards at trainable tokens (0 elsewhere) and ``terminal`` ``[B]`` the rewards after each
    sample's last trainable token summed: the outcome, which slime's layout puts on the
    response's last token, masked or not. A sample with no trainable token keeps its outcome in
    ``terminal`` (the contract then drops it). Torch ops on the rewards' device, no host copy."""
    import torch

    batch, total = len(lengths), rewards.shape[0]
    device = rewards.device
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    sample = torch.repeat_interleave(torch.arange(batch, device=device), counts, output_size=total)
    positions = torch.arange(total, device=device)
    last = torch.full((batch,), -1, dtype=torch.int64, device=device)
    last = last.scatter_reduce(0, sample, torch.where(trainable, positions, -1), reduce="amax")
    zero = torch.zeros((), dtype=rewards.dtype, device=device)
    tail = torch.where(positions > last[sample], rewards, zero)
    terminal = torch.zeros(batch, dtype=rewards.dtype, device=device).index_add(0, sample, tail)
    return torch.where(trainable, rewards, zero), terminal


def _check_counts(what: str, batch: int, **lists) -> None:
    """One entry per sample in every list given (None: not given); else :class:`GAEInputError`."""
    for name, entries in lists.items():
        if entries is not None and len(entries) != batch:
            raise GAEInputError(f"{what}: {name} has {len(entries)} samples, response_lengths {batch}")


def packed_lists(what: str, lengths: list[int], values_list, rewards_list, loss_masks, terminal_rewards):
    """The per-sample lists of a batch of ``lengths`` (counted already, at least one) packed
    once: flat values and rewards in the first values tensor's device and dtype, the mask
    (None: every token trainable, bool), offsets ``[B + 1]``, the terminal rewards ``[B]`` (None
    when not given); :class:`GAEInputError` naming the list and sample at fault."""
    import torch

    device, dtype = values_list[0].device, values_list[0].dtype
    values = _packed(what, "values_list", values_list, lengths).to(device=device, dtype=dtype)
    rewards = _packed(what, "rewards_list", rewards_list, lengths).to(device=device, dtype=dtype)
    if loss_masks is None:
        mask = torch.ones(values.shape[0], dtype=torch.bool, device=device)
    else:
        mask = _packed(what, "loss_masks", loss_masks, lengths).to(device=device)
    offsets = torch.tensor([0, *accumulate(lengths)], dtype=torch.int64, device=device)
    terminal = None if terminal_rewards is None else _terminal(what, terminal_rewards, len(lengths), device, dtype)
    return values, rewards, mask, offsets, terminal


def _packed(what: str, name: str, tensors, lengths: list[int]):
    """The per-sample tensors of ``name`` as one flat tensor, each checked to be ``[R_i]``
    (a shape read, no data); else :class:`GAEInputError` naming the sample."""
    import torch

    shapes = [tuple(tensor.shape) for tensor in tensors]
    if shapes != [(length,) for length in lengths]:
        i = next(i for i, (shape, length) in enumerate(zip(shapes, lengths)) if shape != (length,))
        hint = f"; {CP_HINT}" if len(shapes[i]) == 1 and shapes[i][0] < lengths[i] else ""
        raise GAEInputError(
            f"{what}: sample {i}: {name}[{i}] has shape {shapes[i]}, expected ({lengths[i]},) "
            f"(response_lengths[{i}]){hint}"
        )
    return torch.cat(list(tensors))


def _terminal(what: str, terminal_rewards, batch: int, device, dtype):
    """``terminal_rewards`` (a tensor or a sequence of numbers, one per sample) as ``[B]`` on ``device``."""
    import torch

    terminal = torch.as_tensor(terminal_rewards, dtype=dtype, device=device).reshape(-1)
    if terminal.shape[0] != batch:
        raise GAEInputError(f"{what}: terminal_rewards has {terminal.shape[0]} samples, response_lengths {batch}")
    return terminal
