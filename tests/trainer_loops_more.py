"""SkyRL's, AReaL's, NeMo-RL's and ROLL's GAE written out in float64 Python, one padded row at a
time, as each source writes it (and the contract in each one's layout): the independent side
of tests/test_trainers_more.py."""

from __future__ import annotations

import math

import numpy as np
from trainer_loops import contract_row

from helpers import masked_gae_oracle


def plain_gae_row(rewards, values, gamma, lambd):
    """SkyRL's and ROLL's ``compute_gae_advantage_return`` loop on one row: every column, the
    next value 0 after the last; returns = advantages + values (SkyRL whitens afterwards)."""
    last, advantages, length = 0.0, [0.0] * len(rewards), len(rewards)
    for t in reversed(range(length)):
        next_value = values[t + 1] if t < length - 1 else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lambd * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def roll_row(rewards, values, mask, gamma, lambd):
    """ROLL's ``compute_advantage`` around its GAE on one row: the rewards times the mask, the
    loop on the unmasked values, the advantages times the mask, the returns as computed."""
    advantages, returns = plain_gae_row([r * m for r, m in zip(rewards, mask)], values, gamma, lambd)
    return [a * m for a, m in zip(advantages, mask)], returns


def areal_token_row(rewards, values, loss_mask, no_eos, discount, lam):
    """AReaL's ``_compute_token_level_gae`` on one row: the loop from column T − 2, the next
    value first ``values[T − 1]`` times the no-EOS flag, masked steps skipped (the carry kept)."""
    length = len(rewards)
    advantages, last = [0.0] * length, 0.0
    next_value = values[length - 1] * float(no_eos)
    discounted_lambda = discount * lam
    for t in reversed(range(length - 1)):
        delta = rewards[t] + discount * next_value - values[t]
        new = delta + discounted_lambda * last
        m = loss_mask[t]
        next_value = next_value * (1 - m) + values[t] * m
        last = last * (1 - m) + new * m
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def areal_dump_row(values, rewards, mask, terminal, truncated, bootstrap, discount, lam):
    """AReaL's token loop (:func:`areal_token_row`) on one row of a dump as gaecli's ``areal``
    profile reads it: the response laid out as AReaL's padded row, the outcome on its last
    token, one column after it that is no step and holds the value AReaL reads first,
    ``values[:, T − 1]`` (``bootstrap`` where the row is ``truncated``, no EOS; 0 otherwise,
    where AReaL multiplies it by 0). Returns the response's positions."""
    length = len(values)
    padded_rewards = [float(r) for r in rewards] + [0.0]
    if length:
        padded_rewards[length - 1] += float(terminal)
    padded_values = [float(v) for v in values] + [float(bootstrap) if truncated else 0.0]
    padded_mask = [1.0 if m else 0.0 for m in mask] + [0.0]
    advantages, returns = areal_token_row(padded_rewards, padded_values, padded_mask, truncated, discount, lam)
    return advantages[:length], returns[:length]


def areal_turn_row(rewards, values, loss_mask, turn_ids, no_eos, discount, lam):
    """AReaL's ``_compute_turn_level_gae`` on one row: a turn's reward the sum of its loss-mask
    tokens' rewards, its value that of its first loss-mask token, GAE over the turns that have
    one (the others skipped), the turn's advantage and return at its tokens; at masked tokens
    advantage 0 and return the value."""
    length = len(rewards)
    turn_rewards, first = [0.0] * length, [length] * length
    for t in range(length):
        k = min(max(int(turn_ids[t]), 0), length - 1)
        if loss_mask[t]:
            turn_rewards[k] += rewards[t]
            first[k] = min(first[k], t)
    turn_values = [values[f] if f < length else 0.0 for f in first]
    turn_advantages, last = [0.0] * length, 0.0
    next_value = values[length - 1] * float(no_eos)
    for k in reversed(range(length)):
        delta = turn_rewards[k] + discount * next_value - turn_values[k]
        new = delta + discount * lam * last
        if first[k] < length:
            turn_advantages[k], next_value, last = new, turn_values[k], new
    advantages, returns = [0.0] * length, [0.0] * length
    for t in range(length):
        k = min(max(int(turn_ids[t]), 0), length - 1)
        m = loss_mask[t]
        advantages[t] = turn_advantages[k] * m
        returns[t] = (turn_advantages[k] + turn_values[k]) * m + values[t] * (1 - m)
    return advantages, returns


def areal_turn_contract_row(rewards, values, loss_mask, turn_ids, discount, lam):
    """The masked contract over AReaL's turns on one row: the rewards after the last trainable
    token (the outcome) joined to it, the rewards at other masked tokens dropped, zero
    bootstrap, advantages and returns 0 at masked tokens."""
    trainable = [t for t, m in enumerate(loss_mask) if m]
    kept = [r if m else 0.0 for r, m in zip(rewards, loss_mask)]
    if trainable:
        kept[trainable[-1]] += math.fsum(rewards[trainable[-1] + 1 :])
    advantages, returns = areal_turn_row(kept, values, loss_mask, turn_ids, False, discount, lam)
    return advantages, [ret if m else 0.0 for ret, m in zip(returns, loss_mask)]


def nemo_rl_kl(logprob, reference, kl_type):
    """NeMo-RL's ``calculate_kl`` on one token (its default clamps)."""
    logr = min(max(reference - logprob, -20.0), 20.0)
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = logr * logr / 2
    else:
        kl = math.exp(logr) - 1 - logr
    return min(max(kl, -10.0), 10.0)


def nemo_rl_token_rewards(reward, mask, logprobs, references, kl_coef, kl_type):
    """NeMo-RL's ``_build_token_level_rewards`` on one row: ``−kl_coef·KL`` at every token (when
    log-probs are given), the reward on the last mask-1 token, times the mask."""
    rewards = [0.0] * len(mask)
    if logprobs is not None and kl_coef > 0:
        rewards = [0.0 - kl_coef * nemo_rl_kl(p, q, kl_type) for p, q in zip(logprobs, references)]
    ones = [t for t, m in enumerate(mask) if m]
    if ones:
        rewards[ones[-1]] += reward
    return [r * m for r, m in zip(rewards, mask)]


def nemo_rl_gae_row(token_rewards, values, mask, gamma, lam):
    """NeMo-RL's ``_compute_gae`` on one row (carry-forward at masked positions)."""
    next_value, last, advantages = 0.0, 0.0, [0.0] * len(values)
    for t in reversed(range(len(values))):
        delta = token_rewards[t] + gamma * next_value - values[t]
        new = delta + gamma * lam * last
        m = mask[t]
        next_value = values[t] * m + (1 - m) * next_value
        last = new * m + (1 - m) * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def nemo_rl_length_lambda(alpha, mask):
    """NeMo-RL's length-adaptive λ of one row, in float32 as its ``.float()`` computes it."""
    length = np.float32(sum(1 for m in mask if m))
    scaled = max(np.float32(alpha) * length, np.float32(1.0))
    return np.float32(min(max(np.float32(1.0) - np.float32(1.0) / scaled, np.float32(0.0)), np.float32(1.0)))


def nemo_rl_whiten(rows, masks, dtype=np.float64):
    """NeMo-RL's ``_reward_whiten`` over the batch, then its ``masked_fill``, step by step as its
    tensors take it, each step rounded to ``dtype`` (the advantages' and the mask's; the sums
    exact, then rounded): ``masked_mean`` ``Σ(x·m)/(n + 1e-8)`` (in float32 ``n + 1e-8`` rounds
    to ``n``), ``masked_var`` about that mean, ``Σ((x − mean)²·m)/(n + 1e-8) · n/(n − 1)``
    (infinite for one token: it whitens to 0, or NaN where it equals its mean), then
    ``(x − mean)·rsqrt(var + 1e-8)``; 0 at masked tokens."""
    real = np.dtype(dtype).type
    pairs = [(real(x), real(m)) for row, mask in zip(rows, masks) for x, m in zip(row, mask)]
    with np.errstate(divide="ignore", invalid="ignore"):
        count = real(math.fsum(m for _, m in pairs))
        denominator = count + real(1e-8)
        mean = real(math.fsum(x * m for x, m in pairs)) / denominator
        squares = real(math.fsum((x - mean) * (x - mean) * m for x, m in pairs))
        var = squares / denominator * (count / (count - real(1)))
        inverse = real(1) / np.sqrt(var + real(1e-8))
        return [[float((real(x) - mean) * inverse) if m else 0.0 for x, m in zip(row, mask)]
                for row, mask in zip(rows, masks)]  # fmt: skip


def nemo_rl_contract_row(reward, values, mask, logprobs, references, kl_coef, kl_type, gamma, lam):
    """The masked contract on one NeMo-RL row: the KL rewards at mask-1 tokens, the reward as
    the terminal reward (on the last mask-1 token), 0 at masked positions."""
    kl = [0.0] * len(mask)
    if logprobs is not None and kl_coef > 0:
        kl = [0.0 - kl_coef * nemo_rl_kl(p, q, kl_type) for p, q in zip(logprobs, references)]
    return masked_gae_oracle(values, [k if m else 0.0 for k, m in zip(kl, mask)], mask, reward, gamma, lam)


__all__ = [
    "areal_token_row",
    "areal_turn_contract_row",
    "areal_turn_row",
    "contract_row",
    "nemo_rl_contract_row",
    "nemo_rl_gae_row",
    "nemo_rl_kl",
    "nemo_rl_length_lambda",
    "nemo_rl_token_rewards",
    "nemo_rl_whiten",
    "plain_gae_row",
    "roll_row",
]
