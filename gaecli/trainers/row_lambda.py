"""GAE of a padded ``[B, T]`` batch with a λ of its own per row (AReaL's ``gae_lambda`` tensor,
NeMo-RL's length-adaptive λ), which gaecli's packed kernels (one scalar λ) do not take: a
log-step scan along the rows in torch, on the tensors' device, with no copy to the host: the
scan of :mod:`gaecli.advantages.kernels.scan`, each row a sample of ``T`` tokens with its own
decay ``γλ_i``."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED, PROFILE_VARIANTS, profile_variants
from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.trainers.padded import as_trainable, outcome_split, packed_gae

SKIP_PROFILES: tuple[str, ...] = ("verl", "areal", "nemo-rl")
"""The profiles whose recursion skips masked steps (docs/semantics.md#the-recursions), the ones
:func:`row_lambda_gae` computes beside the contract."""


def carried_advantages(values, rewards, trainable, terminal, gamma: float, decays, after_last=None):
    """``[B, T]``: at each trainable position the masked contract's advantage (the rewards at
    trainable tokens, ``terminal`` ``[B]`` added on each row's last trainable token, the value
    after it ``after_last`` ``[B]`` (None: 0, the zero bootstrap), row i's carry decaying by
    ``decays[i]`` = γλ_i per step); at a masked position the advantage of the row's next
    trainable token (0 after the last one): what a recursion that skips masked steps carries
    there. ``values``, ``rewards`` of one floating dtype, ``trainable`` bool ``[B, T]``,
    ``decays`` and ``after_last`` ``[B]`` of the values' dtype. The scan of
    :func:`gaecli.advantages.kernels.scan.carried_advantages` over the rows as samples."""
    import torch

    from gaecli.advantages.kernels.convention import FlatBatch
    from gaecli.advantages.kernels.scan import carried_advantages as scanned

    batch, length = values.shape
    offsets = torch.arange(batch + 1, device=values.device) * length
    flat = FlatBatch(values.reshape(-1), rewards.reshape(-1), trainable.reshape(-1), offsets, terminal)
    return scanned(flat, gamma, decays, length, after_last).view(batch, length)


def row_lambdas(lambd, batch: int, device):
    """``lambd`` (a tensor: ``[B]``, one λ per row, or a single value) as ``[B]`` on ``device``;
    :class:`GAEInputError` for another shape."""
    if lambd.dim() == 0 or lambd.numel() == 1:
        return lambd.reshape(()).expand(batch).to(device)
    if lambd.shape != (batch,):
        raise GAEInputError(f"a λ per row must be a [batch] tensor ({batch}), got shape {tuple(lambd.shape)}")
    return lambd.to(device)


def row_lambda_gae(values, rewards, mask, gamma: float, lambd, semantics: str, truncation=None):
    """GAE of a padded batch ``[B, T]`` under ``semantics`` with one λ per row (``lambd``: a
    tensor, see :func:`row_lambdas`; the decay of row i is ``gamma * lambd[i]`` computed in
    λ's dtype, as AReaL and NeMo-RL compute it), as ``[B, T]`` advantages and returns in the
    values' dtype and device. ``masked``: the contract (the outcome moved as
    :func:`gaecli.trainers.padded.packed_gae` moves it), 0 at masked positions; a profile of
    :data:`SKIP_PROFILES`: its recursion, the rewards as given (those at masked tokens skipped),
    ``verl`` / ``areal`` the carry at masked positions and returns carry + V, ``nemo-rl`` 0 there
    and returns carry + V. ``truncation``: ``(truncated, bootstrap_values)`` ``[B]`` each, the
    truncation bootstrap (docs/variants.md: a truncated row's value after its last trainable
    token), for ``masked`` and ``areal`` (as the spec takes it), or None. Another semantics, or
    a truncation with another profile, raises :class:`GAEInputError`."""
    import torch

    if semantics != MASKED and semantics not in SKIP_PROFILES:
        raise GAEInputError(f"a λ per row is computed for masked and {', '.join(SKIP_PROFILES)}, not {semantics!r}")
    if truncation is not None and semantics != MASKED and "truncated" not in profile_variants(semantics):
        takers = ", ".join(profile for profile, fields in PROFILE_VARIANTS.items() if "truncated" in fields)
        raise InvalidOptionError(f"the truncation bootstrap is computed for masked and {takers}, not {semantics!r}")
    batch, _ = values.shape
    trainable = as_trainable(mask)
    rewards = rewards.to(values.dtype)
    if semantics == MASKED:
        rewards, terminal = outcome_split(rewards, trainable)
    else:
        terminal = torch.zeros(batch, dtype=values.dtype, device=values.device)
    decays = (gamma * row_lambdas(lambd, batch, values.device)).to(values.dtype)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    after_last = None
    if truncation is not None:
        from gaecli.advantages.variants import row_bootstraps

        after_last = row_bootstraps(*truncation, like=values)
    carried = carried_advantages(values, rewards, trainable, terminal, float(gamma), decays, after_last)
    if semantics == MASKED:
        return torch.where(trainable, carried, zero), torch.where(trainable, carried + values, zero)
    if semantics == "nemo-rl":
        return torch.where(trainable, carried, zero), carried + values
    return carried, carried + values


def padded_lambda_gae(values, rewards, mask, gamma: float, lambd, semantics: str, truncation=None):
    """GAE of a padded batch with ``lambd`` a number (:func:`gaecli.trainers.padded.packed_gae`)
    or a tensor of them, one per row (:func:`row_lambda_gae`); ``truncation``: the truncation
    bootstrap ``(truncated, bootstrap_values)`` ``[B]`` each, or None."""
    from numbers import Real

    if isinstance(lambd, Real):
        return packed_gae(values, rewards, mask, float(gamma), float(lambd), semantics, truncation=truncation)
    return row_lambda_gae(values, rewards, mask, float(gamma), lambd, semantics, truncation)
