"""GAE of a padded ``[B, T]`` batch with a λ of its own per row (AReaL's ``gae_lambda`` tensor,
NeMo-RL's length-adaptive λ), which gaecli's packed kernels (one scalar λ) do not take: a
log-step scan along the rows in torch, on the tensors' device, with no copy to the host.

The recurrence and its scan are those of :mod:`gaecli.advantages.kernels.scan`, written over
the rows of the padded batch instead of the flat buffer: at a trainable position the TD error
against the row's next trainable value (0 after the last: zero bootstrap) with the row's decay
``γλ_i``; at a masked position followed by a trainable one ``(decay, δ) = (1, 0)``, which
passes the next trainable token's advantage through unchanged; a masked position with nothing
trainable after it is ``(0, 0)``. ``ceil(log2(T))`` doubling steps solve it."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.errors import GAEInputError
from gaecli.trainers.padded import as_trainable, outcome_split, packed_gae

SKIP_PROFILES: tuple[str, ...] = ("verl", "areal", "nemo-rl")
"""The profiles whose recursion skips masked steps (docs/semantics.md#the-recursions), the ones
:func:`row_lambda_gae` computes beside the contract."""


def carried_advantages(values, rewards, trainable, terminal, gamma: float, decays):
    """``[B, T]``: at each trainable position the masked contract's advantage (the rewards at
    trainable tokens, ``terminal`` ``[B]`` added on each row's last trainable token, zero
    bootstrap, row i's carry decaying by ``decays[i]`` = γλ_i per step); at a masked position
    the advantage of the row's next trainable token (0 after the last one): what a recursion
    that skips masked steps carries there. ``values``, ``rewards`` of one floating dtype,
    ``trainable`` bool ``[B, T]``, ``decays`` ``[B]`` of the values' dtype."""
    import torch

    batch, length = values.shape
    positions = torch.arange(length, device=values.device)
    candidates = torch.where(trainable, positions, length)
    suffix_min = candidates.flip(1).cummin(1).values.flip(1)
    following = torch.cat([suffix_min[:, 1:], suffix_min.new_full((batch, 1), length)], dim=1)
    has_next = following < length
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    next_values = torch.where(has_next, values.gather(1, following.clamp(max=length - 1)), zero)
    is_last = trainable & ~has_next
    terminal_here = torch.where(is_last, terminal.unsqueeze(1), zero)
    deltas = torch.where(trainable, rewards + terminal_here + gamma * next_values - values, zero)
    one = torch.ones((), dtype=values.dtype, device=values.device)
    decays = torch.where(has_next, torch.where(trainable, decays.unsqueeze(1), one), zero)
    step = 1
    while step < length:
        deltas[:, :-step] += decays[:, :-step] * deltas[:, step:]
        decays[:, :-step] = decays[:, :-step] * decays[:, step:]
        step *= 2
    return deltas


def row_lambdas(lambd, batch: int, device):
    """``lambd`` (a tensor: ``[B]``, one λ per row, or a single value) as ``[B]`` on ``device``;
    :class:`GAEInputError` for another shape."""
    if lambd.dim() == 0 or lambd.numel() == 1:
        return lambd.reshape(()).expand(batch).to(device)
    if lambd.shape != (batch,):
        raise GAEInputError(f"a λ per row must be a [batch] tensor ({batch}), got shape {tuple(lambd.shape)}")
    return lambd.to(device)


def row_lambda_gae(values, rewards, mask, gamma: float, lambd, semantics: str):
    """GAE of a padded batch ``[B, T]`` under ``semantics`` with one λ per row (``lambd``: a
    tensor, see :func:`row_lambdas`; the decay of row i is ``gamma * lambd[i]`` computed in
    λ's dtype, as AReaL and NeMo-RL compute it), as ``[B, T]`` advantages and returns in the
    values' dtype and device. ``masked``: the contract (the outcome moved as
    :func:`gaecli.trainers.padded.packed_gae` moves it), 0 at masked positions; a profile of
    :data:`SKIP_PROFILES`: its recursion, the rewards as given (those at masked tokens skipped),
    ``verl`` / ``areal`` the carry at masked positions and returns carry + V, ``nemo-rl`` 0 there
    and returns carry + V. Another semantics raises :class:`GAEInputError`."""
    import torch

    if semantics != MASKED and semantics not in SKIP_PROFILES:
        raise GAEInputError(f"a λ per row is computed for masked and {', '.join(SKIP_PROFILES)}, not {semantics!r}")
    batch, _ = values.shape
    trainable = as_trainable(mask)
    rewards = rewards.to(values.dtype)
    if semantics == MASKED:
        rewards, terminal = outcome_split(rewards, trainable)
    else:
        terminal = torch.zeros(batch, dtype=values.dtype, device=values.device)
    decays = (gamma * row_lambdas(lambd, batch, values.device)).to(values.dtype)
    carried = carried_advantages(values, rewards, trainable, terminal, float(gamma), decays)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    if semantics == MASKED:
        return torch.where(trainable, carried, zero), torch.where(trainable, carried + values, zero)
    if semantics == "nemo-rl":
        return torch.where(trainable, carried, zero), carried + values
    return carried, carried + values


def padded_lambda_gae(values, rewards, mask, gamma: float, lambd, semantics: str):
    """GAE of a padded batch with ``lambd`` a number (:func:`gaecli.trainers.padded.packed_gae`)
    or a tensor of them, one per row (:func:`row_lambda_gae`)."""
    from numbers import Real

    if isinstance(lambd, Real):
        return packed_gae(values, rewards, mask, float(gamma), float(lambd), semantics)
    return row_lambda_gae(values, rewards, mask, float(gamma), lambd, semantics)
