"""The all-finite screen of the computed outputs (``gaecli.stats.all_finite``): one read at
the array's own width, exactly ``np.isfinite(...).all()``, also where a float32 sum of finite
numbers would overflow; and ``overflow_findings`` with it names the same rows and tokens.
The screens folded into other reads say the same: the largest magnitude (NaN or ±Inf where
one is held), the row figures screened with the advantages they read, the mask's 0-or-1 rule
with its trainable tokens."""

from __future__ import annotations

import numpy as np
import pytest

from gaecli.pipeline.batches import overflow_findings
from gaecli.stats import all_finite, diff_rows, largest_magnitude, mask_trainable, screened_diff_rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_is_isfinite_all(dtype):
    rng = np.random.default_rng(0)
    numbers = rng.normal(size=1001).astype(dtype)
    assert all_finite(numbers) and all_finite(numbers[:0])
    huge = np.full(64, np.finfo(dtype).max, dtype=dtype)  # finite; their sum is not
    assert all_finite(huge) and all_finite(-huge)
    for bad in (np.inf, -np.inf, np.nan):
        for position in (0, 500, 1000):
            broken = numbers.copy()
            broken[position] = bad
            assert not all_finite(broken), (bad, position)
            assert not all_finite(broken[position : position + 1])
    assert all_finite(numbers[::3]) and not all_finite(np.array([1, np.nan, 2], dtype=dtype)[::1])


def test_overflow_findings_name_the_first_bad_token_of_each_row():
    offsets = np.array([0, 3, 3, 7], dtype=np.int64)
    good = np.arange(7, dtype=np.float32)
    bad = good.copy()
    bad[[4, 6]] = [np.inf, np.nan]
    findings = overflow_findings(
        {"advantages": good, "returns": bad, "none": None}, offsets, np.array([1, 4, 5]), "f", 10
    )
    assert [(f.row, f.column, f.code, f.message) for f in findings] == [
        (15, "returns", "overflow", "'returns' overflowed to inf at token 1"),
    ]
    assert overflow_findings({"advantages": good}, offsets, np.array([0, 1, 2]), "f", 0) == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_largest_magnitude_is_the_largest_abs_or_the_fault(dtype):
    numbers = np.random.default_rng(1).normal(size=1001).astype(dtype)
    assert largest_magnitude(numbers) == float(np.abs(numbers).max())
    assert largest_magnitude(numbers[:0]) == 0.0
    assert largest_magnitude(-numbers[::7]) == float(np.abs(numbers[::7]).max())  # a strided view too
    for bad in (np.inf, -np.inf, np.nan, np.copysign(np.nan, -1.0)):
        broken = numbers.copy()
        broken[500] = bad
        magnitude = largest_magnitude(broken)
        assert np.isnan(magnitude) if np.isnan(bad) else magnitude == np.inf, bad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_screened_row_figures_are_the_row_figures_or_none_at_a_fault(dtype):
    rng = np.random.default_rng(2)
    offsets = np.array([0, 3, 3, 10, 16], dtype=np.int64)
    new, old = (rng.normal(size=16).astype(dtype) for _ in range(2))
    trainable = rng.random(16) < 0.6
    trainable[[0, 5]] = True, False
    expected = diff_rows(new, old, trainable, offsets, 1e-6)
    got = screened_diff_rows(new, old, trainable, offsets, 1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    for position in (0, 5):  # a trainable token, a masked one
        for bad in (np.inf, -np.inf, np.nan):
            for which in (0, 1):
                pair = [new.copy(), old.copy()]
                pair[which][position] = bad
                assert screened_diff_rows(*pair, trainable, offsets, 1e-6) is None, (position, bad, which)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.float32, np.float64])
def test_the_mask_rule_and_its_trainable_tokens_in_one_read(dtype):
    mask = np.array([0, 1, 1, 0, 1], dtype=dtype)
    trainable, binary = mask_trainable(mask)
    assert binary and trainable.tolist() == [False, True, True, False, True]
    for bad in (2, -1) if np.dtype(dtype).kind != "u" else (2, 255):
        broken = mask.copy()
        broken[3] = bad
        trainable, binary = mask_trainable(broken)
        assert not binary and trainable.tolist() == [False, True, True, True, True]
    if np.dtype(dtype).kind == "f":
        assert not mask_trainable(np.array([0.0, np.nan, 0.5], dtype=dtype))[1]
