"""Group codes and keyed sums (gaecli.advantages.keyed.KeyTable, gaecli.advantages.statistics.Moments): codes match a
plain Python dictionary in first-seen order for every key type, keys come back as given,
state survives pickling, moments match a float64 loop and do not depend on batching."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from gaecli.advantages.keyed import KeyTable
from gaecli.advantages.statistics import Moments
from gaecli.errors import GAEInputError


def dictionary_codes(values: list) -> tuple[np.ndarray, list]:
    """The oracle: first-seen codes by a Python dict (NaN one key, -0.0 == 0.0, None a key)."""
    codes, seen = [], {}
    for value in values:
        marker = "nan" if isinstance(value, float) and value != value else value
        codes.append(seen.setdefault(marker, len(seen)))
    return np.array(codes), list(seen)


KEY_COLUMNS = [
    pa.array(["a", "b", None, "a", "", None, "ccc", "b"]),
    pa.array(["x", "yy", "x"], pa.large_string()),
    pa.array([b"\x00", b"", b"\x00\x00", b"\x00"], pa.binary()),
    pa.array([1, 2, None, 1, -5, 2**62], pa.int64()),
    pa.array([3, 1, 3], pa.int8()),
    pa.array([2**64 - 1, 0, 2**64 - 1], pa.uint64()),
    pa.array([0.5, math.nan, None, -0.0, 0.0, math.nan, 0.5], pa.float64()),
    pa.array([True, False, None, True]),
    pa.array([10, 20, 10], pa.timestamp("ms")),
    pa.array(["p", "q", "p", None]).dictionary_encode(),
]


@pytest.mark.parametrize("keys", KEY_COLUMNS, ids=lambda keys: str(keys.type))
def test_key_codes_follow_first_seen_order(keys):
    table = KeyTable()
    values = keys.to_pylist()
    expected_codes, distinct = dictionary_codes(values)
    codes = np.concatenate([table.encode(keys[:2]), table.encode(keys[2:])])  # two batches
    assert codes.tolist() == expected_codes.tolist()
    got = table.keys().to_pylist()
    assert [("nan" if isinstance(k, float) and k != k else k) for k in got] == distinct
    again = pickle.loads(pickle.dumps(table))
    assert again.encode(keys, insert=False).tolist() == expected_codes.tolist()


def test_many_string_keys_match_a_dictionary():
    rng = np.random.default_rng(5)
    values = [f"prompt-{n}" for n in rng.integers(0, 20_000, 60_000)]
    table = KeyTable()
    codes = np.concatenate([table.encode(pa.array(values[s : s + 999])) for s in range(0, len(values), 999)])
    expected, distinct = dictionary_codes(values)
    assert np.array_equal(codes, expected) and table.keys().to_pylist() == distinct
    assert table.encode(pa.array(["prompt-x", values[3]]), insert=False).tolist() == [-1, expected[3]]


def test_grouped_moments_match_a_float64_loop_and_ignore_batching():
    rng = np.random.default_rng(8)
    rows = 5_000
    keys = pa.array(rng.integers(0, 700, rows))
    counts = rng.integers(0, 9, rows)
    sums = rng.normal(size=rows) * 10.0 ** rng.integers(-3, 4, rows)
    squares = sums * sums
    whole = Moments()
    whole.add(keys, {"counts": counts, "sums": sums, "squares": squares})
    for batch_rows in (1, 7, 256):
        batched = Moments()
        for start in range(0, rows, batch_rows):
            end = start + batch_rows
            batched.add(
                keys[start:end], {"counts": counts[start:end], "sums": sums[start:end], "squares": squares[start:end]}
            )
        for kind in ("counts", "sums", "errors"):
            assert getattr(batched, kind)[:, : whole.size].tobytes() == getattr(whole, kind)[:, : whole.size].tobytes()
    totals, total_squares = whole.totals()
    key_list = whole.table.keys().to_pylist()
    key_values = np.asarray(keys)
    for code in range(0, whole.size, 37):
        members = key_values == key_list[code]
        assert whole.count("counts")[code] == counts[members].sum()
        exact = math.fsum(sums[members])
        assert abs(totals[code] - exact) <= 4e-16 * abs(exact) + 1e-300
        assert abs(total_squares[code] - math.fsum(squares[members])) <= 4e-16 * math.fsum(squares[members])
    means, variances = whole.mean_variance()
    code = 5
    members = key_values == key_list[code]
    mean = math.fsum(sums[members]) / counts[members].sum()
    assert means[code] == pytest.approx(mean, rel=1e-14)
    row_means, row_variances = whole.row_stats(keys[:10], 10)
    assert row_means.tolist() == means[[key_list.index(k) for k in keys[:10].to_pylist()]].tolist()
    with pytest.raises(GAEInputError, match="group -1 has no statistics"):
        whole.row_stats(pa.array([-1]), 1)


def test_score_statistics_ignore_batching_and_merge_in_order():
    """The estimators' statistics (one KeyedStatistics of Scores per group and per step):
    the same bits for any batch size, for parts merged in input order, after pickling; a
    file's subset holds its own keys with the merged figures."""
    from gaecli.advantages.statistics import SCORES, KeyedStatistics, Statistic, merged_in_order

    rng = np.random.default_rng(11)
    rows = 3_000
    lengths = rng.integers(0, 6, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    trainable = rng.random(offsets[-1]) < 0.7
    scores = np.where(rng.random(rows) < 0.2, 0.0, rng.normal(size=rows) * 10.0 ** rng.integers(-3, 4, rows))
    keys = {"group": pa.array(rng.integers(0, 400, rows)), "step": pa.array(rng.integers(0, 3, rows))}
    declared = (Statistic(SCORES, "scores", "group"), Statistic(SCORES, "scores", "step"), Statistic(SCORES, "scores"))

    def added(first: int, last: int, batch_rows: int) -> KeyedStatistics:
        result = KeyedStatistics(declared)
        for start in range(first, last, batch_rows):
            end = min(start + batch_rows, last)
            tokens = trainable[offsets[start] : offsets[end]]
            part_keys = {name: column[start:end] for name, column in keys.items()}
            result.add({"scores": scores[start:end]}, tokens, offsets[start : end + 1] - offsets[start], part_keys)
        return result

    whole = added(0, rows, rows)
    cut = 1_234
    merged, per_file = merged_in_order(declared, [pickle.loads(pickle.dumps(added(0, cut, 7))), added(cut, rows, 256)])
    for statistic in declared:
        expected, got = whole[statistic], merged[statistic]
        for kind in ("counts", "lows", "highs"):
            assert getattr(got, kind)[:, : got.size].tobytes() == getattr(expected, kind)[:, : expected.size].tobytes()
        assert np.allclose(got.group_statistics()[1], expected.group_statistics()[1], rtol=1e-14, atol=0)
        batched = added(0, rows, 7)[statistic]  # one file in other batches: the same bits
        for kind in ("counts", "sums", "errors", "lows", "highs"):
            assert (
                getattr(batched, kind)[:, : batched.size].tobytes()
                == getattr(expected, kind)[:, : expected.size].tobytes()
            )
        first = per_file[1][statistic]
        codes = got.codes(first.table.keys() if first.table is not None else None, first.size, insert=False)
        for derived, subset in zip(got.group_statistics(), first.group_statistics()):
            assert subset.tobytes() == derived[codes].tobytes()
    steps = whole[declared[1]]
    members = np.asarray(keys["step"]) == steps.key(0)
    assert steps.count("rows")[0] == members.sum() and steps.count("nonzero")[0] == (scores[members] != 0).sum()
    assert steps.count("tokens")[0] == sum(
        trainable[offsets[r] : offsets[r + 1]].sum() for r in np.flatnonzero(members)
    )
    assert steps.alphas()[0] == members.sum() / (scores[members] != 0).sum()
