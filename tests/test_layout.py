"""The next trainable position of every token (``layout.next_trainable_index``), numpy and
torch, against a plain loop; and the skip-recursion profiles' carry, made on numpy in one
backward pass without it, with the bits of the torch path that gathers at it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gaecli.advantages import baselines, layout
from gaecli.advantages.dispatch import compute
from gaecli.advantages.spec import AdvantageSpec
from gaecli.pipeline.packing import PackedBatch, compute_packed


def next_trainable_by_loop(trainable: list[bool], offsets: list[int]) -> list[int]:
    """For every position, the first trainable position after it in its sample, -1 if none."""
    following = []
    for start, end in zip(offsets, offsets[1:]):
        for t in range(start, end):
            following.append(next((u for u in range(t + 1, end) if trainable[u]), -1))
    return following


def ragged(seed: int, samples: int, longest: int, trainable_share: float) -> tuple[np.ndarray, np.ndarray]:
    """A random mask and its offsets: empty, fully masked and fully trainable samples among them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest + 1, samples)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    trainable = rng.random(int(offsets[-1])) < trainable_share
    return trainable, offsets


CASES = [
    (0, 12, 9, 0.5),
    (1, 40, 30, 0.9),
    (2, 25, 6, 0.1),
    (3, 8, 20, 0.0),  # nothing trainable
    (4, 8, 20, 1.0),  # everything trainable
    (5, 1, 0, 0.5),  # one empty sample
]


@pytest.mark.parametrize("case", CASES, ids=[f"seed{case[0]}" for case in CASES])
def test_next_trainable_index_matches_a_loop_on_numpy_and_torch(case):
    trainable, offsets = ragged(*case)
    expected = next_trainable_by_loop(trainable.tolist(), offsets.tolist())
    got = layout.next_trainable_index(trainable, offsets)
    assert got.dtype == np.int64 and got.tolist() == expected
    assert layout.next_trainable_index(torch.from_numpy(trainable), torch.from_numpy(offsets)).tolist() == expected
    # int32 offsets (an Arrow list's) give the same
    assert layout.next_trainable_index(trainable, offsets.astype(np.int32)).tolist() == expected


def test_next_trainable_index_of_no_tokens_is_empty():
    got = layout.next_trainable_index(np.zeros(0, dtype=np.bool_), np.zeros(3, dtype=np.int64))
    assert got.dtype == np.int64 and got.shape == (0,)


def test_the_skip_profiles_carry_in_one_backward_pass_on_numpy_with_the_bits_of_torch(monkeypatch):
    trainable, offsets = ragged(7, 30, 25, 0.6)
    rng = np.random.default_rng(8)
    values, rewards = rng.normal(size=(2, trainable.size)).astype(np.float32)
    terminal = rng.normal(size=offsets.size - 1).astype(np.float32)
    packed = PackedBatch(values, rewards, trainable, offsets, terminal)
    calls = []

    def counted(*arguments):
        calls.append(1)
        return layout.next_trainable_index(*arguments)

    monkeypatch.setattr(baselines, "next_trainable_index", counted)
    for semantics in ("verl", "areal", "nemo-rl", "masked"):
        spec = AdvantageSpec(0.99, 0.95, semantics)
        before = len(calls)
        advantages, returns = compute_packed(packed, spec, "native", "cpu")
        assert len(calls) == before  # numpy: no index of the next trainable tokens
        tensors = [torch.from_numpy(array) for array in (values, rewards, trainable, offsets, terminal)]
        on_torch = compute(spec, *tensors, kernel="native", device="cpu")
        assert advantages.tobytes() == on_torch[0].numpy().tobytes()
        assert returns.tobytes() == on_torch[1].numpy().tobytes()
    assert len(calls) == 3  # torch: the gather of verl, areal and nemo-rl


def test_trainable_sums_and_spread_match_loops_with_empty_and_fully_masked_rows():
    rng = np.random.default_rng(3)
    lengths = np.array([0, 5, 3, 0, 7, 1])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rewards = rng.normal(size=offsets[-1]).astype(np.float32)
    trainable = rng.random(offsets[-1]) < 0.6
    trainable[offsets[2] : offsets[3]] = False  # a fully masked row
    sums, counts = layout.trainable_sums(rewards, trainable, offsets)
    every, every_counts = layout.trainable_sums(rewards, None, offsets)
    row_values = rng.normal(size=lengths.size)
    spread = layout.spread_to_trainable(row_values, trainable, offsets, np.float32)
    for row in range(lengths.size):
        total, count, whole = 0.0, 0, 0.0
        for t in range(offsets[row], offsets[row + 1]):
            whole += float(rewards[t])
            if trainable[t]:
                total += float(rewards[t])
                count += 1
            assert spread[t] == (np.float32(row_values[row]) if trainable[t] else 0.0)
        assert sums[row] == total and counts[row] == count
        assert every[row] == whole and every_counts[row] == lengths[row]
    assert sums.dtype == np.float64 and counts.dtype == np.int64 and spread.dtype == np.float32
