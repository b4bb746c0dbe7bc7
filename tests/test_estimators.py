"""The critic-free estimators (docs/estimators.md): hand-worked numbers, the float64 loop of
``tests/helpers.py`` (``critic_free_oracle``), groups of one, groups whose samples all scored
the same (exactly 0), fully masked and empty samples, groups spread over several files and
batches (bitwise the same for every batch size, engine and worker count), and the options'
exit codes on ``gae recompute`` and ``gae diff``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import gaecli
from gaecli import AdvantageSpec
from gaecli.errors import GAEInputError

from helpers import assert_close, critic_free_oracle
from rollout_files import gae

OUTCOME = ("grpo", "dr-grpo", "rloo", "opo", "gpg")
GROUPED = (*OUTCOME, "reinforce++-baseline")
ESTIMATORS = (*GROUPED, "reinforce++")

# The hand-worked batch: seven samples in four groups.
#   a: s = 1 + 0 + 1 = 2 (K 2), s = 0.5 (K 1)             μ 1.25, σ √1.125, OPO (2·2 + 1·0.5) / 3 = 1.5
#   b: s = 2 (K 2; the masked token's reward is ignored), s = 3 (fully masked: s = z, K 0)
#                                                          μ 2.5, σ √0.5, OPO (2·2 + 0·3) / 2 = 2
#   c: s = 2.5 alone (a group of one)                      μ 0, σ 1, OPO 0
#   d: s = 1 (an empty sample: s = z), s = 1 (K 1)         all the same: exactly 0
HAND = {
    "rewards": [[0.0, 1.0], [0.5], [2.0, 7.0, 0.0], [1.0], [1.0, 1.0], [], [1.0]],
    "masks": [[1, 1], [1], [1, 0, 1], [0], [1, 1], [], [1]],
    "terminals": [1.0, 0.0, 0.0, 3.0, 0.5, 1.0, 0.0],
    "groups": ["a", "a", "b", "b", "c", "d", "d"],
}
SIGMA_A, SIGMA_B = 1.125**0.5, 0.5**0.5
HAND_ROWS = {  # each sample's advantage at its trainable tokens
    "dr-grpo": [0.75, -0.75, -0.5, 0.5, 2.5, 0.0, 0.0],
    "grpo": [
        0.75 / (SIGMA_A + 1e-6),
        -0.75 / (SIGMA_A + 1e-6),
        -0.5 / (SIGMA_B + 1e-6),
        0.5 / (SIGMA_B + 1e-6),
        2.5 / (1 + 1e-6),
        0.0,
        0.0,
    ],
    "rloo": [1.5, -1.5, -1.0, 1.0, 2.5, 0.0, 0.0],
    "opo": [0.5, -1.0, 0.0, 1.0, 2.5, 0.0, 0.0],
    "gpg": [0.75, -0.75, -0.5, 0.5, 2.5, 0.0, 0.0],  # every score non-zero: α = 7 / 7
}


def tensors(rows, dtype=torch.float64):
    return [torch.tensor(row, dtype=dtype) for row in rows]


def api(estimator, batch, dtype=torch.float64, steps=None, gamma=None, **spec):
    rows = {"g": batch["groups"]} if estimator in GROUPED else {}
    if steps is not None:
        rows["s"] = steps
    advantages, returns = gaecli.compute_advantages(
        None,
        tensors(batch["rewards"], dtype),
        tensors(batch["masks"], torch.int64),
        batch["terminals"],
        spec=AdvantageSpec(
            gamma,
            estimator=estimator,
            group_by="g" if estimator in GROUPED else None,
            step_by="s" if steps is not None else None,
            **spec,
        ),
        row_inputs=rows,
    )
    return [a.tolist() for a in advantages], [r.tolist() for r in returns]


@pytest.mark.parametrize("estimator", sorted(HAND_ROWS))
def test_outcome_estimators_against_hand_worked_numbers(estimator):
    advantages, returns = api(estimator, HAND)
    expected = [[value if m else 0.0 for m in mask] for value, mask in zip(HAND_ROWS[estimator], HAND["masks"])]
    for got, want in zip(advantages, expected):
        assert got == pytest.approx(want, rel=1e-15, abs=1e-15)
    assert returns == advantages
    assert advantages[5] == [] and advantages[3] == [0.0]  # empty and fully masked: nothing / zeros
    assert advantages[6] == [0.0]  # group d scored the same: exactly 0


def test_gpg_alpha_over_the_input_and_per_step():
    # one group scored [1, 0, 0, 0]: μ = 0.25; α = 4 rows / 1 non-zero = 4
    batch = {
        "rewards": [[1.0], [0.0], [0.0], [0.0]],
        "masks": [[1], [1], [1], [1]],
        "terminals": [0.0] * 4,
        "groups": ["p"] * 4,
    }
    advantages, _ = api("gpg", batch)
    assert advantages == [[3.0], [-1.0], [-1.0], [-1.0]]
    # steps [0, 0, 1, 1]: step 0 has 2 rows, 1 non-zero (α 2); step 1 has none non-zero (α 2 / max(1, 0) = 2)
    advantages, _ = api("gpg", batch, steps=[0, 0, 1, 1])
    assert advantages == [[1.5], [-0.5], [-0.5], [-0.5]]
    batch["rewards"][2] = [2.0]  # step 1: 2 rows, 1 non-zero; μ = 0.75
    advantages, _ = api("gpg", batch, steps=[0, 0, 1, 1])
    assert advantages == [[0.5], [-1.5], [2.5], [-1.5]]


def test_reinforce_plus_plus_by_hand():
    # γ = 0.5; sample 0: tokens [0, 1] trainable, z = 1 → G = [0 + 0.5·2, 1 + 1] = [1, 2];
    # sample 1: mask [1, 0, 1], rewards [2, 9, 0] → G over tokens 0 and 2 = [2 + 0.5·0, ., 0]
    batch = {"rewards": [[0.0, 1.0], [2.0, 9.0, 0.0], [4.0]], "masks": [[1, 1], [1, 0, 1], [0]], "terminals": [1, 0, 5]}
    advantages, returns = api("reinforce++", batch, gamma=0.5)
    assert returns == [[1.0, 2.0], [2.0, 0.0, 0.0], [0.0]]
    # whitened over the four trainable tokens G = 1, 2, 2, 0: mean 1.25, Bessel var 0.9166...
    std = ((0.0625 + 0.5625 + 0.5625 + 1.5625) / 3 + 1e-8) ** 0.5
    expected = [[-0.25 / std, 0.75 / std], [0.75 / std, 0.0, -1.25 / std], [0.0]]
    for got, want in zip(advantages, expected):
        assert got == pytest.approx(want, rel=1e-14)


def test_reinforce_plus_plus_baseline_by_hand():
    # groups a: s = 1, 3 (μ 2); b: s = 5 alone (μ 0) → per-token 1 token each: -1, 1, 5
    batch = {"rewards": [[1.0], [3.0], [5.0]], "masks": [[1], [1], [1]], "terminals": [0, 0, 0], "groups": "aab"}
    advantages, returns = api("reinforce++-baseline", batch)
    mean = 5 / 3
    std = (((-1 - mean) ** 2 + (1 - mean) ** 2 + (5 - mean) ** 2) / 2 + 1e-8) ** 0.5
    assert [a[0] for a in advantages] == pytest.approx([(x - mean) / std for x in (-1, 1, 5)], rel=1e-14)
    assert returns == advantages


def random_batch(seed: int, samples: int = 40, groups: int = 9, steps: int = 3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 12, samples)
    batch = {
        "rewards": [rng.normal(0, 1, n).round(3).tolist() for n in lengths],
        "masks": [(rng.random(n) < rng.choice([0.0, 0.5, 1.0])).astype(int).tolist() for n in lengths],
        "terminals": rng.choice([0.0, 1.0, -0.5], samples).tolist(),
        "groups": [f"p{k}" for k in rng.integers(0, groups, samples)],
        "steps": rng.integers(0, steps, samples).tolist(),
    }
    return batch


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_estimators_match_the_float64_loop(estimator, seed, dtype):
    batch = random_batch(seed)
    steps = batch["steps"] if estimator in ("gpg", "reinforce++", "reinforce++-baseline") and seed else None
    gamma = 0.9 if estimator == "reinforce++" else None
    advantages, returns = api(estimator, batch, dtype, steps=steps, gamma=gamma)
    rewards = [torch.tensor(r, dtype=dtype).double().tolist() for r in batch["rewards"]]  # the rewards as stored
    want_a, want_r = critic_free_oracle(
        estimator, rewards, batch["masks"], batch["terminals"], batch["groups"], steps, gamma
    )
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    assert_close(estimator, tensors(want_a), tensors(advantages), tolerance)
    assert_close(estimator, tensors(want_r), tensors(returns), tolerance)


@pytest.mark.parametrize("estimator", OUTCOME)
def test_groups_scored_the_same_give_exactly_zero(estimator):
    # 0.1 three times: (0.1 + 0.1 + 0.1) / 3 is not 0.1 in floating point; the group's mean must be
    batch = {
        "rewards": [[0.1], [0.05, 0.05], [0.1, 5.0], [0.1], [0.1]],
        "masks": [[1], [1, 1], [1, 0], [1], [1]],
        "terminals": [0.0, 0.0, 0.0, 0.2, 0.2],
        "groups": ["x", "x", "x", "y", "y"],
    }
    for dtype in (torch.float32, torch.float64):
        advantages, _ = api(estimator, batch, dtype)
        assert advantages == [[0.0], [0.0, 0.0], [0.0, 0.0], [0.0], [0.0]]


def test_spec_rules():
    with pytest.raises(GAEInputError, match="estimator 'grpo' needs group_by"):
        AdvantageSpec(estimator="grpo")
    with pytest.raises(GAEInputError, match="does not use lambd"):
        AdvantageSpec(0.9, 0.9, estimator="reinforce++")
    with pytest.raises(GAEInputError, match="estimator 'reinforce\\+\\+' needs gamma"):
        AdvantageSpec(estimator="reinforce++")
    with pytest.raises(GAEInputError, match="defines its own scaling"):
        AdvantageSpec(estimator="grpo", group_by="g", normalize="all")
    with pytest.raises(GAEInputError, match="no statistic per step"):
        AdvantageSpec(estimator="rloo", group_by="g", step_by="s")
    with pytest.raises(GAEInputError, match="gae' does not use it"):
        AdvantageSpec(0.9, 0.9, group_by="g")
    spec = AdvantageSpec(estimator="gpg", group_by="g", step_by="s")
    assert [(i.name, i.role) for i in spec.row_inputs] == [("g", "group-id"), ("s", "step-id")]
    with pytest.raises(GAEInputError, match="sample 1: the group id is null"):
        api("grpo", {**HAND, "groups": ["a", None, "b", "b", "c", "d", "d"]})


# ----------------------------------------------------------------------------- the commands


def write_files(directory, batch, parts, float_type=pa.float32()):
    """``batch`` as Parquet files, cut after the rows in ``parts``; groups are spread over files."""
    directory.mkdir()
    cuts = [0, *parts, len(batch["rewards"])]
    paths = []
    for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
        table = pa.table(
            {
                "prompt_id": pa.array(batch["groups"][start:end], pa.string()),
                "step": pa.array(batch["steps"][start:end], pa.int64()),
                "rewards": pa.array(batch["rewards"][start:end], pa.list_(float_type)),
                "loss_mask": pa.array(batch["masks"][start:end], pa.list_(pa.int8())),
                "terminal_reward": pa.array(batch["terminals"][start:end], float_type),
            }
        )
        path = directory / f"part-{index}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def estimator_options(estimator):
    options = ["--estimator", estimator]
    if estimator in GROUPED:
        options += ["--group-col", "prompt_id"]
    if estimator in ("gpg", "reinforce++", "reinforce++-baseline"):
        options += ["--step-col", "step"]
    if estimator == "reinforce++":
        options += ["--gamma", "0.9"]
    return options


def recompute_cli(inputs, output, *options):
    return gae("recompute", *map(str, inputs), "-o", str(output), "--quiet", *options)


def read_outputs(directory) -> list[pa.Table]:
    return [pq.read_table(path) for path in sorted(directory.glob("*.parquet")) if ".rejected" not in path.name]


def bitwise_the_same_everywhere(tmp_path, inputs, options, local_ray) -> list[pa.Table]:
    """The outputs of ``gae recompute`` with ``options`` on ``inputs`` for several batch
    sizes, worker counts and engines (Ray where the session has it), asserted bitwise the
    same; returns the first run's tables."""
    runs = {}
    configurations = [("local", 1000, 1), ("local", 1, 1), ("local", 4, 2)]
    if local_ray is not None:  # Ray of the test session (conftest.py)
        configurations.append(("ray", 5, 2))
    for engine, batch_rows, workers in configurations:
        out = tmp_path / f"out-{engine}-{batch_rows}-{workers}"
        every = ("--batch-rows", batch_rows, "--workers", workers, "--engine", engine)
        result = recompute_cli(inputs, out, *options, *every)
        assert result.exit_code == 0, result.output
        runs[engine, batch_rows, workers] = read_outputs(out)
    first = next(iter(runs.values()))
    for tables in runs.values():
        assert len(tables) == len(first) == len(inputs)
        for table, expected in zip(tables, first):
            assert table.column("advantages").equals(expected.column("advantages"))
            assert table.column("returns").equals(expected.column("returns"))
    return first


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_recompute_over_files_and_batches_is_bitwise_the_same_everywhere(tmp_path, estimator, local_ray):
    batch = random_batch(7, samples=30, groups=6)
    inputs = write_files(tmp_path / "in", batch, [7, 19])
    first = bitwise_the_same_everywhere(tmp_path, inputs, estimator_options(estimator), local_ray)
    table = pa.concat_tables(first)
    assert table.schema.metadata[b"gaecli.estimator"] == estimator.encode()
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    steps = batch["steps"] if estimator in ("gpg", "reinforce++", "reinforce++-baseline") else None
    gamma = 0.9 if estimator == "reinforce++" else None
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    want_a, want_r = critic_free_oracle(estimator, rewards, batch["masks"], terminals, batch["groups"], steps, gamma)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("advantages").to_pylist()]
    assert_close(estimator, tensors(want_a), got, 2e-5)
    got = [torch.tensor(row, dtype=torch.float64) for row in table.column("returns").to_pylist()]
    assert_close(estimator, tensors(want_r), got, 2e-5)


def test_recompute_reads_no_values_and_null_group_ids_are_invalid(tmp_path):
    batch = random_batch(3, samples=8)
    batch["groups"][5] = None
    inputs = write_files(tmp_path / "in", batch, [4])
    result = recompute_cli(inputs, tmp_path / "out", "--estimator", "rloo", "--group-col", "prompt_id")
    assert result.exit_code == 1
    assert "part-1.parquet, row 1, column 'prompt_id'" in result.output and "null" in result.output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))
    out = tmp_path / "skip"
    options = ("--estimator", "rloo", "--group-col", "prompt_id", "--on-invalid", "skip", "--values-col", "none")
    assert recompute_cli(inputs, out, *options).exit_code == 0
    rejected = pq.read_table(out / "part-1.rejected.parquet")
    assert rejected.num_rows == 1 and "null" in rejected.column("reason")[0].as_py()
    kept = [group for group in batch["groups"] if group is not None]
    masks = [m for m, g in zip(batch["masks"], batch["groups"]) if g is not None]
    rewards = [r for r, g in zip(pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist(), batch["groups"]) if g]
    terminals = [float(np.float32(t)) for t, g in zip(batch["terminals"], batch["groups"]) if g is not None]
    want, _ = critic_free_oracle("rloo", rewards, masks, terminals, kept)  # the rejected row counts in no group
    got = pa.concat_tables(read_outputs(out)).column("advantages").to_pylist()
    assert_close("rloo", tensors(want), tensors(got), 2e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", "grpo", "--group-col", "prompt_id", "--gamma", "1"), "--gamma is not used"),
        (("--estimator", "reinforce++", "--gamma", "1", "--lambd", "1"), "--lambd is not used"),
        (("--estimator", "reinforce++"), "--gamma is required by --estimator reinforce++"),
        (("--estimator", "grpo"), "needs --group-col"),
        (("--estimator", "grpo", "--group-col", "prompt_id", "--normalize"), "defines its own scaling"),
        (("--estimator", "opo", "--group-col", "prompt_id", "--step-col", "step"), "--step-col is not used"),
        (("--estimator", "grpo", "--group-col", "nope"), "--group-col column 'nope' is missing"),
        (("--estimator", "sarsa"), "unknown estimator 'sarsa'"),
        (("--gamma", "1"), "--lambd is required by --estimator gae"),
    ],
)
def test_recompute_usage_errors_exit_2(tmp_path, options, message):
    inputs = write_files(tmp_path / "in", random_batch(1, samples=4), [])
    result = recompute_cli(inputs, tmp_path / "out.parquet", *options)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_diff_compares_two_estimators(tmp_path):
    batch = random_batch(11, samples=20, groups=4)
    inputs = write_files(tmp_path / "in", batch, [9])
    common = ("--group-col", "prompt_id", "--json", "-", "--quiet")
    result = gae("diff", *map(str, inputs), "--estimator", "rloo", "--old-estimator", "dr-grpo", *common)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimator"] == "rloo" and document["old"]["source"] == "estimator"
    assert document["old"]["estimator"] == "dr-grpo"
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    new, _ = critic_free_oracle("rloo", rewards, batch["masks"], terminals, batch["groups"])
    old, _ = critic_free_oracle("dr-grpo", rewards, batch["masks"], terminals, batch["groups"])
    deltas = [abs(a - b) for rn, ro, m in zip(new, old, batch["masks"]) for a, b, k in zip(rn, ro, m) if k]
    assert document["summary"]["max_abs_delta_advantage"] == pytest.approx(max(deltas), rel=1e-5)
    same = gae("diff", *map(str, inputs), "--estimator", "grpo", "--old-estimator", "grpo", *common)
    assert json.loads(same.stdout)["summary"]["max_abs_delta_advantage"] == 0.0
    mixed = ("--estimator", "reinforce++", "--gamma", "1", "--old-estimator", "grpo", "--step-col", "step")
    assert gae("diff", *map(str, inputs), *mixed, *common).exit_code == 0


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", "grpo", "--group-col", "prompt_id"), "give --old-estimator NAME, --baseline PROFILE"),
        (("--estimator", "opo", "--group-col", "prompt_id"), "give --old-estimator NAME or --against COLUMN"),
        (
            ("--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "opo", "--baseline", "verl"),
            "opo has no trainer profiles",
        ),
        (("--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "rloo", "--against", "x"), "give one"),
        (("--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "gae"), "--gamma is required"),
    ],
)
def test_diff_usage_errors_exit_2(tmp_path, options, message):
    inputs = write_files(tmp_path / "in", random_batch(1, samples=4), [])
    result = gae("diff", *map(str, inputs), *options)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_an_estimator_is_an_old_side_of_its_own():
    """``--old-estimator``: a comparison side named by the estimator, whose spec takes γ, λ and
    the group and step ids only where that estimator reads them."""
    from gaecli.pipeline.description import ComparisonSide, old_side_spec

    side = ComparisonSide.from_estimator("reinforce++-baseline")
    assert side.recomputed and side.name == "reinforce++-baseline"
    assert side.to_dict() == {
        "source": "estimator",
        "baseline": None,
        "advantages_column": None,
        "returns_column": None,
        "estimator": "reinforce++-baseline",
    }
    assert side.output_columns == ("advantages_reinforcepp_baseline", "returns_reinforcepp_baseline")
    ids = ("prompt_id", "step")
    assert old_side_spec(side, 0.9, 0.95, *ids) == AdvantageSpec(
        estimator="reinforce++-baseline", group_by="prompt_id", step_by="step"
    )
    assert old_side_spec(ComparisonSide.from_estimator("reinforce++"), 0.9, 0.95, *ids) == AdvantageSpec(
        0.9, estimator="reinforce++", step_by="step"
    )
    assert old_side_spec(ComparisonSide.from_estimator("rloo"), 0.9, 0.95, *ids) == AdvantageSpec(
        estimator="rloo", group_by="prompt_id"
    )
    assert old_side_spec(ComparisonSide.from_estimator("gae"), 0.9, 0.95, *ids) == AdvantageSpec(0.9, 0.95)


def test_diff_gae_with_a_variant_against_an_estimator(tmp_path):
    """The new side keeps its GAE variants when the old side is another estimator: with V = 0
    and γ = λ = 1 masked GAE's advantage at a trainable token is z plus the rewards at that
    token and the trainable ones after it (decoupled λ changes the returns only)."""
    batch = random_batch(5, samples=16, groups=4)
    inputs = write_files(tmp_path / "in", batch, [6])
    options = ("--gamma", "1", "--lambd", "1", "--lambd-critic", "0.5", "--values-col", "none")
    common = ("--old-estimator", "dr-grpo", "--group-col", "prompt_id", "--json", "-", "--quiet")
    result = gae("diff", *map(str, inputs), *options, *common)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    spec = document["new_spec"]
    assert (spec["estimator"], spec["lambd_critic"], spec["group_by"], spec["step_by"]) == ("gae", 0.5, None, None)
    assert document["old"]["estimator"] == "dr-grpo" and [c["name"] for c in document["comparisons"]] == ["dr-grpo"]
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    old, _ = critic_free_oracle("dr-grpo", rewards, batch["masks"], terminals, batch["groups"])
    deltas = []
    for row_rewards, mask, z, row_old in zip(rewards, batch["masks"], terminals, old):
        following = z
        for reward, trainable, old_advantage in reversed(list(zip(row_rewards, mask, row_old))):
            if trainable:
                following += reward
                deltas.append(abs(following - old_advantage))
    assert document["summary"]["max_abs_delta_advantage"] == pytest.approx(max(deltas), rel=1e-5)
    refused = gae("diff", *map(str, inputs), "--estimator", "grpo", "--timestep", "turn", *common[:4])
    assert refused.exit_code == 2 and "need estimator 'gae'" in refused.output


def test_a_critic_free_output_takes_the_rewards_type_when_values_are_another(tmp_path):
    """float32 values (not read) beside float64 rewards: the outputs are float64 lists, as
    computed, and hold grpo's numbers worked out by hand."""
    table = pa.table(
        {
            "values": pa.array([[0.1, 0.2], [0.3]], pa.list_(pa.float32())),
            "rewards": pa.array([[0.0, 1.0], [0.5]], pa.list_(pa.float64())),
            "loss_mask": [[1, 1], [1]],
            "terminal_reward": [1.0, 0.0],
            "g": [0, 0],
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    result = gae("recompute", tmp_path / "in.parquet", "-o", tmp_path / "out.parquet", "--estimator", "grpo",
                 "--group-col", "g", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.schema.field("advantages").type == pa.list_(pa.float64())
    std = (2 * 0.75**2) ** 0.5  # scores 2 and 0.5 around 1.25, the Bessel std
    expected = [[0.75 / (std + 1e-6)] * 2, [-0.75 / (std + 1e-6)]]
    for got, want in zip(out.column("advantages").to_pylist(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-12)
