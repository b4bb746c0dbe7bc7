"""KL-shaped rewards: the four estimators against values computed by hand and against a
plain ``math`` loop, and ``--kl-coef`` through ``gae recompute`` / ``gae validate`` on
Parquet files (which columns are read, added, checked and recorded)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.advantages.kl import KL_ESTIMATORS, k1, k2, k3, kl_estimate, kl_rewards, low_var_kl
from gaecli.errors import GAEInputError
from gaecli.io.format import Columns

from rollout_files import (
    Rollouts,
    assert_rows_close,
    gae,
    random_rollouts,
    reference_outputs,
    rollout_table,
    write_table,
)

GAMMA, LAMBD = 0.9, 0.8

# log_probs, ref_log_probs -> log-ratio x = [0, 0.5, -1, 2]
LOG_PROBS = np.array([-1.0, -0.5, -2.0, -0.25])
REF_LOG_PROBS = np.array([-1.0, -1.0, -1.0, -2.25])
HAND = {
    "k1": [0.0, 0.5, -1.0, 2.0],
    "k2": [0.0, 0.125, 0.5, 2.0],
    # exp(-x) - 1 + x
    "k3": [0.0, 0.10653065971263342, 0.7182818284590451, 1.1353352832366128],
    # x >= -2.5 keeps k3 under 10: same values
    "low_var_kl": [0.0, 0.10653065971263342, 0.7182818284590451, 1.1353352832366128],
}


@pytest.mark.parametrize("name", list(KL_ESTIMATORS))
def test_estimators_against_hand_computed_values(name):
    got = kl_estimate(LOG_PROBS, REF_LOG_PROBS, name)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, HAND[name], rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", list(KL_ESTIMATORS))
def test_estimators_against_a_math_loop(name):
    rng = np.random.default_rng(0)
    log_ratio = rng.normal(0.0, 1.5, 500)
    formulas = {
        "k1": lambda x: x,
        "k2": lambda x: x * x / 2.0,
        "k3": lambda x: math.exp(-x) - 1.0 + x,
        "low_var_kl": lambda x: min(
            max(math.exp(min(max(-x, -20.0), 20.0)) - 1.0 - min(max(-x, -20.0), 20.0), -10.0), 10.0
        ),
    }
    expected = [formulas[name](float(x)) for x in log_ratio]
    np.testing.assert_allclose(KL_ESTIMATORS[name](log_ratio), expected, rtol=1e-12, atol=1e-13)


def test_low_var_kl_clamps_and_maps_nan_to_zero():
    log_ratio = np.array([-2.5, -3.0, 25.0, -25.0, 1000.0, -1000.0, np.inf, -np.inf, np.nan])
    with np.errstate(over="raise", invalid="raise"):  # the input clamp keeps exp from overflowing
        got = low_var_kl(log_ratio)
    # -x = 2.5: e^2.5 - 1 - 2.5 (under 10); every other |x| >= 3 reaches the output clamp; NaN -> 0
    np.testing.assert_allclose(got, [12.182493960703473 - 3.5, 10, 10, 10, 10, 10, 10, 10, 0.0], rtol=1e-14)


def test_unclamped_estimators_keep_nan_and_signs():
    x = np.array([np.nan, -3.0])
    assert np.isnan(k1(x)[0]) and np.isnan(k2(x)[0]) and np.isnan(k3(x)[0])
    assert k1(x)[1] == -3.0 and k2(x)[1] == 4.5
    assert k3(x)[1] == pytest.approx(math.exp(3.0) - 4.0, rel=1e-14)


def test_rewards_are_minus_coef_times_kl():
    np.testing.assert_allclose(
        kl_rewards(LOG_PROBS, REF_LOG_PROBS, 0.1, "k2"), [-0.0, -0.0125, -0.05, -0.2], rtol=1e-14
    )
    np.testing.assert_array_equal(
        kl_rewards(LOG_PROBS.astype(np.float32), REF_LOG_PROBS.astype(np.float32), 1.0, "k1"), -np.array(HAND["k1"])
    )


def test_bad_options():
    with pytest.raises(GAEInputError, match="unknown KL estimator 'k4'"):
        kl_rewards(LOG_PROBS, REF_LOG_PROBS, 0.1, "k4")
    with pytest.raises(GAEInputError, match="finite"):
        kl_rewards(LOG_PROBS, REF_LOG_PROBS, float("nan"), "k1")


# ----------------------------------------------------------------------------- recompute


def kl_table(
    rows: int = 12, seed: int = 3, **overrides
) -> tuple[pa.Table, Rollouts, list[list[float]], list[list[float]]]:
    """A rollout table with log_probs / ref_log_probs columns (float64, short decimals) and
    a rewards column of large numbers that must not leak into KL-only rewards."""
    rollouts = random_rollouts(rows, seed)
    rng = np.random.default_rng(seed + 1)
    log_probs = [[round(float(-x), 3) for x in rng.random(len(mask)) * 2] for mask in rollouts.masks]
    ref_log_probs = [[round(float(-x), 3) for x in rng.random(len(mask)) * 2] for mask in rollouts.masks]
    rollouts.rewards = [[100.0 + t for t in range(len(mask))] for mask in rollouts.masks]
    extra = {
        "log_probs": pa.array(log_probs, pa.list_(pa.float64())),
        "ref_log_probs": pa.array(ref_log_probs, pa.list_(pa.float64())),
        **overrides,
    }
    table = rollout_table(rollouts, float_type=pa.float64(), extra=extra)
    return table, rollouts, log_probs, ref_log_probs


def hand_rewards(log_probs, ref_log_probs, coef: float, estimator: str) -> list[list[float]]:
    """−coef · KL per token with plain math (k2 and k3 only, as used below)."""
    formulas = {"k2": lambda x: x * x / 2.0, "k3": lambda x: math.exp(-x) - 1.0 + x}
    return [
        [-coef * formulas[estimator](lp - ref) for lp, ref in zip(row_lp, row_ref)]
        for row_lp, row_ref in zip(log_probs, ref_log_probs)
    ]


def recompute(source, target, *options):
    return gae("recompute", source, "-o", target, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *options)


def check_outputs(path, rollouts: Rollouts, rewards: list[list[float]]) -> None:
    expected = Rollouts(rollouts.values, rewards, rollouts.masks, rollouts.terminal)
    advantages, returns = reference_outputs(expected, GAMMA, LAMBD)
    output = pq.read_table(path)
    assert_rows_close("advantages", advantages, output.column("advantages").to_pylist(), 1e-12)
    assert_rows_close("returns", returns, output.column("returns").to_pylist(), 1e-12)


@pytest.mark.parametrize("rewards_option", [[], ["--rewards-col", "none"]], ids=["default", "rewards-col-none"])
def test_kl_coef_alone_does_not_read_the_rewards_column(tmp_path, rewards_option):
    table, rollouts, log_probs, ref_log_probs = kl_table()
    source = write_table(table, tmp_path / "in.parquet")
    result = recompute(source, tmp_path / "out.parquet", "--kl-coef", 0.05, "--kl-estimator", "k3", *rewards_option)
    assert result.exit_code == 0, result.output
    check_outputs(tmp_path / "out.parquet", rollouts, hand_rewards(log_probs, ref_log_probs, 0.05, "k3"))
    columns = json.loads(pq.read_table(tmp_path / "out.parquet").schema.metadata[b"gaecli.columns"])
    assert columns["rewards"] is None and columns["kl_coef"] == 0.05 and columns["kl_estimator"] == "k3"


def test_a_named_rewards_column_is_added_to_the_kl_rewards(tmp_path):
    process = [[round(0.01 * t, 3) for t in range(len(mask))] for mask in random_rollouts(12, 3).masks]
    table, rollouts, log_probs, ref_log_probs = kl_table(process_reward=pa.array(process, pa.list_(pa.float64())))
    source = write_table(table, tmp_path / "in.parquet")
    result = recompute(
        source, tmp_path / "out.parquet", "--kl-coef", 0.2, "--kl-estimator", "k2", "--rewards-col", "process_reward"
    )
    assert result.exit_code == 0, result.output
    kl = hand_rewards(log_probs, ref_log_probs, 0.2, "k2")
    check_outputs(tmp_path / "out.parquet", rollouts, [[a + b for a, b in zip(x, y)] for x, y in zip(kl, process)])


def test_renamed_log_prob_columns(tmp_path):
    table, rollouts, log_probs, ref_log_probs = kl_table()
    table = table.rename_columns(
        [{"log_probs": "actor_lp", "ref_log_probs": "ref_lp"}.get(n, n) for n in table.column_names]
    )
    source = write_table(table, tmp_path / "in.parquet")
    result = recompute(
        source,
        tmp_path / "out.parquet",
        "--kl-coef",
        0.05,
        "--kl-estimator",
        "k3",
        "--logprobs-col",
        "actor_lp",
        "--ref-logprobs-col",
        "ref_lp",
    )
    assert result.exit_code == 0, result.output
    check_outputs(tmp_path / "out.parquet", rollouts, hand_rewards(log_probs, ref_log_probs, 0.05, "k3"))


def test_without_kl_coef_log_probs_are_not_read(tmp_path):
    table, rollouts, _, _ = kl_table()
    broken = [[float("nan")] * len(mask) for mask in rollouts.masks]
    table = table.set_column(
        table.schema.get_field_index("log_probs"), "log_probs", pa.array(broken, pa.list_(pa.float64()))
    )
    source = write_table(table, tmp_path / "in.parquet")
    assert recompute(source, tmp_path / "out.parquet").exit_code == 0
    check_outputs(tmp_path / "out.parquet", rollouts, rollouts.rewards)
    result = recompute(source, tmp_path / "kl.parquet", "--kl-coef", 0.1)
    assert result.exit_code == 1
    assert "'log_probs' is nan" in result.stderr and "[non-finite]" in result.stderr


def test_log_prob_columns_are_checked(tmp_path):
    table, rollouts, log_probs, _ = kl_table()
    short = [row[:-1] if row else row for row in log_probs]
    bad = table.set_column(
        table.schema.get_field_index("log_probs"), "log_probs", pa.array(short, pa.list_(pa.float64()))
    )
    source = write_table(bad, tmp_path / "short.parquet")
    result = recompute(source, tmp_path / "out.parquet", "--kl-coef", 0.1)
    assert result.exit_code == 1 and "[length-mismatch]" in result.stderr
    validated = gae("validate", source, "--kl-coef", 0.1, "--quiet", "--json", "-")
    assert validated.exit_code == 1
    assert {f["column"] for f in json.loads(validated.stdout)["findings"] if f["severity"] == "error"} == {"log_probs"}
    assert gae("validate", source, "--quiet").exit_code == 0
    missing = write_table(table.drop_columns(["ref_log_probs"]), tmp_path / "missing.parquet")
    result = recompute(missing, tmp_path / "out.parquet", "--kl-coef", 0.1)
    assert result.exit_code == 1 and "'ref_log_probs' is missing" in result.stderr


def test_unknown_estimator_is_a_usage_error(tmp_path):
    table, _, _, _ = kl_table()
    source = write_table(table, tmp_path / "in.parquet")
    result = recompute(source, tmp_path / "out.parquet", "--kl-coef", 0.1, "--kl-estimator", "k4")
    assert result.exit_code == 2
    assert not (tmp_path / "out.parquet").exists()


def test_columns_default_is_unchanged():
    columns = Columns()
    assert columns.kl_coef is None
    assert columns.token_columns() == [("values", "values"), ("rewards", "rewards"), ("loss_mask", "loss_mask")]
    assert Columns(rewards=None, kl_coef=0.1).token_columns() == [
        ("values", "values"),
        ("loss_mask", "loss_mask"),
        ("log_probs", "log_probs"),
        ("ref_log_probs", "ref_log_probs"),
    ]
