"""The critic-free estimators maxrl, grpo-passk, remax and gdpo (docs/estimators.md):
hand-worked numbers, the float64 loop ``critic_free_oracle`` of ``tests/helpers.py`` on random
batches, groups of one, tied maxima, constant groups, fully masked and empty samples, groups
spread over several files and batches (bitwise the same for every batch size, engine and
worker count), ``gae diff`` between two of them, and the options' exit codes."""

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
from gaecli.errors import GAEInputError

from helpers import assert_close, critic_free_oracle
from rollout_files import gae

ADDED = ("maxrl", "grpo-passk", "remax", "gdpo")
COMPONENTS = ("acc", "fmt", "len")
E = 1e-6  # the group statistics' ε


def api(estimator, batch, dtype=torch.float64, steps=None, weights=None):
    """``compute_advantages`` with ``estimator`` on ``batch``: group ids ``g`` (not remax),
    the baseline rewards ``b`` (remax), the components of ``batch["components"]`` (gdpo)."""
    rows, spec = {}, {}
    if estimator == "remax":
        rows["b"], spec["baseline_rewards"] = batch["baselines"], "b"
    else:
        rows["g"], spec["group_by"] = batch["groups"], "g"
    if estimator == "gdpo":
        rows.update(batch["components"])
        spec["reward_components"] = tuple(batch["components"])
        if weights is not None:
            spec["reward_weights"] = tuple(weights)
    if steps is not None:
        rows["s"], spec["step_by"] = steps, "s"
    advantages, returns = gaecli.compute_advantages(
        None,
        tensors(batch["rewards"], dtype),
        tensors(batch["masks"], torch.int64),
        batch["terminals"],
        spec=AdvantageSpec(estimator=estimator, **spec),
        row_inputs=rows,
    )
    return [a.tolist() for a in advantages], [r.tolist() for r in returns]


def spread(values, masks):
    """One value per sample written to its trainable tokens, 0 at masked ones."""
    return [[value if m else 0.0 for m in mask] for value, mask in zip(values, masks)]


def assert_rows(got, want, rel=1e-14):
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, rel=rel, abs=rel)


# The grouped batch: fourteen samples in six groups.
#   a: s = 0 + 1 + 1 = 2 (K 2), s = 0.5, s = 2 + 0 = 2 (the masked 7 is ignored)
#      μ 1.5; a tied maximum (2, 2): grpo-passk all 0
#   b: s = 3 (fully masked: s = z), s = 1 + 1 + 1.5 = 3.5, s = 1 (empty: s = z)
#      μ 2.5, σ² ((0.5)² + 1² + 1.5²) / 2 = 1.75; the best 3.5 beats 3 by 0.5
#   c: s = 0.25 + 2 = 2.25 alone (the masked 0.25 is ignored): maxrl s, grpo-passk 0
#   d: s = −1, s = −1 − 1 − 1 = −3: μ −2 (a negative mean: maxrl divides by −2 + ε),
#      σ √2, the best −1 beats −3 by 2
#   e: s = 0.1 three times (0.05 + 0.05 is 0.1 exactly): all the same, exactly 0
#   f: s = 0, s = 0 (empty): all 0, exactly 0
HAND = {
    "rewards": [[0.0, 1.0], [0.5], [2.0, 7.0, 0.0], [1.0], [1.0, 1.0], [], [0.25, 0.25], [-1.0], [-1.0, -1.0],
                [0.1], [0.05, 0.05], [0.1, 5.0], [0.0], []],
    "masks": [[1, 1], [1], [1, 0, 1], [0], [1, 1], [], [1, 0], [1], [1, 1], [1], [1, 1], [1, 0], [1], []],
    "terminals": [1.0, 0.0, 0.0, 3.0, 1.5, 1.0, 2.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "groups": ["a", "a", "a", "b", "b", "b", "c", "d", "d", "e", "e", "e", "f", "f"],
}  # fmt: skip
HAND_ROWS = {
    "maxrl": [0.5 / (1.5 + E), -1.0 / (1.5 + E), 0.5 / (1.5 + E), 0.5 / (2.5 + E), 1.0 / (2.5 + E), -1.5 / (2.5 + E),
              2.25, 1.0 / (-2.0 + E), -1.0 / (-2.0 + E), 0.0, 0.0, 0.0, 0.0, 0.0],
    "grpo-passk": [0.0, 0.0, 0.0, 0.0, 0.5 / (1.75**0.5 + E), 0.0, 0.0, 2.0 / (2.0**0.5 + E), 0.0,
                   0.0, 0.0, 0.0, 0.0, 0.0],
}  # fmt: skip


@pytest.mark.parametrize("estimator", sorted(HAND_ROWS))
def test_grouped_estimators_against_hand_worked_numbers(estimator):
    advantages, returns = api(estimator, HAND)
    assert_rows(advantages, spread(HAND_ROWS[estimator], HAND["masks"]))
    assert returns == advantages
    assert advantages[3] == [0.0] and advantages[5] == [] and advantages[13] == []  # fully masked, empty
    assert advantages[9:14] == [[0.0], [0.0, 0.0], [0.0, 0.0], [0.0], []]  # groups e and f: exactly 0


@pytest.mark.parametrize("estimator", ["maxrl", "grpo-passk"])
def test_groups_scored_the_same_give_exactly_zero(estimator):
    batch = {  # x: 0.1 three times, y: 0.2 twice, z: 0.0 twice
        "rewards": [[0.1], [0.05, 0.05], [0.1, 5.0], [0.1], [0.1], [0.0], []],
        "masks": [[1], [1, 1], [1, 0], [1], [1], [1], []],
        "terminals": [0.0, 0.0, 0.0, 0.1, 0.1, 0.0, 0.0],
        "groups": ["x", "x", "x", "y", "y", "z", "z"],
    }
    for dtype in (torch.float32, torch.float64):
        advantages, _ = api(estimator, batch, dtype)
        assert advantages == [[0.0], [0.0, 0.0], [0.0, 0.0], [0.0], [0.0], [0.0], []]


# remax: G over the trainable positions (γ = 1, z included), A = G − b; no groups.
#   0: r [1, 2, 3] all trainable, z 0.5, b 1        G [6.5, 5.5, 3.5]   A [5.5, 4.5, 2.5]
#   1: r [1, 9, 2], mask [1, 0, 1], z 1, b 0.5      G [1+2+1, 0, 2+1]   A [3.5, 0, 2.5]
#   2: r [0.5, 4], a masked tail, z 2, b −1         G [2.5, 0] (z reaches the last trainable token)  A [3.5, 0]
#   3: fully masked, z 1, b 2                       zeros
#   4: empty, z 3, b 1                              nothing
#   5: r [0.25], z 0, b 0.25                        G [0.25]  A [0]
REMAX = {
    "rewards": [[1.0, 2.0, 3.0], [1.0, 9.0, 2.0], [0.5, 4.0], [5.0], [], [0.25]],
    "masks": [[1, 1, 1], [1, 0, 1], [1, 0], [0], [], [1]],
    "terminals": [0.5, 1.0, 2.0, 1.0, 3.0, 0.0],
    "baselines": [1.0, 0.5, -1.0, 2.0, 1.0, 0.25],
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_remax_by_hand(dtype):
    advantages, returns = api("remax", REMAX, dtype)
    assert returns == [[6.5, 5.5, 3.5], [4.0, 0.0, 3.0], [2.5, 0.0], [0.0], [], [0.25]]
    assert advantages == [[5.5, 4.5, 2.5], [3.5, 0.0, 2.5], [3.5, 0.0], [0.0], [], [0.0]]


# gdpo, weights (1, 0.5); the token rewards and z are not read.
#   p (rows 0-2): acc [1, 0, 1] μ 2/3, σ 1/√3 → [1/3, −2/3, 1/3] / (1/√3 + ε) ≈ [0.577, −1.155, 0.577]
#                 fmt [0, 2, 4] μ 2, σ 2 → [−2, 0, 2] / (2 + ε) ≈ [−1, 0, 1]
#   q (rows 3-4): acc [0, 0] all the same → exactly 0; fmt [3, 1] μ 2, σ √2 → ±1 / (√2 + ε)
#   r (row 5):    a group of one: acc 2 / (1 + ε), fmt −1 / (1 + ε)
#   S ≈ [0.077, −1.155, 1.077, 0.354, −0.354, 1.5]; trainable tokens: row 0 twice, row 1 twice
#   (mask [1, 0, 1]), row 2 none (fully masked), row 3 none (empty), row 4 once, row 5 twice
#   → seven tokens [S0, S0, S1, S1, S4, S5, S5], mean ≈ 0.070, whitened with their Bessel variance
GDPO = {
    "rewards": [[9.0, 9.0], [1.0, 2.0, 3.0], [4.0], [], [-5.0], [1.0, 1.0, 1.0]],
    "masks": [[1, 1], [1, 0, 1], [0], [], [1], [1, 1, 0]],
    "terminals": [1.0, 0.0, 3.0, 1.0, 2.0, 0.0],
    "groups": ["p", "p", "p", "q", "q", "r"],
    "components": {"acc": [1.0, 0.0, 1.0, 0.0, 0.0, 2.0], "fmt": [0.0, 2.0, 4.0, 3.0, 1.0, -1.0]},
}


def test_gdpo_by_hand():
    acc = [x / (3**-0.5 + E) for x in (1 / 3, -2 / 3, 1 / 3)] + [0.0, 0.0, 2 / (1 + E)]
    fmt = [x / (2 + E) for x in (-2, 0, 2)] + [1 / (2**0.5 + E), -1 / (2**0.5 + E), -1 / (1 + E)]
    totals = [a + 0.5 * f for a, f in zip(acc, fmt)]
    tokens = [totals[0], totals[0], totals[1], totals[1], totals[4], totals[5], totals[5]]
    mean = sum(tokens) / 7
    std = (sum((x - mean) ** 2 for x in tokens) / 6 + 1e-8) ** 0.5
    w = [(x - mean) / std for x in totals]
    advantages, returns = api("gdpo", GDPO, weights=(1.0, 0.5))
    assert_rows(advantages, [[w[0], w[0]], [w[1], 0.0, w[1]], [0.0], [], [w[4]], [w[5], w[5], 0.0]], rel=1e-12)
    assert returns == advantages
    other = {**GDPO, "rewards": [[0.0] * len(r) for r in GDPO["rewards"]], "terminals": [7.0] * 6}
    assert api("gdpo", other, weights=(1.0, 0.5)) == (advantages, returns)  # rewards and z are not read
    # one token alone in a step: its variance is 0, its advantage (S − S) / √1e-8 = 0
    alone = {**GDPO, "masks": [[0, 0], [0, 0, 0], [0], [], [1], [0, 0, 0]]}
    assert api("gdpo", alone)[0] == [[0.0, 0.0], [0.0, 0.0, 0.0], [0.0], [], [0.0], [0.0, 0.0, 0.0]]


def added_batch(seed, samples=40, groups=9):
    """``random_batch`` with scores kept positive (maxrl divides by the group mean), a
    baseline reward per sample and three reward components (0/1, three levels, continuous)."""
    batch = random_batch(seed, samples=samples, groups=groups)
    rng = np.random.default_rng(seed + 1000)
    batch["rewards"] = [[round(0.1 * r, 4) for r in row] for row in batch["rewards"]]
    batch["terminals"] = [t + 2.0 for t in batch["terminals"]]
    batch["baselines"] = rng.normal(1.0, 1.0, samples).round(3).tolist()
    batch["components"] = {
        "acc": rng.integers(0, 2, samples).astype(float).tolist(),
        "fmt": rng.choice([0.0, 0.5, 1.0], samples).tolist(),
        "len": rng.normal(0.0, 2.0, samples).round(3).tolist(),
    }
    return batch


def oracle(estimator, batch, rewards, terminals, steps=None, weights=None):
    return critic_free_oracle(
        estimator,
        rewards,
        batch["masks"],
        terminals,
        batch["groups"],
        steps,
        baselines=batch["baselines"],
        components=list(batch["components"].values()),
        weights=weights,
    )


@pytest.mark.parametrize("estimator", ADDED)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_estimators_match_the_float64_loop(estimator, seed, dtype):
    batch = added_batch(seed)
    steps = batch["steps"] if estimator == "gdpo" and seed else None
    weights = (1.0, 0.5, -0.25) if estimator == "gdpo" and seed != 1 else None
    advantages, returns = api(estimator, batch, dtype, steps=steps, weights=weights)
    rewards = [torch.tensor(r, dtype=dtype).double().tolist() for r in batch["rewards"]]  # the rewards as stored
    want_a, want_r = oracle(estimator, batch, rewards, batch["terminals"], steps, weights)
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    assert_close(estimator, tensors(want_a), tensors(advantages), tolerance)
    assert_close(estimator, tensors(want_r), tensors(returns), tolerance)


def test_spec_rules():
    for estimator in ("maxrl", "grpo-passk", "gdpo"):
        with pytest.raises(GAEInputError, match="needs group_by"):
            AdvantageSpec(estimator=estimator, reward_components=("a",) if estimator == "gdpo" else None)
    with pytest.raises(GAEInputError, match="baseline_rewards"):
        AdvantageSpec(estimator="remax")
    with pytest.raises(GAEInputError, match="baseline_rewards"):
        AdvantageSpec(estimator="grpo", group_by="g", baseline_rewards="b")
    with pytest.raises(GAEInputError, match="reward_components"):
        AdvantageSpec(estimator="gdpo", group_by="g")
    with pytest.raises(GAEInputError, match="reward_components"):
        AdvantageSpec(estimator="maxrl", group_by="g", reward_components=("a",))
    with pytest.raises(GAEInputError, match="reward_weights"):
        AdvantageSpec(estimator="gdpo", group_by="g", reward_components=("a", "b"), reward_weights=(1.0,))


@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_invalid_baselines_and_components_name_the_sample(bad):
    baselines = [*REMAX["baselines"]]
    baselines[2] = bad
    with pytest.raises(GAEInputError, match="sample 2"):
        api("remax", {**REMAX, "baselines": baselines})
    fmt = [*GDPO["components"]["fmt"]]
    fmt[4] = bad
    with pytest.raises(GAEInputError, match="sample 4"):
        api("gdpo", {**GDPO, "components": {**GDPO["components"], "fmt": fmt}})


# ----------------------------------------------------------------------------- the commands

OPTIONS = {
    "maxrl": ("--group-col", "prompt_id"),
    "grpo-passk": ("--group-col", "prompt_id"),
    "remax": ("--baseline-reward-col", "baseline"),
    "gdpo": ("--group-col", "prompt_id", "--reward-cols", "acc,fmt,len", "--reward-weights", "1,0.5,-0.25",
             "--step-col", "step"),
}  # fmt: skip


def write_added_files(directory, batch, parts):
    """``write_files`` plus the float64 columns ``baseline``, ``acc``, ``fmt`` and ``len``."""
    paths = write_files(directory, batch, parts)
    cuts = [0, *parts, len(batch["rewards"])]
    columns = {"baseline": batch["baselines"], **batch["components"]}
    for path, start, end in zip(paths, cuts, cuts[1:]):
        table = pq.read_table(path)
        for name, values in columns.items():
            table = table.append_column(name, pa.array(values[start:end], pa.float64()))
        pq.write_table(table, path)
    return paths


def stored(batch):
    """The rewards and terminal rewards as the files store them (float32)."""
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    return rewards, np.float32(batch["terminals"]).astype(float).tolist()


@pytest.mark.parametrize("estimator", ADDED)
def test_recompute_over_files_and_batches_is_bitwise_the_same_everywhere(tmp_path, estimator, local_ray):
    batch = added_batch(7, samples=30, groups=6)
    inputs = write_added_files(tmp_path / "in", batch, [7, 19])
    first = bitwise_the_same_everywhere(tmp_path, inputs, ("--estimator", estimator, *OPTIONS[estimator]), local_ray)
    table = pa.concat_tables(first)
    assert table.schema.metadata[b"gaecli.estimator"] == estimator.encode()
    steps = batch["steps"] if estimator == "gdpo" else None
    weights = (1.0, 0.5, -0.25) if estimator == "gdpo" else None
    want_a, want_r = oracle(estimator, batch, *stored(batch), steps, weights)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("advantages").to_pylist()]
    assert_close(estimator, tensors(want_a), got, 2e-5)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("returns").to_pylist()]
    assert_close(estimator, tensors(want_r), got, 2e-5)


def test_diff_compares_maxrl_with_grpo_passk(tmp_path):
    batch = added_batch(11, samples=20, groups=4)
    inputs = write_added_files(tmp_path / "in", batch, [9])
    common = ("--group-col", "prompt_id", "--json", "-", "--quiet")
    result = gae("diff", *map(str, inputs), "--estimator", "maxrl", "--old-estimator", "grpo-passk", *common)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimator"] == "maxrl" and document["old"]["estimator"] == "grpo-passk"
    new, _ = oracle("maxrl", batch, *stored(batch))
    old, _ = oracle("grpo-passk", batch, *stored(batch))
    deltas = [abs(a - b) for rn, ro, m in zip(new, old, batch["masks"]) for a, b, k in zip(rn, ro, m) if k]
    assert document["summary"]["max_abs_delta_advantage"] == pytest.approx(max(deltas), rel=1e-5)


@pytest.mark.parametrize("column, row", [("baseline", 1), ("fmt", 2)])
@pytest.mark.parametrize("bad", [None, math.nan, -math.inf])
def test_invalid_baselines_and_components_stop_the_run(tmp_path, column, row, bad):
    """gdpo's statistics pass reads every file first, so nothing is written; remax's files are
    independent, so the other file is written and the bad one is not (as for GAE)."""
    batch = added_batch(3, samples=8)
    batch["masks"][4 + row] = [1]  # the bad row has a trainable token
    batch["rewards"][4 + row] = [0.5]
    values = batch["baselines"] if column == "baseline" else batch["components"][column]
    values[4 + row] = bad
    inputs = write_added_files(tmp_path / "in", batch, [4])
    estimator = "remax" if column == "baseline" else "gdpo"
    out = tmp_path / "out"
    result = recompute_cli(inputs, out, "--estimator", estimator, *OPTIONS[estimator])
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert f"part-1.parquet, row {row}, column '{column}'" in message
    written = sorted(path.name for path in out.glob("*.parquet")) if out.exists() else []
    if estimator == "gdpo":
        assert len(message.splitlines()) == 1, message
        assert written == []
    else:
        assert written == ["part-0.parquet"] and "1 of 2 files failed" in message


def test_a_bad_component_goes_to_the_rejects_and_counts_in_no_group(tmp_path):
    batch = added_batch(5, samples=12, groups=3)
    batch["components"]["fmt"][7] = math.nan
    inputs = write_added_files(tmp_path / "in", batch, [5])
    out = tmp_path / "out"
    result = recompute_cli(inputs, out, "--estimator", "gdpo", *OPTIONS["gdpo"], "--on-invalid", "skip")
    assert result.exit_code == 0, result.output
    rejected = pq.read_table(out / "part-1.rejected.parquet")
    assert rejected.num_rows == 1 and "non-finite" in rejected.column("reason")[0].as_py()
    kept = [row for row in range(12) if row != 7]
    rest = {
        "masks": [batch["masks"][row] for row in kept],
        "groups": [batch["groups"][row] for row in kept],
        "baselines": [batch["baselines"][row] for row in kept],
        "components": {name: [values[row] for row in kept] for name, values in batch["components"].items()},
    }
    rewards, terminals = stored(batch)
    steps = [batch["steps"][row] for row in kept]
    want, _ = oracle(
        "gdpo", rest, [rewards[row] for row in kept], [terminals[row] for row in kept], steps, (1.0, 0.5, -0.25)
    )
    got = pa.concat_tables(read_outputs(out)).column("advantages").to_pylist()
    assert_close("gdpo", tensors(want), tensors(got), 2e-5)


GROUP = ("--group-col", "prompt_id")


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", "grpo", *GROUP, "--baseline-reward-col", "baseline"), "--baseline-reward-col is not used"),
        (("--gamma", "1", "--lambd", "1", "--baseline-reward-col", "baseline"), "--baseline-reward-col is not used"),
        (("--estimator", "remax"), "needs --baseline-reward-col"),
        (("--estimator", "remax", "--baseline-reward-col", "baseline", *GROUP), "--group-col is not used"),
        (("--estimator", "remax", "--baseline-reward-col", "baseline", "--gamma", "1"), "--gamma is not used"),
        (("--estimator", "remax", "--baseline-reward-col", "nope"), "column 'nope' is missing"),
        (("--estimator", "gdpo", *GROUP), "needs --reward-cols"),
        (("--estimator", "gdpo", *GROUP, "--reward-cols", "acc,fmt", "--reward-weights", "1"), "--reward-weights"),
        (("--estimator", "gdpo", *GROUP, "--reward-cols", "acc", "--reward-weights", "1,2"), "--reward-weights"),
        (("--estimator", "gdpo", *GROUP, "--reward-cols", "acc,nope"), "column 'nope' is missing"),
        (("--estimator", "gdpo", "--reward-cols", "acc"), "needs --group-col"),
        (("--estimator", "maxrl", *GROUP, "--reward-cols", "acc"), "--reward-cols is not used"),
        (("--estimator", "grpo", *GROUP, "--reward-cols", "acc"), "--reward-cols is not used"),
        (("--estimator", "maxrl"), "needs --group-col"),
        (("--estimator", "grpo-passk"), "needs --group-col"),
        (("--estimator", "maxrl", *GROUP, "--normalize"), "defines its own scaling"),
        (("--estimator", "remax", "--baseline-reward-col", "baseline", "--normalize"), "defines its own scaling"),
    ],
)
def test_recompute_usage_errors_exit_2(tmp_path, options, message):
    inputs = write_added_files(tmp_path / "in", added_batch(1, samples=4), [])
    result = recompute_cli(inputs, tmp_path / "out.parquet", *options)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out.parquet").exists()
