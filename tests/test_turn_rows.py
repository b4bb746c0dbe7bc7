"""Turn rows (docs/episodes.md): gigpo and step-reinforce over episodes whose turns are rows in
any files, batches and order, against hand-worked numbers and the float64 loop of
tests/helpers.py; the episodes' checks over every input (a turn twice, outcomes or groups
that disagree, a null turn), stopping the run or rejecting whole episodes; the old side, the
Python and table APIs, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import bitwise_the_same_everywhere, recompute_cli

import gaecli
from gaecli import AdvantageSpec, WhiteningRule
from gaecli.errors import GAEInputError, InvalidOptionError

from helpers import episode_gae_oracle, episode_outcome_oracle, turn_rows_oracle
from rollout_files import files_under, gae

HAND = {  # two episodes of group 'a', two turns each; row 3 is fully masked
    "rewards": [[0.0, 0.0, 0.0]] * 4,
    "masks": [[1, 1, 0], [0, 1, 1], [1, 0, 1], [0, 0, 0]],
    "terminals": [1.0, 1.0, 0.0, 0.0],
    "groups": ["a"] * 4,
    "episodes": ["x", "x", "y", "y"],
    "turns": [0, 1, 0, 1],
    "states": ["s0", "s1", "s0", "s2"],
    "turn_rewards": [0.1, 0.5, 0.0, 0.2],
}


def spec_of(estimator, gamma, **fields):
    state = {"state_by": "state"} if estimator == "gigpo" else {}
    return AdvantageSpec(gamma, estimator=estimator, group_by="group", episode_by="episode", turn_by="turn",
                         turn_rewards="turn_reward", **state, **fields)  # fmt: skip


def api(batch, spec, dtype=torch.float64):
    inputs = {"group": batch["groups"], "episode": batch["episodes"], "turn": batch["turns"],
              "turn_reward": batch["turn_rewards"]}  # fmt: skip
    if spec.state_by is not None:
        inputs["state"] = batch["states"]
    return gaecli.compute_advantages(
        None,
        [torch.tensor(row, dtype=dtype) for row in batch["rewards"]],
        [torch.tensor(row, dtype=torch.int64) for row in batch["masks"]],
        batch["terminals"],
        spec=spec,
        row_inputs=inputs,
    )


def oracle(estimator, batch, gamma, **options):
    return turn_rows_oracle(estimator, batch["episodes"], batch["turns"], batch["turn_rewards"], batch["terminals"],
                            batch["groups"], batch["states"], gamma, **options)  # fmt: skip


def test_gigpo_hand_worked():
    # returns (γ = 0.5): x0 = 0.1 + 0.5·0.5 = 0.35, x1 = 0.5, y0 = 0 + 0.5·0.2 = 0.1, y1 = 0.2.
    # outcomes 1, 1, 0, 0 in group a: μ = 0.5, σ = √(1/3): ±0.5/(0.57735 + 1e-6) = ±0.866024.
    # state groups (a, s0) = {0.35, 0.1}: μ = 0.225, σ = 0.176777: ±0.125/(σ + 1e-6) = ±0.707103;
    # (a, s1) and (a, s2) hold one turn each: 0.
    advantages, returns = api(HAND, spec_of("gigpo", 0.5))
    episode, step = 0.5 / (np.sqrt(1 / 3) + 1e-6), 0.125 / (np.sqrt(2 * 0.125**2) + 1e-6)
    want = [[episode + step] * 2 + [0.0], [0.0, episode, episode], [-episode - step, 0.0, -episode - step], [0.0] * 3]
    for got, expected, back in zip(advantages, want, returns):
        assert got.tolist() == pytest.approx(expected, abs=1e-12)
        assert torch.equal(got, back)
    assert advantages[0].tolist() == pytest.approx([1.573127, 1.573127, 0.0], abs=1e-6)


def test_step_reinforce_hand_worked_and_the_mean_method():
    # returns 0.35, 0.5, 0.1, 0.2 in one group: μ = 0.2875, σ = 0.170171
    advantages, _ = api(HAND, spec_of("step-reinforce", 0.5))
    sigma = np.std([0.35, 0.5, 0.1, 0.2], ddof=1)
    assert advantages[0][0].item() == pytest.approx((0.35 - 0.2875) / (sigma + 1e-6), abs=1e-12)
    assert advantages[2][0].item() == pytest.approx((0.1 - 0.2875) / (sigma + 1e-6), abs=1e-12)
    centred, _ = api(HAND, spec_of("step-reinforce", 0.5, whitening_rule=WhiteningRule(std="none")))
    assert centred[1].tolist() == pytest.approx([0.0, 0.5 - 0.2875, 0.5 - 0.2875], abs=1e-12)


def random_turn_rows(seed: int, episodes: int = 24, groups: int = 4):
    """Episodes of 1–4 turns (turn indices with gaps, rows in a shuffled order), some rows
    fully masked, states shared within and across groups."""
    rng = np.random.default_rng(seed)
    rows = {key: [] for key in HAND}
    for episode in range(episodes):
        count = int(rng.integers(1, 5))
        indices = np.sort(rng.choice(10, count, replace=False)) * 2
        outcome = float(rng.choice([0.0, 1.0, 0.5]))
        group = f"g{episode % groups}"
        for turn in indices.tolist():
            length = int(rng.integers(0, 9))
            rows["rewards"].append(rng.normal(0, 0.1, length).round(3).tolist())
            rows["masks"].append((rng.random(length) < rng.choice([0.0, 0.7, 1.0])).astype(int).tolist())
            rows["terminals"].append(outcome)
            rows["groups"].append(group)
            rows["episodes"].append(f"e{episode}")
            rows["turns"].append(turn)
            rows["states"].append(f"s{int(rng.integers(0, 3))}")
            rows["turn_rewards"].append(float(rng.choice([0.0, 0.25, -0.5, 1.0])))
    order = rng.permutation(len(rows["turns"]))
    return {key: [values[index] for index in order] for key, values in rows.items()}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("estimator", ["gigpo", "step-reinforce"])
@pytest.mark.parametrize("method", ["mean_std", "mean"])
def test_the_python_api_against_the_loop(seed, estimator, method):
    batch = random_turn_rows(seed)
    rule = WhiteningRule(std="none") if method == "mean" else None
    fields = {"episode_weight": 0.7, "step_weight": 1.5} if estimator == "gigpo" else {}
    advantages, returns = api(batch, spec_of(estimator, 0.95, whitening_rule=rule, **fields))
    weights = {"episode_weight": 0.7, "step_weight": 1.5} if estimator == "gigpo" else {}
    want = oracle(estimator, batch, 0.95, method=method, **weights)
    for got, value, mask, back in zip(advantages, want, batch["masks"], returns):
        assert got.tolist() == pytest.approx([value if m else 0.0 for m in mask], rel=1e-12, abs=1e-12)
        assert torch.equal(got, back)


def test_state_groups_never_span_episode_groups():
    batch = {key: list(values) for key, values in HAND.items()}
    batch["groups"] = ["a", "a", "b", "b"]  # (a, s0) and (b, s0) are two state groups of one turn each
    advantages, _ = api(batch, spec_of("gigpo", 0.5, episode_weight=0.0))
    assert all(value == 0.0 for row in advantages for value in row.tolist())


def write_turn_files(directory, batch, parts, batch_rows=None):
    directory.mkdir()
    cuts = [0, *parts, len(batch["turns"])]
    paths = []
    for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
        table = pa.table({
            "rewards": pa.array(batch["rewards"][start:end], pa.list_(pa.float32())),
            "loss_mask": pa.array(batch["masks"][start:end], pa.list_(pa.int8())),
            "terminal_reward": pa.array(batch["terminals"][start:end], pa.float64()),
            "group": pa.array(batch["groups"][start:end]),
            "episode": pa.array(batch["episodes"][start:end]),
            "turn": pa.array(batch["turns"][start:end], pa.int32()),
            "state": pa.array(batch["states"][start:end]),
            "turn_reward": pa.array(batch["turn_rewards"][start:end], pa.float64()),
        })  # fmt: skip
        paths.append(directory / f"part-{index}.parquet")
        pq.write_table(table, paths[-1])
    return paths


def options(estimator, *more):
    state = ("--state-col", "state") if estimator == "gigpo" else ()
    return ("--estimator", estimator, "--gamma", "0.9", "--group-col", "group", "--episode-col", "episode",
            "--turn-col", "turn", "--turn-rewards-col", "turn_reward", *state, *more)  # fmt: skip


def assert_matches(table, batch, estimator, tolerance=2e-6, **loop):
    want = oracle(estimator, batch, 0.9, **loop)
    for got, value, mask in zip(table.column("advantages").to_pylist(), want, batch["masks"]):
        assert got == pytest.approx([value if m else 0.0 for m in mask], rel=tolerance, abs=tolerance)
    assert table.column("returns").equals(table.column("advantages"))


@pytest.mark.parametrize("estimator", ["gigpo", "step-reinforce"])
def test_episodes_split_over_files_and_batches_give_the_same_bits_everywhere(tmp_path, estimator, local_ray):
    batch = random_turn_rows(5)
    inputs = write_turn_files(tmp_path / "in", batch, [9, 30])  # episodes' rows in several files
    first = bitwise_the_same_everywhere(tmp_path, inputs, options(estimator), local_ray)
    table = pa.concat_tables(first)
    assert table.schema.metadata[b"gaecli.estimator"] == estimator.encode()
    assert_matches(table, batch, estimator)
    whole = write_turn_files(tmp_path / "whole", batch, [])
    result = recompute_cli(whole, tmp_path / "whole.parquet", *options(estimator))
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "whole.parquet").column("advantages").equals(table.column("advantages"))


def test_the_table_api_gives_the_commands_bits(tmp_path):
    from gaecli.pipeline import EstimatorInputs, VariantOptions

    batch = random_turn_rows(3)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    assert recompute_cli(inputs, tmp_path / "out.parquet", *options("gigpo")).exit_code == 0
    table = gaecli.recompute_table(
        pq.read_table(inputs[0]), gamma=0.9, estimator="gigpo", group_by="group",
        estimator_inputs=EstimatorInputs(episode_col="episode", turn_col="turn", state_col="state"),
        variants=VariantOptions(turn_rewards_col="turn_reward"), columns=gaecli.Columns(values=None),
    )  # fmt: skip
    assert table.column("advantages").equals(pq.read_table(tmp_path / "out.parquet").column("advantages"))


def changed(batch, row, **values):
    copy = {key: list(column) for key, column in batch.items()}
    for key, value in values.items():
        copy[key][row] = value
    return copy


def twin_row(batch):
    """A row whose episode has another row (the first such pair: (earlier, later))."""
    for later in range(len(batch["turns"])):
        for earlier in range(later):
            if batch["episodes"][earlier] == batch["episodes"][later]:
                return earlier, later
    raise AssertionError("no episode with two rows")


def faulty_episode(batch, fault: str):
    """``batch`` with a fault in the later of two rows of one episode: (the batch, the earlier
    and the later row, the column and the rule the fault is found by)."""
    earlier, later = twin_row(batch)
    faulty, column, code = {
        "duplicate-turn": (changed(batch, later, turns=batch["turns"][earlier]), "turn", "duplicate-turn"),
        "outcome": (changed(batch, later, terminals=batch["terminals"][earlier] + 1.0), "terminal_reward",
                    "episode-mismatch"),
        "group": (changed(batch, later, groups="another"), "group", "episode-mismatch"),
        "null-turn": (changed(batch, later, turns=None), "turn", "null"),
        "non-finite-reward": (changed(batch, later, turn_rewards=float("nan")), "turn_reward", "non-finite"),
    }[fault]  # fmt: skip
    return faulty, earlier, later, column, code


@pytest.mark.parametrize("fault", ["duplicate-turn", "outcome", "group", "null-turn"])
def test_a_faulty_episode_is_invalid_data_naming_file_row_and_column(tmp_path, fault):
    batch = random_turn_rows(2)
    faulty, earlier, later, column, code = faulty_episode(batch, fault)
    inputs = write_turn_files(tmp_path / "in", faulty, [later])  # the two rows in two files
    before = [path.read_bytes() for path in inputs]
    result = recompute_cli(inputs, tmp_path / "out", *options("gigpo"))
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and f"[{code}]" in line and f"column '{column}'" in line
    assert "part-1.parquet, row 0" in line
    if fault != "null-turn":
        assert f"episode {batch['episodes'][later]!r}" in line and f"part-0.parquet row {earlier}" in line
    assert files_under(tmp_path / "out") == []
    assert [path.read_bytes() for path in inputs] == before
    with pytest.raises((GAEInputError, TypeError, ValueError)):
        api(faulty, spec_of("gigpo", 0.9))


def test_skip_rejects_the_whole_episode_and_computes_the_rest_without_it(tmp_path):
    batch = random_turn_rows(4)
    earlier, later = twin_row(batch)
    episode = batch["episodes"][later]
    faulty = changed(batch, later, turns=batch["turns"][earlier])
    inputs = write_turn_files(tmp_path / "in", faulty, [])
    result = recompute_cli(inputs, tmp_path / "out.parquet", *options("step-reinforce"), "--on-invalid", "skip")
    assert result.exit_code == 0, result.output
    kept = [row for row, name in enumerate(batch["episodes"]) if name != episode]
    rest = {key: [column[row] for row in kept] for key, column in batch.items()}
    assert_matches(pq.read_table(tmp_path / "out.parquet"), rest, "step-reinforce")
    rejects = pq.read_table(tmp_path / "out.rejected.parquet")
    assert rejects.column("episode").to_pylist() == [episode] * (len(batch["turns"]) - len(kept))
    reasons = rejects.column("reason").to_pylist()
    assert all("episode-rejected" in reason and "turn" in reason for reason in reasons)


def test_diff_compares_the_turn_row_estimators(tmp_path):
    batch = random_turn_rows(6)
    inputs = write_turn_files(tmp_path / "in", batch, [20])
    same = gae("diff", *inputs, *options("gigpo"), "--old-estimator", "gigpo", "--json", "-", "--quiet")
    assert same.exit_code == 0, same.output
    assert json.loads(same.stdout)["summary"]["max_abs_delta_advantage"] == 0.0
    other = gae("diff", *inputs, *options("gigpo"), "--old-estimator", "step-reinforce", "--json", "-", "--quiet")
    assert other.exit_code == 0, other.output
    step = oracle("step-reinforce", batch, 0.9)
    gigpo = oracle("gigpo", batch, 0.9)
    want = max(abs(a - b) for a, b, mask in zip(gigpo, step, batch["masks"]) if any(mask))
    assert json.loads(other.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(want, rel=1e-5)


def test_the_advantage_clip_and_weights_apply(tmp_path):
    batch = random_turn_rows(7)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    more = ("--advantage-clip", "0.2", "--episode-weight", "0.5", "--step-weight", "2")
    assert recompute_cli(inputs, tmp_path / "out.parquet", *options("gigpo", *more)).exit_code == 0
    want = oracle("gigpo", batch, 0.9, episode_weight=0.5, step_weight=2.0)
    table = pq.read_table(tmp_path / "out.parquet")
    for got, value, mask in zip(table.column("advantages").to_pylist(), want, batch["masks"]):
        clipped = min(max(value, -0.2), 0.2)
        assert got == pytest.approx([clipped if m else 0.0 for m in mask], abs=2e-6)


@pytest.mark.parametrize("dropped, message", [
    ("--state-col", "--state-col"),
    ("--turn-rewards-col", "--turn-rewards-col"),
    ("--episode-col", "--episode-col"),
    ("--turn-col", "--turn-col"),
])  # fmt: skip
def test_a_missing_option_exits_2(tmp_path, dropped, message):
    inputs = write_turn_files(tmp_path / "in", random_turn_rows(1, episodes=3), [])
    given = list(options("gigpo"))
    index = given.index(dropped)
    del given[index : index + 2]
    result = recompute_cli(inputs, tmp_path / "out", *given)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_refusals(tmp_path):
    batch = random_turn_rows(1, episodes=3)
    inputs = write_turn_files(tmp_path / "in", batch, [])
    grpo = recompute_cli(inputs, tmp_path / "out", "--estimator", "grpo", "--group-col", "group",
                         "--episode-col", "episode")  # fmt: skip
    assert grpo.exit_code == 2 and "--episode-col" in grpo.stderr, grpo.output
    table = pq.read_table(inputs[0])
    floats = table.set_column(table.schema.get_field_index("turn"), "turn", table.column("turn").cast(pa.float64()))
    pq.write_table(floats, tmp_path / "floats.parquet")
    result = recompute_cli([tmp_path / "floats.parquet"], tmp_path / "out2", *options("gigpo"))
    assert result.exit_code == 2 and "integer" in result.stderr, result.output
    with pytest.raises(InvalidOptionError, match="turn_rewards"):
        AdvantageSpec(0.9, estimator="gigpo", group_by="g", episode_by="e", turn_by="t", state_by="s")
    with pytest.raises(InvalidOptionError, match="state_by"):
        AdvantageSpec(0.9, estimator="gigpo", group_by="g", episode_by="e", turn_by="t", turn_rewards="r")
    with pytest.raises(InvalidOptionError, match="episode_weight"):
        spec_of("gigpo", 0.9, episode_weight=float("inf"))


def test_the_readme_example_on_the_sample_turn_rows(tmp_path):
    from pathlib import Path

    sample = Path(__file__).resolve().parents[1] / "sample_data" / "turn_rows.parquet"
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--estimator gigpo --gamma 0.95" in readme and "sample_data/turn_rows.parquet" in readme
    result = gae("recompute", sample, "-o", tmp_path / "gigpo.parquet", "--estimator", "gigpo", "--gamma", "0.95",
                 "--group-col", "group_id", "--episode-col", "episode_id", "--turn-col", "turn", "--state-col",
                 "state", "--turn-rewards-col", "step_score", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pq.read_table(sample).to_pydict()
    assert len(set(rows["episode_id"])) == 8 and len(set(rows["group_id"])) == 2
    rewards = np.float32(rows["step_score"]).astype(float).tolist()
    want = turn_rows_oracle("gigpo", rows["episode_id"], rows["turn"], rewards, rows["terminal_reward"],
                            rows["group_id"], rows["state"], 0.95)  # fmt: skip
    got = pq.read_table(tmp_path / "gigpo.parquet").column("advantages").to_pylist()
    for advantages, value, mask in zip(got, want, rows["loss_mask"]):
        assert advantages == pytest.approx([value if m else 0.0 for m in mask], abs=2e-6)
    assert any(abs(value) > 0.1 for value in want)


VALIDATE = ("--episode-col", "episode", "--turn-col", "turn", "--state-col", "state", "--group-col", "group",
            "--turn-rewards-col", "turn_reward", "--values-col", "none")  # fmt: skip


def validated(*args):
    result = gae("validate", *args, "--json", "-", "--quiet")
    return result.exit_code, json.loads(result.stdout) if result.stdout else None, result


@pytest.mark.parametrize("fault", ["duplicate-turn", "outcome", "group", "null-turn", "non-finite-reward"])
def test_validate_checks_the_episodes_over_every_file(tmp_path, fault):
    batch = random_turn_rows(2)
    faulty, _, later, column, code = faulty_episode(batch, fault)
    inputs = write_turn_files(tmp_path / "in", faulty, [later])
    code_, document, _ = validated(*inputs, *VALIDATE, "--workers", "2")
    assert code_ == 1
    errors = [finding for finding in document["findings"] if finding["severity"] == "error"]
    assert [(f["file"].endswith("part-1.parquet"), f["row"], f["column"], f["code"]) for f in errors] == [
        (True, 0, column, code)
    ]
    assert document["files"][1]["errors"] == 1 and document["counts"][code] == 1
    clean = write_turn_files(tmp_path / "clean", batch, [later])
    code_, document, _ = validated(*clean, *VALIDATE)
    assert code_ == 0 and not [f for f in document["findings"] if f["severity"] == "error"]


def test_validate_refuses_turn_row_options_alone_and_checks_their_types(tmp_path):
    inputs = write_turn_files(tmp_path / "in", random_turn_rows(1, episodes=3), [])
    alone = gae("validate", *inputs, "--turn-col", "turn")
    assert alone.exit_code == 2 and "--episode-col" in alone.stderr
    without = gae("validate", *inputs, "--episode-col", "episode")
    assert without.exit_code == 2 and "--turn-col" in without.stderr
    code, document, _ = validated(*inputs, "--episode-col", "episode", "--turn-col", "group", "--values-col", "none")
    assert code == 1 and [f["code"] for f in document["findings"] if f["severity"] == "error"] == ["wrong-type"]
    code, document, _ = validated(*inputs, "--episode-col", "nope", "--turn-col", "turn", "--values-col", "none")
    assert code == 1 and document["findings"][0]["code"] == "missing-column"


# ----------------------------------------------------------------------------- masked GAE over episodes

EPISODE = {  # one episode of three rows: a masked gap inside row 0 and between rows, row 2 fully masked
    "values": [[0.13, -0.3, 0.5, 1.2], [0.1, 0.4, -0.2, 0.3], [0.0, 0.0, 0.0, 0.0]],
    "rewards": [[0.0, 0.1, 0.0, 0.2], [0.3, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
    "masks": [[1, 1, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]],
    "terminals": [2.0, 2.0, 2.0],
    "episodes": ["x", "x", "x"],
    "turns": [5, 7, 9],
}


def gae_api(batch, gamma, lambd, turn_rewards=None, dtype=torch.float64, **fields):
    spec = AdvantageSpec(gamma, lambd, episode_by="episode", turn_by="turn",
                         turn_rewards="turn_reward" if turn_rewards is not None else None, **fields)  # fmt: skip
    inputs = {"episode": batch["episodes"], "turn": batch["turns"]}
    if turn_rewards is not None:
        inputs["turn_reward"] = turn_rewards
    return gaecli.compute_advantages(
        [torch.tensor(row, dtype=dtype) for row in batch["values"]],
        [torch.tensor(row, dtype=dtype) for row in batch["rewards"]],
        [torch.tensor(row, dtype=torch.int64) for row in batch["masks"]],
        batch["terminals"], spec=spec, row_inputs=inputs,
    )  # fmt: skip


def test_masked_gae_over_an_episode_hand_worked():
    # the subsequence (row, token): (0,0) V .13, (0,1) V −.3 r .1, (0,3) V 1.2 r .2, (1,1) V .4, (1,2) V −.2;
    # z = 2 on (1,2), the episode's last trainable token (row 2 is fully masked); γ = .9, λ = .8:
    # A(1,2) = 2 + .2 = 2.2; A(1,1) = .9·(−.2) − .4 + .72·2.2 = 1.004;
    # A(0,3) = .2 + .9·.4 − 1.2 + .72·1.004 = 0.08288 (one γλ across the gap between the rows);
    # A(0,1) = .1 + .9·1.2 + .3 + .72·0.08288 = 1.5396736 (one γλ across the gap inside row 0);
    # A(0,0) = .9·(−.3) − .13 + .72·1.5396736 = 0.70856499
    advantages, returns = gae_api(EPISODE, 0.9, 0.8)
    want = [[0.70856499, 1.5396736, 0.0, 0.08288], [0.0, 1.004, 2.2, 0.0], [0.0] * 4]
    for got, expected, back, values, mask in zip(advantages, want, returns, EPISODE["values"], EPISODE["masks"]):
        assert got.tolist() == pytest.approx(expected, abs=1e-7)
        expected_back = [a + v if m else 0.0 for a, v, m in zip(expected, values, mask)]
        assert back.tolist() == pytest.approx(expected_back, abs=1e-7)


def test_an_episode_of_one_row_is_todays_masked_gae_bit_for_bit():
    batch = random_turn_rows(3)
    values = [np.random.default_rng(len(mask)).normal(size=len(mask)).tolist() for mask in batch["masks"]]
    batch = {**batch, "values": values, "episodes": [f"own{row}" for row in range(len(values))]}
    advantages, returns = gae_api(batch, 0.95, 0.9)
    tensors = [[torch.tensor(row, dtype=torch.float64) for row in batch[key]] for key in ("values", "rewards")]
    masks = [torch.tensor(row, dtype=torch.int64) for row in batch["masks"]]
    want_a, want_r = gaecli.masked_gae(*tensors, masks, batch["terminals"], gamma=0.95, lambd=0.9)
    for got, expected, back, expected_back in zip(advantages, want_a, returns, want_r):
        assert torch.equal(got, expected) and torch.equal(back, expected_back)


def episode_batch(seed: int):
    batch = random_turn_rows(seed)
    rng = np.random.default_rng(seed + 100)
    batch["values"] = [rng.normal(0, 1, len(mask)).round(3).tolist() for mask in batch["masks"]]
    return batch


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_turn_rewards", [True, False])
def test_masked_gae_over_episodes_against_the_loop(seed, with_turn_rewards):
    batch = episode_batch(seed)
    turn_rewards = batch["turn_rewards"] if with_turn_rewards else [0.0] * len(batch["turns"])
    advantages, returns = gae_api(batch, 0.97, 0.9, batch["turn_rewards"] if with_turn_rewards else None)
    want_a, want_r = episode_gae_oracle(batch["values"], batch["rewards"], batch["masks"], batch["terminals"],
                                        batch["episodes"], batch["turns"], turn_rewards, 0.97, 0.9)  # fmt: skip
    for got, expected, back, expected_back in zip(advantages, want_a, returns, want_r):
        assert got.tolist() == pytest.approx(expected, rel=1e-10, abs=1e-10)
        assert back.tolist() == pytest.approx(expected_back, rel=1e-10, abs=1e-10)


def write_episode_files(directory, batch, parts):
    paths = write_turn_files(directory, batch, parts)
    cuts = [0, *parts, len(batch["turns"])]
    for path, (start, end) in zip(paths, zip(cuts, cuts[1:])):
        table = pq.read_table(path)
        values = pa.array(batch["values"][start:end], pa.list_(pa.float32()))
        pq.write_table(table.append_column("values", values), path)
    return paths


GAE_OPTIONS = ("--gamma", "0.97", "--lambd", "0.9", "--episode-col", "episode", "--turn-col", "turn",
               "--turn-rewards-col", "turn_reward")  # fmt: skip


def test_masked_gae_over_episodes_split_over_files_is_bitwise_the_same_everywhere(tmp_path, local_ray):
    batch = episode_batch(5)
    inputs = write_episode_files(tmp_path / "in", batch, [9, 30])
    first = bitwise_the_same_everywhere(tmp_path, inputs, GAE_OPTIONS, local_ray)
    table = pa.concat_tables(first)
    values = pa.array(batch["values"], pa.list_(pa.float32())).to_pylist()
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    want_a, want_r = episode_gae_oracle(values, rewards, batch["masks"], batch["terminals"], batch["episodes"],
                                        batch["turns"], batch["turn_rewards"], 0.97, 0.9)  # fmt: skip
    for got, expected in zip(table.column("advantages").to_pylist(), want_a):
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)
    for got, expected in zip(table.column("returns").to_pylist(), want_r):
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)
    whole = write_episode_files(tmp_path / "whole", batch, [])
    assert recompute_cli(whole, tmp_path / "whole.parquet", *GAE_OPTIONS, "--batch-rows", "3").exit_code == 0
    assert pq.read_table(tmp_path / "whole.parquet").column("advantages").equals(table.column("advantages"))


def test_the_commands_whiten_over_episodes_and_diff_against_the_rows_on_their_own(tmp_path):
    batch = episode_batch(6)
    inputs = write_episode_files(tmp_path / "in", batch, [])
    assert recompute_cli(inputs, tmp_path / "w.parquet", *GAE_OPTIONS, "--normalize").exit_code == 0
    whitened = [a for row, mask in zip(pq.read_table(tmp_path / "w.parquet").column("advantages").to_pylist(),
                                       batch["masks"]) for a, m in zip(row, mask) if m]  # fmt: skip
    assert abs(np.mean(whitened)) < 1e-5 and np.std(whitened, ddof=1) == pytest.approx(1.0, abs=1e-4)
    result = gae("diff", *inputs, *GAE_OPTIONS, "--baseline", "masked", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["summary"]["max_abs_delta_advantage"] > 0.01  # the rows on their own lose the later turns
    table = pq.read_table(inputs[0])
    own = gae("diff", *inputs, "--gamma", "0.97", "--lambd", "0.9", "--baseline", "masked", "--json", "-", "--quiet")
    assert json.loads(own.stdout)["summary"]["max_abs_delta_advantage"] == 0.0 and table.num_rows > 0


@pytest.mark.parametrize("options, message", [
    (("--lambd-critic", "1"), "episodes"),
    (("--timestep", "turn"), "episodes"),
])  # fmt: skip
def test_the_gae_variants_are_refused_over_episodes(tmp_path, options, message):
    inputs = write_episode_files(tmp_path / "in", episode_batch(1), [])
    result = recompute_cli(inputs, tmp_path / "out", *GAE_OPTIONS, *options)
    assert result.exit_code == 2 and message in result.stderr, result.output
    with pytest.raises(InvalidOptionError, match="turn_by"):
        AdvantageSpec(0.9, 0.9, episode_by="episode")
    with pytest.raises(ValueError, match="episodes"):
        from gaecli.advantages.dispatch import compute

        compute(AdvantageSpec(0.9, 0.9, episode_by="e", turn_by="t"), *([np.zeros(1)] * 2), np.ones(1, bool),
                np.array([0, 1]), np.zeros(1))  # fmt: skip


def test_the_commands_give_todays_bits_for_episodes_of_one_row(tmp_path):
    batch = episode_batch(8)
    batch["episodes"] = [f"own{row}" for row in range(len(batch["turns"]))]
    inputs = write_episode_files(tmp_path / "in", batch, [])
    assert recompute_cli(inputs, tmp_path / "episodes.parquet", *GAE_OPTIONS[:8]).exit_code == 0
    assert recompute_cli(inputs, tmp_path / "rows.parquet", *GAE_OPTIONS[:4]).exit_code == 0
    episodes, rows = (pq.read_table(tmp_path / name) for name in ("episodes.parquet", "rows.parquet"))
    assert episodes.column("advantages").equals(rows.column("advantages"))
    assert episodes.column("returns").equals(rows.column("returns"))
    assert json.loads(episodes.schema.metadata[b"gaecli.spec"])["episode_by"] == "episode"


# ----------------------------------------------------------------------------- outcome estimators over episodes

OUTCOME_ESTIMATORS = ["grpo", "dr-grpo", "rloo", "opo", "gpg", "reinforce++", "reinforce++-baseline"]


def outcome_options(estimator):
    groups = () if estimator == "reinforce++" else ("--group-col", "group")
    gamma = ("--gamma", "0.9") if estimator == "reinforce++" else ()
    return ("--estimator", estimator, *groups, *gamma, "--episode-col", "episode", "--turn-col", "turn")


def outcome_spec(estimator):
    groups = {} if estimator == "reinforce++" else {"group_by": "group"}
    gamma = 0.9 if estimator == "reinforce++" else None
    return AdvantageSpec(gamma, estimator=estimator, episode_by="episode", turn_by="turn", **groups)


def outcome_loop(estimator, batch, rewards=None):
    groups = None if estimator == "reinforce++" else batch["groups"]
    gamma = 0.9 if estimator == "reinforce++" else None
    return episode_outcome_oracle(estimator, rewards or batch["rewards"], batch["masks"], batch["terminals"],
                                  batch["episodes"], batch["turns"], groups, None, gamma)  # fmt: skip


def test_an_outcome_estimator_over_episodes_hand_worked():
    # episode x: outcome 1 + trainable rewards 0.2 (row 0) + 0.1 (row 1) = 1.3; y: 0 + 0.5 = 0.5 (row 3 masked).
    # One group of two episodes (each counted once): μ = 0.9, σ = √0.32; grpo ±0.4/(σ + 1e-6) on every row.
    batch = {**{key: list(values) for key, values in HAND.items()},
             "rewards": [[0.0, 0.2, 0.0], [0.0, 0.0, 0.1], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]}  # fmt: skip
    advantages, _ = api(batch, outcome_spec("grpo"))
    value = 0.4 / (np.sqrt(0.32) + 1e-6)
    want = [[value, value, 0.0], [0.0, value, value], [-value, 0.0, -value], [0.0] * 3]
    for got, expected in zip(advantages, want):
        assert got.tolist() == pytest.approx(expected, abs=1e-12)
    # opo's baseline weighs each episode by the trainable tokens of all its rows: (4·1.3 + 2·0.5)/6
    opo, _ = api(batch, outcome_spec("opo"))
    assert opo[0][0].item() == pytest.approx(1.3 - 6.2 / 6, abs=1e-12)
    assert opo[2][0].item() == pytest.approx(0.5 - 6.2 / 6, abs=1e-12)


@pytest.mark.parametrize("estimator", OUTCOME_ESTIMATORS)
def test_outcome_estimators_over_episodes_against_the_loop(estimator):
    batch = random_turn_rows(9)
    advantages, returns = api(batch, outcome_spec(estimator))
    want_a, want_r = outcome_loop(estimator, batch)
    for got, back, expected, expected_back in zip(advantages, returns, want_a, want_r):
        assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert back.tolist() == pytest.approx(expected_back, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("estimator", ["grpo", "reinforce++", "reinforce++-baseline"])
def test_outcome_estimators_over_episodes_are_bitwise_the_same_everywhere(tmp_path, estimator, local_ray):
    batch = random_turn_rows(10)
    inputs = write_turn_files(tmp_path / "in", batch, [11, 40])
    table = pa.concat_tables(bitwise_the_same_everywhere(tmp_path, inputs, outcome_options(estimator), local_ray))
    rewards = pa.array(batch["rewards"], pa.list_(pa.float32())).to_pylist()
    want_a, want_r = outcome_loop(estimator, batch, rewards)
    for got, expected in zip(table.column("advantages").to_pylist(), want_a):
        assert got == pytest.approx(expected, rel=2e-5, abs=2e-5)
    for got, expected in zip(table.column("returns").to_pylist(), want_r):
        assert got == pytest.approx(expected, rel=2e-5, abs=2e-5)


def test_outcome_estimators_give_todays_bits_for_episodes_of_one_row(tmp_path):
    batch = random_turn_rows(11)
    batch["episodes"] = [f"own{row}" for row in range(len(batch["turns"]))]
    inputs = write_turn_files(tmp_path / "in", batch, [])
    for estimator in ("grpo", "rloo"):
        assert recompute_cli(inputs, tmp_path / f"{estimator}-e.parquet", *outcome_options(estimator)).exit_code == 0
        plain = ("--estimator", estimator, "--group-col", "group")
        assert recompute_cli(inputs, tmp_path / f"{estimator}-r.parquet", *plain).exit_code == 0
        episodes, rows = (pq.read_table(tmp_path / f"{estimator}-{kind}.parquet") for kind in "er")
        assert episodes.column("advantages").equals(rows.column("advantages"))


def test_turn_rewards_are_refused_by_the_outcome_estimators(tmp_path):
    inputs = write_turn_files(tmp_path / "in", random_turn_rows(1, episodes=3), [])
    result = recompute_cli(inputs, tmp_path / "out", *outcome_options("grpo"), "--turn-rewards-col", "turn_reward")
    assert result.exit_code == 2 and "outcome and token rewards" in result.stderr, result.output
    both = gae("diff", *inputs, *outcome_options("reinforce++"), "--old-estimator", "reinforce++")
    assert both.exit_code == 2 and "one side may run its recursion" in both.stderr, both.output
