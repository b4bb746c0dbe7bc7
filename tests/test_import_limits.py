"""The importers against hostile values: a dump whose values are out of range, of the wrong
kind, nested so deep or shared so widely that walking them never ends (a 3 KB ``.pt`` can
hold a tuple of 2^90 shared leaves), and NeMo-RL lines whose numbers no column holds. Each
is refused in one line naming the file and the field, with the documented exit code, no
traceback and no output; the miles dumps run in a child process with a hard timeout (the
unbounded cases never ended before)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_import import rollout_data, write_dump
from test_import_nemo_rl import batch, import_after_a_bad_line, write_step

from rollout_files import files_under, gae

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 120  # a refusal takes a second or two; the unbounded walks never ended
PLACEHOLDER = 987_654_321_987_654  # an int pickled as its own bytes, swapped for a structure


def gae_process(*args) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` in a child process (this tree first on the path), killed at the deadline."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)], env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )


def shared_tuple(depth: int = 90) -> tuple:
    """A tuple of 2^depth leaves in ``depth`` objects (each level holds the one below twice)."""
    nested: tuple = ()
    for _ in range(depth):
        nested = (nested, nested)
    return nested


def nested_list_pickle(depth: int) -> bytes:
    """Pickle opcodes of a list nested ``depth`` deep (``[[[…]]]``), built without recursion:
    ``depth`` empty lists, then each appended to the one below."""
    return pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)


def write_deep_dump(path: Path, depth: int) -> Path:
    """A legacy-format ``torch.save`` file whose ``rollout_id`` is a list nested ``depth``
    deep (torch.save itself cannot write one: its pickler recurses)."""
    torch.save(
        {"rollout_id": PLACEHOLDER, "rank": 0, "rollout_data": rollout_data(1, 3)},
        path,
        _use_new_zipfile_serialization=False,
    )
    placeholder = pickle.dumps(PLACEHOLDER, protocol=2)[2:-1]  # without PROTO and STOP
    content = path.read_bytes()
    assert content.count(placeholder) == 1
    path.write_bytes(content.replace(placeholder, nested_list_pickle(depth)))
    return path


def changed(key: str, change) -> dict:
    data = rollout_data(1, 3)
    change(data)
    return data


def sparse_values() -> list:
    return [torch.zeros(length).to_sparse() for length in (len(m) for m in rollout_data(1, 3)["loss_masks"])]


# (id, how to write the dump, what the one line names)
MILES_CASES = [
    ("rank-2**64", lambda p: write_dump(p, rollout_data(1, 3), rank=2**64), "rank is 18446744073709551616, out of"),
    ("rollout_id-2**70", lambda p: write_dump(p, rollout_data(1, 3), rollout_id=2**70), "rollout_id is 1180591620"),
    ("rank-negative", lambda p: write_dump(p, rollout_data(1, 3), rank=-1), "rank is -1, expected 0 or more"),
    ("rank-bool", lambda p: write_dump(p, rollout_data(1, 3), rank=True), "rank is True, expected an integer"),
    ("rank-bool-tensor", lambda p: write_dump(p, rollout_data(1, 3), rank=torch.tensor(True)), "rank is a 0-D tensor"),
    (
        "rollout_id-shared-90",
        lambda p: write_dump(p, rollout_data(1, 3), rollout_id=shared_tuple()),
        "rollout_id is ((((…), (…)), ((…), (…))), (((…), (…)), ((…), (…)))), expected an integer",
    ),
    ("rollout_id-300000-deep", lambda p: write_deep_dump(p, 300_000), "rollout_id is [[[[…]]]], expected an integer"),
    (
        "qkv_format-shared-90",
        lambda p: write_dump(p, rollout_data(1, 3), cp_size=2, qkv_format=shared_tuple()),
        "qkv_format is (((",
    ),
    (
        "reward-shared-90",
        lambda p: write_dump(p, changed("rewards", lambda d: d["rewards"].__setitem__(1, shared_tuple()))),
        "rollout_data['rewards'][1] is (((",
    ),
    (
        "reward-bool",
        lambda p: write_dump(p, changed("rewards", lambda d: d.__setitem__("rewards", [True, False, True]))),
        "rollout_data['rewards'][0] is True, expected a number",
    ),
    (
        "rewards-bool-tensor",
        lambda p: write_dump(p, changed("rewards", lambda d: d.__setitem__("rewards", torch.ones(3).bool()))),
        "rollout_data['rewards'] is a torch.bool tensor, expected numbers",
    ),
    (
        "rewards-2-D",
        lambda p: write_dump(p, changed("rewards", lambda d: d.__setitem__("rewards", torch.zeros(3, 1)))),
        "rollout_data['rewards'] is a 2-D tensor of shape (3, 1)",
    ),
    (
        "values-sparse",
        lambda p: write_dump(p, changed("values", lambda d: d.__setitem__("values", sparse_values()))),
        "rollout_data['values'][0] is a 1-D sparse_coo tensor",
    ),
    (
        "values-bool",
        lambda p: write_dump(p, changed("values", lambda d: d.__setitem__("values", [v > 0 for v in d["values"]]))),
        "rollout_data['values'] holds bool tensors, expected numbers",
    ),
    (
        "response_length-negative",
        lambda p: write_dump(p, changed("response_lengths", lambda d: d["response_lengths"].__setitem__(2, -4))),
        "rollout_data['response_lengths'][2] is -4, expected 0 or more",
    ),
    (
        "total_length-bool",
        lambda p: write_dump(p, changed("total_lengths", lambda d: d["total_lengths"].__setitem__(0, False))),
        "rollout_data['total_lengths'][0] is False, expected an integer",
    ),
]


@pytest.mark.parametrize("write, expected", [c[1:] for c in MILES_CASES], ids=[c[0] for c in MILES_CASES])
def test_miles_refuses_hostile_values_in_one_line(tmp_path, write, expected):
    source = write(tmp_path / "d.pt")
    assert source.stat().st_size < 1 << 20
    result = gae_process("import", "miles", source, "-o", tmp_path / "out.parquet", "--quiet")
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr[-2000:]
    assert len(lines) == 1 and len(lines[0]) < 600, result.stderr[:2000]
    assert "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: {source}: ")
    assert expected in lines[0]
    assert files_under(tmp_path) == ["d.pt"]


def test_negative_rewards_are_rewards(tmp_path):
    data = rollout_data(1, 3)
    data["rewards"] = [-1.0, -0.25, torch.tensor(-3.0)]
    source = write_dump(tmp_path / "d.pt", data)
    result = gae("import", "miles", source, "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out.parquet").column("terminal_reward").to_pylist() == [-1.0, -0.25, -3.0]


def nemo_line(**changes) -> str:
    """One NeMo-RL line (``changes`` as raw JSON text per key, e.g. ``idx="1" + "0" * 70``)."""
    sample = batch(6, 1)[0] | {"idx": 1}
    fields = [f"{json.dumps(key)}: {changes.pop(key, json.dumps(value))}" for key, value in sample.items()]
    return "{" + ", ".join(fields + [f"{json.dumps(key)}: {value}" for key, value in changes.items()]) + "}"


LOG_PROBS = ", ".join(map(json.dumps, batch(6, 1)[0]["prev_logprobs"][0][1:]))
NEMO_CASES = [
    ("reward-400-digit-integer", nemo_line(rewards="[1" + "0" * 400 + "]"), "'rewards' holds an integer of 401 digits"),
    ("reward-integer-beyond-float64", nemo_line(rewards="[1" + "0" * 320 + "]"), "'rewards' holds an integer of 321"),
    ("idx-2**70", nemo_line(idx=str(2**70)), "'idx' holds 1180591620717411303424, out of the int64 range"),
    ("idx-5000-digits", nemo_line(idx="9" * 5000), "'idx' holds an integer of 5,000 digits, out of the int64 range"),
    ("input_lengths-2**64", nemo_line(input_lengths=f"[{2**64}]"), "'input_lengths' holds 18446744073709551616, out"),
    ("rewards-100000-deep", nemo_line(rewards="[" * 100_000 + "]" * 100_000), "refused: the JSON nests"),
    ("reward-nested-500", nemo_line(rewards="[" + "[" * 500 + "]" * 500 + "]"), "'rewards' holds [[[[…]]]], expected"),
    (
        "token-beyond-float64",
        nemo_line(prev_logprobs=f"[[1{'0' * 320}, {LOG_PROBS}]]"),
        "'prev_logprobs' holds an integer",
    ),
    ("reward-bool", nemo_line(rewards="[true]"), "'rewards' holds true, expected a number"),
]


@pytest.mark.parametrize("line, expected", [c[1:] for c in NEMO_CASES], ids=[c[0] for c in NEMO_CASES])
def test_nemo_rl_refuses_numbers_no_column_holds_in_one_line(tmp_path, line, expected):
    path, result = import_after_a_bad_line(tmp_path, line)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 600, result.stderr[:2000]
    assert lines[0].startswith(f"error: {path}:3: ")
    assert expected in lines[0]
    assert files_under(tmp_path) == ["train_data_step7.jsonl"]


def test_nemo_rl_a_step_no_rollout_id_holds_is_an_unusable_name(tmp_path):
    path = write_step(tmp_path, 7, batch(7, 2)).rename(tmp_path / f"train_data_step{'9' * 26}.jsonl")
    result = gae("import", "nemo-rl", path, "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: the step in the name (26 digits) does not fit")
    assert files_under(tmp_path) == [path.name]
