"""gae identify: dumps whose stored advantages the test helpers' own loops computed (every
profile, masked GAE and the critic-free estimators, with random γ and λ and each
normalisation) are named first with their γ and λ; a column nothing explains says so."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.identify import IdentifyOptions, identify_files, identify_table

from helpers import ORACLES, critic_free_oracle

PROFILES = ("masked", "verl", "openrlhf", "slime", "roll", "areal", "nemo-rl", "skyrl")
GROUP_SIZE = 4


def _rollouts(rows: int, seed: int, values: bool = True):
    """Random rollouts: lengths 4–30, an observation block in most rows (sometimes at the
    end), values and small per-token rewards, a 0/1 terminal reward, groups of four."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(rows):
        n = int(rng.integers(4, 30))
        mask = np.ones(n, dtype=np.int64)
        if rng.random() < 0.7:
            start = int(rng.integers(1, n - 1))
            mask[start : int(rng.integers(start + 1, n + 1))] = 0
        samples.append(
            {
                "values": list(rng.normal(size=n)) if values else [0.0] * n,
                "rewards": list(rng.normal(size=n) * 0.1),
                "loss_mask": list(mask),
                "terminal_reward": float(rng.choice([0.0, 1.0])),
            }
        )
    return samples


def _whitened(advantages, masks, groups=None, over_all=False):
    """verl's masked whitening written out: (A − mean)/sqrt(var + 1e-8), the Bessel variance
    over the trainable tokens (every token with ``over_all``), per group with ``groups``."""
    keys = groups if groups is not None else [0] * len(advantages)
    out = [list(a) for a in advantages]
    for key in set(keys):
        members = [i for i, k in enumerate(keys) if k == key]
        tokens = [a for i in members for a, m in zip(advantages[i], masks[i]) if m or over_all]
        mean = math.fsum(tokens) / len(tokens)
        var = math.fsum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)
        for i in members:
            out[i] = [(a - mean) / math.sqrt(var + 1e-8) for a in advantages[i]]
    return out


def _table(samples, advantages, returns=None, groups=None):
    columns = {name: [s[name] for s in samples] for name in ("values", "rewards", "loss_mask", "terminal_reward")}
    columns["advantages"] = [[float(a) for a in row] for row in advantages]
    if returns is not None:
        columns["returns"] = [[float(a) for a in row] for row in returns]
    if groups is not None:
        columns["group"] = groups
    return pa.table(columns)


def _gae_dump(profile: str, gamma: float, lambd: float, normalization: str, seed: int, rows: int = 96):
    samples = _rollouts(rows, seed)
    groups = [i // GROUP_SIZE for i in range(rows)]
    advantages, returns = [], []
    for s in samples:
        a, r = ORACLES[profile](s["values"], s["rewards"], s["loss_mask"], s["terminal_reward"], gamma, lambd)
        advantages.append(a)
        returns.append(r)
    masks = [s["loss_mask"] for s in samples]
    if normalization == "batch":
        advantages = _whitened(advantages, masks)
    elif normalization == "group":
        advantages = _whitened(advantages, masks, groups)
    return _table(samples, advantages, groups=groups), samples


def _names(candidate: dict) -> set:
    return {member["name"] for member in candidate["members"]}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("normalization", ["none", "batch", "group"])
def test_a_profile_is_named_first_with_its_gamma_and_lambda(profile, normalization):
    rng = np.random.default_rng(zlib.crc32(f"{profile} {normalization}".encode()))
    gamma, lambd = float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.5, 1.0))
    table, _ = _gae_dump(profile, gamma, lambd, normalization, seed=int(rng.integers(1 << 30)))
    document = identify_table(table, group_col="group" if normalization == "group" else None).to_dict()
    best = document["candidates"][0]
    assert document["explained"] is True, document["verdict"]
    assert profile in _names(best)
    assert best["normalization"] == normalization
    assert abs(best["gamma"] - gamma) <= 1e-3 and abs(best["lambd"] - lambd) <= 1e-3
    assert best["share_reproduced"] == 1.0 and best["max_abs_residual"] <= 1e-6
    if normalization == "batch":
        assert best["whitening"]["over"] == "trainable"


def test_equal_computations_are_one_candidate_and_a_simpler_one_ranks_first():
    table, _ = _gae_dump("verl", 0.99, 0.9, "none", seed=3)
    document = identify_table(table).to_dict()
    first = document["candidates"][0]
    assert _names(first) == {"verl", "areal"}  # one loop on these rows: the same numbers
    assert first["normalization"] == "none"
    explaining = [c for c in document["candidates"] if c["explains"]]
    assert [c["normalization"] for c in explaining] == ["none"]  # a whitening adds nothing to explain it


def test_the_verdict_counts_the_lost_terminal_rewards_and_the_masked_positions():
    table, samples = _gae_dump("verl", 1.0, 0.95, "batch", seed=5)
    document = identify_table(table).to_dict()
    lost = sum(1 for s in samples if s["loss_mask"][-1] == 0)  # verl: a response ending masked loses z
    assert document["lost_terminal_samples"] == lost > 0
    assert f"in {lost} samples" in document["verdict"]
    assert document["verdict"].startswith("computed like verl or areal (γ = 1, λ = 0.95, whitened over the batch)")
    assert document["masked_positions"]["holds"] == "carry"  # verl whitens its carry at masked positions


def test_a_column_zeroed_at_masked_positions_says_zeros():
    table, samples = _gae_dump("masked", 0.97, 0.8, "none", seed=6)
    document = identify_table(table).to_dict()
    assert document["masked_positions"]["holds"] == "zeros"
    assert document["masked_positions"]["tokens"] == sum(s["loss_mask"].count(0) for s in samples)


def test_skyrl_whitening_over_every_response_token_is_named():
    samples = _rollouts(80, seed=8)
    advantages = [
        ORACLES["skyrl"](s["values"], s["rewards"], s["loss_mask"], s["terminal_reward"], 1.0, 0.95)[0] for s in samples
    ]
    advantages = _whitened(advantages, [s["loss_mask"] for s in samples], over_all=True)
    document = identify_table(_table(samples, advantages)).to_dict()
    best = document["candidates"][0]
    assert "skyrl" in _names(best) and best["whitening"]["over"] == "response"
    assert "whitened over every response token" in document["verdict"]


@pytest.mark.parametrize("estimator", ["grpo", "dr-grpo", "rloo", "maxrl", "opo", "reinforce++-baseline"])
def test_an_outcome_estimator_is_named_first(estimator):
    samples = _rollouts(96, seed=11)
    rng = np.random.default_rng(12)
    for s in samples:  # outcome rewards that differ within groups
        s["terminal_reward"] = float(rng.integers(0, 4))
    groups = [i // GROUP_SIZE for i in range(len(samples))]
    advantages, _ = critic_free_oracle(
        estimator,
        [s["rewards"] for s in samples],
        [s["loss_mask"] for s in samples],
        [s["terminal_reward"] for s in samples],
        groups,
    )
    document = identify_table(_table(samples, advantages, groups=groups), group_col="group").to_dict()
    best = document["candidates"][0]
    assert document["explained"], document["verdict"]
    assert estimator in {member["estimator"] for member in best["members"]}
    assert best["gamma"] is None and best["lambd"] is None


def test_reinforce_plus_plus_is_named_with_its_gamma():
    samples = _rollouts(96, seed=13)
    gamma = 0.913
    advantages, _ = critic_free_oracle(
        "reinforce++",
        [s["rewards"] for s in samples],
        [s["loss_mask"] for s in samples],
        [s["terminal_reward"] for s in samples],
        gamma=gamma,
    )
    document = identify_table(_table(samples, advantages)).to_dict()
    best = document["candidates"][0]
    assert "reinforce++" in _names(best) and best["normalization"] == "batch"
    assert abs(best["gamma"] - gamma) <= 1e-3 and best["lambd"] is None


def test_a_column_nothing_explains_names_the_closest_and_where_it_breaks():
    table, samples = _gae_dump("verl", 1.0, 0.95, "none", seed=14)
    advantages = [list(row) for row in table.column("advantages").to_pylist()]
    advantages[7][0] += 0.5  # one token off: sample 7 breaks
    rng = np.random.default_rng(15)
    advantages[40] = list(rng.normal(size=len(advantages[40])))
    table = table.set_column(table.schema.get_field_index("advantages"), "advantages", pa.array(advantages))
    document = identify_table(table).to_dict()
    assert document["explained"] is False
    best = document["candidates"][0]
    assert best["samples_reproduced"] == best["samples"] - 2
    assert best["first_break"]["sample"] == 7 and best["first_break"]["token"] == 0
    assert [entry["sample"] for entry in best["breaks"]] == [7, 40]
    assert document["verdict"].startswith("nothing gaecli knows explains 'advantages': the closest is verl")
    assert "row 7, token 0" in document["verdict"]


def test_stored_returns_are_compared():
    samples = _rollouts(64, seed=16)
    outputs = [
        ORACLES["openrlhf"](s["values"], s["rewards"], s["loss_mask"], s["terminal_reward"], 0.99, 0.9) for s in samples
    ]
    table = _table(samples, [a for a, _ in outputs], returns=[r for _, r in outputs])
    document = identify_table(table, against_returns="returns").to_dict()
    best = document["candidates"][0]
    assert "openrlhf" in _names(best) and best["returns_max_abs_residual"] <= 1e-9
    wrong = table.set_column(table.schema.get_field_index("returns"), "returns", table.column("advantages"))
    assert identify_table(wrong, against_returns="returns").to_dict()["explained"] is False


def test_one_trainable_token_per_row_leaves_gamma_and_lambda_unidentified():
    samples = _rollouts(40, seed=17)
    for s in samples:  # one trainable token, the last: its advantage is r + z − V whatever γ and λ
        s["loss_mask"] = [0] * (len(s["loss_mask"]) - 1) + [1]
    advantages = [
        ORACLES["masked"](s["values"], s["rewards"], s["loss_mask"], s["terminal_reward"], 0.9, 0.9)[0] for s in samples
    ]
    document = identify_table(_table(samples, advantages)).to_dict()
    assert document["explained"]
    assert any(note.startswith("γ is not identifiable") for note in document["notes"])
    assert any(note.startswith("λ is not identifiable") for note in document["notes"])


def test_the_sample_is_the_first_rows_and_says_so(tmp_path):
    table, _ = _gae_dump("slime", 0.95, 0.9, "none", seed=18, rows=120)
    path = tmp_path / "dump.parquet"
    pq.write_table(table, path, row_group_size=25)
    report = identify_files([path], IdentifyOptions(sample_rows=50))
    document = report.to_dict()
    assert document["rows_read"] == 50 and document["input_rows"] == 120 and document["complete"] is False
    assert "read the first 50 of 120 rows (--sample-rows)" in document["notes"]
    assert "slime" in _names(document["candidates"][0])


def test_the_command_writes_json_and_exits_zero_either_way(tmp_path):
    table, _ = _gae_dump("roll", 0.98, 0.93, "batch", seed=19)
    path = tmp_path / "dump.parquet"
    pq.write_table(table, path)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["identify", str(path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["explained"] and "roll" in _names(document["candidates"][0])
    for key in ("name", "gamma", "lambd", "normalization", "max_abs_residual", "rms_residual", "share_reproduced"):
        assert key in document["candidates"][0]
    assert "computed like roll" in result.output
    noise = table.set_column(
        table.schema.get_field_index("advantages"),
        "advantages",
        pa.array([list(np.random.default_rng(20).normal(size=len(row))) for row in table.column("values").to_pylist()]),
    )
    pq.write_table(noise, path)
    result = CliRunner().invoke(app, ["identify", str(path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["explained"] is False


def test_bad_input_is_one_line_and_exit_one(tmp_path):
    table, _ = _gae_dump("verl", 1.0, 1.0, "none", seed=21, rows=20)
    advantages = table.column("advantages").to_pylist()
    advantages[3] = advantages[3][:-1]  # one token short
    table = table.set_column(table.schema.get_field_index("advantages"), "advantages", pa.array(advantages))
    path = tmp_path / "dump.parquet"
    pq.write_table(table, path)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["identify", str(path), "--json", str(out)])
    assert result.exit_code == 1
    assert "row 3" in result.output and "advantages" in result.output and "Traceback" not in result.output
    assert not out.exists()
    result = CliRunner().invoke(app, ["identify", str(path), "--against", "stored"])
    assert result.exit_code == 2 and "'stored' is missing" in result.output


@pytest.mark.parametrize("profile", ["verl@2026-08", "verl@2026-07", "slime", "skyrl"])
def test_a_trainer_profile_of_reinforce_plus_plus_is_named_with_its_gamma(profile):
    from test_estimator_profiles import _expected
    from test_estimator_profiles import _samples as profile_samples

    gamma = 0.937
    samples = profile_samples(seed=31, rows=60)
    advantages, _ = _expected(profile, samples, gamma)
    rows = [{"values": [0.0] * len(m), "rewards": r, "loss_mask": m, "terminal_reward": z} for r, m, z in samples]
    document = identify_table(_table(rows, advantages)).to_dict()
    best = document["candidates"][0]
    assert document["explained"], document["verdict"]
    member = next(m for m in best["members"] if m["name"] == f"reinforce++ {profile}")
    assert abs(member["gamma"] - gamma) <= 1e-3 and member["lambd"] is None
    holds = "zeros" if profile.startswith("verl") else "carry"  # verl masks its advantages, slime and SkyRL do not
    assert document["masked_positions"]["holds"] == holds


def test_skyrls_grpo_written_at_every_token_is_told_from_the_contracts():
    from test_estimator_profiles import _outcome_loop
    from test_estimator_profiles import _samples as profile_samples

    samples = profile_samples(seed=33, rows=48)
    groups = [i // 4 for i in range(len(samples))]
    advantages = _outcome_loop("grpo", "skyrl", samples, groups)
    rows = [{"values": [0.0] * len(m), "rewards": r, "loss_mask": m, "terminal_reward": z} for r, m, z in samples]
    document = identify_table(_table(rows, advantages, groups=groups), group_col="group").to_dict()
    best = document["candidates"][0]
    assert document["explained"] and "grpo skyrl" in _names(best), document["verdict"]
    assert document["masked_positions"]["holds"] == "carry"  # the row's advantage at its tool tokens too


def test_an_outcome_estimator_whitened_again_over_the_batch_is_named_with_that_whitening():
    samples = _rollouts(96, seed=35)
    rng = np.random.default_rng(36)
    for s in samples:
        s["terminal_reward"] = float(rng.integers(0, 4))
    groups = [i // GROUP_SIZE for i in range(len(samples))]
    masks = [s["loss_mask"] for s in samples]
    advantages, _ = critic_free_oracle(
        "grpo", [s["rewards"] for s in samples], masks, [s["terminal_reward"] for s in samples], groups
    )
    whitened = [[a if m else 0.0 for a, m in zip(row, mask)] for row, mask in zip(_whitened(advantages, masks), masks)]
    document = identify_table(_table(samples, whitened, groups=groups), group_col="group").to_dict()
    best = document["candidates"][0]
    assert document["explained"] and "grpo" in {m["estimator"] for m in best["members"]}, document["verdict"]
    assert best["normalization"] == "batch" and best["whitening"]["over"] == "trainable"
    # rloo whitened over the batch is reinforce++-baseline (the group's scale whitened away): that one needs no
    # whitening of its own, so it ranks first
    advantages, _ = critic_free_oracle(
        "rloo", [s["rewards"] for s in samples], masks, [s["terminal_reward"] for s in samples], groups
    )
    whitened = [[a if m else 0.0 for a, m in zip(row, mask)] for row, mask in zip(_whitened(advantages, masks), masks)]
    document = identify_table(_table(samples, whitened, groups=groups), group_col="group").to_dict()
    explaining = [c for c in document["candidates"] if c["explains"]]
    assert _names(explaining[0]) == {"reinforce++-baseline"} and explaining[0]["normalization"] == "none"
    assert any(c["normalization"] == "batch" and "rloo" in _names(c) for c in explaining[1:])


# ----------------------------------------------------------------------------- a SkyRL dump with its padding


def _padded_dump(tmp_path, rows, advantages, groups=None):
    """``rows`` of :func:`test_response_mask.skyrl_rows` (padding columns first, response mask 0
    there) with the stored ``advantages``, the response mask named ``response_mask``, as a file."""
    table = pa.table(
        {
            **{name: [r[name] for r in rows] for name in ("values", "rewards", "loss_mask", "terminal_reward")},
            "response_mask": [r["rm"] for r in rows],
            "advantages": [[float(a) for a in row] for row in advantages],
            **({"group": groups} if groups is not None else {}),
        }
    )
    path = tmp_path / "skyrl.parquet"
    pq.write_table(table, path)
    return path


def _identify(path, *options) -> dict:
    from rollout_files import gae

    result = gae("identify", path, "--json", "-", "--quiet", *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _padding_tokens(rows) -> int:
    return sum(r["rm"].count(0) for r in rows)


def test_skyrls_gae_whitened_over_its_response_mask_is_named_with_the_mask(tmp_path):
    from test_response_mask import masked_whiten, skyrl_gae, skyrl_rows

    rows = skyrl_rows(41, samples=60)
    assert _padding_tokens(rows) > 0
    raw = [skyrl_gae(r["values"], r["rewards"], r["terminal_reward"], 0.97, 0.9) for r in rows]
    path = _padded_dump(tmp_path, rows, masked_whiten(raw, [r["rm"] for r in rows]))  # at every position
    document = _identify(path, "--response-mask-col", "response_mask")
    best = document["candidates"][0]
    assert document["explained"] and "skyrl" in _names(best), document["verdict"]
    assert abs(best["gamma"] - 0.97) <= 1e-3 and abs(best["lambd"] - 0.9) <= 1e-3
    assert best["normalization"] == "batch" and best["whitening"]["over"] == "response"
    assert "whitened over every response token" in document["verdict"]
    assert document["masked_positions"]["holds"] == "carry"  # the padding holds SkyRL's whitened loop too
    assert document["masked_positions"]["share_like_best"] == 1.0
    # without the column every token is the response: the statistics are nobody's
    document = _identify(path)
    best = document["candidates"][0]
    assert "skyrl" in _names(best) and best["normalization"] == "batch" and best["whitening"]["over"] is None
    assert "not the statistics of the rows read" in document["verdict"]


def test_skyrls_grpo_written_through_its_response_mask_is_named_with_the_mask(tmp_path):
    from test_estimator_profiles import _outcome_loop
    from test_response_mask import skyrl_rows

    rows = skyrl_rows(42, samples=48)
    groups = [i // 4 for i in range(len(rows))]
    every = _outcome_loop("grpo", "skyrl", [(r["rewards"], r["loss_mask"], r["terminal_reward"]) for r in rows], groups)
    stored = [[a * m for a, m in zip(row, r["rm"])] for row, r in zip(every, rows)]  # scores * response_mask
    path = _padded_dump(tmp_path, rows, stored, groups)
    document = _identify(path, "--group-col", "group", "--response-mask-col", "response_mask")
    best = document["candidates"][0]
    assert document["explained"], document["verdict"]
    assert best["members"][0]["name"] == "grpo skyrl" and best["normalization"] == "none"
    assert document["verdict"].startswith("computed like grpo skyrl")
    assert document["masked_positions"]["holds"] == "carry" and document["masked_positions"]["share_like_best"] == 1.0
    # without the column the padding is written too: the trainable tokens match, the padding does not
    document = _identify(path, "--group-col", "group")
    masked = document["masked_positions"]
    assert document["explained"] and masked["holds"] == "values"
    tool_tokens = sum(m == 0 and rm == 1 for r in rows for m, rm in zip(r["loss_mask"], r["rm"]))
    padding_nonzero = sum(1 for row, r in zip(every, rows) for a, rm in zip(row, r["rm"]) if rm == 0 and a != 0)
    assert padding_nonzero > 0
    assert masked["share_like_best"] == pytest.approx(1 - padding_nonzero / (tool_tokens + _padding_tokens(rows)))


def test_skyrls_reinforce_plus_plus_over_its_response_mask_is_named_with_the_mask(tmp_path):
    from test_response_mask import skyrl_reinforce_expected, skyrl_rows

    rows = skyrl_rows(43, samples=60)
    cut = 0
    for r in rows:  # a response mask 0 inside some responses too, on a masked token after a trainable one
        inside = [t for t in range(1, len(r["rm"])) if r["rm"][t] and not r["loss_mask"][t] and any(r["loss_mask"][:t])]
        if inside and cut < 8:
            r["rm"][inside[0]] = 0
            cut += 1
    assert cut == 8
    advantages, _ = skyrl_reinforce_expected(rows, 0.93)  # reset outside the mask, whitened over it, 0 outside
    path = _padded_dump(tmp_path, rows, advantages)
    document = _identify(path, "--response-mask-col", "response_mask")
    best = document["candidates"][0]
    assert document["explained"] and "reinforce++ skyrl" in _names(best), document["verdict"]
    assert abs(best["gamma"] - 0.93) <= 1e-3 and best["whitening"]["over"] == "response"
    assert document["masked_positions"]["share_like_best"] == 1.0  # 0 outside the mask, as SkyRL writes it
    # without the column no return is reset: the trainable tokens before a cut break
    document = _identify(path)
    assert document["explained"] is False, document["verdict"]
    assert document["candidates"][0]["share_reproduced"] < 1.0


def test_the_python_side_takes_the_response_mask_in_its_columns(tmp_path):
    from test_response_mask import masked_whiten, skyrl_gae, skyrl_rows

    from gaecli import Columns

    rows = skyrl_rows(44, samples=40)
    raw = [skyrl_gae(r["values"], r["rewards"], r["terminal_reward"], 1.0, 0.95) for r in rows]
    table = pq.read_table(_padded_dump(tmp_path, rows, masked_whiten(raw, [r["rm"] for r in rows])))
    columns = Columns(response_mask="response_mask")
    reports = (identify_table(table, columns=columns), identify_files([tmp_path], IdentifyOptions(columns=columns)))
    for report in reports:
        best = report.to_dict()["candidates"][0]
        assert "skyrl" in _names(best) and best["whitening"]["over"] == "response"


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda mask: [2] + mask[1:], "response mask value 2 at token 0 is not 0 or 1 [mask-value]"),
        (lambda mask: mask + [1], "[length-mismatch]"),
        (lambda mask: [0] * len(mask), "has response mask 0"),
    ],
    ids=["a 2", "length", "trainable outside"],
)
def test_an_invalid_response_mask_stops_with_file_row_and_column(tmp_path, change, words):
    from test_response_mask import skyrl_rows

    from rollout_files import gae

    rows = skyrl_rows(45, samples=20)
    bad = next(index for index, r in enumerate(rows) if index > 8 and any(r["loss_mask"]))  # in the 4th batch
    rows[bad]["rm"] = change(rows[bad]["rm"])
    path = _padded_dump(tmp_path, rows, [[0.0] * len(r["loss_mask"]) for r in rows])
    out = tmp_path / "report.json"
    result = gae("identify", path, "--response-mask-col", "response_mask", "--batch-rows", 3, "--json", out)
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"{path}, row {bad}, column 'response_mask'" in message and words in message, message
    assert not out.exists()
