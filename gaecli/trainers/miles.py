"""miles' batched GAE with miles' signature (``miles/backends/training_utils/loss_hub/math_utils.py``,
``get_advantages_and_returns_batch``, radixark/miles ``31f1ca9``; docs/trainers.md#slime-and-miles):
lists of per-sample response tensors, a terminal reward and a loss mask per sample; miles' own
function is the masked contract (since ``3d2e0e4``, "run PPO GAE over trainable tokens only"),
so the default ``semantics="masked"`` computes what miles computes, and a profile
(``semantics="slime"``: miles before that fix) what that trainer would. Importing this module
imports neither miles nor Megatron."""

from __future__ import annotations

from gaecli.advantages.contract import MASKED
from gaecli.trainers.padded import check_semantics
from gaecli.trainers.slime import list_gae


def get_advantages_and_returns_batch(
    total_lengths,
    response_lengths,
    values_list,
    rewards_list,
    terminal_rewards,
    qkv_format,
    max_seq_lens,
    loss_masks,
    gamma,
    lambd,
    chunked: bool = True,
    *,
    semantics: str = MASKED,
):
    """miles' ``get_advantages_and_returns_batch``: ``(advantages_list, returns_list)``, one 1-D
    tensor ``[R_i]`` per sample on the values' device and in their dtype, not whitened.
    ``values_list``, ``rewards_list`` (the per-token rewards, KL shaping: no outcome in them),
    ``loss_masks``: one ``[R_i]`` tensor per sample; ``terminal_rewards``: one number per sample
    (a list, as miles passes it, or a tensor ``[B]``).

    ``semantics="masked"`` (the default, miles' own): GAE over each sample's trainable tokens
    (``loss_masks`` 1) as one sequence, the terminal reward on the last of them, the rewards at
    masked tokens dropped; advantages and returns exactly 0 at masked positions, a fully masked
    sample all 0 (its terminal reward dropped). A profile (``"slime"``, any other): that
    computation at every position with the terminal reward where the profile puts it, as
    :func:`gaecli.baseline_gae_packed` gives it (``slime``: on token R−1, the mask read nowhere).

    ``total_lengths``, ``qkv_format``, ``max_seq_lens`` (what miles' context-parallel gather and
    slice read) and ``chunked`` (the same numbers either way) are accepted and change nothing.
    No collective: the tensors are the whole responses, as miles' function has them after its
    gather (:data:`gaecli.trainers.slime.CP_HINT`); a shorter one raises
    :class:`gaecli.GAEInputError` naming the sample."""
    check_semantics(semantics)
    return list_gae(
        "get_advantages_and_returns_batch", response_lengths, values_list, rewards_list, loss_masks,
        terminal_rewards, gamma, lambd, semantics,
    )  # fmt: skip
