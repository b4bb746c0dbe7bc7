"""ROLL's GAE with ROLL's signature (``roll/utils/functionals.py``,
``compute_gae_advantage_return``, alibaba/ROLL ``8eb27cc``; docs/trainers.md#roll): padded
``[B, T]`` tensors (the sequence after its first token, as ``compute_advantage`` and
``agentic_compute_advantage`` slice it), the masked contract by default or ROLL's own
computation with ``semantics="roll"``. ROLL's function takes no mask; the drop-in takes one
more keyword, ``response_mask``. Neither whitens (ROLL's ``compute_advantage`` does, after).
Importing this module does not import ROLL."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.trainers.padded import check_batch, check_semantics, packed_gae

PROFILE = "roll"
"""gaecli's profile of ROLL (docs/semantics.md#the-baselines)."""


def compute_gae_advantage_return(
    token_level_rewards, values, gamma, lambd, *, response_mask=None, semantics=MASKED, out=None
):
    """ROLL's ``compute_gae_advantage_return``: ``(advantages, returns)`` ``[B, T]``, not
    whitened; ``gamma``, ``lambd`` numbers (or one-element tensors). Tensors stay on their
    device, in the values' dtype.

    ``response_mask`` (``[B, T]`` 0/1, the mask ROLL's caller holds; None: every token):
    ``semantics="masked"`` (the default) computes the masked contract over its tokens, the
    outcome (ROLL puts it on the last attended token, masked or not) on the last trainable
    token, the rewards at other masked tokens dropped, advantages and returns exactly 0 at
    every masked and padding position. ``semantics="roll"``: ROLL's loop over every column (the
    values not masked) as :func:`gaecli.baseline_gae_packed` gives it, with what ROLL's
    ``compute_advantage`` does around the call: the rewards times ``response_mask`` before it,
    the advantages times ``response_mask`` after it, the returns left as computed; without a
    mask, ROLL's function alone. ``out``: two contiguous ``[B, T]`` tensors of the values' dtype
    to write into (a trainer's reused buffers), returned."""
    import torch

    mask = torch.ones_like(values, dtype=torch.bool) if response_mask is None else response_mask
    check_batch("compute_gae_advantage_return", token_level_rewards, values, mask)
    check_semantics(semantics, (MASKED, PROFILE))
    return packed_gae(values, token_level_rewards, mask, float(gamma), float(lambd), semantics, out=out)
