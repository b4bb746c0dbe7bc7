"""slime's and miles' GAE written out in float64 Python, one sample at a time, as their source
writes it (THUDM/slime ``624b824`` ``slime/utils/ppo_utils.py``; radixark/miles ``31f1ca9``
``miles/backends/training_utils/loss_hub/math_utils.py``): the independent side of
tests/test_trainers_slime.py; and slime's outcome estimators (grpo, dr-grpo,
reinforce++-baseline: ``slime/ray/rollout.py`` ``_post_process_rewards``, then
``get_grpo_returns`` or ``get_reinforce_plus_plus_baseline_advantages``), in float64 and as
slime's float32 torch code runs them: the independent side of
tests/test_slime_outcome_profiles.py. A sample is a list of floats per input, of its response length."""

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


SLIME_NORMALISED = ("grpo", "dr-grpo", "reinforce++-baseline")
"""gaecli's names of slime's estimators whose rewards ``_post_process_rewards`` normalises
(slime's ``grpo``, ``grpo`` with ``--disable-grpo-std-normalization``, ``reinforce_plus_plus_baseline``)."""


def slime_post_process_rewards(raw_rewards, estimator, n_samples_per_prompt, rollout_batch_size):
    """slime's ``RolloutManager._post_process_rewards`` in float64 Python: the rewards cut into
    consecutive groups of ``n_samples_per_prompt`` when there are ``n · rollout_batch_size`` of
    them, else one group of all; each centred on its group's mean and, for grpo, divided by
    the Bessel std of the centred values plus 1e-6 (``n_samples_per_prompt = 1`` turns the std
    off: slime's ``arguments.py``; a std over one value is NaN, as ``torch.std``'s)."""
    assert estimator in SLIME_NORMALISED
    divide = estimator == "grpo" and n_samples_per_prompt != 1
    size = n_samples_per_prompt if len(raw_rewards) == n_samples_per_prompt * rollout_batch_size else len(raw_rewards)
    out = []
    for start in range(0, len(raw_rewards), size):
        group = [float(x) for x in raw_rewards[start : start + size]]
        mean = math.fsum(group) / len(group)
        centred = [x - mean for x in group]
        if divide:
            centre = math.fsum(centred) / len(centred)
            spread = math.fsum((x - centre) ** 2 for x in centred)
            std = math.sqrt(spread / (len(centred) - 1)) if len(centred) > 1 else math.nan
            centred = [x / (std + 1e-6) for x in centred]
        out.extend(centred)
    return out


def slime_post_process_rewards_float32(raw_rewards, estimator, n_samples_per_prompt, rollout_batch_size):
    """The same as slime's float32 torch code runs it: ``torch.tensor(raw, dtype=torch.float)``,
    reshaped, ``mean``, ``std`` and ``+ 1e-6`` in float32; a list of Python floats (``tolist``)."""
    import torch

    divide = estimator == "grpo" and n_samples_per_prompt != 1
    rewards = torch.tensor(raw_rewards, dtype=torch.float)
    if rewards.shape[-1] == n_samples_per_prompt * rollout_batch_size:
        rewards = rewards.reshape(-1, n_samples_per_prompt)
    else:
        rewards = rewards.view(-1, rewards.shape[-1])
    rewards = rewards - rewards.mean(dim=-1, keepdim=True)
    if divide:
        rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
    return rewards.flatten().tolist()


def slime_outcome_row(estimator, reward, token_rewards):
    """One sample's advantages before ``normalize_advantages``: grpo's and dr-grpo's
    (``get_grpo_returns``: ``ones_like(kl) · reward``, the normalised scalar at every token of
    the response, masked ones included) or reinforce++-baseline's
    (``get_reinforce_plus_plus_baseline_advantages``: ``ones_like(kl) · reward − kl_coef · kl``,
    where ``token_rewards`` are gaecli's per-token rewards, ``−kl_coef · kl``)."""
    if estimator == "reinforce++-baseline":
        return [reward + r for r in token_rewards]
    return [reward] * len(token_rewards)


def slime_normalize_advantages(advantages, masks):
    """slime's ``normalize_advantages`` (``distributed_masked_whiten`` over the loss masks):
    the mean and Bessel variance of the trainable tokens' values, ``(A − mean)·rsqrt(var +
    1e-8)`` written at **every** token, masked ones included."""
    tokens = [a for row, mask in zip(advantages, masks) for a, m in zip(row, mask) if m]
    mean = math.fsum(tokens) / len(tokens)
    var = math.fsum((a - mean) ** 2 for a in tokens) / (len(tokens) - 1)
    return [[(a - mean) / math.sqrt(var + 1e-8) for a in row] for row in advantages]
