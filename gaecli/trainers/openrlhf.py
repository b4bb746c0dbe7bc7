"""OpenRLHF's advantage functions with OpenRLHF's signatures
(``openrlhf/trainer/ppo_utils/experience_maker.py``, OpenRLHF/OpenRLHF ``3c3be62``;
docs/trainers.md#openrlhf), as functions (the experience maker's methods take ``self`` first;
bind them with ``types.MethodType`` or call these): padded ``[B, T]`` tensors, the masked
contract by default or OpenRLHF's own profile with ``semantics="openrlhf"``; OpenRLHF whitens
later, over the batch, so neither whitens. Importing this module does not import OpenRLHF."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.trainers.padded import check_batch, check_semantics, packed_gae


def get_advantages_and_returns(
    values, rewards, action_mask, gamma: float, lambd: float, *, semantics: str = MASKED, out=None
):
    """OpenRLHF's ``get_advantages_and_returns``: ``(advantages, returns)`` ``[B, T]``, not
    whitened. ``semantics="masked"``: the masked contract over the ``action_mask`` tokens, the
    outcome reward (on the last action token in OpenRLHF's layout, or after it) on the last
    trainable token, 0 at every masked and padding position; ``"openrlhf"``: OpenRLHF's loop (V and
    r zeroed at masked tokens, GAE over every token) as :func:`gaecli.baseline_gae_packed` gives
    it. ``action_mask`` None: every token is an action. ``out``: two contiguous ``[B, T]``
    tensors of the values' dtype to write into (a trainer's reused buffers), returned."""
    import torch

    mask = torch.ones_like(rewards, dtype=torch.bool) if action_mask is None else action_mask
    check_batch("get_advantages_and_returns", values, rewards, mask)
    check_semantics(semantics)
    return packed_gae(values, rewards, mask, gamma, lambd, semantics, out=out)


def get_cumulative_returns(rewards, action_mask, gamma: float, *, semantics: str = MASKED):
    """OpenRLHF's ``get_cumulative_returns``: the returns ``[B, T]`` (one tensor, as OpenRLHF's),
    ``G_t = r_t + γ·G_{t+1}``: GAE with V = 0 and λ = 1 under ``semantics`` (``masked``: over the
    trainable tokens, the outcome on the last of them, 0 elsewhere; ``openrlhf``: the rewards
    masked, discounted over every token)."""
    import torch

    mask = torch.ones_like(rewards, dtype=torch.bool) if action_mask is None else action_mask
    check_batch("get_cumulative_returns", rewards, mask)
    check_semantics(semantics, (MASKED, "openrlhf"))
    zeros = torch.zeros_like(rewards)
    return packed_gae(zeros, rewards, mask, gamma, 1.0, semantics)[1]
