"""slime's and miles' GAE written out in float64 Python, one sample at a time, as their source
writes it (THUDM/slime ``624b824`` ``slime/utils/ppo_utils.py``; radixark/miles ``31f1ca9``
``miles/backends/training_utils/loss_hub/math_utils.py``): the independent side of
tests/test_trainers_slime.py. A sample is a list of floats per input, of its response length."""

from __future__ import annotations

import math


def vanilla_gae_row(values, rewards, gamma, lambd):
    """``vanilla_gae`` on one sample: the backward loop over every token, the next value 0
    after the last; ``returns = advantages + values``."""
    length = len(values)
    last, advantages = 0.0, [0.0] * length
    for t in reversed(range(length)):
        next_value = values[t + 1] if t < length - 1 else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lambd * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def chunked_gae_row(values, rewards, gamma, lambd, chunk_size=128):
    """``chunked_gae`` on one sample: the deltas reversed, each chunk scanned through the matrix
    ``M[i, j] = w^(j − i)`` (j ≥ i, ``w = γλ``), the carry of the previous chunk added as
    ``s_prev · w^(t + 1)``; flipped back."""
    length, w = len(values), gamma * lambd
    next_values = values[1:] + [0.0]
    deltas = [r + gamma * nv - v for r, nv, v in zip(rewards, next_values, values)]
    reversed_deltas = deltas[::-1]
    scanned, carry = [], 0.0
    for start in range(0, length, chunk_size):
        chunk = reversed_deltas[start : start + chunk_size]
        matrix = [[w ** (j - i) if w else float(i == j) for j in range(len(chunk))] for i in range(len(chunk))]
        local = [math.fsum(chunk[i] * matrix[i][j] for i in range(j + 1)) for j in range(len(chunk))]
        block = [s + carry * (w ** (j + 1) if w else 0.0) for j, s in enumerate(local)]
        scanned.extend(block)
        carry = block[-1]
    advantages = scanned[::-1]
    return advantages, [a + v for a, v in zip(advantages, values)]


def slime_row(values, rewards, gamma, lambd):
    """slime's ``get_advantages_and_returns_batch`` on one sample, the outcome already in the
    rewards (slime's ``compute_advantages_and_returns``: ``token_level_rewards[-1] += reward``)."""
    return vanilla_gae_row(values, rewards, gamma, lambd)


def miles_row(values, rewards, mask, terminal, gamma, lambd):
    """miles' ``get_advantages_and_returns_batch`` on one sample: the trainable positions
    (``loss_mask`` nonzero) compressed, the terminal reward added to the last of them, the loop
    over the compressed sample, scattered back into zeros; a fully masked sample all zeros."""
    index = [t for t, m in enumerate(mask) if m]
    advantages, returns = [0.0] * len(values), [0.0] * len(values)
    if not index:
        return advantages, returns
    compressed_values = [values[t] for t in index]
    compressed_rewards = [rewards[t] for t in index]
    compressed_rewards[-1] += terminal
    compressed_advantages, compressed_returns = vanilla_gae_row(compressed_values, compressed_rewards, gamma, lambd)
    for k, t in enumerate(index):
        advantages[t], returns[t] = compressed_advantages[k], compressed_returns[k]
    return advantages, returns


def pre_fix_miles_row(values, rewards, terminal, gamma, lambd):
    """miles before ``3d2e0e4``: the terminal reward added to token R−1, the loop over every token."""
    rewards = list(rewards)
    if rewards:
        rewards[-1] += terminal
    return vanilla_gae_row(values, rewards, gamma, lambd)


def contract_in_slime_layout(values, rewards, mask, gamma, lambd):
    """The masked contract on one sample in slime's layout: the rewards after the last trainable
    token (the outcome on token R−1, and the KL terms of a masked tail) summed onto the last
    trainable token, the rewards at the other masked tokens dropped: miles' loop on those."""
    index = [t for t, m in enumerate(mask) if m]
    last = index[-1] if index else -1
    outcome = math.fsum(rewards[last + 1 :])
    kept = [r if m else 0.0 for r, m in zip(rewards, mask)]
    return miles_row(values, kept, mask, outcome, gamma, lambd)
