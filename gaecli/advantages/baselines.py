"""The baselines: what trainers computed instead of the masked contract, written once around
any masked-GAE kernel for numpy and torch alike (definitions: docs/semantics.md#the-baselines).
"""

from __future__ import annotations

from gaecli.advantages.contract import BASELINES, MASKED
from gaecli.advantages.layout import array_module, last_trainable_index, next_trainable_index
from gaecli.errors import InvalidOptionError


def apply_semantics(run, values, rewards, trainable, offsets, terminal_rewards, *, gamma: float, lambd: float,
                    semantics: str):
    """The one implementation of the semantics around a masked-GAE kernel, for numpy arrays
    and torch tensors alike: only operations both spell the same way (``where``,
    ``zeros_like``, ``ones_like``, indexing), element-wise and in the same order, so both give
    the same bits for the same kernel.

    ``run(values, rewards, trainable, terminal_rewards)`` is the masked-GAE kernel on this
    batch. Shapes: flat ``[N]`` values, rewards (one float dtype, which the outputs take) and
    bool ``trainable``, ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``. Returns flat
    ``(advantages, returns)``: what ``semantics`` computes at every position
    (docs/semantics.md#the-baselines).
    """
    xp = array_module(values)
    if semantics == "masked":
        return run(values, rewards, trainable, terminal_rewards)
    everywhere = xp.ones_like(trainable)
    if semantics == "unmasked":
        return run(values, rewards, everywhere, terminal_rewards)
    if semantics == "zero-masked":
        zeroed_values = xp.where(trainable, values, 0.0)
        zeroed_rewards = xp.where(trainable, rewards, 0.0)
        last = last_trainable_index(trainable, offsets)
        has_trainable = last >= 0
        zeroed_rewards[last[has_trainable]] += terminal_rewards[has_trainable]
        return run(zeroed_values, zeroed_rewards, everywhere, xp.zeros_like(terminal_rewards))
    if semantics == "skip-masked":
        last_position = offsets[1:] - 1
        nonempty = offsets[1:] > offsets[:-1]
        ends_trainable = xp.zeros_like(nonempty)
        ends_trainable[nonempty] = trainable[last_position[nonempty]]
        kept_terminal = xp.where(ends_trainable, terminal_rewards, 0.0)
        advantages, returns = run(values, rewards, trainable, kept_terminal)
        following = next_trainable_index(trainable, offsets)
        has_next = following >= 0
        safe_following = xp.where(has_next, following, 0)
        next_values = xp.where(has_next, values[safe_following], 0.0)
        carry = xp.where(has_next, advantages[safe_following], 0.0)
        lost_terminal = xp.zeros_like(values)
        lost = nonempty & ~ends_trainable
        lost_terminal[last_position[lost]] = terminal_rewards[lost]
        masked_advantages = rewards + lost_terminal + gamma * next_values - values + (gamma * lambd) * carry
        advantages = xp.where(trainable, advantages, masked_advantages)
        returns = xp.where(trainable, returns, masked_advantages + values)
        return advantages, returns
    raise InvalidOptionError(f"unknown semantics {semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")
