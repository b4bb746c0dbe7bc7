"""optimal-token-baseline (docs/estimators.md): hand-worked numbers, the float64 loop
``token_baseline_oracle`` of ``tests/helpers.py`` on random batches, groups of one, the tail of
a group's one longest sample, fully masked and empty samples, groups spread over several files
and batches (bitwise the same for every batch size, engine and worker count), the options'
exit codes and invalid log-probs and Σπ² at trainable tokens."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import bitwise_the_same_everywhere, random_batch, read_outputs, recompute_cli, tensors, write_files

import gaecli
from gaecli import AdvantageSpec
from gaecli.errors import GAEInputError, InvalidOptionError

from helpers import assert_close, critic_free_oracle, token_baseline_oracle
from rollout_files import gae

OTB = "optimal-token-baseline"
E = 1e-8  # the baseline's ε
HALF = math.log(0.5)  # π = 0.5 with Σπ² = 0.5: w = 1 − 1 + 0.5 = 0.5 per token


def api(batch, dtype=torch.float64, lists=True):
    """``compute_advantages`` with optimal-token-baseline on ``batch`` (group ids ``g``, the
    per-token inputs ``lp`` and ``sp``: per-sample lists, or flat arrays on the packed form)."""
    spec = AdvantageSpec(estimator=OTB, group_by="g", log_probs="lp", sum_pi_squared="sp")
    rows = {"g": batch["groups"], "lp": tensors(batch["log_probs"]), "sp": tensors(batch["sum_pi_squared"])}
    if lists:
        advantages, returns = gaecli.compute_advantages(
            None, tensors(batch["rewards"], dtype), tensors(batch["masks"], torch.int64), batch["terminals"],
            spec=spec, row_inputs=rows,
        )  # fmt: skip
        return [a.tolist() for a in advantages], [r.tolist() for r in returns]
    lengths = [len(mask) for mask in batch["masks"]]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    flat = {name: torch.cat(rows[name]) if rows[name] else torch.zeros(0) for name in ("lp", "sp")}
    advantages, returns = gaecli.compute_advantages_packed(
        None,
        torch.cat(tensors(batch["rewards"], dtype)),
        torch.cat(tensors(batch["masks"], torch.int64)),
        offsets,
        torch.tensor(batch["terminals"], dtype=dtype),
        spec=spec,
        row_inputs={"g": batch["groups"], **flat},
    )
    return [part.tolist() for part in advantages.split(lengths)], [part.tolist() for part in returns.split(lengths)]


# Every token has w = 0.5 (π = 0.5, Σπ² = 0.5), so W_k = 0.5·(k + 1) over the trainable ones.
#   group a: sample 0, K 3, rewards 0 and z 1: G = 1, 1, 1; W = .5, 1, 1.5
#            sample 1, K 2 (a masked token between its two trainable ones, whose 9 is no
#            reward), z 0: G = 0, 0; W = .5, 1
#            k = 0: b = (1·.5 + 0·.5) / (1 + ε);  k = 1: b = (1·1 + 0) / (2 + ε);
#            k = 2: sample 0 alone reaches it, b = 0 (verl's zero tail): A = G = 1
#   group b: one sample, K 2, rewards 1, 2, z 0.5: G = 3.5, 2.5, b = 0 (a group of one)
#   group a also holds an empty sample and a fully masked one (z 7): no token, no weight.
HAND = {
    "rewards": [[0.0, 0.0, 0.0], [0.0, 9.0, 0.0], [1.0, 2.0], [], [3.0]],
    "masks": [[1, 1, 1], [1, 0, 1], [1, 1], [], [0]],
    "terminals": [1.0, 0.0, 0.5, 2.0, 7.0],
    "groups": ["a", "a", "b", "a", "a"],
    "log_probs": [[HALF] * 3, [HALF, 5.0, HALF], [HALF] * 2, [], [HALF]],
    "sum_pi_squared": [[0.5] * 3, [0.5, math.nan, 0.5], [0.5] * 2, [], [0.5]],  # the NaN is at a masked token
}
B0, B1 = 0.5 / (1 + E), 1.0 / (2 + E)
HAND_ADVANTAGES = [[1 - B0, 1 - B1, 1.0], [-B0, 0.0, -B1], [3.5, 2.5], [], [0.0]]
HAND_RETURNS = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [3.5, 2.5], [], [0.0]]


@pytest.mark.parametrize("lists", [True, False])
def test_hand_worked_numbers(lists):
    advantages, returns = api(HAND, lists=lists)
    for got, want in zip(advantages, HAND_ADVANTAGES):
        assert got == pytest.approx(want, rel=1e-15, abs=1e-15)
    assert returns == HAND_RETURNS


def test_the_oracle_gives_the_hand_worked_numbers():
    rows = [HAND[name] for name in ("rewards", "masks", "terminals", "groups", "log_probs", "sum_pi_squared")]
    advantages, returns = token_baseline_oracle(*rows)
    for got, want in zip(advantages, HAND_ADVANTAGES):
        assert got == pytest.approx(want, rel=1e-15, abs=1e-15)
    assert returns == HAND_RETURNS


def test_a_tied_longest_pair_keeps_its_baseline():
    """Two samples of the group reach the last position: its baseline is their weighted mean
    (only a single longest sample gets the zero tail). Weights w = 1 − 2·0.25 + 0.5 = 1 and
    w = 1 − 2·0.5 + 0.5 = 0.5: at k = 0, W = 1 and 0.5, G = 2 and 0: b = 2 / (1.5 + ε)."""
    batch = {
        "rewards": [[0.0], [0.0]], "masks": [[1], [1]], "terminals": [2.0, 0.0], "groups": [0, 0],
        "log_probs": [[math.log(0.25)], [HALF]], "sum_pi_squared": [[0.5], [0.5]],
    }  # fmt: skip
    advantages, _ = api(batch)
    b = 2.0 / (1.5 + E)
    assert advantages[0] == pytest.approx([2.0 - b], rel=1e-15)
    assert advantages[1] == pytest.approx([-b], rel=1e-15)


def token_batch(seed, samples=40, groups=9):
    """``random_batch`` with per-token log-probs (π in (0, 1)) and Σπ² in [π², 1]."""
    batch = random_batch(seed, samples, groups)
    rng = np.random.default_rng(seed + 100)
    pis = [rng.uniform(0.01, 0.99, len(row)) for row in batch["rewards"]]
    batch["log_probs"] = [np.log(pi).tolist() for pi in pis]
    batch["sum_pi_squared"] = [(pi**2 + (1 - pi**2) * rng.random(pi.size)).tolist() for pi in pis]
    return batch


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_the_float64_loop(seed, dtype):
    batch = token_batch(seed)
    advantages, returns = api(batch, dtype)
    rewards = [torch.tensor(r, dtype=dtype).double().tolist() for r in batch["rewards"]]
    terminals = torch.tensor(batch["terminals"], dtype=dtype).double().tolist()
    rows = (batch["masks"], terminals, batch["groups"], batch["log_probs"], batch["sum_pi_squared"])
    want_a, want_r = token_baseline_oracle(rewards, *rows)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert_close(OTB, tensors(want_a), tensors(advantages), tolerance)
    assert_close(OTB, tensors(want_r), tensors(returns), tolerance)


def test_spec_rules():
    with pytest.raises(InvalidOptionError, match="needs log_probs"):
        AdvantageSpec(estimator=OTB, group_by="g", sum_pi_squared="sp")
    with pytest.raises(InvalidOptionError, match="needs sum_pi_squared"):
        AdvantageSpec(estimator=OTB, group_by="g", log_probs="lp")
    with pytest.raises(InvalidOptionError, match="needs group_by"):
        AdvantageSpec(estimator=OTB, log_probs="lp", sum_pi_squared="sp")
    with pytest.raises(InvalidOptionError, match="does not use log_probs"):
        AdvantageSpec(estimator="grpo", group_by="g", log_probs="lp")


@pytest.mark.parametrize("name, bad", [("lp", math.nan), ("sp", math.inf), ("lp", None)])
def test_invalid_token_inputs_name_the_sample_and_token(name, bad):
    batch = {key: [list(row) if isinstance(row, list) else row for row in value] for key, value in HAND.items()}
    key = "log_probs" if name == "lp" else "sum_pi_squared"
    if bad is None:
        batch[key][2] = [HALF]  # one value for two tokens
        with pytest.raises(GAEInputError, match=f"sample 2: {name} has 1 values, the sample has 2 tokens"):
            api(batch)
        return
    batch[key][2][1] = bad
    with pytest.raises(GAEInputError, match=f"sample 2: {name} is {bad} at token 1"):
        api(batch)


def write_token_files(directory, batch, parts):
    """``write_files`` plus the list columns ``log_probs`` and ``spsq`` (float32)."""
    paths = write_files(directory, batch, parts)
    cuts = [0, *parts, len(batch["rewards"])]
    for path, start, end in zip(paths, cuts, cuts[1:]):
        table = pq.read_table(path)
        for name, key in (("log_probs", "log_probs"), ("spsq", "sum_pi_squared")):
            table = table.append_column(name, pa.array(batch[key][start:end], pa.list_(pa.float32())))
        pq.write_table(table, path)
    return paths


OPTIONS = ("--estimator", OTB, "--group-col", "prompt_id", "--sum-pi-squared-col", "spsq")


def stored(batch, key):
    return pa.array(batch[key], pa.list_(pa.float32())).to_pylist()


def test_recompute_over_files_and_batches_is_bitwise_the_same_everywhere(tmp_path, local_ray):
    batch = token_batch(7, samples=30, groups=6)
    inputs = write_token_files(tmp_path / "in", batch, [7, 19])
    first = bitwise_the_same_everywhere(tmp_path, inputs, OPTIONS, local_ray)
    table = pa.concat_tables(first)
    assert table.schema.metadata[b"gaecli.estimator"] == OTB.encode()
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    rows = (batch["masks"], terminals, batch["groups"], stored(batch, "log_probs"), stored(batch, "sum_pi_squared"))
    want_a, want_r = token_baseline_oracle(stored(batch, "rewards"), *rows)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("advantages").to_pylist()]
    assert_close(OTB, tensors(want_a), got, 2e-5)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("returns").to_pylist()]
    assert_close(OTB, tensors(want_r), got, 2e-5)


def bad_batch(key, bad):
    batch = token_batch(3, samples=8, groups=2)
    batch["masks"][5], batch["rewards"][5] = [0, 1, 1], [0.5, 0.5, 0.5]  # part-1, row 1
    batch["log_probs"][5], batch["sum_pi_squared"][5] = [HALF] * 3, [0.5] * 3
    batch[key][5][0] = math.nan  # at a masked token: not read
    if bad == "length":
        batch[key][5] = batch[key][5][:2]
    elif bad == "null list":
        batch[key][5] = None
    else:
        batch[key][5][2] = bad
    return batch


@pytest.mark.parametrize("key, column", [("log_probs", "log_probs"), ("sum_pi_squared", "spsq")])
@pytest.mark.parametrize("bad", [None, math.nan, -math.inf, "length", "null list"])
def test_invalid_token_inputs_stop_the_run(tmp_path, key, column, bad):
    inputs = write_token_files(tmp_path / "in", bad_batch(key, bad), [4])
    out = tmp_path / "out"
    result = recompute_cli(inputs, out, *OPTIONS)
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"part-1.parquet, row 1, column '{column}'" in message
    assert not list(out.glob("*.parquet")) if out.exists() else True


def test_a_bad_row_goes_to_the_rejects_and_counts_in_no_group(tmp_path):
    batch = bad_batch("sum_pi_squared", math.nan)
    inputs = write_token_files(tmp_path / "in", batch, [4])
    out = tmp_path / "out"
    result = recompute_cli(inputs, out, *OPTIONS, "--on-invalid", "skip")
    assert result.exit_code == 0, result.output
    rejected = pq.read_table(out / "part-1.rejected.parquet")
    assert rejected.num_rows == 1 and "non-finite" in rejected.column("reason")[0].as_py()
    kept = [row for row in range(8) if row != 5]
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    columns = (stored(batch, "rewards"), batch["masks"], terminals, batch["groups"])
    rest = [[values[row] for row in kept] for values in columns]
    tokens = [[values[row] for row in kept] for values in (stored(batch, "log_probs"), stored(batch, "sum_pi_squared"))]
    want, _ = token_baseline_oracle(*rest, *tokens)
    got = pa.concat_tables(read_outputs(out)).column("advantages").to_pylist()
    assert_close(OTB, tensors(want), tensors(got), 2e-5)


GROUP = ("--group-col", "prompt_id")


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", OTB), "needs --group-col"),
        (("--estimator", OTB, *GROUP), "column 'sum_pi_squared' is missing"),
        (("--estimator", OTB, *GROUP, "--sum-pi-squared-col", "spsq", "--logprobs-col", "nope"), "'nope' is missing"),
        (("--estimator", OTB, *GROUP, "--sum-pi-squared-col", "prompt_id"), "expected a list of numbers"),
        (("--estimator", "grpo", *GROUP, "--sum-pi-squared-col", "spsq"), "--sum-pi-squared-col is not used"),
        (("--estimator", OTB, *GROUP, "--sum-pi-squared-col", "spsq", "--gamma", "1"), "--gamma is not used"),
        (("--estimator", OTB, *GROUP, "--sum-pi-squared-col", "spsq", "--normalize"), "defines its own scaling"),
    ],
)
def test_recompute_usage_errors_exit_2(tmp_path, options, message):
    inputs = write_token_files(tmp_path / "in", token_batch(1, samples=4), [])
    result = recompute_cli(inputs, tmp_path / "out.parquet", *options)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out.parquet").exists()


def test_diff_compares_with_grpo(tmp_path):
    batch = token_batch(4, samples=12, groups=3)
    inputs = write_token_files(tmp_path / "in", batch, [5])
    result = gae("diff", *map(str, inputs), *OPTIONS, "--old-estimator", "grpo", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimator"] == OTB and document["old"]["estimator"] == "grpo"
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    rewards = stored(batch, "rewards")
    rows = (batch["masks"], terminals, batch["groups"], stored(batch, "log_probs"), stored(batch, "sum_pi_squared"))
    new, _ = token_baseline_oracle(rewards, *rows)
    old, _ = critic_free_oracle("grpo", rewards, batch["masks"], terminals, batch["groups"])
    deltas = [abs(a - b) for rn, ro, m in zip(new, old, batch["masks"]) for a, b, k in zip(rn, ro, m) if k]
    assert document["summary"]["max_abs_delta_advantage"] == pytest.approx(max(deltas), rel=1e-5)


def test_the_table_api_agrees_bitwise_with_the_command(tmp_path):
    from gaecli.pipeline import EstimatorInputs

    batch = token_batch(5, samples=16, groups=4)
    (source,) = write_token_files(tmp_path / "in", batch, [])
    inputs = EstimatorInputs(sum_pi_squared_col="spsq")
    got = gaecli.recompute_table(pq.read_table(source), estimator=OTB, group_by="prompt_id", estimator_inputs=inputs)
    result = recompute_cli([source], tmp_path / "out.parquet", *OPTIONS)
    assert result.exit_code == 0, result.output
    want = pq.read_table(tmp_path / "out.parquet")
    assert got.column("advantages").equals(want.column("advantages"))
    assert got.column("returns").equals(want.column("returns"))
