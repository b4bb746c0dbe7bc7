"""AReaL's GAE functions with AReaL's signatures (``areal/trainer/ppo/gae.py``,
``_compute_token_level_gae`` and ``_compute_turn_level_gae``, areal-project/AReaL ``cbff54d``;
docs/trainers.md#areal): padded ``[B, T]`` tensors laid out as ``PPOActor._compute_advantages``
(``areal/trainer/ppo/actor.py``) lays them (the prompt-and-response sequence, the loss mask
rolled by one, the outcome on the last response position ``seqlens − 2``, right padding), the
masked contract by default or AReaL's own computation with ``semantics="areal"``. Neither
whitens (AReaL's actor normalises afterwards). Importing this module does not import AReaL."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.errors import GAEInputError
from gaecli.trainers.padded import as_trainable, check_batch, check_semantics, outcome_split
from gaecli.trainers.row_lambda import padded_lambda_gae

PROFILE = "areal"
"""gaecli's profile of AReaL (docs/semantics.md#the-baselines)."""

_TURN_ID_DTYPES = ("uint8", "int8", "int16", "int32", "int64")


def compute_token_level_gae(
    rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda, *, semantics: str = MASKED
):
    """AReaL's ``_compute_token_level_gae``: ``(advantages, returns)`` ``[B, T]``, each token a
    timestep; the last column is no timestep (AReaL's loop starts at ``T − 2``): its reward is
    not read, its advantage is 0 and its value is the bootstrap of a sequence without EOS.
    ``gae_lambda``: a number, or a tensor ``[B]`` (one λ per row, AReaL's custom λ functions).
    Outputs in the values' dtype promoted with float32 (AReaL's accumulators are float32), on
    their device.

    ``semantics="masked"``: the masked contract over the ``loss_mask`` tokens, the outcome (on
    the last response position, masked or not) on the last trainable token, the rewards at
    other masked tokens dropped, zero bootstrap (``seq_no_eos_mask`` is not read), advantages
    and returns 0 at every masked and padding position. ``semantics="areal"``: AReaL's loop
    (masked steps skipped, the carry stored there, returns = advantages + values, its bootstrap
    ``values[:, T − 1]`` the value after the last step of each ``seq_no_eos_mask`` row) as
    :func:`gaecli.baseline_gae_packed` gives it with ``truncated=seq_no_eos_mask`` and
    ``bootstrap_values=values[:, T − 1]`` (the truncation bootstrap of the ``areal`` profile)."""
    check_batch("compute_token_level_gae", rewards, values, loss_mask)
    check_semantics(semantics, (MASKED, PROFILE))
    values, steps, rewards = _steps(values, loss_mask, rewards)
    truncation = _truncation(values, seq_no_eos_mask) if semantics == PROFILE else None
    return padded_lambda_gae(values, rewards, steps, discount, gae_lambda, semantics, truncation)


def compute_turn_level_gae(
    rewards, values, loss_mask, turn_ids, seq_no_eos_mask, discount, gae_lambda, *, semantics: str = MASKED
):
    """AReaL's ``_compute_turn_level_gae``: ``(advantages, returns)`` ``[B, T]``, each turn a
    timestep. A turn is the ``loss_mask`` tokens of a row holding one ``turn_ids`` value (an
    integer tensor ``[B, T]``, ``−1`` or anything at masked tokens; at trainable tokens ≥ 0,
    below ``T`` and non-decreasing, else :class:`GAEInputError`, or on an accelerator an
    asynchronous device assertion, as AReaL checks them); its reward is the sum of its tokens'
    rewards, its value the value at its first token; the turn's advantage and return are
    written at each of its tokens. ``gae_lambda`` and the dtype as
    :func:`compute_token_level_gae`.

    ``semantics="masked"``: the outcome (on the last response position, masked or not) joins
    the last trainable token's turn, zero bootstrap, advantages and returns 0 at masked
    positions. ``semantics="areal"``: AReaL's (the rewards of masked tokens, the outcome on a
    masked tail included, dropped; its bootstrap as :func:`compute_token_level_gae`, the
    truncation bootstrap of the masked contract over the turns; the values as the returns at
    masked positions)."""
    import torch

    check_batch("compute_turn_level_gae", rewards, values, loss_mask, turn_ids)
    check_semantics(semantics, (MASKED, PROFILE))
    _check_turn_ids(loss_mask, turn_ids)
    _, length = values.shape
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    valid = as_trainable(loss_mask)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    token_rewards = torch.where(valid, rewards.to(values.dtype), zero)
    if semantics == MASKED:
        kept, terminal = outcome_split(rewards.to(values.dtype), valid)
        token_rewards = kept + torch.where(_last_of(valid), terminal.unsqueeze(1), zero)
    safe_ids = turn_ids.long().clamp(min=0, max=length - 1)
    turn_rewards = torch.zeros_like(values).scatter_add_(1, safe_ids, token_rewards)
    positions = torch.arange(length, device=values.device).expand_as(safe_ids)
    first = torch.full_like(safe_ids, length).scatter_reduce_(
        1, safe_ids, torch.where(valid, positions, length), reduce="amin", include_self=True
    )
    valid_turn = first < length
    turn_values = torch.where(valid_turn, values.gather(1, first.clamp(max=length - 1)), zero)
    truncation = _truncation(values, seq_no_eos_mask) if semantics == PROFILE else None
    turn_gae = padded_lambda_gae(turn_values, turn_rewards, valid_turn, discount, gae_lambda, MASKED, truncation)
    turn_advantages, turn_returns = turn_gae
    advantages = torch.where(valid, turn_advantages.gather(1, safe_ids), zero)
    returns = torch.where(valid, turn_returns.gather(1, safe_ids), values if semantics == PROFILE else zero)
    return advantages, returns


def _steps(values, loss_mask, rewards):
    """The values in AReaL's dtype, the timesteps (``loss_mask`` as bool without the last
    column) and the rewards without the last column's (which AReaL never reads)."""
    import torch

    values = values.to(torch.promote_types(values.dtype, torch.float32))
    last_column = torch.arange(values.shape[1], device=values.device) == values.shape[1] - 1
    steps = as_trainable(loss_mask) & ~last_column
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return values, steps, torch.where(last_column, zero, rewards.to(values.dtype))


def _last_of(trainable):
    """Bool ``[B, T]``: each row's last trainable position (none in a row without one)."""
    import torch

    positions = torch.arange(trainable.shape[1], device=trainable.device)
    last = torch.where(trainable, positions, -1).amax(dim=1, keepdim=True)
    return positions == last


def _truncation(values, seq_no_eos_mask):
    """AReaL's bootstrap as the truncation bootstrap (docs/variants.md): ``(truncated,
    bootstrap_values)`` ``[B]`` each, the rows of ``seq_no_eos_mask`` (a 0/1 tensor ``[B]``) and
    AReaL's initial ``nextvalues``, ``values[:, T − 1] · seq_no_eos_mask`` (``values`` in AReaL's
    dtype, :func:`_steps`), the value after each row's last step; None without a mask (zero
    bootstrap). :class:`GAEInputError` for a mask of another shape."""
    if seq_no_eos_mask is None:
        return None
    no_eos = seq_no_eos_mask.to(device=values.device)
    if no_eos.shape != (values.shape[0],):
        raise GAEInputError(f"seq_no_eos_mask: expected [{values.shape[0]}], got shape {tuple(no_eos.shape)}")
    return no_eos != 0, values[:, -1] * no_eos


def _check_turn_ids(loss_mask, turn_ids) -> None:
    """AReaL's ``_validate_turn_ids``: integer ids, at trainable tokens ≥ 0, below ``T`` and
    non-decreasing. On the host a fault raises :class:`GAEInputError` naming the row; on an
    accelerator it is an asynchronous device assertion (no copy to the host), as in AReaL."""
    import torch

    if str(turn_ids.dtype).removeprefix("torch.") not in _TURN_ID_DTYPES:
        raise GAEInputError(f"turn_ids must use an integer dtype, got {turn_ids.dtype}")
    valid = as_trainable(loss_mask)
    ids = turn_ids.long()
    active = torch.where(valid, ids, -1)
    running_max = torch.cummax(active, dim=1).values
    good = ~valid | ((ids >= 0) & (ids < loss_mask.shape[1]) & (ids >= running_max))
    if turn_ids.device.type != "cpu":
        torch._assert_async(good.all(), "turn_ids at trainable tokens must be in [0, T) and non-decreasing")
        return
    bad = (~good).any(dim=1).nonzero().flatten()
    if bad.numel():
        raise GAEInputError(
            f"turn_ids of row {int(bad[0])}: at trainable tokens they must be in [0, {loss_mask.shape[1]}) "
            "and non-decreasing"
        )
