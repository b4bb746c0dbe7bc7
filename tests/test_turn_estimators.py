"""agentic-reinforce (docs/estimators.md): each turn, a maximal run of trainable tokens, gets
the discounted sum of the turn rewards from it on, against hand-worked numbers and a float64
loop written here; on the Python API and the commands (over files, batches, workers and
engines the same bits), as an old side, and its refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import bitwise_the_same_everywhere, recompute_cli

import gaecli
from gaecli import AdvantageSpec
from gaecli.errors import GAEInputError, InvalidOptionError

from rollout_files import files_under, gae


def runs_of(mask):
    """The turns of a mask: lists of the positions of each maximal run of 1s."""
    runs, current = [], []
    for position, keep in enumerate(mask):
        if keep:
            current.append(position)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def agentic_reinforce_loop(rewards, masks, terminals, gamma, turn_rewards=None):
    """Per row: R_u = the rewards of turn u (math.fsum) + its turn reward (+ z on the last
    turn); G_u = R_u + γ·G_{u+1} from the last turn back, at every token of turn u."""
    out = []
    for row, (reward, mask, z) in enumerate(zip(rewards, masks, terminals)):
        runs = runs_of(mask)
        turns = turn_rewards[row] if turn_rewards is not None else [0.0] * len(runs)
        values = [0.0] * len(mask)
        carry = 0.0
        for index in reversed(range(len(runs))):
            own = math.fsum(float(reward[t]) for t in runs[index]) + turns[index]
            if index == len(runs) - 1:
                own += z
            carry = own + gamma * carry
            for t in runs[index]:
                values[t] = carry
        out.append(values)
    return out


def random_turn_rows(seed: int, samples: int = 30):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 14, samples)
    masks = [(rng.random(n) < rng.choice([0.0, 0.6, 1.0])).astype(int).tolist() for n in lengths]
    return {
        "rewards": [rng.normal(0, 1, n).round(3).tolist() for n in lengths],
        "masks": masks,
        "terminals": rng.choice([0.0, 1.0, -0.5], samples).tolist(),
        "turns": [rng.normal(0, 1, len(runs_of(mask))).round(3).tolist() for mask in masks],
    }


def api(batch, gamma, with_turns=True, dtype=torch.float64):
    spec = AdvantageSpec(gamma, estimator="agentic-reinforce", turn_rewards="tr" if with_turns else None)
    return gaecli.compute_advantages(
        None,
        [torch.tensor(row, dtype=dtype) for row in batch["rewards"]],
        [torch.tensor(row, dtype=torch.int64) for row in batch["masks"]],
        batch["terminals"],
        spec=spec,
        turn_rewards=batch["turns"] if with_turns else None,
    )


def test_hand_worked_numbers():
    # turns [0, 1], [3], [5]; γ = 0.5; z = 2 on the last turn
    # R_2 = 0.4 + 3 + 2 = 5.4, R_1 = 0.3 + 2 = 2.3, R_0 = 0.1 + 0.2 + 1 = 1.3
    # G_2 = 5.4, G_1 = 2.3 + 0.5·5.4 = 5.0, G_0 = 1.3 + 0.5·5.0 = 3.8; a masked reward (9) is no reward
    batch = {"rewards": [[0.1, 0.2, 9.0, 0.3, 9.0, 0.4]], "masks": [[1, 1, 0, 1, 0, 1]], "terminals": [2.0],
             "turns": [[1.0, 2.0, 3.0]]}  # fmt: skip
    advantages, returns = api(batch, 0.5)
    assert advantages[0].tolist() == pytest.approx([3.8, 3.8, 0.0, 5.0, 0.0, 5.4], abs=1e-14)
    assert torch.equal(advantages[0], returns[0])
    without, _ = api(batch, 0.5, with_turns=False)  # G_2 = 2.4, G_1 = 0.3 + 1.2, G_0 = 0.3 + 0.75
    assert without[0].tolist() == pytest.approx([1.05, 1.05, 0.0, 1.5, 0.0, 2.4], abs=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_turns", [True, False])
def test_the_python_api_against_the_loop(seed, dtype, with_turns):
    batch = random_turn_rows(seed)
    advantages, returns = api(batch, 0.9, with_turns, dtype)
    rewards = [torch.tensor(r, dtype=dtype).double().tolist() for r in batch["rewards"]]
    want = agentic_reinforce_loop(rewards, batch["masks"], batch["terminals"], 0.9,
                                  batch["turns"] if with_turns else None)  # fmt: skip
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    for got, expected, back in zip(advantages, want, returns):
        assert got.double().tolist() == pytest.approx(expected, rel=tolerance, abs=tolerance)
        assert torch.equal(got, back) and got.dtype == dtype


def test_with_gamma_1_the_first_turn_gets_the_rows_score():
    """γ = 1, no turn rewards: the first turn's value is the score grpo reads (z plus every
    trainable reward)."""
    batch = random_turn_rows(4)
    advantages, _ = api(batch, 1.0, with_turns=False)
    for got, reward, mask, z in zip(advantages, batch["rewards"], batch["masks"], batch["terminals"]):
        if any(mask):
            first = mask.index(1)
            score = z + math.fsum(r for r, m in zip(reward, mask) if m)
            assert got[first].item() == pytest.approx(score, rel=1e-12, abs=1e-12)


def write_turn_files(directory, batch, parts):
    directory.mkdir()
    cuts = [0, *parts, len(batch["rewards"])]
    paths = []
    for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
        table = pa.table({
            "rewards": pa.array(batch["rewards"][start:end], pa.list_(pa.float32())),
            "loss_mask": pa.array(batch["masks"][start:end], pa.list_(pa.int8())),
            "terminal_reward": pa.array(batch["terminals"][start:end], pa.float32()),
            "turn_rewards": pa.array(batch["turns"][start:end], pa.list_(pa.float64())),
        })  # fmt: skip
        paths.append(directory / f"part-{index}.parquet")
        pq.write_table(table, paths[-1])
    return paths


OPTIONS = ("--estimator", "agentic-reinforce", "--gamma", "0.95", "--turn-rewards-col", "turn_rewards")


def test_the_commands_are_bitwise_the_same_everywhere_and_match_the_loop(tmp_path, local_ray):
    batch = random_turn_rows(7, samples=36)
    inputs = write_turn_files(tmp_path / "in", batch, [10, 25])
    first = bitwise_the_same_everywhere(tmp_path, inputs, OPTIONS, local_ray)
    table = pa.concat_tables(first)
    assert table.schema.metadata[b"gaecli.estimator"] == b"agentic-reinforce"
    rewards = [np.float32(r).astype(float).tolist() for r in batch["rewards"]]
    terminals = np.float32(batch["terminals"]).astype(float).tolist()
    want = agentic_reinforce_loop(rewards, batch["masks"], terminals, 0.95, batch["turns"])
    for got, expected in zip(table.column("advantages").to_pylist(), want):
        assert got == pytest.approx(expected, rel=2e-6, abs=2e-6)
    assert table.column("returns").equals(table.column("advantages"))


def test_an_old_side_reads_the_turn_rewards_too(tmp_path):
    batch = random_turn_rows(3, samples=12)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    same = gae("diff", inputs[0], *OPTIONS, "--old-estimator", "agentic-reinforce", "--json", "-", "--quiet")
    assert same.exit_code == 0, same.output
    assert json.loads(same.stdout)["summary"]["max_abs_delta_advantage"] == 0.0
    other = gae("diff", inputs[0], *OPTIONS, "--old-estimator", "reinforce++", "--json", "-", "--quiet")
    assert other.exit_code == 0 and json.loads(other.stdout)["summary"]["max_abs_delta_advantage"] > 0


def test_a_wrong_turn_count_is_invalid_data_naming_file_row_and_column(tmp_path):
    batch = random_turn_rows(5, samples=8)
    row = next(index for index, mask in enumerate(batch["masks"]) if runs_of(mask))
    batch["turns"][row] = batch["turns"][row] + [1.0]
    inputs = write_turn_files(tmp_path / "in", batch, [])
    before = inputs[0].read_bytes()
    result = recompute_cli(inputs, tmp_path / "out", *OPTIONS)
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert f"row {row}, column 'turn_rewards'" in line and "[turn-rewards-length]" in line
    assert files_under(tmp_path / "out") == []
    assert inputs[0].read_bytes() == before
    with pytest.raises(GAEInputError, match="sample"):
        api(batch, 0.9)


@pytest.mark.parametrize("options, message", [
    (("--kernel", "scan"), "does not support"),
    (("--lambd", "0.9"), "--lambd"),
    (("--timestep", "turn"), "need estimator 'gae'"),
])  # fmt: skip
def test_refused_options_exit_2(tmp_path, options, message):
    batch = random_turn_rows(1, samples=4)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    result = recompute_cli(inputs, tmp_path / "out", *OPTIONS, *options)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    refused = recompute_cli(inputs, tmp_path / "out", "--estimator", "reinforce++", "--gamma", "0.9",
                            "--turn-rewards-col", "turn_rewards")  # fmt: skip
    assert refused.exit_code == 2 and "agentic-reinforce" in refused.stderr


def test_the_spec_takes_turn_rewards_and_nothing_else_of_the_variants():
    spec = AdvantageSpec(0.9, estimator="agentic-reinforce", turn_rewards="tr")
    assert {"timestep:turn", "turn_rewards"} <= spec.features
    with pytest.raises(InvalidOptionError, match="need estimator 'gae'"):
        AdvantageSpec(0.9, estimator="agentic-reinforce", lambd_critic=1.0)
    with pytest.raises(InvalidOptionError, match="gamma"):
        AdvantageSpec(estimator="agentic-reinforce")


def test_the_table_api_gives_the_commands_bits(tmp_path):
    from gaecli.pipeline import VariantOptions

    batch = random_turn_rows(8, samples=16)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    assert recompute_cli(inputs, tmp_path / "out.parquet", *OPTIONS).exit_code == 0
    table = gaecli.recompute_table(pq.read_table(inputs[0]), gamma=0.95, estimator="agentic-reinforce",
                                   variants=VariantOptions(turn_rewards_col="turn_rewards"),
                                   columns=gaecli.Columns(values=None))  # fmt: skip
    assert table.column("advantages").equals(pq.read_table(tmp_path / "out.parquet").column("advantages"))
