"""On-policy distillation (docs/estimators.md#on-policy-distillation): the pure estimator
``opd`` and the term ``--opd-coef`` adds to another estimator, before or after the whitening,
against hand-worked numbers and a float64 loop written here; files and batches bitwise the
same everywhere; the teacher's log-probs checked as a token column; the Python functions."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import bitwise_the_same_everywhere, random_batch, read_outputs, recompute_cli

import gaecli
from gaecli.errors import GAEInputError

from helpers import critic_free_oracle
from rollout_files import gae

# Three samples; KL k1 = student − teacher per token.
#   0: mask [1, 1], student [−0.5, −1.0], teacher [−0.4, −1.5] → KL [−0.1, 0.5]
#   1: mask [1, 0, 1], student [−1, −2, −0.1], teacher [−0.5, −9, −0.3] → KL [−0.5, (7), 0.2]
#   2: mask [0] → nothing trainable
HAND = {
    "rewards": [[0.0, 1.0], [2.0, 9.0, 0.0], [4.0]],
    "masks": [[1, 1], [1, 0, 1], [0]],
    "terminals": [1.0, 0.0, 5.0],
    "student": [[-0.5, -1.0], [-1.0, -2.0, -0.1], [-0.3]],
    "teacher": [[-0.4, -1.5], [-0.5, -9.0, -0.3], [-0.1]],
    "groups": ["a", "a", "b"],
    "steps": [0, 0, 0],
}


def write(directory, batch, parts=(), float_type=None, teacher="teacher_log_probs"):
    """``batch`` as Parquet files cut after the rows in ``parts``, with the log-prob columns."""
    directory.mkdir()
    float_type = float_type or pa.float64()
    cuts = [0, *parts, len(batch["rewards"])]
    paths = []
    for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
        lists = pa.list_(float_type)
        table = pa.table(
            {
                "prompt_id": pa.array(batch["groups"][start:end], pa.string()),
                "step": pa.array(batch["steps"][start:end], pa.int64()),
                "rewards": pa.array(batch["rewards"][start:end], lists),
                "loss_mask": pa.array(batch["masks"][start:end], pa.list_(pa.int8())),
                "terminal_reward": pa.array(batch["terminals"][start:end], float_type),
                "log_probs": pa.array(batch["student"][start:end], lists),
                teacher: pa.array(batch["teacher"][start:end], lists),
            }
        )
        path = directory / f"part-{index}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def with_log_probs(batch, seed):
    """``batch`` with a student's and a teacher's log-probs of its lengths."""
    rng = np.random.default_rng(seed)
    batch["student"] = [(-rng.random(len(r)) * 3).round(4).tolist() for r in batch["rewards"]]
    batch["teacher"] = [(-rng.random(len(r)) * 3).round(4).tolist() for r in batch["rewards"]]
    return batch


def kl_loop(student, teacher, estimator="k1"):
    out = []
    for s_row, t_row in zip(student, teacher):
        row = []
        for s, t in zip(s_row, t_row):
            x = s - t
            row.append(x if estimator == "k1" else math.exp(-x) - 1 + x)
        out.append(row)
    return out


def whitened_loop(rows, masks):
    """``(A − mean) / sqrt(var + 1e-8)`` over the trainable tokens, Bessel variance, 0 masked."""
    cells = [a for row, mask in zip(rows, masks) for a, m in zip(row, mask) if m]
    mean = math.fsum(cells) / len(cells)
    var = math.fsum((a - mean) ** 2 for a in cells) / (len(cells) - 1) if len(cells) > 1 else 0.0
    return [
        [(a - mean) / math.sqrt(var + 1e-8) if m else 0.0 for a, m in zip(row, mask)] for row, mask in zip(rows, masks)
    ]


def outputs(path) -> tuple[list, list]:
    """Advantages and returns of an output file, or of the outputs in a directory."""
    table = pq.read_table(path) if path.is_file() else pa.concat_tables(read_outputs(path))
    return table.column("advantages").to_pylist(), table.column("returns").to_pylist()


def assert_rows(got, want, rel=1e-12):
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, rel=rel, abs=rel)


def test_the_pure_estimator_by_hand(tmp_path):
    inputs = write(tmp_path / "in", HAND)
    assert recompute_cli(inputs, tmp_path / "out", "--estimator", "opd").exit_code == 0
    advantages, returns = outputs(tmp_path / "out")
    assert_rows(advantages, [[0.1, -0.5], [0.5, 0.0, -0.2], [0.0]])
    assert returns == advantages
    want = gaecli.distillation_advantages(
        [torch.tensor(row, dtype=torch.float64) for row in HAND["student"]],
        [torch.tensor(row, dtype=torch.float64) for row in HAND["teacher"]],
        [torch.tensor(row) for row in HAND["masks"]],
    )
    assert_rows([row.tolist() for row in want], advantages, rel=1e-15)


def test_the_term_on_grpo_by_hand(tmp_path):
    # grpo over group a (s = 2, 2) is 0; group b alone: s = z = 5 → 5 / (1 + 1e-6), but no trainable token
    inputs = write(tmp_path / "in", HAND)
    options = ("--estimator", "grpo", "--group-col", "prompt_id", "--opd-coef", "0.5")
    assert recompute_cli(inputs, tmp_path / "out", *options).exit_code == 0
    advantages, returns = outputs(tmp_path / "out")
    assert_rows(advantages, [[0.05, -0.25], [0.25, 0.0, -0.1], [0.0]])
    assert_rows(returns, [[0.0, 0.0], [0.0, 0.0, 0.0], [0.0]])  # the returns are grpo's alone


@pytest.mark.parametrize("stage", ["before-whiten", "after-whiten"])
def test_the_stage_before_or_after_the_whitening(tmp_path, stage):
    batch = with_log_probs(random_batch(4, samples=14), 4)
    inputs = write(tmp_path / "in", batch, [6])
    options = ("--estimator", "reinforce++", "--gamma", "0.9", "--opd-coef", "0.3", "--opd-stage", stage)
    result = recompute_cli(inputs, tmp_path / "out", *options)
    assert result.exit_code == 0, result.output
    advantages, returns = outputs(tmp_path / "out")
    # the oracle's returns are reinforce++'s G, before its whitening
    _, want_returns = critic_free_oracle("reinforce++", batch["rewards"], batch["masks"], batch["terminals"], gamma=0.9)
    kl = kl_loop(batch["student"], batch["teacher"])
    masks = batch["masks"]

    def shifted(rows):
        return [[a - 0.3 * k if m else a for a, k, m in zip(r, kr, mr)] for r, kr, mr in zip(rows, kl, masks)]

    if stage == "before-whiten":
        want = whitened_loop(shifted(want_returns), masks)
    else:
        want = shifted(whitened_loop(want_returns, masks))
    assert_rows(advantages, want, rel=1e-9)
    assert_rows(returns, want_returns, rel=1e-12)


@pytest.mark.parametrize(
    "options",
    [
        ("--estimator", "opd"),
        ("--estimator", "reinforce++", "--gamma", "1", "--step-col", "step", "--opd-coef", "0.3"),
        ("--estimator", "gdpo", "--group-col", "prompt_id", "--reward-cols", "terminal_reward", "--opd-coef", "2",
         "--opd-stage", "after-whiten"),
    ],
)  # fmt: skip
def test_files_and_batches_give_the_same_bits_everywhere(tmp_path, options, local_ray):
    batch = with_log_probs(random_batch(9, samples=24, groups=5), 9)
    inputs = write(tmp_path / "in", batch, [5, 13], float_type=pa.float32())
    first = bitwise_the_same_everywhere(tmp_path, inputs, options, local_ray)
    assert pa.concat_tables(first).num_rows == 24


def test_diff_compares_the_term_with_the_estimator_alone(tmp_path):
    batch = with_log_probs(random_batch(6, samples=16, groups=4), 6)
    inputs = write(tmp_path / "in", batch, [7])
    common = ("--group-col", "prompt_id", "--json", "-", "--quiet")
    result = gae(
        "diff", *map(str, inputs), "--estimator", "rloo", "--opd-coef", "2", "--old-estimator", "rloo", *common
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    kl = kl_loop(batch["student"], batch["teacher"])
    largest = max(abs(2 * k) for row, mask in zip(kl, batch["masks"]) for k, m in zip(row, mask) if m)
    assert document["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-12)


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", "opd", "--opd-coef", "1"), "leave --opd-coef out"),
        (("--estimator", "opd", "--opd-stage", "never"), "--opd-stage"),
        (("--estimator", "opd", "--opd-coef", "nan"), "--opd-coef"),
        (("--estimator", "opd", "--teacher-logprobs-col", "nope"), "nope"),
    ],
)
def test_usage_errors(tmp_path, options, message):
    inputs = write(tmp_path / "in", HAND)
    result = recompute_cli(inputs, tmp_path / "out", *options)
    assert result.exit_code in (1, 2), result.output
    assert result.exit_code == 2 or "missing" in result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_bad_teacher_log_prob_is_invalid_data(tmp_path, bad):
    batch = {**HAND, "teacher": [[-0.4, -1.5], [-0.5, bad, -0.3], [-0.1]]}
    inputs = write(tmp_path / "in", batch)
    result = recompute_cli(
        inputs, tmp_path / "out", "--estimator", "grpo", "--group-col", "prompt_id", "--opd-coef", "1"
    )
    assert result.exit_code == 1, result.output
    assert "part-0.parquet, row 1, column 'teacher_log_probs'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))
    # without the term the teacher is not read, and the same file computes
    assert recompute_cli(inputs, tmp_path / "plain", "--estimator", "grpo", "--group-col", "prompt_id").exit_code == 0


def test_the_python_functions():
    student = [torch.tensor([-0.5, -1.0]), torch.tensor([-1.0, -2.0, -0.1])]
    teacher = [torch.tensor([-0.4, -1.5]), torch.tensor([-0.5, -9.0, -0.3])]
    masks = [torch.tensor([1, 1]), torch.tensor([1, 0, 1])]
    base = [torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([0.0, 0.0, 3.0], dtype=torch.float64)]
    got = gaecli.add_distillation(base, student, teacher, masks, coef=2.0, kl_estimator="k3")
    k3 = kl_loop([s.tolist() for s in student], [t.tolist() for t in teacher], "k3")
    want = [
        [b - 2.0 * k if m else b for b, k, m in zip(br.tolist(), kr, mr.tolist())]
        for br, kr, mr in zip(base, k3, masks)
    ]
    assert_rows([row.tolist() for row in got], want, rel=1e-6)  # the log-probs are float32
    assert got[0].dtype == torch.float64 and base[0].tolist() == [1.0, 2.0]  # not modified
    with pytest.raises(GAEInputError, match="sample 1: teacher_log_probs is nan at token 2"):
        gaecli.add_distillation(base, student, [teacher[0], torch.tensor([0.0, 0.0, math.nan])], masks, coef=1.0)
    with pytest.raises(GAEInputError, match="sample 0: log_probs has 1 tokens, loss_mask 2"):
        gaecli.distillation_advantages([torch.zeros(1), student[1]], teacher, masks)
    with pytest.raises(GAEInputError, match="distillation_advantages"):
        gaecli.compute_advantages(None, [torch.zeros(2)], masks[:1], [0.0], spec=gaecli.AdvantageSpec(estimator="opd"))
