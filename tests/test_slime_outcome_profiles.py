"""slime's profiles of its outcome estimators (grpo, dr-grpo, reinforce++-baseline): slime's
reward normalisation and per-token pass written out in tests/trainer_loops_slime.py, one group
and one sample at a time, against gaecli's profile at every position, through the API,
``gae diff``, ``gae recompute --keep-baseline`` and ``gae identify``."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from trainer_loops_slime import (
    slime_normalize_advantages,
    slime_outcome_row,
    slime_post_process_rewards,
    slime_post_process_rewards_float32,
)
from typer.testing import CliRunner

from gaecli import AdvantageSpec, compute_advantages_packed
from gaecli.cli import app
from gaecli.identify import identify_table

from rollout_files import packed_reward_rows, reward_rows

ESTIMATORS = ("grpo", "dr-grpo", "reinforce++-baseline")


def _samples(seed: int, rows: int):
    """Rows with masked blocks, some ending masked, one fully masked and one empty, per-token
    rewards (slime's KL term, ``−kl_coef · kl``) at every token, and scalar rewards that
    differ within groups (some non-dyadic)."""
    samples = reward_rows(np.random.default_rng(seed), rows, 13, [0.0, 1.0, 0.3, -1.0, 2.5])
    samples[1][1] = [0] * len(samples[1][1])  # fully masked
    samples[-2] = [[], [], 1.0]  # empty
    return samples


def _slime(estimator, samples, n_samples_per_prompt, rollout_batch_size):
    """slime's advantages and returns of the batch, every position: ``_post_process_rewards``,
    the per-token pass and, for reinforce++-baseline, ``normalize_advantages`` (which the
    estimator requires); its returns are the advantages before that whitening."""
    normalised = slime_post_process_rewards(
        [z for _, _, z in samples], estimator, n_samples_per_prompt, rollout_batch_size
    )
    rows = [slime_outcome_row(estimator, v, r) for v, (r, _, _) in zip(normalised, samples)]
    if estimator != "reinforce++-baseline":
        return rows, rows
    return slime_normalize_advantages(rows, [m for _, m, _ in samples]), rows


def _flat(rows):
    return np.array([x for row in rows for x in row], dtype=np.float64)


# the batches slime forms: groups of n consecutive samples (n · batch of them), groups of one
# (n_samples_per_prompt = 1, which turns grpo's std off), and the fallback to one group of all
LAYOUTS = {"groups of four": (4, 6, 24), "groups of one": (1, 9, 9), "one batch-wide group": (4, 6, 23)}


def _group_ids(layout):
    n, batch, rows = LAYOUTS[layout]
    return [i // n for i in range(rows)] if rows == n * batch else [0] * rows


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_slime_profile_is_slimes_loop_at_every_position(estimator, layout):
    n, batch, rows = LAYOUTS[layout]
    samples = _samples(seed=rows + len(estimator), rows=rows)
    spec = AdvantageSpec(estimator=estimator, group_by="g", semantics="slime")
    advantages, returns = compute_advantages_packed(
        None, *packed_reward_rows(samples), spec=spec, row_inputs={"g": _group_ids(layout)}
    )
    expected, expected_returns = _slime(estimator, samples, n, batch)
    np.testing.assert_allclose(advantages.numpy(), _flat(expected), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), _flat(expected_returns), rtol=1e-12, atol=1e-12)


def test_the_score_is_the_outcome_alone_and_the_advantage_fills_the_response():
    samples = _samples(seed=3, rows=8)
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    groups = [i // 4 for i in range(8)]
    spec = AdvantageSpec(estimator="dr-grpo", group_by="g", semantics="slime")
    advantages = compute_advantages_packed(None, rewards, mask, offsets, terminal, spec=spec, row_inputs={"g": groups})
    shifted = compute_advantages_packed(
        None, rewards * 7.0 + 1.0, mask, offsets, terminal, spec=spec, row_inputs={"g": groups}
    )  # the per-token rewards count for nothing
    assert torch.equal(advantages[0], shifted[0])
    first = [z for _, _, z in samples[:4]]
    value = first[0] - math.fsum(first) / 4  # by hand: z less its group's mean
    assert advantages[0][: len(samples[0][1])].tolist() == pytest.approx([value] * len(samples[0][1]), abs=1e-15)
    assert samples[0][1][-1] == 0 and advantages[0][len(samples[0][1]) - 1] != 0  # written where masked too


def test_slimes_float32_normalisation_differs_by_its_rounding_except_for_equal_scores():
    """Where slime's float32 group mean misses a common score by an ulp, σ + 1e-6 with σ = 0
    amplifies it: six rows scoring 0.3 get about 0.03 each from slime, 0 from gaecli."""
    raw = [0.0, 1.0, 0.3, 2.5, 1.0, -1.0, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    spec = AdvantageSpec(estimator="grpo", group_by="g", semantics="slime")
    samples = [[[0.0], [1], z] for z in raw]
    advantages, _ = compute_advantages_packed(
        None, *packed_reward_rows(samples), spec=spec, row_inputs={"g": [0] * 6 + [1] * 6}
    )
    float32 = np.array(slime_post_process_rewards_float32(raw, "grpo", 6, 2))
    np.testing.assert_allclose(advantages.numpy()[:6], float32[:6], rtol=1e-6, atol=1e-6)
    assert advantages.numpy()[6:].tolist() == [0.0] * 6
    assert np.abs(float32[6:]).min() > 1e-2


# ----------------------------------------------------------------------------- the commands


def _dump(path, samples, groups, row_group_size=None):
    table = pa.table(
        {
            "rewards": pa.array([r for r, _, _ in samples], type=pa.list_(pa.float64())),
            "loss_mask": pa.array([m for _, m, _ in samples], type=pa.list_(pa.int64())),
            "terminal_reward": [z for _, _, z in samples],
            "g": groups,
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def test_diff_puts_the_contracts_grpo_beside_slimes(tmp_path):
    samples = _samples(seed=8, rows=24)
    groups = _group_ids("groups of four")
    _dump(tmp_path / "d.parquet", samples, groups, row_group_size=7)  # groups across batches
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        ["diff", str(tmp_path / "d.parquet"), "--estimator", "grpo", "--group-col", "g", "--values-col", "none",
         "--baseline", "slime", "--batch-rows", "5", "--json", str(out), "--quiet", "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (comparison,) = json.loads(out.read_text())["comparisons"]
    assert comparison["name"] == "slime"
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    new = compute_advantages_packed(
        None, rewards, mask, offsets, terminal, spec=AdvantageSpec(estimator="grpo", group_by="g"),
        row_inputs={"g": groups},
    )[0].numpy()  # fmt: skip
    delta = np.abs(new - _flat(_slime("grpo", samples, 4, 6)[0]))[mask.numpy()]
    assert comparison["summary"]["max_abs_delta_advantage"] == pytest.approx(delta.max(), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_recompute_keeps_slimes_estimator_at_every_position(tmp_path, estimator):
    samples = _samples(seed=10, rows=24)
    _dump(tmp_path / "d.parquet", samples, _group_ids("groups of four"), row_group_size=5)
    out = tmp_path / "o.parquet"
    result = CliRunner().invoke(
        app,
        ["recompute", str(tmp_path / "d.parquet"), "-o", str(out), "--estimator", estimator, "--group-col", "g",
         "--values-col", "none", "--baseline", "slime", "--keep-baseline", "--batch-rows", "4", "--quiet",
         "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    expected, expected_returns = _slime(estimator, samples, 4, 6)
    kept = _flat(table.column("advantages_slime").to_pylist())
    np.testing.assert_allclose(kept, _flat(expected), rtol=1e-12, atol=1e-12)
    kept_returns = _flat(table.column("returns_slime").to_pylist())
    np.testing.assert_allclose(kept_returns, _flat(expected_returns), rtol=1e-12, atol=1e-12)


def test_list_baselines_and_baseline_all_name_slime(tmp_path):
    result = CliRunner().invoke(app, ["diff", "--list-baselines"])
    assert result.exit_code == 0, result.output
    listing = result.output[result.output.index("with --estimator grpo") :]
    assert "slime: the score is z alone" in listing.splitlines()[2]
    assert "with --estimator reinforce++-baseline" in result.output
    samples = _samples(seed=12, rows=8)
    _dump(tmp_path / "d.parquet", samples, _group_ids("groups of four")[:8])
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        ["diff", str(tmp_path / "d.parquet"), "--estimator", "dr-grpo", "--group-col", "g", "--values-col", "none",
         "--baseline", "all", "--json", str(out), "--quiet", "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [c["name"] for c in json.loads(out.read_text())["comparisons"]] == ["verl", "slime", "skyrl"]


# ----------------------------------------------------------------------------- identify


@pytest.mark.parametrize("estimator", ["grpo", "reinforce++-baseline"])
def test_identify_names_slimes_estimator_from_what_slimes_loop_stored(estimator):
    """The advantages slime's loop stores (its float32 reward normalisation, the value at every
    token of the response) are named ``E slime``, masked positions holding the row's value."""
    samples = [s for s in _samples(seed=33, rows=48) if s[1]][:44]  # identify reads non-empty rows
    normalised = slime_post_process_rewards_float32([z for _, _, z in samples], estimator, 4, 11)
    rows = [slime_outcome_row(estimator, v, r) for v, (r, _, _) in zip(normalised, samples)]
    if estimator == "reinforce++-baseline":
        rows = slime_normalize_advantages(rows, [m for _, m, _ in samples])
    table = pa.table(
        {
            "rewards": [r for r, _, _ in samples],
            "loss_mask": [m for _, m, _ in samples],
            "terminal_reward": [z for _, _, z in samples],
            "values": [[0.0] * len(m) for _, m, _ in samples],
            "advantages": [[float(np.float32(a)) for a in row] for row in rows],
            "group": [i // 4 for i in range(len(samples))],
        }
    )
    document = identify_table(table, group_col="group").to_dict()
    best = document["candidates"][0]
    assert document["explained"], document["verdict"]
    assert f"{estimator} slime" in {member["name"] for member in best["members"]}, document["verdict"]
    assert document["masked_positions"]["holds"] == "carry"
