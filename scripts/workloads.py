"""Seeded synthetic rollout batches for benchmarks and sample files: flat numpy buffers plus
offsets, the layout every gaecli kernel takes.

Three shapes of batch, each a function of ``num_samples`` and ``seed``:

- ``agentic``: multi-turn rollouts. Response lengths are lognormal (median 3,000, σ = 0.9,
  clipped to [16, 32,768]); trainable turns of 50–800 tokens alternate with masked
  observation blocks of 20–1,500 tokens; 10 % of samples end in a masked tail, 2 % are fully
  masked.
- ``single-turn``: lengths uniform in [512, 8,192], every token trainable.
- ``long``: 131,072-token samples, about half of each masked in blocks of 256–8,192 tokens.

Everything is vectorised over the flat buffer (no Python loop over tokens or samples), so
the same functions scale to the ~16,000-row files used elsewhere::

    from scripts.workloads import make_workload
    batch = make_workload("agentic", num_samples=16_000, seed=1)
    batch.values, batch.offsets, ...      # numpy arrays
    batch.as_tensors()                    # the kernel's keyword arguments, as torch tensors
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

GAMMA = 0.99
LAMBD = 0.95


@dataclass(frozen=True)
class Workload:
    """One synthetic batch of B samples and N tokens.

    ``values``, ``rewards``: float32 ``[N]``; ``loss_mask``: bool ``[N]``; ``offsets``: int64
    ``[B + 1]`` with ``offsets[0] == 0`` and ``offsets[-1] == N``; ``terminal_rewards``:
    float32 ``[B]``. Sample ``i`` owns flat positions ``offsets[i]:offsets[i + 1]``.
    """

    name: str
    values: np.ndarray
    rewards: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    terminal_rewards: np.ndarray

    @property
    def num_samples(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.values.size)

    @property
    def lengths(self) -> np.ndarray:
        """Response length of every sample, int64 ``[B]``."""
        return np.diff(self.offsets)

    @property
    def trainable_lengths(self) -> np.ndarray:
        """Number of trainable tokens of every sample, int64 ``[B]``."""
        counted = np.zeros(self.num_tokens + 1, dtype=np.int64)
        np.cumsum(self.loss_mask, out=counted[1:])
        return counted[self.offsets[1:]] - counted[self.offsets[:-1]]

    def as_tensors(self) -> dict:
        """The kernel's positional inputs as CPU torch tensors sharing this batch's memory:
        ``values, rewards, loss_mask, offsets, terminal_rewards``."""
        import torch

        return {
            "values": torch.from_numpy(self.values),
            "rewards": torch.from_numpy(self.rewards),
            "loss_mask": torch.from_numpy(self.loss_mask),
            "offsets": torch.from_numpy(self.offsets),
            "terminal_rewards": torch.from_numpy(self.terminal_rewards),
        }


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """int64 ``[B + 1]`` offsets of samples with the given lengths."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def alternating_blocks(
    batch: int,
    max_length: int,
    trainable_block: tuple[int, int],
    masked_block: tuple[int, int],
    rng: np.random.Generator,
) -> np.ndarray:
    """Block lengths int64 ``[B, 2P]``: even columns trainable, odd columns masked, lengths
    uniform in the given inclusive ranges; every row adds up to more than ``max_length``."""
    pairs = max_length // (trainable_block[0] + masked_block[0]) + 1
    blocks = np.empty((batch, 2 * pairs), dtype=np.int64)
    blocks[:, 0::2] = rng.integers(trainable_block[0], trainable_block[1] + 1, size=(batch, pairs))
    blocks[:, 1::2] = rng.integers(masked_block[0], masked_block[1] + 1, size=(batch, pairs))
    return blocks


def blocks_to_mask(blocks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat bool mask ``[sum(lengths)]`` of the alternating blocks of
    :func:`alternating_blocks` (trainable first), each row cut at its sample's length: one
    ``np.repeat`` of the blocks' trainable flags."""
    lengths = np.asarray(lengths, dtype=np.int64)
    raw_ends = np.cumsum(blocks, axis=1)
    ends = np.minimum(raw_ends, lengths[:, None])
    starts = np.minimum(raw_ends - blocks, lengths[:, None])
    trainable = np.zeros(blocks.shape[1], dtype=bool)
    trainable[0::2] = True
    return np.repeat(np.broadcast_to(trainable, blocks.shape).ravel(), (ends - starts).ravel())


def alternating_block_mask(
    lengths: np.ndarray,
    trainable_block: tuple[int, int],
    masked_block: tuple[int, int],
    rng: np.random.Generator,
) -> np.ndarray:
    """Flat bool mask ``[sum(lengths)]``: every sample starts with a trainable block and then
    alternates masked / trainable blocks, block lengths uniform in the given inclusive
    ranges, the last block cut wherever the sample ends."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return np.zeros(0, dtype=bool)
    blocks = alternating_blocks(lengths.size, int(lengths.max()), trainable_block, masked_block, rng)
    return blocks_to_mask(blocks, lengths)


def prefix_mask(lengths: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Flat bool ``[sum(lengths)]``: True on the first ``kept[i]`` tokens of sample ``i``,
    False on the rest (``0 <= kept <= lengths``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    kept = np.asarray(kept, dtype=np.int64)
    runs = np.stack([kept, lengths - kept], axis=1).ravel()
    flags = np.tile(np.array([True, False]), lengths.size)
    return np.repeat(flags, runs)


def _random_rewards(total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Values ~ N(0, 1) and small KL-like per-token rewards ~ N(0, 0.01²), float32 ``[N]``."""
    values = rng.standard_normal(total, dtype=np.float32)
    rewards = rng.standard_normal(total, dtype=np.float32) * np.float32(0.01)
    return values, rewards


def _terminal_rewards(batch: int, rng: np.random.Generator) -> np.ndarray:
    """Terminal rewards: half the samples a {0, 1} outcome, the rest a N(0, 1) score."""
    outcome = rng.integers(0, 2, size=batch).astype(np.float32)
    score = rng.standard_normal(batch, dtype=np.float32)
    return np.where(rng.random(batch) < 0.5, outcome, score).astype(np.float32)


def agentic(
    num_samples: int = 256,
    seed: int = 0,
    *,
    median_length: float = 3000.0,
    max_length: int = 32_768,
    turn: tuple[int, int] = (50, 800),
    observation: tuple[int, int] = (20, 1_500),
    masked_tail_share: float = 0.10,
    fully_masked_share: float = 0.02,
) -> Workload:
    """Multi-turn agentic rollouts (see the module docstring; the keyword arguments change
    its figures, e.g. for small sample files).

    Each sample alternates trainable turns (``turn``: 50–800 tokens) and masked observations
    (``observation``: 20–1,500), starting with a turn. A target length is drawn from the lognormal and the
    sample is cut at the block boundary nearest to it: the end of a turn for most samples,
    the end of an observation for the 10 % that end in a masked tail. 2 % of the samples
    (disjoint from those) are then masked entirely.
    """
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=np.log(median_length), sigma=0.9, size=num_samples)
    target = np.clip(np.rint(raw), 16, max_length).astype(np.int64)
    blocks = alternating_blocks(num_samples, max_length, turn, observation, rng)

    order = rng.permutation(num_samples)
    n_tail = int(round(masked_tail_share * num_samples))
    n_masked = int(round(fully_masked_share * num_samples))
    ends_masked = np.zeros(num_samples, dtype=bool)
    ends_masked[order[:n_tail]] = True
    fully_masked = order[n_tail : n_tail + n_masked]

    # Cut each sample at the nearest boundary of the right kind that fits in max_length.
    raw_ends = np.cumsum(blocks, axis=1)
    block_is_masked = (np.arange(blocks.shape[1]) % 2 == 1)[None, :]
    allowed = (block_is_masked == ends_masked[:, None]) & (raw_ends <= max_length)
    distance = np.where(allowed, np.abs(raw_ends - target[:, None]), np.iinfo(np.int64).max)
    lengths = np.take_along_axis(raw_ends, distance.argmin(axis=1)[:, None], axis=1)[:, 0]
    offsets = offsets_from_lengths(lengths)
    loss_mask = blocks_to_mask(blocks, lengths)
    kept = lengths.copy()
    kept[fully_masked] = 0
    loss_mask &= prefix_mask(lengths, kept)

    values, rewards = _random_rewards(int(offsets[-1]), rng)
    return Workload("agentic", values, rewards, loss_mask, offsets, _terminal_rewards(num_samples, rng))


def single_turn(num_samples: int = 256, seed: int = 0) -> Workload:
    """Single-turn responses, lengths uniform in [512, 8,192], every token trainable."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(512, 8_193, size=num_samples).astype(np.int64)
    offsets = offsets_from_lengths(lengths)
    total = int(offsets[-1])
    loss_mask = np.ones(total, dtype=bool)
    values, rewards = _random_rewards(total, rng)
    return Workload("single-turn", values, rewards, loss_mask, offsets, _terminal_rewards(num_samples, rng))


def long(num_samples: int = 8, seed: int = 0, length: int = 131_072) -> Workload:
    """Long samples of ``length`` tokens, about half masked in blocks of 256–8,192 tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.full(num_samples, length, dtype=np.int64)
    offsets = offsets_from_lengths(lengths)
    total = int(offsets[-1])
    loss_mask = alternating_block_mask(lengths, (256, 8_192), (256, 8_192), rng)
    values, rewards = _random_rewards(total, rng)
    return Workload("long", values, rewards, loss_mask, offsets, _terminal_rewards(num_samples, rng))


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "agentic": agentic,
    "single-turn": single_turn,
    "long": long,
}


def make_workload(name: str, num_samples: int | None = None, seed: int = 0) -> Workload:
    """The workload ``name`` (a key of :data:`WORKLOADS`) with its default sample count
    unless ``num_samples`` is given."""
    try:
        generator = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}") from None
    if num_samples is None:
        return generator(seed=seed)
    return generator(num_samples=num_samples, seed=seed)


__all__ = [
    "GAMMA",
    "LAMBD",
    "WORKLOADS",
    "Workload",
    "agentic",
    "alternating_block_mask",
    "alternating_blocks",
    "blocks_to_mask",
    "long",
    "make_workload",
    "offsets_from_lengths",
    "prefix_mask",
    "single_turn",
]
