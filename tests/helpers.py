"""Test helpers: the one tolerance check, independent pure-Python GAE oracles, and random
ragged batches (a seeded builder plus a hypothesis strategy).

The oracles here share no code with gaecli: plain contiguous GAE, the masked contract
(compress, plain GAE, scatter) and the trainer profiles written as the trainers' own
loops, one sample at a time, all on Python floats (float64).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from hypothesis import strategies as st

import gaecli

# |got - ref| <= TOLERANCE[dtype] * (1 + max |ref|), the max taken per sample. float16 and
# bfloat16 results are computed in float32 and rounded once to their dtype: half an ulp of
# the largest (2^-11 and 2^-8 relative).
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
KERNEL_NAMES: list[str] = gaecli.available_kernels("cpu")
FAST_KERNEL_NAMES: list[str] = [name for name in KERNEL_NAMES if name != "reference"]


# ----------------------------------------------------------------------------- tolerance


def spec_document(gamma: float, lambd: float, **fields) -> dict:
    """An ``AdvantageSpec``'s JSON document (``to_dict``, the outputs' ``gaecli.spec``) written
    out field by field: the defaults, but ``fields``."""
    document = {
        "gamma": gamma,
        "lambd": lambd,
        "semantics": "masked",
        "normalize": "none",
        "normalize_by": None,
        "estimator": "gae",
        "timestep": "token",
        "lambd_critic": None,
        "lambd_alpha": None,
        "lambd_schedule": None,
        "lambd_q": None,
        "turn_rewards": None,
        "truncated": None,
        "bootstrap_values": None,
        "turn_ids": None,
        "group_by": None,
        "step_by": None,
        "baseline_rewards": None,
        "reward_components": None,
        "reward_weights": None,
        "log_probs": None,
        "sum_pi_squared": None,
        "whitening_rule": None,
        "advantage_clip": None,
        "episode_by": None,
        "turn_by": None,
        "state_by": None,
        "episode_weight": None,
        "step_weight": None,
    }
    assert set(fields) <= set(document), f"no spec field {sorted(set(fields) - set(document))}"
    return {**document, **fields}


def _as_samples(tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    return list(tensors)


def assert_close(name: str, ref, got, tolerance: float | None = None) -> float:
    """Assert ``got`` matches ``ref`` within ``tolerance * (1 + max|ref|)`` per sample.

    ``ref`` and ``got`` are both tensors (one sample) or both lists of tensors (one per
    sample; each scaled by its own ``max|ref|``). ``tolerance`` defaults to
    ``TOLERANCE[got.dtype]``. Checks shapes, NaN/inf in either side, prints one readable
    line (shown by pytest on failure) and returns the worst error ratio (error / allowed).
    """
    ref_samples, got_samples = _as_samples(ref), _as_samples(got)
    assert len(ref_samples) == len(got_samples), f"{name}: {len(got_samples)} samples, expected {len(ref_samples)}"
    worst_ratio, worst_error, worst_sample = 0.0, 0.0, None
    for index, (expected, actual) in enumerate(zip(ref_samples, got_samples)):
        assert expected.shape == actual.shape, (
            f"{name}: sample {index} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )
        assert torch.isfinite(expected).all(), f"{name}: sample {index}: the reference is not finite"
        assert torch.isfinite(actual).all(), f"{name}: sample {index}: NaN or inf in the result"
        allowed_tolerance = tolerance if tolerance is not None else TOLERANCE[actual.dtype]
        if expected.numel() == 0:
            continue
        expected64, actual64 = expected.detach().double().cpu(), actual.detach().double().cpu()
        error = float((actual64 - expected64).abs().max())
        allowed = allowed_tolerance * (1.0 + float(expected64.abs().max()))
        if error / allowed >= worst_ratio:
            worst_ratio, worst_error, worst_sample = error / allowed, error, index
    line = f"{name}: max abs error {worst_error:.3e} (sample {worst_sample}) = {worst_ratio:.3f} of the allowed error"
    print(line)
    assert worst_ratio <= 1.0, line
    return worst_ratio


def assert_bitwise(name: str, expected: torch.Tensor, got: torch.Tensor) -> None:
    """Assert two tensors are identical (``torch.equal``), naming the first difference."""
    assert expected.dtype == got.dtype, f"{name}: dtype {got.dtype}, expected {expected.dtype}"
    assert expected.shape == got.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(expected, got):
        differ = (expected != got).nonzero()
        first = int(differ[0, 0]) if differ.numel() else -1
        raise AssertionError(
            f"{name}: not bitwise equal; {differ.shape[0]} positions differ, first at {first}: "
            f"{expected[first].item()!r} vs {got[first].item()!r}"
        )


# ----------------------------------------------------------------------------- oracles


def plain_gae(values: Sequence[float], rewards: Sequence[float], gamma: float, lambd: float) -> list[float]:
    """Textbook GAE over a contiguous sequence, zero bootstrap after the last token."""
    advantages = [0.0] * len(values)
    carry, next_value = 0.0, 0.0
    for t in reversed(range(len(values))):
        delta = rewards[t] + gamma * next_value - values[t]
        carry = delta + gamma * lambd * carry
        advantages[t] = carry
        next_value = values[t]
    return advantages


def masked_gae_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """The contract for one sample: plain GAE on the trainable subsequence, the terminal
    reward on the last trainable token, scattered back with zeros at masked positions."""
    values, rewards, mask = _floats(values), _floats(rewards), [float(m) != 0.0 for m in _floats(mask)]
    trainable = [t for t, keep in enumerate(mask) if keep]
    sub_values = [values[t] for t in trainable]
    sub_rewards = [rewards[t] for t in trainable]
    if sub_rewards:
        sub_rewards[-1] += float(terminal)
    sub_advantages = plain_gae(sub_values, sub_rewards, gamma, lambd)
    advantages, returns = [0.0] * len(values), [0.0] * len(values)
    for t, advantage in zip(trainable, sub_advantages):
        advantages[t] = advantage
        returns[t] = advantage + values[t]
    return advantages, returns


def unmasked_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """slime (``megatron_utils/loss.py``: z added to the last token's reward;
    ``ppo_utils.vanilla_gae``) and pre-fix miles: every token a transition, terminal reward
    on token R-1."""
    values, rewards = _floats(values), _floats(rewards)
    if rewards:
        rewards[-1] += float(terminal)
    advantages = plain_gae(values, rewards, gamma, lambd)
    return advantages, [a + v for a, v in zip(advantages, values)]


def skyrl_oracle(values, rewards, mask, terminal, gamma, lambd, padding: int = 3) -> tuple[list[float], list[float]]:
    """SkyRL (``ppo_utils.compute_gae_advantage_return``; a response-level reward on the
    response's last token, ``trainer.postprocess_generator_output``): the sample laid out as
    SkyRL lays it, right-aligned after ``padding`` leading columns (prompt positions, with
    values and rewards of their own), then one loop over every column from the last (next
    value 0 there), the mask read nowhere; returns = advantages + values before whitening. The
    response's columns are returned."""
    values, rewards = _floats(values), _floats(rewards)
    width = padding + len(values)
    row_values = [0.75 * (column + 1) for column in range(padding)] + values
    row_rewards = [0.5] * padding + rewards
    if values:
        row_rewards[width - 1] += float(terminal)
    advantages = [0.0] * width
    carry = 0.0
    for column in reversed(range(width)):
        following = row_values[column + 1] if column < width - 1 else 0.0
        carry = row_rewards[column] + gamma * following - row_values[column] + gamma * lambd * carry
        advantages[column] = carry
    response = advantages[padding:]
    return response, [a + v for a, v in zip(response, values)]


def verl_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """verl (``core_algos.compute_gae_advantage_return`` with ``response_mask``; the reward
    managers put z on token ``valid_response_length - 1`` = R-1): a masked step leaves the
    next value and the carry as they were, and the loop stores the carry it holds after the
    step, so a masked position gets the next trainable token's advantage (0 after the last).
    Returns = advantages + values everywhere."""
    values, rewards, mask = _floats(values), _floats(rewards), _floats(mask)
    if rewards:
        rewards[-1] += float(terminal)
    advantages = _carry_forward_gae(values, rewards, mask, gamma, lambd)
    return advantages, [a + v for a, v in zip(advantages, values)]


def _carry_forward_gae(values, rewards, mask, gamma, lambd) -> list[float]:
    """The loop verl and NeMo-RL share: walking back, a masked step leaves the next value and
    the carry as they were; every position stores the carry held after its step."""
    advantages = [0.0] * len(values)
    next_value, carry = 0.0, 0.0
    for t in reversed(range(len(values))):
        step = rewards[t] + gamma * next_value - values[t] + gamma * lambd * carry
        if mask[t]:
            next_value, carry = values[t], step
        advantages[t] = carry
    return advantages


def areal_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """AReaL (``trainer/ppo/actor.py``, ``PPOActor._compute_advantages``) without a bootstrap
    value: z on the last response token, the loop walks back from the end holding
    ``nextvalues`` and ``lastgaelam``, both blended with the mask, and appends ``lastgaelam``.
    Returns = advantages + values."""
    values, rewards, mask = _floats(values), _floats(rewards), _floats(mask)
    length = len(values)
    shaped = list(rewards)
    if length:
        shaped[length - 1] = shaped[length - 1] + float(terminal)
    reversed_advantages = []
    next_values, last_gae = 0.0, 0.0
    for t in range(length - 1, -1, -1):
        delta = shaped[t] + gamma * next_values - values[t]
        new_gae = delta + gamma * lambd * last_gae
        keep = 1.0 - mask[t]
        next_values = next_values if keep else values[t]
        last_gae = last_gae if keep else new_gae
        reversed_advantages.append(last_gae)
    advantages = reversed_advantages[::-1]
    return advantages, [a + v for a, v in zip(advantages, values)]


def roll_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """ROLL (``functionals.expand_to_token_level``, ``compute_gae_advantage_return``,
    ``agentic/utils.agentic_compute_advantage``): z on the last token, then the token
    rewards times the mask; plain GAE over every token with the values unmasked; returns =
    advantages + values before the advantages are multiplied by the mask."""
    values, mask = _floats(values), _floats(mask)
    token_rewards = _floats(rewards)
    if token_rewards:
        token_rewards[-1] += float(terminal)
    token_rewards = [r * m for r, m in zip(token_rewards, mask)]
    advantages = plain_gae(values, token_rewards, gamma, lambd)
    returns = [a + v for a, v in zip(advantages, values)]
    return [a * m for a, m in zip(advantages, mask)], returns


def nemo_rl_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """NeMo-RL (``advantage_estimator.GeneralizedAdvantageEstimator``): z on the last token
    with mask 1 (dropped when there is none), rewards times the mask, the carry-forward loop
    (``_compute_gae``), returns = advantages + values, then advantages set to 0 where the
    mask is 0."""
    values, mask = _floats(values), _floats(mask)
    token_rewards = _floats(rewards)
    trainable = [t for t, m in enumerate(mask) if m]
    if trainable:
        token_rewards[trainable[-1]] += float(terminal)
    token_rewards = [r * m for r, m in zip(token_rewards, mask)]
    advantages = _carry_forward_gae(values, token_rewards, mask, gamma, lambd)  # NeMo-RL's _compute_gae
    returns = [a + v for a, v in zip(advantages, values)]
    return [a if m else 0.0 for a, m in zip(advantages, mask)], returns


def zero_masked_oracle(values, rewards, mask, terminal, gamma, lambd) -> tuple[list[float], list[float]]:
    """OpenRLHF: values and rewards times the mask, terminal reward on the last trainable
    token, every token a transition; returns = advantages + zeroed values."""
    mask = [float(m) for m in _floats(mask)]
    values = [v * m for v, m in zip(_floats(values), mask)]
    rewards = [r * m for r, m in zip(_floats(rewards), mask)]
    trainable = [t for t, m in enumerate(mask) if m]
    if trainable:
        rewards[trainable[-1]] += float(terminal)
    advantages = plain_gae(values, rewards, gamma, lambd)
    return advantages, [a + v for a, v in zip(advantages, values)]


ORACLES = {
    "masked": masked_gae_oracle,
    "verl": verl_oracle,
    "openrlhf": zero_masked_oracle,
    "slime": unmasked_oracle,
    "roll": roll_oracle,
    "areal": areal_oracle,
    "nemo-rl": nemo_rl_oracle,
    "skyrl": skyrl_oracle,
    # The generic names of earlier releases, each the trainer's loop it names.
    "unmasked": unmasked_oracle,
    "skip-masked": verl_oracle,
    "zero-masked": zero_masked_oracle,
}


def variant_oracle(
    values,
    rewards,
    mask,
    terminal,
    gamma,
    lambd,
    *,
    timestep: str = "token",
    lambd_critic: float | None = None,
    lambd_alpha: float | None = None,
    turn_rewards: Sequence[float] | None = None,
    truncated: bool = False,
    bootstrap: float = 0.0,
    lambd_schedule: str | None = None,
    lambd_q: float | None = None,
    turn_ids: Sequence[int] | None = None,
) -> tuple[list[float], list[float]]:
    """The GAE variants (docs/variants.md) for one sample, written from their definitions as
    explicit discounted sums (A_k = Σ_{j ≥ k} (γλ)^{j−k} δ_j), not as the kernels' backward
    recursion. Timesteps: the trainable tokens, or the turns (maximal runs of trainable
    tokens) with the value of a turn's first token; the reward of turn u's last token (token
    mode) or of turn u (turn mode) gains ``turn_rewards[u]``; z goes on the last timestep;
    the value after the last timestep is ``bootstrap`` when ``truncated``. With ``turn_ids``
    (turn mode) turn u is the trainable tokens of the u-th distinct id, in id order.
    ``lambd_schedule="relative-position"``: λ = q^(1/(L−1)) for L ≥ 2 timesteps, 1 for L = 1."""
    values, rewards, mask = _floats(values), _floats(rewards), [float(m) != 0.0 for m in _floats(mask)]
    turns: list[list[int]] = []
    if turn_ids is not None:
        by_id: dict[int, list[int]] = {}
        for t, keep in enumerate(mask):
            if keep:
                by_id.setdefault(int(turn_ids[t]), []).append(t)
        turns = [by_id[key] for key in sorted(by_id)]
    for t, keep in enumerate(mask if turn_ids is None else []):
        if keep:
            if t > 0 and mask[t - 1]:
                turns[-1].append(t)
            else:
                turns.append([t])
    bonus = [0.0] * len(turns) if turn_rewards is None else [float(x) for x in turn_rewards]
    if timestep == "turn":
        steps = [(turn, values[turn[0]], bonus[u]) for u, turn in enumerate(turns)]
    else:
        steps = [
            ([t], values[t], rewards[t] + (bonus[u] if t == turn[-1] else 0.0))
            for u, turn in enumerate(turns)
            for t in turn
        ]
    count = len(steps)
    step_values = [value for _, value, _ in steps] + [float(bootstrap) if truncated else 0.0]
    step_rewards = [reward for _, _, reward in steps]
    if count:
        step_rewards[-1] += float(terminal)
    deltas = [step_rewards[k] + gamma * step_values[k + 1] - step_values[k] for k in range(count)]

    def discounted(lam: float) -> list[float]:
        return [sum((gamma * lam) ** (j - k) * deltas[j] for j in range(k, count)) for k in range(count)]

    advantage_lambd = lambd  # the length-adaptive λ shapes the advantages only
    if lambd_alpha is not None:
        advantage_lambd = min(max(1.0 - 1.0 / max(lambd_alpha * count, 1.0), 0.0), 1.0)
    if lambd_schedule == "relative-position":
        advantage_lambd = lambd_q ** (1.0 / (count - 1)) if count >= 2 else float(count == 1)
    advantages_k = discounted(advantage_lambd)
    returns_k = discounted(lambd if lambd_critic is None else lambd_critic)
    advantages, returns = [0.0] * len(values), [0.0] * len(values)
    for k, (positions, value, _) in enumerate(steps):
        for t in positions:
            advantages[t] = advantages_k[k] + (rewards[t] if timestep == "turn" else 0.0)
            returns[t] = returns_k[k] + value
    return advantages, returns


def _floats(xs) -> list[float]:
    if isinstance(xs, torch.Tensor):
        return [float(x) for x in xs.detach().double().cpu().tolist()]
    return [float(x) for x in xs]


# ----------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """A ragged batch in list form (one 1-D tensor per sample) plus its discount."""

    values: list[torch.Tensor]
    rewards: list[torch.Tensor]
    masks: list[torch.Tensor]
    terminals: list[float]
    gamma: float
    lambd: float
    dtype: torch.dtype = torch.float32
    kinds: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)

    def args(self) -> tuple:
        return self.values, self.rewards, self.masks, self.terminals

    def subset(self, indices: Sequence[int]) -> "Batch":
        pick = lambda xs: [xs[i] for i in indices]  # noqa: E731
        return Batch(
            pick(self.values),
            pick(self.rewards),
            pick(self.masks),
            pick(self.terminals),
            self.gamma,
            self.lambd,
            self.dtype,
        )

    def as_float64(self) -> "Batch":
        to64 = lambda xs: [x.double() for x in xs]  # noqa: E731
        return Batch(
            to64(self.values), to64(self.rewards), self.masks, self.terminals, self.gamma, self.lambd, torch.float64
        )

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(values, rewards, loss_mask, offsets, terminal_rewards)`` flat."""
        offsets = torch.tensor([0, *itertools.accumulate(v.numel() for v in self.values)], dtype=torch.int64)
        cat = lambda xs, dtype: torch.cat(xs) if xs else torch.zeros(0, dtype=dtype)  # noqa: E731
        return (
            cat(self.values, self.dtype),
            cat(self.rewards, self.dtype),
            cat(self.masks, torch.bool),
            offsets,
            torch.tensor(self.terminals, dtype=torch.float64),
        )


MASK_KINDS = ("random", "blocks", "zeros", "ones", "masked-tail", "masked-head")


def alternating_blocks(length: int, bound: int, rng: np.random.Generator, trainable: bool = True) -> np.ndarray:
    """A bool mask of ``length``: blocks of ``rng.integers(1, bound)`` tokens, trainable and
    masked in turn, the first ``trainable``."""
    mask = np.zeros(length, dtype=bool)
    position = 0
    while position < length:
        block = int(rng.integers(1, bound))
        mask[position : position + block] = trainable
        position, trainable = position + block, not trainable
    return mask


def make_mask(kind: str, length: int, rng: np.random.Generator) -> torch.Tensor:
    """A bool mask of ``length`` of the given kind (random tokens, alternating blocks, all
    zeros, all ones, trainable then a masked tail, a masked head then trainable)."""
    if kind == "random":
        mask = rng.random(length) < rng.uniform(0.2, 0.9)
    elif kind == "blocks":
        mask = alternating_blocks(length, 9, rng, trainable=bool(rng.integers(2)))
    elif kind == "zeros":
        mask = np.zeros(length, dtype=bool)
    elif kind == "ones":
        mask = np.ones(length, dtype=bool)
    elif kind == "masked-tail":
        mask = np.arange(length) < int(rng.integers(0, length + 1))
    elif kind == "masked-head":
        mask = np.arange(length) >= int(rng.integers(0, length + 1))
    else:
        raise ValueError(kind)
    return torch.from_numpy(mask.copy())


def make_batch(
    seed: int,
    lengths: Sequence[int],
    kinds: Sequence[str] | None = None,
    *,
    gamma: float = 0.99,
    lambd: float = 0.95,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """A seeded random ragged batch: values ~ N(0, s), rewards ~ N(0, s/4) with a random
    scale s per sample, terminal rewards in [-2, 2]."""
    rng = np.random.default_rng(seed)
    kinds = list(kinds) if kinds is not None else [MASK_KINDS[int(rng.integers(len(MASK_KINDS)))] for _ in lengths]
    values, rewards, masks, terminals = [], [], [], []
    for length, kind in zip(lengths, kinds):
        scale = float(rng.choice([0.01, 1.0, 10.0]))
        values.append(torch.from_numpy(rng.normal(0.0, scale, length)).to(dtype))
        rewards.append(torch.from_numpy(rng.normal(0.0, scale / 4, length)).to(dtype))
        masks.append(make_mask(kind, length, rng))
        terminals.append(float(np.float32(rng.uniform(-2.0, 2.0))))
    return Batch(values, rewards, masks, terminals, gamma, lambd, dtype, list(kinds))


def discounts() -> st.SearchStrategy[float]:
    """γ or λ: exactly 0 or 1 often, else anywhere in [0, 1]."""
    return st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.95, 0.99]), st.floats(0.0, 1.0))


@st.composite
def ragged_batches(draw, max_samples: int = 6, max_length: int = 60, dtype: torch.dtype | None = None) -> Batch:
    """Random ragged batches: 0..max_samples samples of length 0..max_length, every mask
    kind (all-zero and all-one included), γ and λ including exactly 0 and 1, float32 and
    float64 (unless ``dtype`` is given). The numbers come from a drawn seed (fast); the
    structure is drawn directly."""
    count = draw(st.integers(0, max_samples))
    lengths = draw(
        st.lists(st.one_of(st.integers(0, max_length), st.sampled_from([0, 1, 2])), min_size=count, max_size=count)
    )
    kinds = draw(st.lists(st.sampled_from(MASK_KINDS), min_size=count, max_size=count))
    seed = draw(st.integers(0, 2**32 - 1))
    if dtype is None:
        dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return make_batch(seed, lengths, kinds, gamma=draw(discounts()), lambd=draw(discounts()), dtype=dtype)


def oracle_batch(semantics: str, batch: Batch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The pure-Python oracle of ``semantics`` over every sample, as float64 tensors."""
    advantages, returns = [], []
    for values, rewards, mask, terminal in zip(*batch.args()):
        sample_advantages, sample_returns = ORACLES[semantics](
            values, rewards, mask, terminal, batch.gamma, batch.lambd
        )
        advantages.append(torch.tensor(sample_advantages, dtype=torch.float64))
        returns.append(torch.tensor(sample_returns, dtype=torch.float64))
    return advantages, returns


# ----------------------------------------------------------------------------- critic-free oracle

GROUP_EPSILON = 1e-6  # the group statistics' ε (grpo, maxrl, grpo-passk, gdpo)
WHITEN_EPSILON = 1e-8  # the whitening's ε (reinforce++, reinforce++-baseline, gdpo)


def critic_free_oracle(
    estimator: str,
    rewards: Sequence[Sequence[float]],
    masks: Sequence[Sequence[float]],
    terminals: Sequence[float],
    groups: Sequence | None = None,
    steps: Sequence | None = None,
    gamma: float | None = None,
    *,
    baselines: Sequence[float] | None = None,
    components: Sequence[Sequence[float]] | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[list[list[float]], list[list[float]]]:
    """The critic-free estimators of docs/estimators.md as plain Python loops on floats, one
    sample at a time, groups in a dict (written apart from gaecli's numpy code; exact sums by
    ``math.fsum``). Returns (advantages, returns) as lists of lists.

    ``baselines``: remax's baseline reward, one per sample. ``components``: gdpo's reward
    components, one sequence per component with one value per sample; ``weights`` one per
    component (None: all 1). gdpo reads neither ``rewards`` nor ``terminals``."""
    if estimator == "remax":
        return _remax_oracle(rewards, masks, terminals, baselines)
    if estimator == "gdpo":
        return _gdpo_oracle(masks, groups, steps, components, weights)
    samples = len(rewards)
    groups = list(groups) if groups is not None else [None] * samples
    steps = list(steps) if steps is not None else [None] * samples
    scores, counts = _scores_and_counts(rewards, masks, terminals)
    members = _members(groups)
    mean, std, opo, passk = {}, {}, {}, [0.0] * samples
    for group, indices in members.items():
        values = [scores[i] for i in indices]
        n = len(values)
        if n == 1:
            mean[group], std[group], opo[group] = 0.0, 1.0, 0.0
            continue
        mean[group] = _group_mean(values)
        std[group] = _bessel_std(values, mean[group])
        tokens = sum(counts[i] for i in indices)
        opo[group] = math.fsum(counts[i] * scores[i] for i in indices) / tokens if tokens else 0.0
        top, second = sorted(values, reverse=True)[:2]
        if top > second:  # the one best sample; a tied best gives all 0
            best = next(i for i in indices if scores[i] == top)
            passk[best] = (top - second) / (std[group] + GROUP_EPSILON)
    alpha = {}
    for step in set(steps):
        rows = [i for i in range(samples) if steps[i] == step]
        alpha[step] = len(rows) / max(1, sum(1 for i in rows if scores[i] != 0.0))

    def row_value(i: int) -> float:
        s, g = scores[i], groups[i]
        n = len(members[g])
        if estimator == "grpo":
            return (s - mean[g]) / (std[g] + GROUP_EPSILON)
        if estimator in ("dr-grpo", "reinforce++-baseline"):
            return s - mean[g]
        if estimator == "rloo":
            return n / (n - 1) * (s - mean[g]) if n > 1 else s
        if estimator == "opo":
            return s - opo[g]
        if estimator == "gpg":
            return alpha[steps[i]] * (s - mean[g])
        if estimator == "maxrl":
            return (s - mean[g]) / (mean[g] + GROUP_EPSILON) if n > 1 else s
        if estimator == "grpo-passk":
            return passk[i]
        raise ValueError(estimator)

    if estimator == "reinforce++":
        returns = []
        for reward, mask, terminal in zip(rewards, masks, terminals):
            out = [0.0] * len(reward)
            positions = [t for t, m in enumerate(mask) if m]
            carry = 0.0
            for k in reversed(range(len(positions))):
                t = positions[k]
                carry = float(reward[t]) + (float(terminal) if k == len(positions) - 1 else 0.0) + gamma * carry
                out[t] = carry
            returns.append(out)
        advantages = returns
    else:
        advantages = [[row_value(i) if m else 0.0 for m in masks[i]] for i in range(samples)]
        returns = advantages
    if estimator in ("reinforce++", "reinforce++-baseline"):
        whitened = _whiten_trainable(advantages, masks, steps)
        if estimator == "reinforce++-baseline":
            returns = whitened
        advantages = whitened
    return advantages, returns


def _scores_and_counts(rewards, masks, terminals) -> tuple[list[float], list[int]]:
    """Each sample's score (z plus its rewards at trainable tokens) and trainable count."""
    scores, counts = [], []
    for reward, mask, terminal in zip(rewards, masks, terminals):
        kept = [float(r) for r, m in zip(reward, mask) if m]
        scores.append(math.fsum(kept) + float(terminal))
        counts.append(len(kept))
    return scores, counts


def _members(groups) -> dict:
    """Each group's sample indices, in sample order."""
    members: dict = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    return members


def _group_mean(values: Sequence[float]) -> float:
    """The mean; exactly the value when all values are the same."""
    if all(v == values[0] for v in values):
        return values[0]
    return math.fsum(values) / len(values)


def _bessel_std(values: Sequence[float], mean: float) -> float:
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _whiten_trainable(per_token, masks, steps) -> list[list[float]]:
    """``(x − mean) / sqrt(var + 1e-8)`` over the trainable tokens of each step (Bessel
    variance, 0 for one token); masked positions 0."""
    samples = len(per_token)
    whitened = [[0.0] * len(a) for a in per_token]
    for step in set(steps):
        cells = [(i, t) for i in range(samples) if steps[i] == step for t, m in enumerate(masks[i]) if m]
        if not cells:
            continue
        numbers = [per_token[i][t] for i, t in cells]
        mu = math.fsum(numbers) / len(numbers)
        var = math.fsum((x - mu) ** 2 for x in numbers) / (len(numbers) - 1) if len(numbers) > 1 else 0.0
        for (i, t), x in zip(cells, numbers):
            whitened[i][t] = (x - mu) / math.sqrt(var + WHITEN_EPSILON)
    return whitened


def _remax_oracle(rewards, masks, terminals, baselines) -> tuple[list[list[float]], list[list[float]]]:
    """ReMax: G_k = z + Σ_{j ≥ k} r[idx_j] over the trainable positions (γ = 1), each a sum
    of its own; returns G, advantages G − b; 0 at masked positions."""
    advantages, returns = [], []
    for reward, mask, terminal, baseline in zip(rewards, masks, terminals, baselines):
        positions = [t for t, m in enumerate(mask) if m]
        row_returns, row_advantages = [0.0] * len(reward), [0.0] * len(reward)
        for k, t in enumerate(positions):
            following = math.fsum([float(reward[j]) for j in positions[k:]] + [float(terminal)])
            row_returns[t], row_advantages[t] = following, following - float(baseline)
        advantages.append(row_advantages)
        returns.append(row_returns)
    return advantages, returns


def _gdpo_oracle(masks, groups, steps, components, weights) -> tuple[list[list[float]], list[list[float]]]:
    """GDPO: each component normalised in its group (a group of one: μ 0, σ 1), the weighted
    sum per sample, whitened over the trainable tokens of the input or of each step (a sample
    counts once per trainable token); returns = advantages."""
    samples = len(masks)
    steps = list(steps) if steps is not None else [None] * samples
    weights = [1.0] * len(components) if weights is None else [float(w) for w in weights]
    members = _members(groups)
    normalised = []
    for column in components:
        values = [float(v) for v in column]
        row_values = [0.0] * samples
        for indices in members.values():
            mu, sigma = 0.0, 1.0
            if len(indices) > 1:
                mu = _group_mean([values[i] for i in indices])
                sigma = _bessel_std([values[i] for i in indices], mu)
            for i in indices:
                row_values[i] = (values[i] - mu) / (sigma + GROUP_EPSILON)
        normalised.append(row_values)
    totals = [math.fsum(w * column[i] for w, column in zip(weights, normalised)) for i in range(samples)]
    per_token = [[totals[i] if m else 0.0 for m in masks[i]] for i in range(samples)]
    advantages = _whiten_trainable(per_token, masks, steps)
    return advantages, advantages


TOKEN_BASELINE_EPSILON = 1e-8  # optimal-token-baseline's ε: b_k = Σ G·W / (Σ W + ε)


def token_baseline_oracle(
    rewards: Sequence[Sequence[float]],
    masks: Sequence[Sequence[float]],
    terminals: Sequence[float],
    groups: Sequence,
    log_probs: Sequence[Sequence[float]],
    sum_pi_squared: Sequence[Sequence[float]],
) -> tuple[list[list[float]], list[list[float]]]:
    """optimal-token-baseline of docs/estimators.md as plain Python loops on floats, one
    sample at a time (written apart from gaecli's numpy code; the group sums by ``math.fsum``):
    over each sample's trainable tokens only, ``w = 1 − 2·exp(logp) + Σπ²``, ``W_k`` its
    running sum, ``G_k`` the rewards from k on plus the terminal reward; per group and
    position k, ``b_k = Σ G·W / (Σ W + ε)`` over the samples that reach k (0 where fewer than
    two do). Returns (advantages, returns), 0 at masked positions."""
    paths = []  # per sample: [(token index, G, W)] over its trainable tokens
    for reward, mask, terminal, logp, spsq in zip(rewards, masks, terminals, log_probs, sum_pi_squared):
        kept = [t for t in range(len(mask)) if mask[t] != 0]
        weights, total = [], 0.0
        for t in kept:
            total += 1.0 - 2.0 * math.exp(logp[t]) + spsq[t]
            weights.append(total)
        returns, running = [0.0] * len(kept), float(terminal)
        for k in range(len(kept) - 1, -1, -1):
            running = reward[kept[k]] + running
            returns[k] = running
        paths.append([(t, returns[k], weights[k]) for k, t in enumerate(kept)])
    members: dict = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    advantages = [[0.0] * len(mask) for mask in masks]
    returns_out = [[0.0] * len(mask) for mask in masks]
    for indices in members.values():
        longest = max((len(paths[i]) for i in indices), default=0)
        for k in range(longest):
            reach = [paths[i][k] for i in indices if len(paths[i]) > k]
            baseline = 0.0
            if len(reach) >= 2:
                numerator = math.fsum(g * w for _, g, w in reach)
                baseline = numerator / (math.fsum(w for _, _, w in reach) + TOKEN_BASELINE_EPSILON)
            for i in indices:
                if len(paths[i]) > k:
                    t, g, _ = paths[i][k]
                    advantages[i][t] = g - baseline
                    returns_out[i][t] = g
    return advantages, returns_out


def turn_rows_oracle(estimator, episodes, turns, turn_rewards, outcomes, groups, states, gamma, *,
                     method="mean_std", episode_weight=1.0, step_weight=1.0):  # fmt: skip
    """gigpo and step-reinforce on turn rows, a float64 loop written from ROLL's
    ``roll/pipeline/agentic/utils.py`` (docs/episodes.md): each row's discounted return over
    the later turns of its episode (by turn index), normalised per group of rows
    (``mean_std``: ``(x − μ)/(σ + 1e-6)`` with the Bessel σ, 0 for a group of one or σ ≤ 1e-6;
    ``mean``: ``x − μ``); gigpo adds the outcome normalised per episode group, the return per
    (group, state). One advantage per row."""
    rows = len(episodes)
    returns = [0.0] * rows
    for episode in set(episodes):
        members = sorted((turns[row], row) for row in range(rows) if episodes[row] == episode)
        running = 0.0
        for _, row in reversed(members):
            running = turn_rewards[row] + gamma * running
            returns[row] = running

    def normalised(values, keys):
        out = [0.0] * rows
        for key in set(keys):
            members = [row for row in range(rows) if keys[row] == key]
            group = [values[row] for row in members]
            mean = math.fsum(group) / len(group)
            std = _bessel_std(group, mean) if len(group) > 1 else 0.0
            for row in members:
                if method == "mean":
                    out[row] = values[row] - mean
                elif len(group) > 1 and std > 1e-6:
                    out[row] = (values[row] - mean) / (std + 1e-6)
        return out

    if estimator == "step-reinforce":
        return normalised(returns, groups)
    episode_part = normalised(list(map(float, outcomes)), groups)
    step_part = normalised(returns, [(group, state) for group, state in zip(groups, states)])
    return [episode_weight * a + step_weight * b for a, b in zip(episode_part, step_part)]


def episode_gae_oracle(values, rewards, masks, outcomes, episodes, turns, turn_rewards, gamma, lambd):
    """Masked GAE over episodes (docs/episodes.md), a float64 loop: each episode's rows in
    turn order, their trainable tokens one subsequence (a row's turn reward added on its last
    trainable token, the outcome on the episode's last), plain GAE over it with zero bootstrap,
    scattered back; returns = advantages + values. Lists per row."""
    rows = len(values)
    advantages = [[0.0] * len(mask) for mask in masks]
    returns = [[0.0] * len(mask) for mask in masks]
    for episode in dict.fromkeys(episodes):
        members = sorted((turns[row], row) for row in range(rows) if episodes[row] == episode)
        places, sub_values, sub_rewards = [], [], []
        for _, row in members:
            kept = [t for t, keep in enumerate(masks[row]) if keep]
            for t in kept:
                places.append((row, t))
                sub_values.append(float(values[row][t]))
                sub_rewards.append(float(rewards[row][t]))
            if kept:
                sub_rewards[-1] += float(turn_rewards[row])
        if not places:
            continue
        sub_rewards[-1] += float(outcomes[members[-1][1]])
        for (row, t), advantage, value in zip(places, plain_gae(sub_values, sub_rewards, gamma, lambd), sub_values):
            advantages[row][t] = advantage
            returns[row][t] = advantage + value
    return advantages, returns


def episode_outcome_oracle(estimator, rewards, masks, outcomes, episodes, turns, groups=None, steps=None,
                           gamma=None):  # fmt: skip
    """The critic-free estimators over episodes (docs/episodes.md): each episode's rows, in turn
    order, joined into one sample (its outcome as the terminal reward, its group and step its
    first row's), :func:`critic_free_oracle` over those samples, each sample's per-token
    results split back to its rows. Lists per row."""
    rows = len(rewards)
    order = {episode: sorted(range(rows), key=lambda row: turns[row]) for episode in dict.fromkeys(episodes)}
    members = {episode: [row for row in ranked if episodes[row] == episode] for episode, ranked in order.items()}
    joined = list(members.values())
    sample_rewards = [[float(r) for row in rows_ for r in rewards[row]] for rows_ in joined]
    sample_masks = [[m for row in rows_ for m in masks[row]] for rows_ in joined]
    sample_outcomes = [float(outcomes[rows_[0]]) for rows_ in joined]
    sample_groups = None if groups is None else [groups[rows_[0]] for rows_ in joined]
    sample_steps = None if steps is None else [steps[rows_[0]] for rows_ in joined]
    advantages, returns = critic_free_oracle(estimator, sample_rewards, sample_masks, sample_outcomes, sample_groups,
                                             sample_steps, gamma)  # fmt: skip
    out_a, out_r = [None] * rows, [None] * rows
    for rows_, sample_a, sample_r in zip(joined, advantages, returns):
        start = 0
        for row in rows_:
            end = start + len(masks[row])
            out_a[row], out_r[row] = list(sample_a[start:end]), list(sample_r[start:end])
            start = end
    return out_a, out_r
