"""``gae inspect``: each file's footer figures (rows, row groups, tokens) against counts made
here from the data, the columns read and their roles for the options given, which estimators
and variants a file allows (a missing column named), whether a diff against stored advantages
is possible, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.inspection import InspectOptions, inspect_files
from gaecli.io.format import Columns

from rollout_files import gae

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_data"
MASKS = [[1, 1, 0, 1], [0, 1], [], [1, 1, 1], [1]]  # one empty response


def write_file(path: Path, *, values: bool = True, stored: bool = False, statistics: bool = True, **extra) -> Path:
    """A rollout file of the five responses of :data:`MASKS`, in two row groups."""
    columns = {
        "loss_mask": pa.array(MASKS, pa.list_(pa.int8())),
        "rewards": pa.array([[0.0] * len(m) for m in MASKS], pa.list_(pa.float32())),
        "terminal_reward": pa.array([1.0, 0.0, 1.0, 0.5, 0.0], pa.float64()),
        "prompt_id": pa.array(["a", "a", "b", "b", "b"]),
    }
    if values:
        columns["values"] = pa.array([[0.5] * len(m) for m in MASKS], pa.list_(pa.float32()))
    if stored:
        columns["advantages"] = pa.array([[0.1] * len(m) for m in MASKS], pa.list_(pa.float64()))
    columns.update(extra)
    pq.write_table(pa.table(columns), path, row_group_size=3, write_statistics=statistics)
    return path


def by_name(entries: list[dict], key: str) -> dict:
    return {entry[key]: entry for entry in entries}


def test_footer_figures_are_the_file_s_own(tmp_path):
    path = write_file(tmp_path / "a.parquet")
    (entry,) = inspect_files([path]).to_dict()["files"]
    assert entry["status"] == "ok"
    assert (entry["rows"], entry["row_groups"]) == (5, 2)
    assert entry["tokens"]["tokens"] == sum(len(mask) for mask in MASKS) == 10
    assert [column["column"] for column in entry["schema"]] == pq.read_schema(path).names


def test_without_statistics_the_token_count_is_a_bound_from_the_levels(tmp_path):
    path = write_file(tmp_path / "a.parquet", statistics=False)
    (entry,) = inspect_files([path]).to_dict()["files"]
    assert entry["tokens"]["tokens"] is None
    assert entry["tokens"]["levels"] == 10 + 1  # one level for the empty list


def test_sample_data_rows_and_tokens(tmp_path):
    report = inspect_files([SAMPLES / "critic_free"], InspectOptions(estimator="grpo", group_by="prompt_id"))
    (entry,) = report.to_dict()["files"]
    table = pq.read_table(SAMPLES / "critic_free" / "grpo_step_0000.parquet")
    assert entry["rows"] == table.num_rows == 32
    assert entry["tokens"]["tokens"] == sum(len(mask) for mask in table.column("loss_mask").to_pylist())
    read = {(column["role"], column["column"]) for column in entry["read"]}
    assert read == {
        ("rewards", "rewards"),
        ("loss_mask", "loss_mask"),
        ("terminal_reward", "terminal_reward"),
        ("response_length", "response_length"),
        ("--group-col", "prompt_id"),
    }
    estimators = by_name(entry["estimators"], "estimator")
    assert estimators["grpo"]["ok"] and estimators["rloo"]["ok"]
    assert not estimators["gae"]["ok"] and "column 'values' is missing" in estimators["gae"]["reason"]
    assert entry["candidates"]["--group-col"] == ["prompt", "prompt_id"]


def test_the_columns_read_follow_the_column_options(tmp_path):
    path = write_file(tmp_path / "a.parquet", v=pa.array([[0.0] * len(m) for m in MASKS], pa.list_(pa.float32())))
    columns = Columns(values="v", rewards=None, loss_mask="loss_mask", terminal_reward="terminal_reward")
    (entry,) = inspect_files([path], InspectOptions(columns=columns)).to_dict()["files"]
    assert [(c["role"], c["column"], c["present"]) for c in entry["read"]] == [
        ("values", "v", True),
        ("loss_mask", "loss_mask", True),
        ("terminal_reward", "terminal_reward", True),
    ]
    roles = {column["column"]: column["read_as"] for column in entry["schema"]}
    assert roles == {"loss_mask": "loss_mask", "rewards": None, "terminal_reward": "terminal_reward",
                     "prompt_id": None, "values": None, "v": "values"}  # fmt: skip


def test_what_a_file_without_values_allows(tmp_path):
    path = write_file(tmp_path / "a.parquet", values=False)
    (entry,) = inspect_files([path], InspectOptions(group_by="prompt_id")).to_dict()["files"]
    estimators = by_name(entry["estimators"], "estimator")
    assert {name for name, e in estimators.items() if e["ok"]} == {
        "grpo", "dr-grpo", "rloo", "opo", "gpg", "reinforce++", "reinforce++-baseline", "maxrl", "grpo-passk",
        "agentic-reinforce",
    }  # fmt: skip
    assert "'values'" in estimators["gae"]["reason"]
    assert "--baseline-reward-col" in estimators["remax"]["reason"]
    assert "'log_probs'" in estimators["opd"]["reason"]
    assert [c for c in entry["read"] if not c["present"]] == [
        {"role": "values", "column": "values", "present": False, "type": None}
    ]
    variants = by_name(entry["variants"], "variant")
    assert not any(v["ok"] for v in variants.values())  # every variant is gae's
    assert entry["diff"]["possible"] is False


def test_a_missing_group_column_is_named(tmp_path):
    path = write_file(tmp_path / "a.parquet")
    (entry,) = inspect_files([path], InspectOptions(estimator="grpo", group_by="uid")).to_dict()["files"]
    grpo = by_name(entry["estimators"], "estimator")["grpo"]
    assert not grpo["ok"] and "--group-col column 'uid' is missing" in grpo["reason"]
    assert {"role": "--group-col", "column": "uid", "present": False, "type": None} in entry["read"]


def test_a_diff_against_stored_advantages(tmp_path):
    path = write_file(tmp_path / "a.parquet", stored=True)
    (entry,) = inspect_files([path]).to_dict()["files"]
    assert entry["diff"] == {"columns": ["advantages"], "reason": None, "possible": True, "new_side": None}
    (entry,) = inspect_files([path], InspectOptions(against="old_adv")).to_dict()["files"]
    assert entry["diff"]["possible"] is False and "--against column 'old_adv' is missing" in entry["diff"]["reason"]
    (entry,) = inspect_files([path], InspectOptions(against="prompt_id")).to_dict()["files"]
    assert "expected a list of float32 or float64" in entry["diff"]["reason"]


def test_variants_need_their_columns(tmp_path):
    path = write_file(tmp_path / "a.parquet", truncated=pa.array([False] * 5), boot=pa.array([0.0] * 5))
    (entry,) = inspect_files([path]).to_dict()["files"]
    variants = by_name(entry["variants"], "variant")
    assert variants["decoupled λ (--lambd-critic)"]["ok"]
    assert variants["truncation bootstrap"]["reason"] == "give --truncated-col COLUMN and --bootstrap-col COLUMN"
    from gaecli.pipeline.options import VariantOptions

    options = InspectOptions(variants=VariantOptions(truncated_col="truncated", bootstrap_col="boot"))
    (entry,) = inspect_files([path], options).to_dict()["files"]
    assert by_name(entry["variants"], "variant")["truncation bootstrap"]["ok"]
    assert ("--truncated-col", "truncated") in {(c["role"], c["column"]) for c in entry["read"]}


def test_the_command_json_and_terminal(tmp_path):
    path = write_file(tmp_path / "a.parquet", values=False)
    result = gae("inspect", path, "--estimator", "grpo", "--group-col", "prompt_id", "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimator"] == "grpo" and document["unreadable"] == []
    (entry,) = document["files"]
    assert entry["rows"] == 5 and by_name(entry["estimators"], "estimator")["grpo"]["ok"]
    text = " ".join(result.stderr.split())
    assert "1 file · 5 rows · 10 tokens · estimator grpo" in text
    assert "reads for grpo: rewards, loss_mask, terminal_reward, prompt_id (--group-col)" in text
    assert "not gae: column 'values' is missing" in text


def test_a_second_file_like_the_first_is_not_shown_twice(tmp_path):
    first, second = write_file(tmp_path / "a.parquet"), write_file(tmp_path / "b.parquet")
    result = gae("inspect", first, second)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("schema and what it allows: as the file above") == 1
    assert result.stderr.count("can compute") == 1


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    good = write_file(tmp_path / "a.parquet")
    bad = tmp_path / "b.parquet"
    bad.write_text("not parquet")
    result = gae("inspect", good, bad, "--json", "-", "-q")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert [f["status"] for f in document["files"]] == ["ok", "unreadable"]
    assert "cannot read as Parquet" in document["unreadable"][0]["message"]
    result = gae("inspect", tmp_path / "missing.parquet")
    assert result.exit_code == 2
    assert f"error: {tmp_path / 'missing.parquet'}: no such file or directory\n" in result.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (("--estimator", "nope"), "unknown estimator 'nope'"),
        (("--json", "a.parquet"), "a.parquet"),
    ],
    ids=["unknown-estimator", "json-onto-input"],
)
def test_usage_errors_are_one_line_and_exit_2(tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    write_file(tmp_path / "a.parquet")
    result = gae("inspect", "a.parquet", *options)
    assert result.exit_code == 2
    assert result.stderr.startswith("error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # one message (wrapped at 80 columns at most once)
