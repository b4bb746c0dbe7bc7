"""A normalisation rule on grpo's and dr-grpo's scores (docs/semantics.md#whitening-rules):
each choice (levels, Bessel, ε and its place, the group of one, leave-one-out, the std floor)
against a float64 loop written here and hand-worked numbers; today's bytes kept under
``--norm-like verl`` and where a rule equals the estimator's own; over files, batches,
workers and engines the same bits; the trainers' presets; the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_estimators import (
    GROUPED,
    api,
    bitwise_the_same_everywhere,
    random_batch,
    read_outputs,
    recompute_cli,
    write_files,
)

import gaecli
from gaecli import AdvantageSpec, WhiteningRule
from gaecli.advantages.normalization import SCORE_NORM_LIKE, SCORE_RULE
from gaecli.errors import InvalidOptionError

from rollout_files import gae

assert "grpo" in GROUPED


def row_scores(batch):
    """Each row's score: its terminal reward plus its rewards at trainable tokens (float64,
    the rewards as float32 stores them when ``stored``)."""
    return [
        float(z) + math.fsum(float(r) for r, m in zip(rewards, mask) if m)
        for rewards, mask, z in zip(batch["rewards"], batch["masks"], batch["terminals"])
    ]


def normalized_loop(scores, groups, steps, rule: WhiteningRule):
    """The rule on per-row ``scores`` as plain Python: the centre the mean of the row's group
    (``groups``) or batch (``steps``; None: all rows), leave-one-out the others' mean; the std
    at its level about that level's mean (about 0 without a centre, about each row's
    leave-one-out centre with it, or of the row's others), Bessel or biased; ε in its place; a
    group of one as the rule says; a std at or below the floor gives 0 or leaves the centred
    value undivided; ``count_eps`` δ: the mean's and the squares' sums over ``n + δ`` (more
    than one row), Bessel times ``n/(n − 1)``."""
    steps = steps if steps is not None else [0] * len(scores)
    level_keys = {"group": groups, "batch": steps}
    out = []
    for row, score in enumerate(scores):
        members = {
            level: [i for i, key in enumerate(keys) if key == keys[row]] for level, keys in level_keys.items()
        }
        center_level = "group" if rule.mean == "none" else rule.mean
        n = len(members[center_level])
        mates = [scores[i] for i in members[center_level]]
        if rule.mean == "none":
            center = 0.0
        elif rule.leave_one_out and n > 1:
            center = (math.fsum(mates) - score) / (n - 1)
        else:
            center = math.fsum(mates) / (n + rule.count_eps if n > 1 else n)
        if rule.std == "none":
            scale = 1.0
        else:
            values = [scores[i] for i in members[rule.std]]
            if rule.std_of_others:
                values = [scores[i] for i in members[rule.std] if i != row]
            m = len(values)
            if rule.std_of_others:
                mean = math.fsum(values) / m if m else 0.0
                deviations = [v - mean for v in values]
            elif rule.mean == "none":
                deviations = values
            elif rule.leave_one_out and n > 1 and rule.std == center_level:
                total = math.fsum(values)
                deviations = [v - (total - v) / (m - 1) for v in values]
            else:
                mean = math.fsum(values) / (m + rule.count_eps if m > 1 else m)
                deviations = [v - mean for v in values]
                if rule.leave_one_out and n > 1:
                    deviations = [d * n / (n - 1) for d in deviations]
            squares = math.fsum(d * d for d in deviations)
            variance = 0.0 if m <= 1 else squares / (m + rule.count_eps) * (m / (m - 1) if rule.unbiased else 1.0)
            if n <= 1 and rule.one_token == "unit":
                variance = 1.0
            std = math.sqrt(variance)
            if rule.eps_in == "sqrt":
                scale = math.sqrt(variance + rule.eps)
            elif rule.eps_in == "std":
                scale = std + rule.eps
            else:
                scale = math.sqrt(max(variance, rule.eps))
            if rule.std_floor is not None and std <= rule.std_floor:
                scale = math.inf if rule.below_floor == "zero" else 1.0
        if n <= 1 and rule.one_token != "zero":
            center = 0.0
            scale = 1.0 if rule.one_token == "keep" else scale
        out.append((score - center) / scale)
    return out


def spread(row_values, masks):
    """Each row's value on its trainable tokens, 0 at the masked ones."""
    return [[value if m else 0.0 for m in mask] for value, mask in zip(row_values, masks)]


RULES = [
    SCORE_RULE,
    WhiteningRule(),
    WhiteningRule(mean="none", eps_in="std"),
    WhiteningRule(std="none"),
    WhiteningRule(unbiased=False, eps=1e-3, eps_in="floor"),
    WhiteningRule(std="batch", eps_in="std", eps=1e-6),
    WhiteningRule(mean="batch", std="batch", one_token="keep"),
    WhiteningRule(mean="batch", std="group", one_token="unit"),
    WhiteningRule(leave_one_out=True, eps=1e-5, eps_in="std"),
    WhiteningRule(leave_one_out=True, std="batch", unbiased=False),
    WhiteningRule(leave_one_out=True, mean="batch", std="batch"),
    WhiteningRule(std_floor=1e-6, eps=1e-6, eps_in="std"),
    WhiteningRule(leave_one_out=True, std_of_others=True, std_floor=0.0, below_floor="undivided"),
    WhiteningRule(leave_one_out=True, std_of_others=True, unbiased=False, std_floor=0.5, below_floor="undivided"),
    WhiteningRule(count_eps=0.5, eps_in="std"),
    WhiteningRule(count_eps=0.25, mean="batch", std="group", unbiased=False, one_token="unit"),
    *SCORE_NORM_LIKE.values(),
]


@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("steps", [False, True])
def test_the_python_api_against_the_loop(rule, steps):
    batch = random_batch(4, samples=36, groups=8)
    batch["rewards"][3] = [0.5] * len(batch["rewards"][3])  # a group's scores may tie: the floor's case
    reads_steps = steps and "batch" in rule.levels_used()
    step_ids = batch["steps"] if reads_steps else None
    advantages, returns = api("grpo", batch, steps=step_ids, whitening_rule=rule)
    want = normalized_loop(row_scores(batch), batch["groups"], step_ids, rule)
    for got, expected in zip(advantages, spread(want, batch["masks"])):
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert returns == advantages


# Scores 1, 2, 3, 6 in group a and 4 alone in group b (one trainable token each).
HAND = {
    "rewards": [[1.0], [2.0], [3.0], [6.0], [4.0]],
    "masks": [[1]] * 5,
    "terminals": [0.0] * 5,
    "groups": ["a", "a", "a", "a", "b"],
    "steps": [0] * 5,
}


def test_hand_worked_numbers():
    # group a: mean 3, Bessel variance (4 + 1 + 0 + 9)/3 = 14/3, biased 14/4 = 3.5
    bessel, biased = math.sqrt(14 / 3), math.sqrt(3.5)
    cases = {
        WhiteningRule(eps=0.0, eps_in="std", one_token="unit"): [-2 / bessel, -1 / bessel, 0.0, 3 / bessel, 4.0],
        WhiteningRule(unbiased=False, eps=0.0, eps_in="std", one_token="keep"): [-2 / biased, -1 / biased, 0.0,
                                                                                3 / biased, 4.0],
        WhiteningRule(std="none"): [-2.0, -1.0, 0.0, 3.0, 0.0],
        # leave-one-out: the others' means 11/3, 10/3, 3, 2; deviations (4/3)(s − 3); their Bessel std (4/3)·bessel
        WhiteningRule(leave_one_out=True, std="none"): [-8 / 3, -4 / 3, 0.0, 4.0, 0.0],
        WhiteningRule(leave_one_out=True, eps=1e-300, eps_in="std"): [-2 / bessel, -1 / bessel, 0.0, 3 / bessel, 0.0],
        # batch: all five rows, mean 16/5
        WhiteningRule(mean="batch", std="none"): [1 - 3.2, 2 - 3.2, 3 - 3.2, 6 - 3.2, 4 - 3.2],
        # a std floor above group a's std: a normalises to 0; b (variance 0) too
        WhiteningRule(std_floor=3.0, eps_in="std"): [0.0] * 5,
        # the others' means 11/3, 10/3, 3, 2 and the others' Bessel stds: of {2, 3, 6} sqrt(13/3), of {1, 3, 6}
        # sqrt(19/3), of {1, 2, 6} sqrt(7), of {1, 2, 3} 1; b has no other: undivided, s − s = 0
        WhiteningRule(leave_one_out=True, std_of_others=True, eps=0.0, eps_in="std", std_floor=0.0,
                      below_floor="undivided"): [(1 - 11 / 3) / math.sqrt(13 / 3), (2 - 10 / 3) / math.sqrt(19 / 3),
                                                 0.0, 4.0, 0.0],
    }  # fmt: skip
    for rule, expected in cases.items():
        advantages, _ = api("grpo", HAND, whitening_rule=rule)
        assert [row[0] for row in advantages] == pytest.approx(expected, rel=1e-14, abs=1e-14), rule


def test_a_rule_equal_to_the_estimators_own_keeps_its_bits(tmp_path):
    """Today's grpo is the rule SCORE_RULE; dr-grpo's is it without the std; on the commands,
    bit for bit."""
    batch = random_batch(6, samples=30, groups=7)
    inputs = write_files(tmp_path / "in", batch, [11])
    runs = {
        "grpo": ("--estimator", "grpo"),
        "verl": ("--estimator", "grpo", "--norm-like", "verl"),
        "explicit": ("--estimator", "grpo", "--norm-eps", "1e-6"),
        "dr-grpo": ("--estimator", "dr-grpo"),
        "no-std": ("--estimator", "grpo", "--norm-std", "none"),
        "biased": ("--estimator", "grpo", "--norm-std-biased"),
    }
    columns = {}
    for name, options in runs.items():
        result = recompute_cli(inputs, tmp_path / name, "--group-col", "prompt_id", *options)
        assert result.exit_code == 0, result.output
        columns[name] = [table.column("advantages") for table in read_outputs(tmp_path / name)]
    assert columns["grpo"] == columns["verl"] == columns["explicit"]
    assert columns["dr-grpo"] == columns["no-std"]
    assert columns["biased"] != columns["grpo"]


def stored(batch):
    """``batch`` with its rewards and terminal rewards as float32 files store them."""
    rewards = [np.float32(r).astype(float).tolist() for r in batch["rewards"]]
    return dict(batch, rewards=rewards, terminals=np.float32(batch["terminals"]).astype(float).tolist())


@pytest.mark.parametrize("like", sorted(SCORE_NORM_LIKE))
def test_each_trainers_rule_on_the_commands_against_the_loop(tmp_path, like):
    """Each preset on groups of one, two, tied and spread scores, over two files."""
    batch = random_batch(12, samples=30, groups=9)
    batch["groups"][:4] = ["solo", "pair", "pair", "tied"]
    batch["groups"][-1] = "tied"
    for row in (3, len(batch["groups"]) - 1):
        batch["rewards"][row], batch["masks"][row], batch["terminals"][row] = [0.25], [1], 1.0
    inputs = write_files(tmp_path / "in", batch, [14])
    result = recompute_cli(inputs, tmp_path / "out", "--estimator", "grpo", "--group-col", "prompt_id",
                           "--norm-like", like)  # fmt: skip
    assert result.exit_code == 0, result.output
    got = pa.concat_tables(read_outputs(tmp_path / "out")).column("advantages").to_pylist()
    want = spread(normalized_loop(row_scores(stored(batch)), batch["groups"], None, SCORE_NORM_LIKE[like]),
                  batch["masks"])  # fmt: skip
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, rel=2e-6, abs=2e-6)
    tied = [row for row, group in enumerate(batch["groups"]) if group == "tied"]
    if SCORE_NORM_LIKE[like].mean == "group":  # a tied group: exactly 0
        assert all(value == 0.0 for row in tied for value in got[row])


@pytest.mark.parametrize("rule_options, rule", [
    (("--norm-like", "roll"), SCORE_NORM_LIKE["roll"]),
    (("--norm-like", "areal", "--norm-std", "batch"), None),
    (("--norm-leave-one-out", "--norm-std-biased", "--norm-std", "batch"), None),
    (("--norm-mean", "batch", "--norm-one-token", "keep", "--norm-std-floor", "0.01"), None),
])  # fmt: skip
def test_the_commands_are_bitwise_the_same_everywhere_and_match_the_loop(tmp_path, local_ray, rule_options, rule):
    batch = random_batch(9, samples=40, groups=8, steps=3)
    inputs = write_files(tmp_path / "in", batch, [9, 23])
    options = ("--estimator", "grpo", "--group-col", "prompt_id", *rule_options)
    from gaecli.cli.computation_options import make_whitening_rule

    flags = dict(zip(rule_options[::2], rule_options[1::2]))
    if rule is None:
        rule = make_whitening_rule(
            "grpo",
            norm_like=flags.get("--norm-like"),
            norm_mean=flags.get("--norm-mean"),
            norm_std=flags.get("--norm-std"),
            norm_unbiased=False if "--norm-std-biased" in rule_options else None,
            norm_one_token=flags.get("--norm-one-token"),
            norm_leave_one_out=True if "--norm-leave-one-out" in rule_options else None,
            norm_std_floor=float(flags["--norm-std-floor"]) if "--norm-std-floor" in flags else None,
        )
    step_ids = None
    if "batch" in rule.levels_used():
        options += ("--step-col", "step")
        step_ids = batch["steps"]
    first = bitwise_the_same_everywhere(tmp_path, inputs, options, local_ray)
    want = spread(normalized_loop(row_scores(stored(batch)), batch["groups"], step_ids, rule), batch["masks"])
    got = pa.concat_tables(first).column("advantages").to_pylist()
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, rel=2e-6, abs=2e-6)
    spec = json.loads(first[0].schema.metadata[b"gaecli.spec"])
    assert spec["whitening_rule"]["leave_one_out"] == rule.leave_one_out


def test_diff_compares_a_trainers_grpo_with_todays(tmp_path):
    """The rule is the new side's: --old-estimator grpo stays today's grpo."""
    batch = random_batch(3, samples=24, groups=5)
    inputs = write_files(tmp_path / "in", batch, [])
    diffed = gae("diff", inputs[0], "--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "grpo",
                 "--norm-std-biased", "--json", "-", "--quiet")  # fmt: skip
    assert diffed.exit_code == 0, diffed.output
    scores = row_scores(stored(batch))
    new = normalized_loop(scores, batch["groups"], None, WhiteningRule(unbiased=False, eps=1e-6, eps_in="std",
                                                                        one_token="unit"))  # fmt: skip
    old = normalized_loop(scores, batch["groups"], None, SCORE_RULE)
    largest = max(abs(a - b) for a, b, mask in zip(new, old, batch["masks"]) if any(mask))
    assert json.loads(diffed.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-5)


@pytest.mark.parametrize("options, message", [
    (("--estimator", "rloo", "--norm-like", "verl"), "--estimator 'rloo' has its own rule"),
    (("--estimator", "grpo", "--norm-leave-one-out", "--norm-mean", "none"), "needs --norm-mean group or batch"),
    (("--estimator", "grpo", "--step-col", "step"), "--step-col"),
    (("--estimator", "grpo", "--norm-std-floor", "-1"), "--norm-std-floor"),
    (("--estimator", "grpo", "--norm-one-token", "drop"), "--norm-one-token"),
])  # fmt: skip
def test_refused_rules_exit_2(tmp_path, options, message):
    batch = random_batch(1, samples=8, groups=2)
    inputs = write_files(tmp_path / "in", batch, [])
    result = recompute_cli(inputs, tmp_path / "out", "--group-col", "prompt_id", *options)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_the_spec_refuses_a_rule_on_an_estimator_with_its_own():
    with pytest.raises(InvalidOptionError, match="has its own rule"):
        AdvantageSpec(estimator="maxrl", group_by="g", whitening_rule=SCORE_RULE)
    spec = AdvantageSpec(estimator="dr-grpo", group_by="g", step_by="s", whitening_rule=WhiteningRule(std="batch"))
    assert spec.step_by == "s"
    with pytest.raises(InvalidOptionError, match="step_by"):
        AdvantageSpec(estimator="grpo", group_by="g", step_by="s", whitening_rule=SCORE_RULE)
    others = WhiteningRule(leave_one_out=True, std_of_others=True)
    with pytest.raises(InvalidOptionError, match="is for the scores"):
        AdvantageSpec(1.0, 1.0, normalize="all", whitening_rule=others)
    with pytest.raises(InvalidOptionError, match="needs --norm-leave-one-out"):
        WhiteningRule(std_of_others=True)
    with pytest.raises(InvalidOptionError, match="--norm-below-floor"):
        WhiteningRule(std_floor=0.0, below_floor="one")


def test_the_old_side_carries_its_own_distillation_term(tmp_path):
    """--old-opd-coef: the old side's advantages less its coefficient times the teacher KL (k1
    by default), at the same stage; equal coefficients on the same estimator: no difference."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 7, 10)
    lists = pa.list_(pa.float32())
    table = pa.table({
        "rewards": pa.array([rng.normal(size=n).round(2).tolist() for n in lengths], lists),
        "loss_mask": [(rng.random(n) < 0.7).astype(int).tolist() for n in lengths],
        "terminal_reward": rng.normal(size=10).round(2),
        "log_probs": pa.array([(-rng.random(n)).round(3).tolist() for n in lengths], lists),
        "teacher_log_probs": pa.array([(-rng.random(n)).round(3).tolist() for n in lengths], lists),
        "prompt_id": [f"p{i % 3}" for i in range(10)],
    })  # fmt: skip
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    base = ("diff", path, "--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "grpo", "--json", "-",
            "--quiet", "--opd-coef", "0.5")  # fmt: skip
    same = gae(*base, "--old-opd-coef", "0.5")
    assert same.exit_code == 0, same.output
    assert json.loads(same.stdout)["summary"]["max_abs_delta_advantage"] == 0.0
    other = gae(*base, "--old-opd-coef", "0.25")
    student, teacher = (table.column(name).to_pylist() for name in ("log_probs", "teacher_log_probs"))
    kl = [np.float32(s).astype(float) - np.float32(t).astype(float) for s, t in zip(student, teacher)]
    largest = max(0.25 * abs(k) for row, mask in zip(kl, table.column("loss_mask").to_pylist())
                  for k, m in zip(row, mask) if m)  # fmt: skip
    assert json.loads(other.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-5)
    stored = gae("diff", path, "--estimator", "grpo", "--group-col", "prompt_id", "--against", "rewards",
                 "--old-opd-coef", "0.5", "--quiet")  # fmt: skip
    assert stored.exit_code == 2 and "recomputed old side" in stored.stderr


def test_the_table_api_gives_the_commands_bits(tmp_path):
    batch = random_batch(10, samples=20, groups=4)
    inputs = write_files(tmp_path / "in", batch, [])
    options = ("--estimator", "grpo", "--group-col", "prompt_id", "--norm-like", "nemo-rl")
    assert recompute_cli(inputs, tmp_path / "out.parquet", *options).exit_code == 0
    table = gaecli.recompute_table(
        pq.read_table(inputs[0]), estimator="grpo", group_by="prompt_id", whitening_rule=SCORE_NORM_LIKE["nemo-rl"],
        columns=gaecli.Columns(values=None),
    )
    assert table.column("advantages").equals(pq.read_table(tmp_path / "out.parquet").column("advantages"))
