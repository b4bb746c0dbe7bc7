"""The all-finite screen of the computed outputs (``gaecli.stats.all_finite``): one read at
the array's own width, exactly ``np.isfinite(...).all()``, also where a float32 sum of finite
numbers would overflow; and ``overflow_findings`` with it names the same rows and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from gaecli.pipeline.batches import overflow_findings
from gaecli.stats import all_finite


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
