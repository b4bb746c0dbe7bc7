"""The ``skyrl`` profile and SkyRL's whitening (docs/semantics.md#the-trainer-profiles): GAE over
every column of the response and ``masked_whiten`` over the response mask, held against a
float64 loop laid out as SkyRL lays its batch (:func:`helpers.skyrl_oracle`) and SkyRL's
whitening written out here with numpy."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.advantages.contract import PROFILES

from helpers import skyrl_oracle
from rollout_files import gae

GAMMA, LAMBD = 0.9, 0.8


def skyrl_rows(seed: int, samples: int = 12):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, samples)
    masks = [(rng.random(n) < 0.6).astype(int).tolist() for n in lengths]
    masks[3] = [0] * len(masks[3])  # a fully masked sample: SkyRL still runs its recursion
    return {
        "values": [rng.normal(0, 1, n).round(3).tolist() for n in lengths],
        "rewards": [rng.normal(0, 0.2, n).round(3).tolist() for n in lengths],
        "loss_mask": masks,
        "terminal_reward": rng.normal(0, 1, samples).round(3).tolist(),
    }


def write(path, rows):
    table = pa.table(
        {
            "values": pa.array(rows["values"], pa.list_(pa.float64())),
            "rewards": pa.array(rows["rewards"], pa.list_(pa.float64())),
            "loss_mask": pa.array(rows["loss_mask"], pa.list_(pa.int8())),
            "terminal_reward": pa.array(rows["terminal_reward"], pa.float64()),
        }
    )
    pq.write_table(table, path)
    return path


def skyrl_stored(rows):
    """What SkyRL stores: the raw GAE of every row (the oracle), then ``masked_whiten`` over the
    response mask, every column here: the mean over all tokens, the Bessel variance, ``(A −
    mean)·rsqrt(var + 1e-8)``, written at every position."""
    raw = [
        skyrl_oracle(v, r, m, z, GAMMA, LAMBD)
        for v, r, m, z in zip(rows["values"], rows["rewards"], rows["loss_mask"], rows["terminal_reward"])
    ]
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a, _ in raw])
    mean, variance = flat.mean(), flat.var(ddof=1)
    whitened = [(np.asarray(a) - mean) / np.sqrt(variance + 1e-8) for a, _ in raw]
    return raw, whitened


def test_the_profile_is_skyrls_loop_at_every_position(tmp_path):
    rows = skyrl_rows(1)
    source = write(tmp_path / "in.parquet", rows)
    result = gae(
        "recompute", str(source), "-o", str(tmp_path / "out.parquet"), "--quiet", "--gamma", str(GAMMA),
        "--lambd", str(LAMBD), "--baseline", "skyrl", "--keep-baseline",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "out.parquet")
    raw, _ = skyrl_stored(rows)
    for got, got_returns, (advantages, returns) in zip(
        table.column("advantages_skyrl").to_pylist(), table.column("returns_skyrl").to_pylist(), raw
    ):
        assert got == pytest.approx(advantages, rel=1e-12, abs=1e-12)
        assert got_returns == pytest.approx(returns, rel=1e-12, abs=1e-12)


def test_skyrls_whitening_reproduces_its_stored_advantages_at_every_position(tmp_path):
    rows = skyrl_rows(2)
    source = write(tmp_path / "in.parquet", rows)
    result = gae(
        "recompute", str(source), "-o", str(tmp_path / "out.parquet"), "--quiet", "--gamma", str(GAMMA),
        "--lambd", str(LAMBD), "--baseline", "skyrl", "--keep-baseline", "--normalize", "--norm-like", "skyrl",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "out.parquet")
    _, stored = skyrl_stored(rows)
    for got, want in zip(table.column("advantages_skyrl").to_pylist(), stored):
        assert got == pytest.approx(want.tolist(), rel=1e-10, abs=1e-10)
    # verl's whitening takes the statistics over trainable tokens only: other numbers
    verl = tmp_path / "verl.parquet"
    result = gae(
        "recompute", str(source), "-o", str(verl), "--quiet", "--gamma", str(GAMMA), "--lambd", str(LAMBD),
        "--baseline", "skyrl", "--keep-baseline", "--normalize", "--norm-like", "verl",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert pq.read_table(verl).column("advantages_skyrl") != table.column("advantages_skyrl")


def test_the_new_side_is_whitened_over_every_token_and_written_at_trainable_ones(tmp_path):
    rows = skyrl_rows(3)
    source = write(tmp_path / "in.parquet", rows)
    plain, skyrl = tmp_path / "plain.parquet", tmp_path / "skyrl.parquet"
    common = ("--quiet", "--gamma", str(GAMMA), "--lambd", str(LAMBD))
    assert gae("recompute", str(source), "-o", str(plain), *common).exit_code == 0
    whitened = gae("recompute", str(source), "-o", str(skyrl), *common, "--normalize", "--norm-like", "skyrl")
    assert whitened.exit_code == 0, whitened.output
    raw = [np.asarray(row, dtype=np.float64) for row in pq.read_table(plain).column("advantages").to_pylist()]
    flat = np.concatenate(raw)  # the contract's advantages are 0 at masked positions, and counted there
    mean, scale = flat.mean(), np.sqrt(flat.var(ddof=1) + 1e-8)
    for got, advantages, mask in zip(pq.read_table(skyrl).column("advantages").to_pylist(), raw, rows["loss_mask"]):
        want = np.where(np.asarray(mask, dtype=bool), (advantages - mean) / scale, 0.0)
        assert got == pytest.approx(want.tolist(), rel=1e-10, abs=1e-10)


def test_all_means_seven_profiles(tmp_path):
    source = write(tmp_path / "in.parquet", skyrl_rows(4))
    result = gae("diff", str(source), "--gamma", "0.9", "--lambd", "0.8", "--baseline", "all", "--json", "-")
    assert result.exit_code == 0, result.output
    names = [comparison["name"] for comparison in json.loads(result.stdout)["comparisons"]]
    assert names == list(PROFILES) and len(names) == 7 and names[-1] == "skyrl"
