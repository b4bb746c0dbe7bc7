"""The whitening rules (docs/semantics.md#whitening-rules): every choice against a float64
loop written here, on the Python API (over the input and per group) and on the commands (over
files and batches, bitwise the same everywhere); today's rule kept bit for bit when no option
or ``--norm-like verl`` is given; the trainers' presets; the refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import bitwise_the_same_everywhere, read_outputs, recompute_cli
from trainer_loops_more import nemo_rl_whiten

import gaecli
from gaecli import AdvantageSpec, WhiteningRule
from gaecli.advantages.normalization import NORM_LIKE
from gaecli.errors import GAEInputError

from rollout_files import gae


def _counted(n, rule):
    """What a sum over ``n`` units is divided by: ``n``, or ``n + count_eps`` for more than one."""
    return n + rule.count_eps if n > 1 else n


def _leave_one_out_centers(values, rule):
    """Each unit's centre: the mean (0 without one) or, leave-one-out, the others' mean."""
    n, total = len(values), math.fsum(values)
    if rule.mean == "none":
        return [0.0] * n
    if rule.leave_one_out and n > 1:
        return [(total - v) / (n - 1) for v in values]
    return [total / _counted(n, rule)] * n


def whitened_loop(rows, masks, groups, rule: WhiteningRule):
    """The rule as plain Python per group of rows (``groups``: one key per row; the batch:
    every row): mean and variance over the level's trainable tokens by ``math.fsum``; the
    std about the centres when it is at the centre's level, else about its level's mean
    (leave-one-out: times n/(n − 1) of the centre's level); with ``count_eps`` δ, the mean and the
    squares over ``n + δ``, Bessel times ``n/(n − 1)`` (NeMo-RL's). With ``tokens="response"`` the
    statistics count every token, and the result is still written at trainable tokens only."""
    if rule.tokens == "response":
        whitened = whitened_loop(rows, [[1] * len(row) for row in rows], groups, replace(rule, tokens="trainable"))
        return [[value if m else 0.0 for value, m in zip(row, mask)] for row, mask in zip(whitened, masks)]
    out = [[0.0] * len(row) for row in rows]
    every = [(i, t) for i in range(len(rows)) for t, m in enumerate(masks[i]) if m]
    for group in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        cells = [(i, t) for i in members for t, m in enumerate(masks[i]) if m]
        level_cells = {"group": cells, "batch": every, "none": cells}
        center_cells = level_cells[rule.mean]
        center_values = [float(rows[i][t]) for i, t in center_cells]
        n = len(center_values)
        by_cell = dict(zip(center_cells, _leave_one_out_centers(center_values, rule)))
        centers = [by_cell[cell] for cell in cells] if rule.mean == "group" or rule.mean == "none" else None
        if centers is None:  # a batch centre: each of the group's cells has the batch's
            centers = [by_cell[cell] for cell in cells]
        std_cells = level_cells["group" if rule.std == "none" else rule.std]
        std_values = [float(rows[i][t]) for i, t in std_cells]
        m = len(std_values)
        if rule.std == rule.mean or rule.mean == "none":
            deviations = [v - c for v, c in zip(std_values, _leave_one_out_centers(std_values, rule))]
        else:
            mean = math.fsum(std_values) / _counted(m, rule)
            factor = n / (n - 1) if rule.leave_one_out and n > 1 else 1.0
            deviations = [(v - mean) * factor for v in std_values]
        squares = math.fsum(d * d for d in deviations)
        var = (squares / (m + rule.count_eps) * (m / (m - 1) if rule.unbiased else 1.0)) if m > 1 else 0.0
        if rule.std == "none":
            scale = 1.0
        elif rule.eps_in == "sqrt":
            scale = math.sqrt(var + rule.eps)
        elif rule.eps_in == "std":
            scale = math.sqrt(var) + rule.eps
        else:
            scale = math.sqrt(max(var, rule.eps))
        if rule.std != "none" and rule.std_floor is not None and math.sqrt(var) <= rule.std_floor:
            scale = math.inf if rule.below_floor == "zero" else 1.0
        if n <= 1 and rule.one_token == "keep":
            centers, scale = [0.0] * len(cells), 1.0
        for (i, t), c in zip(cells, centers):
            out[i][t] = (float(rows[i][t]) - c) / scale
    return out


def random_rows(seed: int, samples: int = 24, groups: int = 4):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 10, samples)
    return {
        "values": [rng.normal(0, 1, n).round(3).tolist() for n in lengths],
        "rewards": [rng.normal(0, 1, n).round(3).tolist() for n in lengths],
        "masks": [(rng.random(n) < 0.7).astype(int).tolist() for n in lengths],
        "terminals": rng.normal(0, 1, samples).round(3).tolist(),
        "groups": [f"g{k}" for k in rng.integers(0, groups, samples)],
    }


RULES = [
    WhiteningRule(),
    WhiteningRule(mean="none"),
    WhiteningRule(std="none"),
    WhiteningRule(unbiased=False),
    WhiteningRule(eps=1e-3, eps_in="std"),
    WhiteningRule(eps=0.5, eps_in="floor"),
    WhiteningRule(one_token="keep"),
    WhiteningRule(leave_one_out=True, eps=1e-5, eps_in="std"),
    WhiteningRule(leave_one_out=True, std="none"),
    WhiteningRule(std_floor=0.9, eps_in="std"),
    WhiteningRule(std_floor=0.9, below_floor="undivided", unbiased=False),
    WhiteningRule(std="batch"),
    WhiteningRule(mean="batch", std="group", eps_in="std"),
    WhiteningRule(mean="none", std="batch", unbiased=False),
    WhiteningRule(leave_one_out=True, std="batch"),
    WhiteningRule(tokens="response", leave_one_out=True, one_token="keep"),
    WhiteningRule(count_eps=0.5),
    WhiteningRule(count_eps=0.25, mean="none", unbiased=False),
    WhiteningRule(count_eps=0.5, mean="batch", std="group", eps_in="std"),
    WhiteningRule(count_eps=2.0, std="batch", one_token="keep", tokens="response"),
    *NORM_LIKE.values(),
]


def raw_advantages(batch, gamma=0.9, lambd=0.95):
    tensors = [[torch.tensor(row, dtype=torch.float64) for row in batch[name]] for name in ("values", "rewards")]
    masks = [torch.tensor(row) for row in batch["masks"]]
    advantages, _ = gaecli.compute_advantages(*tensors, masks, batch["terminals"], spec=AdvantageSpec(gamma, lambd))
    return [row.tolist() for row in advantages], tensors, masks


@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("by_group", [False, True])
def test_the_python_api_against_the_loop(rule, by_group):
    batch = random_rows(3)
    batch["masks"][5] = [0] * len(batch["masks"][5])
    raw, tensors, masks = raw_advantages(batch)
    keys = batch["groups"] if by_group else ["all"] * len(raw)
    spec = AdvantageSpec(0.9, 0.95, normalize="by" if by_group else "all", normalize_by="g" if by_group else None,
                         whitening_rule=rule)  # fmt: skip
    rows = {"g": batch["groups"]} if by_group else None
    got, _ = gaecli.compute_advantages(*tensors, masks, batch["terminals"], spec=spec, row_inputs=rows)
    want = whitened_loop(raw, batch["masks"], keys, rule)
    for got_row, want_row in zip(got, want):
        assert got_row.tolist() == pytest.approx(want_row, rel=1e-12, abs=1e-12)


def test_a_group_of_one_token_is_kept_or_zeroed():
    one = [torch.tensor([2.0, 5.0])], [torch.tensor([1, 0])]
    assert gaecli.whiten(*one, WhiteningRule(one_token="keep"))[0].tolist() == [2.0, 0.0]
    assert gaecli.whiten(*one)[0].tolist() == [0.0, 0.0]
    # per group: g0 holds one trainable token (kept as it is), g1 three (whitened)
    rows = [[2.0, 5.0], [1.0, 3.0], [4.0]]
    masks = [[1, 0], [1, 1], [1]]
    groups = ["g0", "g1", "g1"]
    spec = AdvantageSpec(1.0, 1.0, normalize="by", normalize_by="g", whitening_rule=WhiteningRule(one_token="keep"))
    values = [torch.zeros(len(row), dtype=torch.float64) for row in rows]
    rewards = [torch.tensor([0.0] * (len(row) - 1) + [row[-1]], dtype=torch.float64) for row in rows]
    raw, _ = gaecli.compute_advantages(
        values, rewards, [torch.tensor(m) for m in masks], [0.0] * 3, spec=AdvantageSpec(1.0, 1.0)
    )
    got, _ = gaecli.compute_advantages(
        values, rewards, [torch.tensor(m) for m in masks], [0.0] * 3, spec=spec, row_inputs={"g": groups}
    )
    want = whitened_loop([row.tolist() for row in raw], masks, groups, WhiteningRule(one_token="keep"))
    assert got[0].tolist() == [raw[0][0].item(), 0.0]
    for got_row, want_row in zip(got, want):
        assert got_row.tolist() == pytest.approx(want_row, rel=1e-12)


def write(directory, batch, parts, float_type=None):
    directory.mkdir()
    float_type = float_type or pa.float64()
    cuts = [0, *parts, len(batch["values"])]
    paths = []
    for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
        lists = pa.list_(float_type)
        table = pa.table(
            {
                "prompt_id": pa.array(batch["groups"][start:end]),
                "values": pa.array(batch["values"][start:end], lists),
                "rewards": pa.array(batch["rewards"][start:end], lists),
                "loss_mask": pa.array(batch["masks"][start:end], pa.list_(pa.int8())),
                "terminal_reward": pa.array(batch["terminals"][start:end], float_type),
            }
        )
        paths.append(directory / f"part-{index}.parquet")
        pq.write_table(table, paths[-1])
    return paths


GAE = ("--gamma", "0.9", "--lambd", "0.95")


@pytest.mark.parametrize(
    "options, rule",
    [
        (("--norm-mean", "none"), WhiteningRule(mean="none")),
        (("--norm-std-biased", "--norm-eps", "0.001", "--norm-eps-in", "std"),
         WhiteningRule(unbiased=False, eps=1e-3, eps_in="std")),
        (("--norm-like", "openrlhf"), NORM_LIKE["openrlhf"]),
        (("--norm-like", "areal", "--norm-eps", "0.25"), WhiteningRule(eps=0.25, eps_in="std")),
        (("--norm-leave-one-out", "--norm-std-floor", "0.9"), WhiteningRule(leave_one_out=True, std_floor=0.9)),
        (("--norm-std", "batch", "--norm-eps-in", "std"), WhiteningRule(std="batch", eps_in="std")),
        (("--norm-mean", "batch", "--norm-leave-one-out"), WhiteningRule(mean="batch", leave_one_out=True)),
        (("--norm-like", "skyrl"), WhiteningRule(tokens="response")),
        (("--norm-tokens", "response", "--norm-std", "batch"), WhiteningRule(tokens="response", std="batch")),
        (("--norm-like", "nemo-rl"), WhiteningRule(count_eps=1e-8)),
        (("--norm-count-eps", "0.5", "--norm-std-biased"), WhiteningRule(count_eps=0.5, unbiased=False)),
    ],
)  # fmt: skip
def test_the_commands_against_the_loop(tmp_path, options, rule):
    batch = random_rows(8, samples=20)
    inputs = write(tmp_path / "in", batch, [9])
    result = recompute_cli(inputs, tmp_path / "out", *GAE, "--normalize-by", "prompt_id", *options)
    assert result.exit_code == 0, result.output
    got = pa.concat_tables(read_outputs(tmp_path / "out")).column("advantages").to_pylist()
    raw, _, _ = raw_advantages(batch)
    want = whitened_loop(raw, batch["masks"], batch["groups"], rule)
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, rel=1e-9, abs=1e-9)


def test_norm_like_nemo_rl_is_nemo_rls_whitening(tmp_path):
    # γ = λ = 1 and no per-token reward: A_t = z − V_t at the four trainable tokens, 999.75, 1000.5,
    # 1000.25 and 1000.9. Their mean is some 2000 std: NeMo-RL's n + 1e-8 moves them by about 1e-5.
    batch = {
        "values": [[0.25, 0.5], [-0.5], [0.0, 0.75, 0.1]],
        "rewards": [[0.0, 0.0], [0.0], [0.0, 0.0, 0.0]],
        "masks": [[1, 0], [1], [0, 1, 1]],
        "terminals": [1000.0, 1000.0, 1001.0],
        "groups": ["a", "b", "a"],
    }
    raw = [[z - v if m else 0.0 for v, m in zip(row, mask)]
           for row, mask, z in zip(batch["values"], batch["masks"], batch["terminals"])]  # fmt: skip
    want = nemo_rl_whiten(raw, batch["masks"])
    inputs = write(tmp_path / "in", batch, [1])
    options = ("--gamma", "1", "--lambd", "1", "--normalize", "--norm-like", "nemo-rl")
    result = recompute_cli(inputs, tmp_path / "out", *options)
    assert result.exit_code == 0, result.output
    # the commands' variance is Σx² − Σ·mean over compensated sums: (mean/std)²·1e-16 off, some 1e-10 here
    got = [(1e-9, pa.concat_tables(read_outputs(tmp_path / "out")).column("advantages").to_pylist())]
    tensors = [[torch.tensor(row, dtype=torch.float64) for row in batch[name]] for name in ("values", "rewards")]
    masks = [torch.tensor(m) for m in batch["masks"]]
    for normalize, by in (("all", None), ("by", "g")):  # the whole input, and one group through the grouped path
        spec = AdvantageSpec(1.0, 1.0, normalize=normalize, normalize_by=by, whitening_rule=NORM_LIKE["nemo-rl"])
        rows = {"g": ["all"] * 3} if by else None
        advantages, _ = gaecli.compute_advantages(*tensors, masks, batch["terminals"], spec=spec, row_inputs=rows)
        got.append((1e-12, [row.tolist() for row in advantages]))
    exact_mean = whitened_loop(raw, batch["masks"], ["all"] * 3, WhiteningRule())  # the mean Σ/n
    for tolerance, rows in got:
        for got_row, want_row in zip(rows, want):
            assert got_row == pytest.approx(want_row, rel=tolerance, abs=tolerance)
        assert max(abs(a - b) for row, exact in zip(rows, exact_mean) for a, b in zip(row, exact)) > 1e-6


def test_today_rule_is_kept_bit_for_bit(tmp_path):
    batch = random_rows(2, samples=16)
    inputs = write(tmp_path / "in", batch, [7], float_type=pa.float32())
    outputs = {}
    for name, options in {"plain": (), "verl": ("--norm-like", "verl"), "explicit": ("--norm-eps", "1e-8")}.items():
        assert recompute_cli(inputs, tmp_path / name, *GAE, "--normalize", *options).exit_code == 0
        outputs[name] = [table.column("advantages") for table in read_outputs(tmp_path / name)]
    assert outputs["plain"] == outputs["verl"] == outputs["explicit"]
    assert recompute_cli(inputs, tmp_path / "biased", *GAE, "--normalize", "--norm-std-biased").exit_code == 0
    assert [table.column("advantages") for table in read_outputs(tmp_path / "biased")] != outputs["plain"]


@pytest.mark.parametrize("rule_options", [
    ("--norm-like", "areal", "--norm-mean", "none"),
    ("--norm-std", "batch", "--norm-leave-one-out"),
    ("--norm-like", "skyrl"),
])  # fmt: skip
def test_files_and_batches_give_the_same_bits_everywhere(tmp_path, local_ray, rule_options):
    batch = random_rows(5, samples=30)
    inputs = write(tmp_path / "in", batch, [8, 19], float_type=pa.float32())
    options = (*GAE, "--normalize-by", "prompt_id", *rule_options)
    first = bitwise_the_same_everywhere(tmp_path, inputs, options, local_ray)
    assert len(first) == 3


@pytest.mark.parametrize(
    "options, message",
    [
        (("--norm-like", "verl"), "turn --normalize on"),
        (("--normalize", "--norm-like", "trl"), "unknown trainer 'trl'"),
        (("--normalize", "--norm-mean", "row"), "--norm-mean"),
        (("--normalize", "--norm-eps", "-1"), "--norm-eps"),
        (("--normalize", "--norm-tokens", "loss"), "--norm-tokens"),
        (("--normalize", "--norm-count-eps", "-1e-8"), "--norm-count-eps"),
        (("--normalize", "--norm-like", "nemo-rl", "--norm-leave-one-out"), "takes no --norm-leave-one-out"),
    ],
)
def test_refusals_exit_2(tmp_path, options, message):
    inputs = write(tmp_path / "in", random_rows(1, samples=4), [])
    result = recompute_cli(inputs, tmp_path / "out.parquet", *GAE, *options)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    refused = gae("diff", *map(str, inputs), *GAE, *options)
    assert refused.exit_code == 2 and message in " ".join(refused.output.split())


def test_the_spec_refuses_a_rule_without_whitening():
    with pytest.raises(GAEInputError, match="says how normalize whitens"):
        AdvantageSpec(0.9, 0.9, whitening_rule=WhiteningRule())
    with pytest.raises(GAEInputError, match="must be a gaecli WhiteningRule"):
        AdvantageSpec(0.9, 0.9, normalize="all", whitening_rule={"eps": 1})
    spec = AdvantageSpec(0.9, 0.9, normalize="all", whitening_rule=WhiteningRule(eps=0.5))
    assert spec.to_dict()["whitening_rule"]["eps"] == 0.5


def test_a_rule_over_every_token_is_for_whitening_only():
    with pytest.raises(GAEInputError, match="every token of the response is for the whitening of GAE advantages"):
        AdvantageSpec(None, None, estimator="grpo", group_by="g", whitening_rule=WhiteningRule(tokens="response"))
    with pytest.raises(GAEInputError, match="--norm-tokens"):
        WhiteningRule(tokens="loss")
    spec = AdvantageSpec(0.9, 0.9, normalize="all", whitening_rule=NORM_LIKE["skyrl"])
    assert spec.to_dict()["whitening_rule"]["tokens"] == "response"
