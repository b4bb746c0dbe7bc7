"""Masked GAE and the baselines on flat numpy buffers with the compiled kernel, and the
contract's constants and γ/λ check: the commands' CPU path, which never imports torch.

Importing torch costs a process about a second and a half; every worker process of
``--engine local`` and every Ray task's worker would pay it. On the CPU with the ``native``
kernel the commands therefore compute here. The semantics around the kernel are written
once, for numpy and torch alike (:func:`apply_semantics`);
:func:`gaecli.semantics.baseline_gae_packed` (torch, any kernel, any device) runs them on
tensors, so with the same compiled kernel both give the same bits
(``tests/test_baselines.py`` checks it).

Layout as everywhere in gaecli: ``values``, ``rewards`` float ``[N]`` of one dtype (the
outputs take it), ``trainable`` bool ``[N]``, ``offsets`` int64 ``[B + 1]`` (an Arrow list
column's offsets), ``terminal_rewards`` ``[B]`` in the values' dtype.
"""

from __future__ import annotations

import numpy as np

from gaecli.errors import InvalidOptionError
from gaecli.options import check_number

BASELINES: tuple[str, ...] = ("unmasked", "skip-masked", "zero-masked")
WHITEN_EPSILON = 1e-8


def check_discount(gamma: float, lambd: float, names: tuple[str, str] = ("gamma", "lambd")) -> None:
    """Raise :class:`InvalidOptionError` unless γ and λ are finite numbers in [0, 1]; the
    message calls them ``names``."""
    check_number(names[0], gamma, 0.0, 1.0)
    check_number(names[1], lambd, 0.0, 1.0)


def last_trainable_index(trainable: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Flat index of each sample's last trainable token, -1 when it has none. int64 ``[B]``."""
    positions = np.flatnonzero(trainable)
    # positions[index] is the last trainable position before each sample's end.
    index = np.searchsorted(positions, offsets[1:], side="left") - 1
    candidate = np.append(positions, -1)[index]  # index -1 (none before) picks the -1
    return np.where(candidate >= offsets[:-1], candidate, -1)


def next_trainable_index(trainable: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For every flat position t, the index of the first trainable position after t in the
    same sample, or -1 when there is none. int64 ``[N]``."""
    total = trainable.size
    positions = np.flatnonzero(trainable)
    following = np.append(positions, total)[np.searchsorted(positions, np.arange(total), side="right")]
    sample_end = np.repeat(offsets[1:], np.diff(offsets))
    return np.where(following < sample_end, following, -1)


def apply_semantics(xp, run, values, rewards, trainable, offsets, terminal_rewards, *, gamma: float, lambd: float,
                    semantics: str, last_trainable, next_trainable):
    """The one implementation of the semantics around a masked-GAE kernel, for numpy arrays
    (``xp`` = numpy) and torch tensors (``xp`` = torch) alike: only operations both spell
    the same way (``where``, ``zeros_like``, ``ones_like``, indexing), element-wise and in the
    same order, so both give the same bits for the same kernel.

    ``run(values, rewards, trainable, terminal_rewards)`` is the masked-GAE kernel on this
    batch; ``last_trainable(trainable, offsets)`` and ``next_trainable(trainable, offsets)``
    are the layout helpers of that array library (:func:`last_trainable_index`,
    :func:`next_trainable_index`). Shapes and results as :func:`gae_flat`.
    """
    if semantics == "masked":
        return run(values, rewards, trainable, terminal_rewards)
    everywhere = xp.ones_like(trainable)
    if semantics == "unmasked":
        return run(values, rewards, everywhere, terminal_rewards)
    if semantics == "zero-masked":
        zeroed_values = xp.where(trainable, values, 0.0)
        zeroed_rewards = xp.where(trainable, rewards, 0.0)
        last = last_trainable(trainable, offsets)
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
        following = next_trainable(trainable, offsets)
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
    raise InvalidOptionError(f"unknown semantics {semantics!r}; choose one of: masked, {', '.join(BASELINES)}")


def gae_flat(
    values: np.ndarray,
    rewards: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    terminal_rewards: np.ndarray,
    *,
    gamma: float,
    lambd: float,
    semantics: str = "masked",
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns ``[N]`` (the values' dtype) under ``semantics``: ``masked``
    (the contract: 0 at masked positions, a fully masked sample all 0) or a baseline, as
    documented at :func:`gaecli.semantics.baseline_gae_packed` (which may be non-zero at
    masked positions). Empty samples own no position. The inputs are not checked (the
    commands check every batch before) and not modified."""
    from gaecli.kernels.native import native_gae_flat

    def run(v, r, m, z):
        return native_gae_flat(v, r, m, offsets, z, gamma=gamma, lambd=lambd)

    return apply_semantics(np, run, values, rewards, trainable, offsets, terminal_rewards, gamma=gamma, lambd=lambd,
                           semantics=semantics, last_trainable=last_trainable_index, next_trainable=next_trainable_index)
