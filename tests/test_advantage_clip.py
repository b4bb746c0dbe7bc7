"""--advantage-clip (docs/semantics.md#advantage-clip): the new advantages clipped to [−C, C]
after every normalisation, the returns not, against the unclipped outputs clamped here; on
the Python API, the commands and the table API; the refusals."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_estimators import random_batch, recompute_cli, write_files

import gaecli
from gaecli import AdvantageSpec
from gaecli.errors import InvalidOptionError

from rollout_files import gae


def clamp(rows, limit):
    return [[min(max(value, -limit), limit) for value in row] for row in rows]


def grpo_api(batch, **spec):
    return gaecli.compute_advantages(
        None,
        [torch.tensor(row, dtype=torch.float64) for row in batch["rewards"]],
        [torch.tensor(row, dtype=torch.int64) for row in batch["masks"]],
        batch["terminals"],
        spec=AdvantageSpec(estimator="grpo", group_by="g", **spec),
        row_inputs={"g": batch["groups"]},
    )


def test_the_python_api_clips_the_advantages_and_not_the_returns():
    batch = random_batch(3, samples=30, groups=6)
    plain, _ = grpo_api(batch)
    limit = 0.5 * max(abs(value) for row in plain for value in row.tolist())
    clipped, returns = grpo_api(batch, advantage_clip=limit)
    assert [row.tolist() for row in clipped] == clamp([row.tolist() for row in plain], limit)
    assert [row.tolist() for row in returns] == [row.tolist() for row in plain]  # grpo's returns: unclipped
    assert any(abs(value) == limit for row in clipped for value in row.tolist())


def test_gae_is_clipped_after_its_whitening():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 9, 12)
    values = [torch.tensor(rng.normal(size=n)) for n in lengths]
    rewards = [torch.tensor(rng.normal(size=n)) for n in lengths]
    masks = [torch.tensor((rng.random(n) < 0.7).astype(np.int64)) for n in lengths]
    terminal = rng.normal(size=12).tolist()
    whitened, returns = gaecli.compute_advantages(values, rewards, masks, terminal,
                                                  spec=AdvantageSpec(0.9, 0.95, normalize="all"))  # fmt: skip
    clipped, clipped_returns = gaecli.compute_advantages(
        values, rewards, masks, terminal, spec=AdvantageSpec(0.9, 0.95, normalize="all", advantage_clip=1.0)
    )
    assert [row.tolist() for row in clipped] == clamp([row.tolist() for row in whitened], 1.0)
    assert all(torch.equal(a, b) for a, b in zip(returns, clipped_returns))


@pytest.mark.parametrize("options", [
    ("--estimator", "grpo", "--group-col", "prompt_id"),
    ("--estimator", "reinforce++", "--gamma", "0.9", "--step-col", "step"),
])  # fmt: skip
def test_the_commands_clip_what_they_would_write(tmp_path, options):
    batch = random_batch(5, samples=40, groups=8)
    inputs = write_files(tmp_path / "in", batch, [])
    assert recompute_cli(inputs, tmp_path / "plain.parquet", *options).exit_code == 0
    result = recompute_cli(inputs, tmp_path / "clip.parquet", *options, "--advantage-clip", "0.75")
    assert result.exit_code == 0, result.output
    plain, clip = pq.read_table(tmp_path / "plain.parquet"), pq.read_table(tmp_path / "clip.parquet")
    expected = clamp(plain.column("advantages").to_pylist(), np.float32(0.75).item())
    assert clip.column("advantages").to_pylist() == expected
    assert clip.column("returns").equals(plain.column("returns"))
    assert json.loads(clip.schema.metadata[b"gaecli.spec"])["advantage_clip"] == 0.75
    table = gaecli.recompute_table(pq.read_table(inputs[0]), **table_options(options), advantage_clip=0.75,
                                   columns=gaecli.Columns(values=None))  # fmt: skip
    assert table.column("advantages").equals(clip.column("advantages"))


def table_options(options):
    named = dict(zip(options[::2], options[1::2]))
    keys = {"--estimator": "estimator", "--group-col": "group_by", "--gamma": "gamma", "--step-col": "step_by"}
    return {keys[flag]: float(value) if flag == "--gamma" else value for flag, value in named.items()}


def test_diff_clips_the_new_side_only(tmp_path):
    batch = random_batch(6, samples=30, groups=6)
    inputs = write_files(tmp_path / "in", batch, [])
    options = ("--estimator", "grpo", "--group-col", "prompt_id", "--old-estimator", "grpo", "--json", "-", "--quiet")
    diffed = gae("diff", inputs[0], *options, "--advantage-clip", "0.5")
    assert diffed.exit_code == 0, diffed.output
    plain_run = recompute_cli(inputs, tmp_path / "plain.parquet", "--estimator", "grpo", "--group-col", "prompt_id")
    assert plain_run.exit_code == 0
    plain = pq.read_table(tmp_path / "plain.parquet").column("advantages").to_pylist()
    largest = max(max(abs(value) - 0.5, 0.0) for row in plain for value in row)
    assert json.loads(diffed.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-6)


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf"])
def test_a_clip_that_is_not_a_positive_number_exits_2(tmp_path, limit):
    batch = random_batch(1, samples=6, groups=2)
    inputs = write_files(tmp_path / "in", batch, [])
    result = recompute_cli(inputs, tmp_path / "out", "--estimator", "grpo", "--group-col", "prompt_id",
                           "--advantage-clip", limit)  # fmt: skip
    assert result.exit_code == 2 and "--advantage-clip" in result.stderr, result.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(InvalidOptionError, match="advantage_clip"):
        AdvantageSpec(estimator="grpo", group_by="g", advantage_clip=float(limit))
