"""The trainer profiles of ``reinforce++`` (verl after and before #7300, slime, SkyRL): each
trainer's loop written out here on one sample at a time, as its source writes it, against
gaecli's profile at every position, through the API and ``gae diff``."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from gaecli import AdvantageSpec, compute_advantages_packed
from gaecli.cli import app
from gaecli.errors import InvalidOptionError

from rollout_files import packed_reward_rows, reward_rows

PROFILES = ("verl@2026-08", "verl@2026-07", "slime", "skyrl")


def _samples(seed: int, rows: int = 24):
    """Rows with masked blocks in the middle and at the end, per-token rewards everywhere."""
    return reward_rows(np.random.default_rng(seed), rows, 15, [0.0, 1.0, -1.0])


def _verl_new(rewards, mask, z, gamma):
    r = list(rewards)
    r[-1] += z  # verl puts the score on the last response token
    returns, running = [0.0] * len(r), 0.0
    for t in reversed(range(len(r))):
        new = r[t] + gamma * running
        returns[t] = new * mask[t]
        running = new * mask[t] + running * (1 - mask[t])
    return returns


def _verl_old(rewards, mask, z, gamma):
    r = list(rewards)
    r[-1] += z
    returns, running = [0.0] * len(r), 0.0
    for t in reversed(range(len(r))):
        running = r[t] + gamma * running
        returns[t] = running
        running = running * mask[t]
    return returns


def _slime(rewards, mask, z, gamma):
    r = [reward * m for reward, m in zip(rewards, mask)]  # the KL term masked
    last = max(t for t, m in enumerate(mask) if m)
    r[last] += z
    returns, running = [0.0] * len(r), 0.0
    for t in reversed(range(len(r))):
        running = r[t] + gamma * running
        returns[t] = running
    return returns


def _skyrl(rewards, mask, z, gamma):
    r = list(rewards)
    r[-1] += z
    returns, running = [0.0] * len(r), 0.0
    for t in reversed(range(len(r))):
        running = r[t] + gamma * running
        returns[t] = running  # its response mask is 1 on every token of the response
    return returns


LOOPS = {"verl@2026-08": _verl_new, "verl@2026-07": _verl_old, "slime": _slime, "skyrl": _skyrl}


def _whitened(profile, returns, masks):
    """Each trainer's masked whitening: the Bessel variance, (x − mean)·rsqrt(var + 1e-8), over
    the loss mask (SkyRL: over its response mask, every token); verl then multiplies by the mask."""
    over_all = profile == "skyrl"
    tokens = [x for row, mask in zip(returns, masks) for x, m in zip(row, mask) if m or over_all]
    mean = math.fsum(tokens) / len(tokens)
    var = math.fsum((x - mean) ** 2 for x in tokens) / (len(tokens) - 1)
    out = []
    for row, mask in zip(returns, masks):
        whitened = [(x - mean) / math.sqrt(var + 1e-8) for x in row]
        out.append([w * m for w, m in zip(whitened, mask)] if profile.startswith("verl") else whitened)
    return out


def _expected(profile, samples, gamma):
    returns = [LOOPS[profile](r, m, z, gamma) for r, m, z in samples]
    return _whitened(profile, returns, [m for _, m, _ in samples]), returns


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_each_profile_is_its_trainer_loop_at_every_position(profile, gamma):
    samples = _samples(seed=int(gamma * 10) + len(profile))
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    spec = AdvantageSpec(gamma, estimator="reinforce++", semantics=profile)
    advantages, _ = compute_advantages_packed(None, rewards, mask, offsets, terminal, spec=spec)
    expected, _ = _expected(profile, samples, gamma)
    np.testing.assert_allclose(advantages.numpy(), [x for row in expected for x in row], rtol=1e-12, atol=1e-12)


def test_bare_verl_is_the_newest_and_the_versions_differ_where_the_fix_did():
    samples = _samples(seed=3)
    rewards, mask, offsets, terminal = packed_reward_rows(samples)

    def run(name):
        spec = AdvantageSpec(1.0, estimator="reinforce++", semantics=name)
        return compute_advantages_packed(None, rewards, mask, offsets, terminal, spec=spec)[0]

    assert torch.equal(run("verl"), run("verl@2026-08"))
    assert not torch.allclose(run("verl@2026-07"), run("verl@2026-08"))  # masked blocks reset the old return


def test_verl_after_its_fix_is_the_contract_but_for_a_response_ending_masked():
    samples = [s for s in _samples(seed=4) if s[1][-1] == 1]  # every response ends trainable
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    contract = AdvantageSpec(0.95, estimator="reinforce++")
    verl = AdvantageSpec(0.95, estimator="reinforce++", semantics="verl")
    a = compute_advantages_packed(None, rewards, mask, offsets, terminal, spec=contract)[0]
    b = compute_advantages_packed(None, rewards, mask, offsets, terminal, spec=verl)[0]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_an_unknown_profile_of_an_estimator_is_refused_with_the_choices():
    with pytest.raises(InvalidOptionError, match="verl@2026-07"):
        AdvantageSpec(1.0, estimator="reinforce++", semantics="openrlhf")
    with pytest.raises(InvalidOptionError, match="masked contract only"):
        AdvantageSpec(estimator="gpg", group_by="g", semantics="verl")
    with pytest.raises(InvalidOptionError, match="verl, slime, skyrl"):
        AdvantageSpec(estimator="grpo", group_by="g", semantics="openrlhf")


def _dump(path, samples):
    table = pa.table(
        {
            "rewards": [r for r, _, _ in samples],
            "loss_mask": [m for _, m, _ in samples],
            "terminal_reward": [z for _, _, z in samples],
        }
    )
    pq.write_table(table, path)


def test_diff_compares_the_contract_with_every_trainer_profile(tmp_path):
    samples = _samples(seed=5)
    _dump(tmp_path / "d.parquet", samples)
    out = tmp_path / "r.json"
    args = ["diff", str(tmp_path / "d.parquet"), "--estimator", "reinforce++", "--gamma", "0.9", "--values-col", "none"]
    result = CliRunner().invoke(app, [*args, "--baseline", "all", "--json", str(out), "--quiet", "--workers", "1"])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert [c["name"] for c in document["comparisons"]] == ["verl", "slime", "skyrl"]
    contract, _ = _expected("verl@2026-08", [s for s in samples], 0.9)  # for the figures' scale only
    new = compute_advantages_packed(
        None, *packed_reward_rows(samples), spec=AdvantageSpec(0.9, estimator="reinforce++")
    )[0]
    masks = [m for _, m, _ in samples]
    trainable = np.array([x for m in masks for x in m], dtype=bool)
    for comparison in document["comparisons"]:
        name = {"verl": "verl@2026-08"}.get(comparison["name"], comparison["name"])
        old, _ = _expected(name, samples, 0.9)
        delta = np.abs(new.numpy() - np.array([x for row in old for x in row]))[trainable]
        assert comparison["summary"]["max_abs_delta_advantage"] == pytest.approx(delta.max(), rel=1e-9, abs=1e-12)
    assert len(contract) == len(samples)


def test_old_estimator_with_a_baseline_is_that_trainers_estimator(tmp_path):
    samples = _samples(seed=6)
    _dump(tmp_path / "d.parquet", samples)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        [
            "diff",
            str(tmp_path / "d.parquet"),
            "--estimator",
            "reinforce++",
            "--gamma",
            "1",
            "--values-col",
            "none",
            "--old-estimator",
            "reinforce++",
            "--baseline",
            "verl@2026-07,skyrl",
            "--json",
            str(out),
            "--quiet",
            "--workers",
            "1",
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    names = [c["name"] for c in json.loads(out.read_text())["comparisons"]]
    assert names == ["verl@2026-07", "skyrl"]
    result = CliRunner().invoke(
        app,
        ["diff", str(tmp_path / "d.parquet"), "--estimator", "reinforce++", "--gamma", "1", "--values-col", "none",
         "--baseline", "roll"],
    )  # fmt: skip
    assert result.exit_code == 2 and "verl@2026-07" in result.output


# ----------------------------------------------------------------------------- the outcome estimators

OUTCOME = [("grpo", "verl"), ("grpo", "skyrl"), ("dr-grpo", "verl"), ("dr-grpo", "skyrl"), ("rloo", "verl"),
           ("rloo", "skyrl"), ("maxrl", "skyrl")]  # fmt: skip


def _outcome_loop(estimator, trainer, samples, groups):
    """verl's and SkyRL's loops over the batch: the score sums every token's reward (the
    outcome on the last token), grouped by index; verl writes through the loss mask, SkyRL
    through its response mask (every token)."""
    scores = [math.fsum(r) + z for r, _, z in samples]
    members = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    values = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in members[groups[i]]]
        n = len(group)
        mean = math.fsum(group) / n if n > 1 else 0.0
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in group) / (n - 1)) if n > 1 else 1.0
        if estimator == "grpo":
            value = (s - mean) / (std + 1e-6)
        elif estimator == "dr-grpo":
            value = s - mean
        elif estimator == "rloo":
            value = (s - mean) * n / (n - 1) if n > 1 else (0.0 if trainer == "skyrl" else s)
        else:  # maxrl
            value = (s - mean) / (mean + 1e-6) if n > 1 else s - mean
        values.append(value)
    return [[v * (1 if trainer == "skyrl" else m) for m in mask] for v, (_, mask, _) in zip(values, samples)]


@pytest.mark.parametrize("estimator, trainer", OUTCOME)
def test_each_outcome_profile_is_its_trainer_loop_at_every_position(estimator, trainer):
    samples = _samples(seed=7, rows=23)
    groups = [i // 4 for i in range(len(samples))]  # the last group has three rows
    groups[-1] = 99  # and one group of one
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    spec = AdvantageSpec(estimator=estimator, group_by="g", semantics=trainer)
    advantages, _ = compute_advantages_packed(
        None, rewards, mask, offsets, terminal, spec=spec, row_inputs={"g": groups}
    )
    expected = _outcome_loop(estimator, trainer, samples, groups)
    np.testing.assert_allclose(advantages.numpy(), [x for row in expected for x in row], rtol=1e-12, atol=1e-12)


def test_diff_puts_grpo_beside_verls_and_skyrls(tmp_path):
    samples = _samples(seed=8, rows=24)
    groups = [i // 4 for i in range(len(samples))]
    table = pa.table(
        {
            "rewards": [r for r, _, _ in samples],
            "loss_mask": [m for _, m, _ in samples],
            "terminal_reward": [z for _, _, z in samples],
            "g": groups,
        }
    )
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=7)  # groups across batches
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        ["diff", str(tmp_path / "d.parquet"), "--estimator", "grpo", "--group-col", "g", "--values-col", "none",
         "--baseline", "all", "--batch-rows", "5", "--json", str(out), "--quiet", "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert [c["name"] for c in document["comparisons"]] == ["verl", "slime", "skyrl"]
    rewards, mask, offsets, terminal = packed_reward_rows(samples)
    new = compute_advantages_packed(
        None, rewards, mask, offsets, terminal, spec=AdvantageSpec(estimator="grpo", group_by="g"),
        row_inputs={"g": groups},
    )[0].numpy()  # fmt: skip
    trainable = mask.numpy()
    for comparison in document["comparisons"][::2]:  # slime's: tests/test_slime_outcome_profiles.py
        old = np.array([x for row in _outcome_loop("grpo", comparison["name"], samples, groups) for x in row])
        delta = np.abs(new - old)[trainable]
        assert comparison["summary"]["max_abs_delta_advantage"] == pytest.approx(delta.max(), rel=1e-9, abs=1e-12)


def test_recompute_keeps_a_trainer_profile_of_the_estimator(tmp_path):
    samples = _samples(seed=10)
    _dump(tmp_path / "d.parquet", samples)
    out = tmp_path / "o.parquet"
    args = ["recompute", str(tmp_path / "d.parquet"), "-o", str(out), "--estimator", "reinforce++", "--gamma", "0.9",
            "--values-col", "none", "--quiet", "--workers", "1"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--baseline", "verl@2026-07", "--keep-baseline"])
    assert result.exit_code == 0, result.output
    kept = pq.read_table(out).column("advantages_verl_2026_07").to_pylist()
    expected, _ = _expected("verl@2026-07", samples, 0.9)
    np.testing.assert_allclose([x for row in kept for x in row], [x for row in expected for x in row], atol=1e-12)
    result = CliRunner().invoke(app, [*args, "--keep-baseline", "--overwrite"])  # the default names no profile
    assert result.exit_code == 2 and "give --baseline PROFILE" in result.output and "verl@2026-07" in result.output
