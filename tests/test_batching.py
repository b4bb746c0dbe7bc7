"""Automatic batch sizes (about a million tokens a batch, from the footer) and the cheap
checks that let large batches of short rows run at the speed of their tokens: the global
overflow bound, the suffix-only terminal-credit probe and the one-pass whitening."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gaecli.io.reader as reader
from gaecli.advantages.layout import last_trainable_index, masked_tail_lengths
from gaecli.checks import check_batch
from gaecli.comparison.figures import terminal_credit
from gaecli.io.format import Columns
from gaecli.io.reader import BATCH_TOKENS, MAX_BATCH_ROWS, MIN_BATCH_ROWS, RolloutFile, rows_for_tokens
from gaecli.overflow import VALUE_WEIGHT, cannot_overflow
from gaecli.recompute import RecomputeOptions, recompute_files

from rollout_files import random_rollouts, rollout_table, write_table

GAMMA, LAMBD = 0.99, 0.95


@pytest.mark.parametrize(
    "rows, tokens, expected",
    [
        (1000, 64_000, BATCH_TOKENS // 64),  # short rows: a million tokens a batch
        (100, 409_600, MIN_BATCH_ROWS),  # 4,096-token rows: the least batch
        (1000, 2_000, MAX_BATCH_ROWS),  # two-token rows: the most rows
        (0, 0, MAX_BATCH_ROWS),  # nothing to read: any size
        (10, 0, MAX_BATCH_ROWS),  # all empty rows
    ],
)
def test_rows_for_tokens(rows, tokens, expected):
    assert rows_for_tokens(rows, tokens) == expected


def test_automatic_batches_follow_the_footer(tmp_path, monkeypatch):
    rollouts = random_rollouts(300, seed=3)
    path = write_table(rollout_table(rollouts), tmp_path / "in.parquet", row_group_size=70)
    monkeypatch.setattr(reader, "BATCH_TOKENS", 1000)
    monkeypatch.setattr(reader, "MIN_BATCH_ROWS", 1)
    rollout = RolloutFile(path)
    try:
        # The footer counts one value per token and one per empty list.
        counted = sum(max(len(mask), 1) for mask in rollouts.masks)
        assert rollout.list_values("loss_mask") == counted
        assert rollout.list_values("no_such_column") == 0
        sizes = [batch.num_rows for batch in rollout.iter_batches(None, None, "loss_mask")]
    finally:
        rollout.close()
    expected = int(1000 // (counted / 300))
    assert sum(sizes) == 300
    assert max(sizes) == expected < 70


def test_automatic_batches_give_the_same_bits(tmp_path):
    rollouts = random_rollouts(240, seed=5)
    source = write_table(rollout_table(rollouts), tmp_path / "in" / "part.parquet", row_group_size=50)
    outputs = {}
    for label, batch_rows in (("auto", None), ("seven", 7)):
        options = RecomputeOptions(gamma=GAMMA, lambd=LAMBD, batch_rows=batch_rows, normalize=True)
        recompute_files([source], tmp_path / label / "out.parquet", options)
        outputs[label] = pq.read_table(tmp_path / label / "out.parquet")
    for name in ("advantages", "returns"):
        auto = outputs["auto"].column(name).combine_chunks().values.to_numpy()
        seven = outputs["seven"].column(name).combine_chunks().values.to_numpy()
        assert auto.tobytes() == seven.tobytes()


# ----------------------------------------------------------------------------- overflow bound


def _lists(values, rewards):
    def flat(rows):
        return np.array([number for row in rows for number in row], dtype=np.float32)

    return {"values": flat(values), "rewards": flat(rewards)}


def test_the_global_bound_clears_ordinary_batches():
    lists = _lists([[1.0, -2.5], [3.0]], [[0.0, 1.0], [-4.0]])
    terminal = np.array([1.0, -1.0])
    lengths = np.array([2, 1])
    # Longest row 2, max |value| 3, max |reward| 4, max |terminal| 1: 2·(3·3 + 4) + 1 = 27.
    assert cannot_overflow(lists, Columns(), terminal, lengths, 54.0)
    assert not cannot_overflow(lists, Columns(), terminal, lengths, 53.0)


def test_the_global_bound_defers_to_the_rows():
    big = float(np.finfo(np.float32).max) / 4
    lists = _lists([[big, big], [1.0]], [[0.0, 0.0], [0.0]])
    limit = float(np.finfo(np.float32).max)
    assert not cannot_overflow(lists, Columns(), np.zeros(2), np.array([2, 1]), limit)
    nan_lists = _lists([[float("nan")], [1.0]], [[0.0], [0.0]])
    assert not cannot_overflow(nan_lists, Columns(), np.zeros(2), np.array([1, 1]), limit)
    # The per-row bounds then flag only the row whose sum can overflow: row 0 (3·2·big).
    batch = pa.record_batch(
        {
            "values": pa.array([[big, big], [1.0]], pa.list_(pa.float32())),
            "rewards": pa.array([[0.0, 0.0], [0.0]], pa.list_(pa.float32())),
            "loss_mask": pa.array([[1, 1], [1]], pa.list_(pa.int8())),
            "terminal_reward": pa.array([0.0, 0.0]),
        }
    )
    check = check_batch(batch, Columns(), "f.parquet", 0)
    assert VALUE_WEIGHT * 2 * big > limit
    assert check.invalid.tolist() == [True, False]
    assert [finding.code for finding in check.findings] == ["overflow"]


# ----------------------------------------------------------------------------- layout and credit


def _last_trainable_loop(mask, offsets):
    last = []
    for row in range(len(offsets) - 1):
        found = -1
        for t in range(offsets[row], offsets[row + 1]):
            if mask[t]:
                found = t
        last.append(found)
    return last


def test_last_trainable_and_tails_match_a_loop():
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 9, 200)
    offsets = np.zeros(201, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = rng.random(int(offsets[-1])) < 0.4
    expected = _last_trainable_loop(mask, offsets)
    assert last_trainable_index(mask, offsets).tolist() == expected
    tails = [int(offsets[row + 1] - 1 - last) if last >= 0 else int(lengths[row]) for row, last in enumerate(expected)]
    assert masked_tail_lengths(mask, offsets).tolist() == tails


@pytest.mark.parametrize("semantics", ["masked", "slime", "verl", "openrlhf", "roll", "nemo-rl", "areal"])
def test_terminal_credit_of_a_tail_of_gap_tokens(semantics):
    # Rows: [1 1 0 0 0] (a tail of 3), [0 1] (no tail), [0 0] (fully masked), [] (empty).
    mask = np.array([1, 1, 0, 0, 0, 0, 1, 0, 0], dtype=bool)
    offsets = np.array([0, 5, 7, 9, 9], dtype=np.int64)
    credit = terminal_credit(semantics, GAMMA, LAMBD, mask, offsets)
    decayed = {"slime": (GAMMA * LAMBD) ** 3, "verl": 0.0, "roll": 0.0, "areal": 0.0}
    assert credit[0] == pytest.approx(decayed.get(semantics, 1.0), rel=1e-12)
    assert credit[1] == 1.0
    assert np.isnan(credit[2]) and np.isnan(credit[3])


def test_short_samples_outside_the_lanes_give_the_reference_bits():
    # Samples under SHORT_SAMPLE tokens run one by one after the laned ones: float64
    # results equal the reference kernel's bit for bit, on either side of the threshold.
    from gaecli.advantages.kernels.native import SHORT_SAMPLE, native_gae_flat
    from gaecli.advantages.kernels.reference import reference_gae

    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(0, 2 * SHORT_SAMPLE, 300), [SHORT_SAMPLE - 1, SHORT_SAMPLE, 0, 1]])
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    values, rewards = rng.normal(size=total), rng.normal(0.0, 0.1, total)
    mask = rng.random(total) < 0.7
    terminal = rng.normal(size=lengths.size)
    advantages, returns = native_gae_flat(values, rewards, mask, offsets, terminal, gamma=GAMMA, lambd=LAMBD)
    import torch

    expected = reference_gae(
        *(torch.from_numpy(array) for array in (values, rewards, mask, offsets, terminal)), gamma=GAMMA, lambd=LAMBD
    )
    assert advantages.tobytes() == expected[0].numpy().tobytes()
    assert returns.tobytes() == expected[1].numpy().tobytes()


def test_the_native_kernel_plans_token_balanced_groups_longest_first():
    # Each group holds the samples whose first token lies in its share [g, g + 1) * N / G of
    # the tokens, longest first, equal lengths in sample order; every sample once.
    from gaecli.advantages.kernels.compiled import plan_groups

    rng = np.random.default_rng(11)
    for _ in range(300):
        lengths = rng.integers(0, 6, int(rng.integers(0, 14)))
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        groups = int(rng.integers(1, 5))
        order, bounds = plan_groups(offsets, groups)
        total = int(offsets[-1])
        expected_order = []
        for group in range(groups):
            share = (total * group // groups, total * (group + 1) // groups)
            members = [
                row
                for row in range(lengths.size)
                if share[0] <= offsets[row] < share[1] or (group == groups - 1 and offsets[row] >= share[1])
            ]
            assert bounds[group + 1] - bounds[group] == len(members)
            expected_order += sorted(members, key=lambda row: (-lengths[row], row))
        assert order.tolist() == expected_order and bounds[0] == 0 and bounds[-1] == lengths.size


def test_the_command_keeps_freed_batch_buffers_for_reuse():
    # The CLI sets glibc's thresholds for itself and, through the environment, for its
    # workers, and Arrow's buffers come from glibc's heap too; a value the user set is kept.
    import os
    import subprocess
    import sys

    from gaecli.cli.memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    script = (
        "import os\nfrom gaecli.cli.memory import reuse_freed_memory\nreuse_freed_memory()\n"
        "import pyarrow\n"
        "print(os.environ['MALLOC_MMAP_THRESHOLD_'], os.environ['MALLOC_TRIM_THRESHOLD_'],"
        " pyarrow.default_memory_pool().backend_name)"
    )
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MALLOC_") and key != "ARROW_DEFAULT_MEMORY_POOL"
    }
    printed = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
    )
    if sys.platform.startswith("linux"):
        assert printed.stdout.split() == [str(MMAP_THRESHOLD), str(TRIM_THRESHOLD), "system"]
        environment["MALLOC_TRIM_THRESHOLD_"] = "12345"
        environment["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
        printed = subprocess.run(
            [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
        )
        assert printed.stdout.split() == [str(MMAP_THRESHOLD), "12345", "jemalloc"]


@pytest.mark.parametrize(
    "array",
    [
        pa.array([1.5, -2.0, 3.25, 4.0], pa.float32()).slice(1, 2),
        pa.array([7, 8, 9], pa.int64()).slice(2),
        pa.array([0, 1, 1, 0], pa.int8()),
        pa.array([True, False, True]),
        pa.array([], pa.float64()),
        pa.Array.from_buffers(pa.float32(), 0, [None, None]),
        pa.array([1.0, None, 3.0], pa.float64()),
    ],
    ids=["sliced-float32", "sliced-int64", "int8", "bool", "empty", "empty-no-buffer", "with-nulls"],
)
def test_numbers_read_from_arrow_buffers_are_what_arrow_converts(array):
    from gaecli.io.format import numeric_arrow, numeric_numpy

    got = numeric_numpy(array)
    expected = array.to_numpy(zero_copy_only=False)
    assert got.dtype == expected.dtype and np.array_equal(got, expected, equal_nan=True)
    if array.null_count == 0 and not pa.types.is_boolean(array.type):
        assert numeric_arrow(got).equals(array)  # and back, on the same buffer
