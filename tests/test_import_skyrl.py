"""``gae import skyrl``: ``global_step_{N}_training_input.pkl`` dumps pickled here the way
SkyRL's ``TrainingInputBatch.save`` writes them (``tests/skyrl_dumps.py``, without SkyRL),
imported and held against the responses cut by a per-row loop written here; the rewards
recovered from the returns held against the rewards the returns were built from (float64
loops); the round trip through ``gae recompute --baseline slime``; the restricted unpickler
against pickles that would run code; every refusal, with nothing written and the input kept."""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from skyrl_dumps import (
    dump_name,
    numpy_entry,
    pickle_batch,
    skyrl_batch,
    skyrl_modules,
    torch_entry,
    write_batch,
)

import gaecli
from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.importers import ImportReport, import_skyrl

from rollout_files import TOLERANCE, assert_rows_close, files_under, gae, sha256

GAMMA, LAMBD = 0.99, 0.95
# Stored returns are float32, each within 2^-24 of the float64 returns; a recovered reward
# reads ret_t and ret_{t+1} once each, so it is within 2^-24·(|ret_t| + |ret_{t+1}|) of the
# true one. The tests allow twice that, plus float64 noise.
RECOVERY_ULPS = 2.0**-23


def one_line(stderr: str) -> bool:
    return len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def message(result) -> str:
    return " ".join(result.stderr.split())


def import_dumps(*args):
    return gae("import", "skyrl", *args, "--quiet")


# ----------------------------------------------------------------------------- the columns


def test_every_column_round_trips_cut_to_the_response(tmp_path):
    batches = {10: skyrl_batch(1), 2: skyrl_batch(2, width=5), 9: skyrl_batch(3, prompts=2)}
    for step, batch in batches.items():
        write_batch(tmp_path / "dumps" / f"run{step % 2}" / dump_name(step), batch.state)
    before = {path: sha256(tmp_path / "dumps" / path) for path in files_under(tmp_path / "dumps")}
    result = gae("import", "skyrl", tmp_path / "dumps", "-o", tmp_path / "out.parquet", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    assert {path: sha256(tmp_path / "dumps" / path) for path in before} == before
    table = pq.read_table(tmp_path / "out.parquet")
    order = [2, 9, 10]  # numerically, not by name
    assert table.column("step").to_pylist() == [step for step in order for _ in batches[step].lengths]
    assert table.column("row").to_pylist() == [row for step in order for row in range(len(batches[step].lengths))]
    assert table.column("response_length").to_pylist() == [n for step in order for n in batches[step].lengths]
    columns = {
        "values": "values",
        "loss_mask": "loss_mask",
        "log_probs": "action_log_probs",
        "ref_log_probs": "base_action_log_probs",
        "kl": "kl",
        "trained_advantages": "advantages",
        "trained_returns": "returns",
    }
    for column, key in columns.items():
        assert table.column(column).to_pylist() == [row for step in order for row in batches[step].cut(key)], column
        assert str(table.schema.field(column).type) == "list<element: float>", column
    assert "rollout_log_probs" not in table.column_names and "rewards" not in table.column_names
    assert table.column("is_batch_pad").to_pylist() == [False] * table.num_rows
    assert table.schema.metadata[b"gaecli.imported_from"] == b"skyrl"
    assert json.loads(table.schema.metadata[b"gaecli.import_sources"]) == [dump_name(step) for step in order]
    report = json.loads(result.stdout)
    assert report["format"] == "skyrl"
    assert [(f["rollout_id"], f["rows"]) for f in report["files"]] == [(s, len(batches[s].lengths)) for s in order]
    assert report["tokens"] == sum(sum(batches[step].lengths) for step in order)
    assert report["missing_keys"] == ["rollout_logprobs"]
    assert report["ignored_keys"] == ["attention_mask", "sequences"]
    assert any("SkyRL drops the rewards" in note and "cannot be recovered" in note for note in report["notes"])
    assert any("--estimator gae --gamma G --lambd L" in step for step in report["next_steps"])


def test_the_cut_keeps_the_last_response_length_columns_and_an_empty_response(tmp_path):
    batch = skyrl_batch(4, width=6)
    mask = batch.arrays["response_mask"]
    mask[3] = 0  # a row with no response
    batch.lengths[3] = 0
    batch.state["batch_dict"]["response_mask"] = numpy_entry(mask)
    source = write_batch(tmp_path / dump_name(1), batch.state)
    import_skyrl([source], tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    for row, length in enumerate(batch.lengths):
        assert table.column("values")[row].as_py() == batch.arrays["values"][row, 6 - length :].tolist()
    assert table.column("loss_mask")[3].as_py() == [] and table.column("response_length")[3].as_py() == 0
    assert table.column("values")[0].as_py() == batch.arrays["values"][0].tolist()  # a response of all R columns


def with_boundaries(batch, boundaries):
    """``batch`` with its metadata's ``policy_prompt_boundaries`` set to ``boundaries``."""
    batch.boundaries = boundaries
    batch.state["metadata"]["policy_prompt_boundaries"] = list(boundaries)
    return batch


def test_pad_rows_are_flagged_and_each_gets_a_group_of_its_own(tmp_path):
    batch = skyrl_batch(5, prompts=3, per_prompt=2, pad=3)
    source = write_batch(tmp_path / dump_name(4), batch.state)
    report = import_skyrl([source], tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    # prompts 0, 1, 2 from the boundaries (0, 2), (2, 4), (4, 6); the pad rows 3, 4, 5 (SkyRL's pad0, pad1, pad2)
    assert table.column("group_index").to_pylist() == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert table.column("group_index").null_count == 0 and str(table.schema.field("group_index").type) == "int64"
    assert table.column("is_batch_pad").to_pylist() == [False] * 6 + [True] * 3
    assert table.column("loss_mask").to_pylist()[6:] == [[0.0] * batch.lengths[0]] * 3
    assert table.column("values").to_pylist()[6:] == [batch.arrays["values"][0].tolist()] * 3  # copies of row 0
    assert table.column_names[:5] == ["step", "row", "group_index", "is_batch_pad", "response_length"]
    assert any("3 batch-padding row(s)" in note and "a group_index of its own" in note for note in report.notes)


def test_group_ids_are_unique_across_steps_and_stable(tmp_path):
    batches = {
        12: with_boundaries(skyrl_batch(31, prompts=2, per_prompt=2, pad=1), [(0, 3), (3, 4)]),
        3: with_boundaries(skyrl_batch(32, prompts=3, per_prompt=2, pad=2), [(0, 1), (1, 4), (4, 6)]),
        7: with_boundaries(skyrl_batch(33, prompts=2, per_prompt=3), [(0, 2), (2, 3), (3, 6)]),
    }
    for step, batch in batches.items():
        write_batch(tmp_path / "dumps" / dump_name(step), batch.state)
    report = import_skyrl([tmp_path / "dumps"], tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("step").to_pylist() == [3] * 8 + [7] * 6 + [12] * 5
    by_hand = [
        *[0, 1, 1, 1, 2, 2, 3, 4],  # step 3: (0, 1), (1, 4), (4, 6), then its two pad rows
        *[5, 5, 6, 7, 7, 7],  # step 7: (0, 2), (2, 3), (3, 6), after step 3's five groups
        *[8, 8, 8, 9, 10],  # step 12: (0, 3), (3, 4), then its pad row
    ]
    assert table.column("group_index").to_pylist() == by_hand
    per_step = {}
    for step, group in zip(table.column("step").to_pylist(), by_hand):
        per_step.setdefault(step, set()).add(group)
    assert sum(len(groups) for groups in per_step.values()) == len(set().union(*per_step.values()))
    assert any("no two steps share a group id" in note for note in report.notes)
    # the same dumps, named one by one in another order, give the same ids
    import_skyrl([tmp_path / "dumps" / dump_name(step) for step in (12, 7, 3)], tmp_path / "again.parquet")
    assert pq.read_table(tmp_path / "again.parquet").column("group_index").to_pylist() == by_hand


def grpo_by_hand(table, groups: list) -> list[list[float]]:
    """grpo as docs/estimators.md defines it, one row at a time: the score ``s`` =
    ``terminal_reward`` + the rewards at trainable tokens (token order, float64); per group
    ``(s − μ) / (σ + 1e-6)`` with the Bessel σ, a group of one ``s / (1 + 1e-6)``; that value
    at every trainable token, 0 at the masked ones. ``groups``: each row's group, any key."""
    masks = table.column("loss_mask").to_pylist()
    scores = []
    for rewards, mask, terminal in zip(table.column("rewards").to_pylist(), masks, table.column("terminal_reward")):
        score = terminal.as_py()
        for reward, trainable in zip(rewards, mask):
            if trainable:
                score += reward
        scores.append(score)
    members = {}
    for score, group in zip(scores, groups):
        members.setdefault(group, []).append(score)
    advantages = []
    for score, group, mask in zip(scores, groups, masks):
        group_scores = members[group]
        if len(group_scores) == 1:
            value = score / (1 + 1e-6)
        else:
            mean = sum(group_scores) / len(group_scores)
            std = (sum((x - mean) ** 2 for x in group_scores) / (len(group_scores) - 1)) ** 0.5
            value = (score - mean) / (std + 1e-6)
        advantages.append([value if trainable else 0.0 for trainable in mask])
    return advantages


def test_grpo_recomputes_on_an_import_with_pad_rows_over_the_boundaries_groups(tmp_path):
    """The groups by hand from the boundaries, keyed by step (two steps' groups stay apart),
    each pad row alone: what ``gae recompute --estimator grpo --group-col group_index``
    (the default --norm-like, grpo's own rule) must give on the import."""
    boundaries = {1: [(0, 3), (3, 5), (5, 6)], 2: [(0, 2), (2, 4), (4, 6)]}
    pads = {1: 2, 2: 1}
    for step in (1, 2):
        batch = skyrl_batch(40 + step, pad=pads[step], estimator="reinforce++", gamma=1.0, critic=False)
        write_batch(tmp_path / "dumps" / dump_name(step), with_boundaries(batch, boundaries[step]).state)
    imported = tmp_path / "out.parquet"
    assert import_dumps(tmp_path / "dumps", "-o", imported, "--estimator", "reinforce++", "--gamma", 1).exit_code == 0
    options = ("--estimator", "grpo", "--group-col", "group_index", "-q")
    result = gae("recompute", imported, "-o", tmp_path / "r.parquet", *options)
    assert result.exit_code == 0, result.output
    groups = []
    for step in (1, 2):
        for prompt, (start, end) in enumerate(boundaries[step]):
            groups += [(step, prompt)] * (end - start)
        groups += [(step, "pad", i) for i in range(pads[step])]
    table = pq.read_table(imported)
    expected = grpo_by_hand(table, groups)
    got = pq.read_table(tmp_path / "r.parquet").column("advantages").to_pylist()
    assert len(got) == len(expected) == 6 + 2 + 6 + 1
    for row, (want, have) in enumerate(zip(expected, got)):
        assert np.allclose(have, want, rtol=1e-6, atol=1e-7), row
    pad_rows = [row for row, pad in enumerate(table.column("is_batch_pad").to_pylist()) if pad]
    assert pad_rows == [6, 7, 14] and all(not any(got[row]) for row in pad_rows)  # loss_mask all 0: zeros
    assert all(any(got[row]) for row in (5, 13))  # row 5 a group of one, row 13 a pair: not zero


def test_without_boundaries_there_is_no_group_index_and_a_note(tmp_path):
    source = write_batch(tmp_path / dump_name(0), skyrl_batch(6, boundaries=False, pad=1).state)
    report = import_skyrl([source], tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert "group_index" not in table.column_names and table.column("is_batch_pad").to_pylist()[-1]
    assert any("no policy_prompt_boundaries" in note and "drops the uids" in note for note in report.notes)
    assert any("1 batch-padding row(s)" in note and "group_index" not in note for note in report.notes)


def test_without_a_critic_there_is_no_values_column_and_gae_recovery_is_refused(tmp_path):
    source = write_batch(tmp_path / dump_name(3), skyrl_batch(7, critic=False).state)
    report = import_skyrl([source], tmp_path / "out.parquet")
    assert "values" not in report.columns and report.missing_keys == ["values", "rollout_logprobs"]
    assert any("--values-col none" in step for step in report.next_steps())
    result = import_dumps(source, "-o", tmp_path / "gae.parquet", "--estimator", "gae", "--gamma", 1, "--lambd", 1)
    assert result.exit_code == 1 and one_line(result.stderr), result.output
    assert f"{source}: batch_dict['values'] is None or absent (a run without a critic" in message(result)
    assert not (tmp_path / "gae.parquet").exists()


def test_a_step_comes_from_the_metadata_when_the_name_lacks_it(tmp_path):
    named = write_batch(tmp_path / "batch.pkl", skyrl_batch(8, step=17).state)
    import_skyrl([named], tmp_path / "out.parquet")
    assert set(pq.read_table(tmp_path / "out.parquet").column("step").to_pylist()) == {17}
    unnamed = write_batch(tmp_path / "other.pkl", skyrl_batch(8).state)
    result = import_dumps(unnamed, "-o", tmp_path / "none.parquet")
    assert result.exit_code == 2 and "cannot tell the training step" in message(result)


def test_legacy_entries_without_a_format_are_numpy_entries(tmp_path):
    batch = skyrl_batch(9)
    for entry in batch.state["batch_dict"].values():
        if entry is not None and entry.get("format") == "numpy":
            del entry["format"]
    import_skyrl([write_batch(tmp_path / dump_name(0), batch.state)], tmp_path / "out.parquet")
    assert pq.read_table(tmp_path / "out.parquet").column("values").to_pylist() == batch.cut("values")


def test_non_finite_numbers_are_imported_as_they_are(tmp_path):
    """As the other importers do: gae validate (and recompute) report them, naming the row."""
    batch = skyrl_batch(10)
    values = batch.arrays["values"].copy()
    values[2, -1] = np.nan
    batch.state["batch_dict"]["values"] = numpy_entry(values)
    source = write_batch(tmp_path / dump_name(0), batch.state)
    import_skyrl([source], tmp_path / "out.parquet", estimator="gae", gamma=GAMMA, lambd=LAMBD)
    table = pq.read_table(tmp_path / "out.parquet")
    assert np.isnan(table.column("values")[2].as_py()[-1])
    assert np.isnan(table.column("rewards")[2].as_py()[-2])  # r_t reads V_{t+1}
    result = gae("validate", tmp_path / "out.parquet")
    assert result.exit_code == 1 and "non-finite" in result.output and "row 2" in result.output


def test_the_library_function_is_exported_and_skyrl_is_never_imported(tmp_path):
    assert gaecli.import_skyrl is import_skyrl
    source = write_batch(tmp_path / dump_name(0), skyrl_batch(11).state)
    assert not any(name == "skyrl" or name.startswith("skyrl.") for name in sys.modules)
    report = import_skyrl([source], tmp_path / "out.parquet")
    assert isinstance(report, ImportReport) and report.rows == 6
    assert not any(name == "skyrl" or name.startswith("skyrl.") for name in sys.modules)


# ----------------------------------------------------------------------------- reward recovery


def recovery_tolerance(batch, row: int, positions: np.ndarray) -> np.ndarray:
    returns = batch.arrays["returns"].astype(np.float64)[row]
    following = np.append(returns[1:], 0.0)
    return RECOVERY_ULPS * (np.abs(returns) + np.abs(following))[positions] + 1e-12


def assert_rewards_recovered(table, batch) -> None:
    """``rewards`` and ``terminal_reward`` are the batch's true rewards (the last response
    token's in terminal_reward, 0 in its rewards entry) within :func:`recovery_tolerance`."""
    width = batch.rewards.shape[1]
    for row, length in enumerate(batch.lengths):
        positions = np.arange(width - length, width)
        true = batch.rewards[row, positions]
        got = np.array(table.column("rewards")[row].as_py())
        assert got[-1] == 0.0
        allowed = recovery_tolerance(batch, row, positions)
        assert np.all(np.abs(got[:-1] - true[:-1]) <= allowed[:-1]), row
        assert abs(table.column("terminal_reward")[row].as_py() - true[-1]) <= allowed[-1], row


def recompute_slime(tmp_path: Path, imported: Path, *options) -> None:
    """``gae recompute --baseline slime --keep-baseline`` (SkyRL's GAE before whitening:
    plain GAE over every token, z on token R−1) on the import: its returns are
    ``trained_returns`` at every position."""
    result = gae(
        "recompute", imported, "-o", tmp_path / "r.parquet", *options, "--baseline", "slime", "--keep-baseline", "-q"
    )
    assert result.exit_code == 0, result.output
    recomputed = pq.read_table(tmp_path / "r.parquet")
    expected = [np.array(row) for row in recomputed.column("trained_returns").to_pylist()]
    assert_rows_close("returns_slime", expected, recomputed.column("returns_slime").to_pylist(), TOLERANCE["float"])


def test_gae_rewards_are_recovered_from_the_returns_and_values(tmp_path):
    batches = {3: skyrl_batch(12, prompts=4, width=24, pad=1), 4: skyrl_batch(13, prompts=3, width=17)}
    for step, batch in batches.items():
        write_batch(tmp_path / "dumps" / dump_name(step), batch.state)
    imported = tmp_path / "out.parquet"
    options = ("--estimator", "gae", "--gamma", GAMMA, "--lambd", LAMBD)
    result = gae("import", "skyrl", tmp_path / "dumps", "-o", imported, *options, "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    table = pq.read_table(imported)
    assert table.column_names[5:9] == ["values", "loss_mask", "rewards", "terminal_reward"]
    assert str(table.schema.field("rewards").type) == "list<element: double>"
    assert json.loads(table.schema.metadata[b"gaecli.recovered_rewards"]) == {
        "estimator": "gae",
        "gamma": GAMMA,
        "lambd": LAMBD,
    }
    start = 0
    for step in (3, 4):
        rows = len(batches[step].lengths)
        assert_rewards_recovered(table.slice(start, rows), batches[step])
        start += rows
    report = json.loads(result.stdout)
    assert any("recovered from the returns and values" in note for note in report["notes"])
    assert any("recovered from the returns" in step and "--kl-coef" in step for step in report["next_steps"])
    recompute_slime(tmp_path, imported, "--gamma", GAMMA, "--lambd", LAMBD)


def test_reinforce_plus_plus_rewards_are_recovered_from_the_returns(tmp_path):
    gamma = 0.97
    batch = skyrl_batch(14, prompts=4, width=20, estimator="reinforce++", gamma=gamma, critic=False)
    source = write_batch(tmp_path / dump_name(5), batch.state)
    imported = tmp_path / "out.parquet"
    report = import_skyrl([source], imported, estimator="reinforce++", gamma=gamma)
    table = pq.read_table(imported)
    assert_rewards_recovered(table, batch)
    assert "values" not in report.columns
    # reinforce++'s returns are GAE's with V = 0 and λ = 1 over the response
    recompute_slime(tmp_path, imported, "--gamma", gamma, "--lambd", 1, "--values-col", "none")


def test_outcome_estimator_returns_are_refused(tmp_path):
    """grpo / rloo / maxrl dumps: returns = advantages = the score times the mask."""
    batch = skyrl_batch(15, critic=False)
    score = np.where(batch.arrays["response_mask"] == 1, 0.7, 0.0).astype(np.float32)
    batch.state["batch_dict"]["returns"] = batch.state["batch_dict"]["advantages"] = numpy_entry(score)
    source = write_batch(tmp_path / dump_name(0), batch.state)
    result = import_dumps(source, "-o", tmp_path / "out.parquet", "--estimator", "reinforce++", "--gamma", 1)
    assert result.exit_code == 1 and one_line(result.stderr), result.output
    assert "equals batch_dict['advantages'] at every response token" in message(result)
    assert files_under(tmp_path) == [dump_name(0)]


@pytest.mark.parametrize(
    "options, expected",
    [
        (("--estimator", "grpo"), "--estimator grpo: SkyRL's grpo writes returns = advantages"),
        (("--estimator", "ppo", "--gamma", "1"), "--estimator: unknown estimator to recover the rewards of 'ppo'"),
        (("--gamma", "0.9"), "--gamma and --lambd say how to recover the rewards"),
        (("--estimator", "gae", "--gamma", "1"), "--estimator gae needs --lambd"),
        (("--estimator", "reinforce++"), "--estimator reinforce++ needs --gamma"),
        (("--estimator", "reinforce++", "--gamma", "1", "--lambd", "1"), "--estimator reinforce++ takes --gamma only"),
        (("--estimator", "gae", "--gamma", "1.5", "--lambd", "1"), "--gamma must be in [0, 1], got 1.5"),
    ],
    ids=["grpo", "unknown", "gamma-alone", "no-lambd", "no-gamma", "lambd-with-reinforce", "gamma-range"],
)
def test_recovery_options_that_do_not_go_together_are_usage_errors(tmp_path, options, expected):
    source = write_batch(tmp_path / dump_name(0), skyrl_batch(16).state)
    result = import_dumps(source, "-o", tmp_path / "out.parquet", *options)
    assert result.exit_code == 2 and one_line(result.stderr), result.output
    assert expected in message(result)
    assert files_under(tmp_path) == [dump_name(0)]


def test_the_library_refuses_the_same_options():
    with pytest.raises(InvalidOptionError, match="needs --lambd"):
        import_skyrl(["nowhere"], "out.parquet", estimator="gae", gamma=1.0)


# ----------------------------------------------------------------------------- the restricted unpickler


class Reduce:
    """An object that pickles as ``call(*args)``: what a malicious dump does."""

    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return (self.call, self.args)


def code_runners(marker: Path) -> dict:
    return {
        "os.system": Reduce(os.system, (f"touch {marker}",)),
        "builtins.exec": Reduce(builtins.exec, (f"open({str(marker)!r}, 'w').close()",)),
        "subprocess.Popen": Reduce(subprocess.Popen, (["touch", str(marker)],)),
    }


def refused(path: Path, name: str) -> str:
    return (
        f"error: {path}: refused: the dump holds a pickled Python object ({name}) that a SkyRL training-input dump "
        f"does not; gaecli never unpickles arbitrary objects"
    )


@pytest.mark.parametrize("runner", ["os.system", "builtins.exec", "subprocess.Popen"])
@pytest.mark.parametrize("place", ["top level", "metadata"])
def test_a_pickle_that_would_run_code_runs_none(tmp_path, runner, place):
    marker = tmp_path / "marker"
    evil = code_runners(marker)[runner]
    if place == "top level":
        data = pickle.dumps(evil)
    else:
        state = skyrl_batch(17).state
        state["metadata"]["metrics"] = {"policy/kl": evil}
        data = pickle_batch(state)
    source = tmp_path / "dumps" / dump_name(0)
    source.parent.mkdir()
    source.write_bytes(data)
    result = import_dumps(tmp_path / "dumps", "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and one_line(result.stderr), result.output
    assert result.stderr.strip() == refused(source, f"{evil.call.__module__}.{evil.call.__qualname__}")
    assert not marker.exists() and files_under(tmp_path) == [f"dumps/{dump_name(0)}"]
    assert source.read_bytes() == data


def test_a_torch_entry_that_would_run_code_runs_none(tmp_path):
    marker = tmp_path / "marker"
    state = skyrl_batch(18).state
    buffer = io.BytesIO()
    torch.save(code_runners(marker)["os.system"], buffer)
    state["batch_dict"]["values"] = {"format": "torch", "data": buffer.getvalue()}
    source = write_batch(tmp_path / dump_name(0), state)
    result = import_dumps(source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and one_line(result.stderr), result.output
    assert f"{source}: batch_dict['values']: refused: its torch.save bytes hold a pickled Python object" in message(
        result
    )
    assert not marker.exists() and files_under(tmp_path) == [dump_name(0)]


def test_a_persistent_id_is_refused(tmp_path):
    class Persistent(pickle.Pickler):
        def persistent_id(self, obj):
            return "storage-0" if isinstance(obj, Path) else None

    buffer = io.BytesIO()
    Persistent(buffer).dump({"batch_dict": Path("x")})
    source = tmp_path / dump_name(0)
    source.write_bytes(buffer.getvalue())
    result = import_dumps(source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and result.stderr.strip() == refused(source, "the persistent id 'storage-0'")


def test_a_device_is_admitted_only_as_a_name(tmp_path):
    state = skyrl_batch(19).state
    state["device"] = torch.device("cuda", 1)  # torch.device('cuda', 1): a string and an index
    import_skyrl([write_batch(tmp_path / dump_name(0), state)], tmp_path / "out.parquet")
    state["device"] = Reduce(torch.device, (["cpu"],))  # a list where the name belongs
    source = write_batch(tmp_path / dump_name(1), state)
    with pytest.raises(GAEInputError, match=r"refused: .*\(torch.device of \['cpu'\], None\)"):
        import_skyrl([source], tmp_path / "other.parquet")


def test_numpy_numbers_in_the_metadata_are_admitted_and_numpy_arrays_refused(tmp_path):
    state = skyrl_batch(30).state
    state["metadata"].update(pad_size=np.int64(0), ratio=np.float32(0.5), flag=np.bool_(True))
    import_skyrl([write_batch(tmp_path / dump_name(0), state)], tmp_path / "out.parquet")
    state["metadata"]["lengths"] = np.arange(3)
    source = write_batch(tmp_path / dump_name(1), state)
    with pytest.raises(GAEInputError, match=r"refused: .*\(numpy\._?core\.multiarray\._reconstruct\)"):
        import_skyrl([source], tmp_path / "other.parquet")


# ----------------------------------------------------------------------------- refusals


def test_a_pickle_that_is_no_training_input_batch_is_refused(tmp_path):
    plain = tmp_path / "plain" / dump_name(0)
    plain.parent.mkdir()
    plain.write_bytes(pickle.dumps({"batch_dict": {}, "metadata": {}}))
    result = import_dumps(plain, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and one_line(result.stderr)
    assert result.stderr.strip() == (
        f"error: {plain}: holds a dict (keys: batch_dict, metadata), not a SkyRL TrainingInputBatch (dump_data "
        f"pickles one, as _rebuild_tensor_batch of its state)"
    )
    output = write_batch(tmp_path / "output" / dump_name(0), skyrl_batch(20).state, kind="TrainingOutputBatch")
    result = import_dumps(output, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {output}: holds a SkyRL TrainingOutputBatch, not the TrainingInputBatch that dump_data writes"
    )
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(
    "data",
    [b"not a pickle at all\n", "half", b"", b"\x80\x04\x95garbage"],
    ids=["text", "truncated", "empty", "garbage"],
)
def test_bytes_that_are_no_pickle_are_unreadable(tmp_path, data):
    if data == "half":
        whole = pickle_batch(skyrl_batch(21).state)
        data = whole[: len(whole) // 2]
    source = tmp_path / dump_name(0)
    source.write_bytes(data)
    result = import_dumps(source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 2 and one_line(result.stderr), result.output
    assert f"{source}: cannot read as a SkyRL dump (a pickle file) (" in message(result)
    assert files_under(tmp_path) == [dump_name(0)]


def set_entry(key, array):
    return lambda state: state["batch_dict"].__setitem__(key, numpy_entry(array))


def change_mask(change):
    def apply(state):
        mask = np.frombuffer(state["batch_dict"]["response_mask"]["data"], dtype=np.int64).reshape(6, 9).copy()
        change(mask)
        state["batch_dict"]["response_mask"] = numpy_entry(mask)

    return apply


def set_metadata(key, value):
    return lambda state: state["metadata"].__setitem__(key, value)


BAD_BATCHES = {
    "no-loss-mask": (
        lambda state: state["batch_dict"].pop("loss_mask"),
        "batch_dict lacks loss_mask (or holds None); it has sequences, attention_mask, response_mask,",
    ),
    "response-mask-none": (
        lambda state: state["batch_dict"].__setitem__("response_mask", None),
        "batch_dict lacks response_mask (or holds None)",
    ),
    "no-batch-dict": (lambda state: state.pop("batch_dict"), "the TrainingInputBatch's state lacks batch_dict"),
    "shape": (set_entry("values", np.zeros((6, 8), np.float32)), "batch_dict['values'] has shape (6, 8) but "),
    "batch-size": (
        lambda state: state.__setitem__("batch_size", 7),
        "batch_dict['response_mask'] has shape (6, 9), expected (batch_size, R) with batch_size 7",
    ),
    "one-dimensional": (
        set_entry("kl", np.zeros(6, np.float32)),
        "batch_dict['kl'] has shape (6,), expected (batch_size, R)",
    ),
    "bool-values": (set_entry("values", np.ones((6, 9), bool)), "batch_dict['values'] is a bool tensor"),
    "object-dtype": (
        lambda state: state["batch_dict"]["values"].__setitem__("dtype", "object"),
        "batch_dict['values']['dtype'] is 'object', expected one of bool, float16,",
    ),
    "short-bytes": (
        lambda state: state["batch_dict"]["values"].__setitem__("data", b"\x00" * 12),
        "batch_dict['values'] holds 12 bytes, but a float32 array of shape (6, 9) has 216",
    ),
    "tensor-list": (
        lambda state: state["batch_dict"].__setitem__("returns", {"format": "tensor_list", "items": []}),
        "batch_dict['returns'] is a tensor list, expected one [batch_size, R] tensor",
    ),
    "left-aligned": (
        change_mask(lambda mask: mask.__setitem__((0, 3), 0)),
        "batch_dict['response_mask'] row 0, column 3 is 0 after a 1: SkyRL's response-level tensors are right-aligned",
    ),
    "mask-value": (
        change_mask(lambda mask: mask.__setitem__((4, 8), 2)),
        "batch_dict['response_mask'] row 4, column 8 is 2, expected 0 or 1",
    ),
    "pad-size": (set_metadata("pad_size", 99), "metadata['pad_size'] is 99, more than the batch's 6 rows"),
    "boundaries-short": (
        set_metadata("policy_prompt_boundaries", [(0, 2), (2, 4)]),
        "metadata['policy_prompt_boundaries'] covers rows 0 to 4, but the batch has 6 rows before its padding",
    ),
    "boundaries-gap": (
        set_metadata("policy_prompt_boundaries", [(0, 2), (3, 6)]),
        "metadata['policy_prompt_boundaries'][1] is (3, 6): expected consecutive (start, end) row pairs",
    ),
    "boundaries-type": (
        set_metadata("policy_prompt_boundaries", [(0, 2.5), (2.5, 6)]),
        "metadata['policy_prompt_boundaries'] is [(0, 2.5), (2.5, 6)], expected a list of (start, end) row pairs",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_bad_batches_are_named_with_file_key_row_and_column(tmp_path, name):
    change, expected = BAD_BATCHES[name]
    state = skyrl_batch(22).state
    change(state)
    source = write_batch(tmp_path / dump_name(0), state)
    before = sha256(source)
    result = import_dumps(source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and one_line(result.stderr), result.output
    assert f"{source}: {expected}" in message(result)
    assert files_under(tmp_path) == [dump_name(0)] and sha256(source) == before


def test_two_files_of_one_step_are_refused(tmp_path):
    write_batch(tmp_path / "a" / dump_name(4), skyrl_batch(23).state)
    write_batch(tmp_path / "b" / dump_name(4), skyrl_batch(24).state)
    result = import_dumps(tmp_path / "a", tmp_path / "b", "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and "both hold step 4; import one of them" in message(result)


def test_dumps_whose_keys_differ_are_refused(tmp_path):
    write_batch(tmp_path / dump_name(1), skyrl_batch(25).state)
    write_batch(tmp_path / dump_name(2), skyrl_batch(26, critic=False).state)
    result = import_dumps(tmp_path, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and "the dumps differ in their keys" in message(result)
    assert "values" in message(result) and not (tmp_path / "out.parquet").exists()


def test_a_later_dump_that_fails_leaves_no_output(tmp_path):
    """The first file converts, the second fails in the first pass: nothing is written."""
    write_batch(tmp_path / dump_name(1), skyrl_batch(27).state)
    state = skyrl_batch(28).state
    state["batch_dict"].pop("response_mask")
    write_batch(tmp_path / dump_name(2), state)
    result = import_dumps(tmp_path, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1 and files_under(tmp_path) == [dump_name(1), dump_name(2)]


# ----------------------------------------------------------------------------- help


def test_the_import_help_lists_skyrl():
    result = gae("import", "--help")
    assert result.exit_code == 0 and "skyrl" in result.output and "SkyRL" in result.output
    help_text = gae("import", "skyrl", "--help").output
    assert "--estimator" in help_text and "reinforce++" in help_text and "DUMP..." in help_text


def test_the_stand_in_modules_are_gone_after_pickling():
    with skyrl_modules():
        assert "skyrl.backends.skyrl_train.training_batch" in sys.modules
    assert "skyrl" not in sys.modules and "skyrl.backends.skyrl_train.training_batch" not in sys.modules
    assert torch_entry(torch.zeros(1))["format"] == "torch"
