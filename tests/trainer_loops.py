"""Each trainer's own algorithm written out in float64 Python, one padded row at a time, as its
source writes it: the independent side of the drop-in tests (tests/test_trainers.py)."""

from __future__ import annotations

import math

from helpers import masked_gae_oracle


def verl_gae_row(rewards, values, mask, gamma, lam):
    """verl's ``compute_gae_advantage_return`` loop on one row (before its whitening)."""
    next_value, last, advantages = 0.0, 0.0, [0.0] * len(rewards)
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        candidate = delta + gamma * lam * last
        next_value = values[t] * mask[t] + (1 - mask[t]) * next_value
        last = candidate * mask[t] + (1 - mask[t]) * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def openrlhf_gae_row(values, rewards, mask, gamma, lambd):
    """OpenRLHF's ``get_advantages_and_returns`` loop on one row."""
    values = [v * m for v, m in zip(values, mask)]
    rewards = [r * m for r, m in zip(rewards, mask)]
    last, advantages = 0.0, [0.0] * len(rewards)
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t < len(rewards) - 1 else 0.0
        last = rewards[t] + gamma * next_value - values[t] + gamma * lambd * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def openrlhf_cumulative_row(rewards, mask, gamma):
    """OpenRLHF's ``get_cumulative_returns`` loop on one row."""
    running, returns = 0.0, [0.0] * len(rewards)
    for t in reversed(range(len(rewards))):
        running = rewards[t] * mask[t] + gamma * running
        returns[t] = running
    return returns


def contract_row(values, rewards, mask, gamma, lambd):
    """The masked contract on one padded row: the rewards after the last trainable token (the
    outcome) on the last trainable token, the rewards at other masked tokens dropped."""
    trainable = [t for t, m in enumerate(mask) if m]
    last = trainable[-1] if trainable else -1
    outcome = math.fsum(rewards[t] for t in range(last + 1, len(rewards)))
    kept = [r if m else 0.0 for r, m in zip(rewards, mask)]
    return masked_gae_oracle(values, kept, mask, outcome, gamma, lambd)


def masked_whiten(rows, masks, everywhere: bool):
    """verl's ``masked_whiten`` over the batch: the mean and Bessel variance of the masked-in
    tokens, ``(x − mean)/sqrt(var + 1e-8)``; written everywhere (verl) or 0 at masked tokens."""
    tokens = [x for row, mask in zip(rows, masks) for x, m in zip(row, mask) if m]
    mean = math.fsum(tokens) / len(tokens)
    var = math.fsum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1)
    scale = math.sqrt(var + 1e-8)
    return [
        [(x - mean) / scale if everywhere or m else 0.0 for x, m in zip(row, mask)] for row, mask in zip(rows, masks)
    ]


def group_scores(scores, index, estimator, epsilon=1e-6):
    """verl's grpo, dr-grpo and rloo over ``index`` groups (a group of one: μ = 0, σ = 1; rloo: ``s``)."""
    members = {}
    for i, key in enumerate(index):
        members.setdefault(key, []).append(scores[i])
    out = []
    for s, key in zip(scores, index):
        group = members[key]
        n = len(group)
        mean = math.fsum(group) / n if n > 1 else 0.0
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in group) / (n - 1)) if n > 1 else 1.0
        if estimator == "grpo":
            out.append((s - mean) / (std + epsilon))
        elif estimator == "dr-grpo":
            out.append(s - mean)
        else:
            out.append((s - mean) * n / (n - 1) if n > 1 else s)
    return out
