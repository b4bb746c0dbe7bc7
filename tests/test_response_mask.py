"""``--response-mask-col`` and ``response_mask=`` (docs/semantics.md#whitening-rules): SkyRL's
``masked_whiten(advantages, response_mask)`` and its reinforce++ at every position, with the
response mask read from a column, held against float64 loops written out here (SkyRL's GAE
loop, its reinforce++ loop and ``masked_whiten``, in plain Python over rows laid out as SkyRL
lays them: padding columns with response mask 0 before the response); without the column
the numbers are today's (every token); invalid response masks are invalid data."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import gaecli
from gaecli import AdvantageSpec, GAEInputError, compute_advantages, compute_advantages_packed
from gaecli.advantages.normalization import NORM_LIKE

from helpers import masked_gae_oracle
from rollout_files import files_under, gae, sha256

GAMMA, LAMBD = 0.9, 0.8
SCHEMA = pa.schema(
    [
        ("values", pa.list_(pa.float64())),
        ("rewards", pa.list_(pa.float64())),
        ("loss_mask", pa.list_(pa.int8())),
        ("rm", pa.list_(pa.int8())),
        ("ones", pa.list_(pa.bool_())),
        ("terminal_reward", pa.float64()),
    ]
)


def skyrl_rows(seed: int, samples: int = 14) -> list[dict]:
    """Rows as SkyRL lays them out: 0 to 3 padding columns (response mask 0, loss mask 0, values
    and rewards of their own) before the response (response mask 1), the loss mask 0 on some
    response tokens; one row without a response token at all (all padding)."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(samples):
        padding = int(rng.integers(0, 4))
        response = 0 if index == 5 else int(rng.integers(1, 8))
        loss = [0] * padding + [int(x) for x in rng.random(response) < 0.6]
        if index == 2:
            loss[padding:] = [0] * response  # a response that trains nothing
        width = padding + response
        rows.append(
            {
                "values": rng.normal(0, 1, width).round(3).tolist(),
                "rewards": rng.normal(0, 0.3, width).round(3).tolist(),
                "loss_mask": loss,
                "rm": [0] * padding + [1] * response,
                "ones": [True] * width,
                "terminal_reward": float(rng.normal(0, 1)),
            }
        )
    return rows


def write(path, rows, schema=SCHEMA):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def skyrl_gae(values, rewards, terminal, gamma, lambd):
    """SkyRL's ``compute_gae_advantage_return`` on one row: the response-level reward on the
    last column, one loop over every column from the last (next value 0 there), no mask."""
    rewards = list(rewards)
    if rewards:
        rewards[-1] += terminal
    advantages, carry = [0.0] * len(values), 0.0
    for t in reversed(range(len(values))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        carry = rewards[t] + gamma * following - values[t] + gamma * lambd * carry
        advantages[t] = carry
    return advantages


def skyrl_reinforce(rewards, response_mask, terminal, gamma):
    """SkyRL's ``compute_reinforce_plus_plus_outcome_advantage`` returns on one row:
    ``running = r_t + γ·running; returns_t = running; running *= response_mask_t``."""
    rewards = list(rewards)
    if rewards:
        rewards[-1] += terminal
    returns, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        returns[t] = running
        running = running * response_mask[t]
    return returns


def masked_whiten(rows, masks):
    """SkyRL's ``masked_whiten(x, response_mask)``: the mean and the Bessel variance over the
    positions whose mask is 1, ``(x − mean)·rsqrt(var + 1e-8)`` at every position."""
    counted = [x for row, mask in zip(rows, masks) for x, m in zip(row, mask) if m]
    mean = math.fsum(counted) / len(counted)
    variance = math.fsum((x - mean) ** 2 for x in counted) / (len(counted) - 1)
    return [[(x - mean) / math.sqrt(variance + 1e-8) for x in row] for row in rows]


def flat(rows):
    return np.array([x for row in rows for x in row], dtype=np.float64)


def recompute(source, output, *options):
    return gae(
        "recompute", source, "-o", output, "--quiet", "--gamma", GAMMA, "--lambd", LAMBD, *options
    )  # fmt: skip


SKYRL = ("--baseline", "skyrl", "--keep-baseline", "--normalize", "--norm-like", "skyrl")


def test_recompute_is_skyrls_masked_whiten_over_the_response_mask_at_every_position(tmp_path):
    rows = skyrl_rows(1)
    source = write(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    result = recompute(source, out, *SKYRL, "--response-mask-col", "rm")
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    masks = [row["rm"] for row in rows]
    raw = [skyrl_gae(r["values"], r["rewards"], r["terminal_reward"], GAMMA, LAMBD) for r in rows]
    stored = masked_whiten(raw, masks)
    np.testing.assert_allclose(flat(table.column("advantages_skyrl").to_pylist()), flat(stored), rtol=1e-10, atol=1e-10)
    returns = [[a + v for a, v in zip(row, r["values"])] for row, r in zip(raw, rows)]  # never whitened
    np.testing.assert_allclose(flat(table.column("returns_skyrl").to_pylist()), flat(returns), rtol=1e-12, atol=1e-12)
    # the new side: the contract, its statistics over the same response mask, written at trainable tokens
    contract = [masked_gae_oracle(r["values"], r["rewards"], r["loss_mask"], r["terminal_reward"], GAMMA, LAMBD)[0]
                for r in rows]  # fmt: skip
    whitened = masked_whiten(contract, masks)
    want = [[w if m else 0.0 for w, m in zip(row, r["loss_mask"])] for row, r in zip(whitened, rows)]
    np.testing.assert_allclose(flat(table.column("advantages").to_pylist()), flat(want), rtol=1e-10, atol=1e-10)
    # the padding is what moves the numbers: over every token they differ
    every = tmp_path / "every.parquet"
    assert recompute(source, every, *SKYRL).exit_code == 0
    assert not np.allclose(flat(pq.read_table(every).column("advantages_skyrl").to_pylist()), flat(stored))


def test_without_the_column_or_with_all_ones_the_numbers_are_todays(tmp_path):
    rows = skyrl_rows(2)
    source = write(tmp_path / "in.parquet", rows)
    plain, ones = tmp_path / "plain.parquet", tmp_path / "ones.parquet"
    assert recompute(source, plain, *SKYRL).exit_code == 0
    assert recompute(source, ones, *SKYRL, "--response-mask-col", "ones").exit_code == 0
    for name in ("advantages", "returns", "advantages_skyrl", "returns_skyrl"):
        assert pq.read_table(plain).column(name).equals(pq.read_table(ones).column(name)), name
    raw = [skyrl_gae(r["values"], r["rewards"], r["terminal_reward"], GAMMA, LAMBD) for r in rows]
    every = masked_whiten(raw, [[1] * len(row) for row in raw])  # today's: every token of the row
    np.testing.assert_allclose(
        flat(pq.read_table(plain).column("advantages_skyrl").to_pylist()), flat(every), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("rule", [(), ("--norm-like", "verl"), ("--norm-tokens", "trainable")], ids=repr)
def test_a_rule_over_trainable_tokens_reads_the_column_for_nothing(tmp_path, rule):
    source = write(tmp_path / "in.parquet", skyrl_rows(3))
    plain, masked = tmp_path / "plain.parquet", tmp_path / "masked.parquet"
    options = ("--baseline", "skyrl", "--keep-baseline", "--normalize", *rule)
    assert recompute(source, plain, *options).exit_code == 0
    result = recompute(source, masked, *options, "--response-mask-col", "rm")
    assert result.exit_code == 0, result.output
    for name in ("advantages", "advantages_skyrl"):
        assert pq.read_table(plain).column(name).equals(pq.read_table(masked).column(name)), name


def test_diff_holds_the_contract_against_skyrls_whitening_over_its_response_mask(tmp_path):
    rows = skyrl_rows(4)
    source = write(tmp_path / "in.parquet", rows)
    result = gae(
        "diff", source, "--gamma", GAMMA, "--lambd", LAMBD, "--baseline", "skyrl", "--normalize", "--norm-like",
        "skyrl", "--response-mask-col", "rm", "--batch-rows", 3, "--json", "-", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["comparisons"][0]["summary"]
    masks = [row["rm"] for row in rows]
    old = masked_whiten([skyrl_gae(r["values"], r["rewards"], r["terminal_reward"], GAMMA, LAMBD) for r in rows], masks)
    contract = [masked_gae_oracle(r["values"], r["rewards"], r["loss_mask"], r["terminal_reward"], GAMMA, LAMBD)[0]
                for r in rows]  # fmt: skip
    new = masked_whiten(contract, masks)
    trainable = flat([r["loss_mask"] for r in rows]) != 0
    delta = np.abs(flat(new) - flat(old))[trainable]
    assert summary["max_abs_delta_advantage"] == pytest.approx(delta.max(), rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------------------- reinforce++ under SkyRL


def packed(rows):
    lengths = [len(r["rm"]) for r in rows]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    rewards = torch.tensor(flat([r["rewards"] for r in rows]))
    loss_mask = torch.tensor(flat([r["loss_mask"] for r in rows]) != 0)
    terminal = torch.tensor([r["terminal_reward"] for r in rows], dtype=torch.float64)
    return rewards, loss_mask, offsets, terminal


def skyrl_reinforce_expected(rows, gamma):
    """SkyRL's reinforce++ at every position: its returns, ``masked_whiten(returns,
    response_mask)`` and then ``advantages * response_mask``."""
    masks = [r["rm"] for r in rows]
    returns = [skyrl_reinforce(r["rewards"], r["rm"], r["terminal_reward"], gamma) for r in rows]
    whitened = masked_whiten(returns, masks)
    return [[w * m for w, m in zip(row, mask)] for row, mask in zip(whitened, masks)], returns


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_under_skyrl_is_its_loop_with_the_response_mask_at_every_position(gamma):
    rows = skyrl_rows(5)
    rewards, loss_mask, offsets, terminal = packed(rows)
    response = torch.tensor(flat([r["rm"] for r in rows]), dtype=torch.int64)
    spec = AdvantageSpec(gamma, estimator="reinforce++", semantics="skyrl")
    advantages, returns = compute_advantages_packed(
        None, rewards, loss_mask, offsets, terminal, spec=spec, response_mask=response
    )
    want_advantages, want_returns = skyrl_reinforce_expected(rows, gamma)
    np.testing.assert_allclose(advantages.numpy(), flat(want_advantages), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), flat(want_returns), rtol=1e-12, atol=1e-12)  # not whitened
    # all ones is today's profile, bit for bit; the list form reads the same mask
    ones = torch.ones_like(loss_mask)
    today = compute_advantages_packed(None, rewards, loss_mask, offsets, terminal, spec=spec)[0]
    assert torch.equal(compute_advantages_packed(None, rewards, loss_mask, offsets, terminal, spec=spec,
                                                 response_mask=ones)[0], today)  # fmt: skip
    sample_rewards = [torch.tensor(r["rewards"], dtype=torch.float64) for r in rows]
    lists = compute_advantages(
        None, sample_rewards, [torch.tensor(r["loss_mask"]) for r in rows], [r["terminal_reward"] for r in rows],
        spec=spec, response_mask=[r["rm"] for r in rows],
    )[0]  # fmt: skip
    assert torch.equal(torch.cat(lists), advantages)


def test_diff_of_reinforce_against_skyrls_reads_the_response_mask(tmp_path):
    rows = skyrl_rows(6)
    source = write(tmp_path / "in.parquet", rows)
    result = gae(
        "diff", source, "--estimator", "reinforce++", "--gamma", GAMMA, "--values-col", "none", "--baseline",
        "skyrl", "--response-mask-col", "rm", "--batch-rows", 4, "--json", "-", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["comparisons"][0]["summary"]
    rewards, loss_mask, offsets, terminal = packed(rows)
    new = compute_advantages_packed(
        None, rewards, loss_mask, offsets, terminal, spec=AdvantageSpec(GAMMA, estimator="reinforce++")
    )[0].numpy()
    old, _ = skyrl_reinforce_expected(rows, GAMMA)
    delta = np.abs(new - flat(old))[loss_mask.numpy()]
    assert summary["max_abs_delta_advantage"] == pytest.approx(delta.max(), rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------------------- the tensor API


def test_whiten_takes_the_response_mask_in_both_forms():
    rows = skyrl_rows(7)
    advantages = [torch.tensor(r["values"], dtype=torch.float64) for r in rows]
    loss = [torch.tensor(r["loss_mask"]) for r in rows]
    masks = [r["rm"] for r in rows]
    expected = masked_whiten([r["values"] for r in rows], masks)
    want = [[w if m else 0.0 for w, m in zip(row, r["loss_mask"])] for row, r in zip(expected, rows)]
    got = gaecli.whiten(advantages, loss, NORM_LIKE["skyrl"], response_mask=[torch.tensor(m) for m in masks])
    np.testing.assert_allclose(torch.cat(got).numpy(), flat(want), rtol=1e-12, atol=1e-12)
    flat_got = gaecli.whiten(torch.cat(advantages), torch.cat(loss), NORM_LIKE["skyrl"],
                             response_mask=torch.tensor(flat(masks)))  # fmt: skip
    assert torch.equal(flat_got, torch.cat(got))
    # a rule over the trainable tokens does not read it; without it every token is counted
    plain = gaecli.whiten(torch.cat(advantages), torch.cat(loss))
    assert torch.equal(gaecli.whiten(torch.cat(advantages), torch.cat(loss), response_mask=torch.tensor(flat(masks))),
                       plain)  # fmt: skip
    every = masked_whiten([r["values"] for r in rows], [[1] * len(m) for m in masks])
    want = [[w if m else 0.0 for w, m in zip(row, r["loss_mask"])] for row, r in zip(every, rows)]
    got = gaecli.whiten(torch.cat(advantages), torch.cat(loss), NORM_LIKE["skyrl"])
    np.testing.assert_allclose(got.numpy(), flat(want), rtol=1e-12, atol=1e-12)


def test_compute_advantages_whitens_over_the_response_mask_by_group():
    rows = skyrl_rows(8)
    values = torch.tensor(flat([r["values"] for r in rows]))
    rewards, loss_mask, offsets, terminal = packed(rows)
    groups = [index % 2 for index in range(len(rows))]
    spec = AdvantageSpec(GAMMA, LAMBD, normalize="by", normalize_by="g", whitening_rule=NORM_LIKE["skyrl"])
    response = torch.tensor(flat([r["rm"] for r in rows]) != 0)
    got = compute_advantages_packed(
        values, rewards, loss_mask, offsets, terminal, spec=spec, row_inputs={"g": groups}, response_mask=response
    )[0].numpy()
    contract = [masked_gae_oracle(r["values"], r["rewards"], r["loss_mask"], r["terminal_reward"], GAMMA, LAMBD)[0]
                for r in rows]  # fmt: skip
    want = [None] * len(rows)
    for group in (0, 1):
        members = [index for index in range(len(rows)) if groups[index] == group]
        whitened = masked_whiten([contract[i] for i in members], [rows[i]["rm"] for i in members])
        for index, row in zip(members, whitened):
            want[index] = [w if m else 0.0 for w, m in zip(row, rows[index]["loss_mask"])]
    np.testing.assert_allclose(got, flat(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m[:-1], "shape"),
        (lambda m: np.where(np.arange(m.size) == 4, 2, m), "response_mask value 2"),
        (lambda m: np.zeros_like(m), "has response_mask 0"),
    ],
    ids=["length", "a 2", "outside"],
)
def test_the_api_refuses_a_bad_response_mask_naming_the_sample(change, words):
    rows = skyrl_rows(9)
    rewards, loss_mask, offsets, terminal = packed(rows)
    response = change(flat([r["rm"] for r in rows]).astype(np.int64))
    spec = AdvantageSpec(GAMMA, estimator="reinforce++", semantics="skyrl")
    with pytest.raises(GAEInputError, match=words):
        compute_advantages_packed(None, rewards, loss_mask, offsets, terminal, spec=spec, response_mask=response)
    with pytest.raises(GAEInputError, match=words):
        gaecli.whiten(rewards, loss_mask, NORM_LIKE["skyrl"], response_mask=torch.from_numpy(response))
    if words != "shape":
        with pytest.raises(GAEInputError, match="sample"):
            compute_advantages_packed(None, rewards, loss_mask, offsets, terminal, spec=spec, response_mask=response)


# ----------------------------------------------------------------------------- invalid data

BAD = {
    "wrong length": (lambda row: row.update(rm=row["rm"] + [1]), "length-mismatch"),
    "a 2": (lambda row: row.update(rm=[2] + row["rm"][1:]), "response mask value 2 at token 0"),
    "a null": (lambda row: row.update(rm=[None] + row["rm"][1:]), "the list holds a null"),
    "a null list": (lambda row: row.update(rm=None), "the list is null"),
    "trainable outside": (lambda row: row.update(rm=[0] * len(row["rm"])), "has response mask 0"),
}


@pytest.mark.parametrize("command", ["recompute", "diff"])
@pytest.mark.parametrize("case", list(BAD))
def test_an_invalid_response_mask_row_stops_with_file_row_and_column(tmp_path, case, command):
    rows = skyrl_rows(10)
    change, words = BAD[case]
    row = next(index for index, r in enumerate(rows) if index > 6 and any(r["loss_mask"]))  # in the 3rd batch
    change(rows[row])
    source = write(tmp_path / "in" / "bad.parquet", rows)
    before = sha256(source)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    options = ("--response-mask-col", "rm", "--batch-rows", 3, "--normalize", "--norm-like", "skyrl")
    if command == "recompute":
        result = recompute(source, out_dir / "bad.parquet", *options)
    else:
        result = gae("diff", source, "--gamma", GAMMA, "--lambd", LAMBD, *options, "--json", out_dir / "r.json")
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert str(source) in message and f"row {row}," in message and "column 'rm'" in message and words in message
    assert sha256(source) == before
    assert files_under(out_dir) == []


def test_a_response_mask_column_missing_or_of_another_type_is_invalid_data(tmp_path):
    rows = skyrl_rows(11)
    source = write(tmp_path / "in.parquet", rows)
    result = recompute(source, tmp_path / "out" / "o.parquet", "--response-mask-col", "nope")
    assert result.exit_code == 1 and "'nope' is missing" in result.stderr
    floats = [{**r, "rm": [float(x) for x in r["values"]]} for r in rows]
    schema = SCHEMA.set(SCHEMA.get_field_index("rm"), pa.field("rm", pa.float64()))
    for r in floats:
        r["rm"] = 1.0
    source = write(tmp_path / "scalar.parquet", floats, schema)
    result = recompute(source, tmp_path / "out" / "o.parquet", "--response-mask-col", "rm")
    assert result.exit_code == 1 and "expected a list of bool, int or float" in result.stderr
    assert files_under(tmp_path / "out") == []


def test_validate_checks_the_response_mask_like_the_loss_mask(tmp_path):
    rows = skyrl_rows(12)
    rows[3]["loss_mask"][-1] = 1  # trainable, and now outside its response mask
    rows[3]["rm"] = [0] * len(rows[3]["rm"])
    rows[4]["rm"] = [1] * (len(rows[4]["rm"]) + 1)
    source = write(tmp_path / "in.parquet", rows)
    result = gae("validate", source, "--response-mask-col", "rm", "--json", "-")
    assert result.exit_code == 1, result.output
    findings = json.loads(result.stdout)["findings"]
    found = [(f["row"], f["column"], f["code"]) for f in findings if f["severity"] == "error"]
    assert found == [(3, "rm", "outside-response"), (4, "rm", "length-mismatch")]
    assert gae("validate", source, "--json", "-").exit_code == 0  # the column is read only when named


def test_skyrls_grpo_writes_through_the_response_mask():
    """SkyRL's compute_grpo_outcome_advantage: ``scores.unsqueeze(-1) * response_mask``: the row's
    advantage at every response token and 0 at padding (the score sums every token's reward)."""
    rows = skyrl_rows(7)
    rewards, loss_mask, offsets, terminal = packed(rows)
    response = torch.tensor(flat([r["rm"] for r in rows]), dtype=torch.int64)
    groups = [i // 3 for i in range(len(rows))]
    spec = AdvantageSpec(estimator="grpo", group_by="g", semantics="skyrl")
    got = compute_advantages_packed(
        None, rewards, loss_mask, offsets, terminal, spec=spec, row_inputs={"g": groups}, response_mask=response
    )[0]
    scores = [math.fsum(r["rewards"]) + r["terminal_reward"] for r in rows]
    members = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(scores[i])
    expected = []
    for s, g, row in zip(scores, groups, rows):
        group = members[g]
        n = len(group)
        mean = math.fsum(group) / n if n > 1 else 0.0
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in group) / (n - 1)) if n > 1 else 1.0
        expected.append([(s - mean) / (std + 1e-6) * m for m in row["rm"]])
    np.testing.assert_allclose(got.numpy(), flat(expected), rtol=1e-12, atol=1e-12)
