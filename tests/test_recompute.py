"""``gae recompute`` end to end: real Parquet files in tmp dirs through the CLI (Typer's
CliRunner), outputs held against the float64 reference or plain Python / numpy loops,
output layout, normalization, baselines, every bad input with its exit code and message,
and the all-or-nothing guarantees (nothing left behind, inputs untouched)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import gaecli
import gaecli.pipeline.batches
import gaecli.recompute
from gaecli.errors import InvalidDataError
from gaecli.io.format import Columns
from gaecli.recompute import RecomputeOptions, recompute_file, recompute_files

from rollout_files import (
    MASK_TYPES,
    TOLERANCE,
    Rollouts,
    assert_rows_close,
    count_footer_reads,
    files_under,
    gae,
    masked_advantages,
    random_rollouts,
    reference_outputs,
    rollout_table,
    rollouts_from_table,
    sha256,
    unmasked_advantages,
    whiten_numpy,
    write_table,
)

GAMMA, LAMBD = 0.9, 0.8
SUMMARY_KEYS = {
    "samples",
    "tokens",
    "trainable_tokens",
    "changed_samples",
    "masked_tail_samples",
    "mean_terminal_credit",
    "fully_masked_samples",
    "mean_abs_delta_advantage",
    "max_abs_delta_advantage",
}


def recompute(inputs, output, *options, gamma=GAMMA, lambd=LAMBD, quiet=True):
    return gae(
        "recompute",
        *inputs,
        "-o",
        output,
        "--gamma",
        gamma,
        "--lambd",
        lambd,
        *(["--quiet"] if quiet else []),
        *options,
    )


def assert_ok(result) -> None:
    assert result.exit_code == 0, result.output


def assert_nothing_written(out_dir: Path) -> None:
    """No output, no hidden temp file, not even the (new) output directory."""
    assert files_under(out_dir) == []
    assert not out_dir.exists(), f"{out_dir} was left behind"


def assert_matches_reference(
    table: pa.Table, output: pa.Table, *, gamma=GAMMA, lambd=LAMBD, tolerance=None, **names
) -> None:
    """``output``'s advantages and returns against reference_gae on ``table``'s data."""
    advantages_col = names.pop("advantages", "advantages")
    returns_col = names.pop("returns", "returns")
    data = rollouts_from_table(table, **names)
    expected_advantages, expected_returns = reference_outputs(data, gamma, lambd)
    tolerance = tolerance or TOLERANCE[str(output.schema.field(advantages_col).type.value_type)]
    got_advantages = output.column(advantages_col).to_pylist()
    got_returns = output.column(returns_col).to_pylist()
    assert_rows_close("advantages", expected_advantages, got_advantages, tolerance)
    assert_rows_close("returns", expected_returns, got_returns, tolerance)
    for row, (mask, advantages, returns) in enumerate(zip(data.masks, got_advantages, got_returns)):
        masked = [(a, r) for a, r, m in zip(advantages, returns, mask) if not m]
        assert all(a == 0.0 and r == 0.0 for a, r in masked), f"row {row}: non-zero output at a masked position"


@pytest.fixture
def rollouts() -> Rollouts:
    return random_rollouts(53, seed=1)


@pytest.fixture
def source(tmp_path, rollouts) -> Path:
    return write_table(rollout_table(rollouts), tmp_path / "in" / "rollouts.parquet", row_group_size=10)


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("batch_rows", [1, 7, 1000])
def test_outputs_match_reference_over_row_groups(tmp_path, source, batch_rows):
    assert pq.ParquetFile(source).metadata.num_row_groups == 6
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", batch_rows))
    output = pq.read_table(target)
    assert output.num_rows == 53
    assert output.schema.field("advantages").type == pa.list_(pa.float32())
    assert output.schema.field("returns").type == pa.list_(pa.float32())
    assert_matches_reference(pq.read_table(source), output)


def test_results_do_not_depend_on_batch_rows(tmp_path, source):
    outputs = []
    for batch_rows in (1, 13, 1000):
        target = tmp_path / f"out{batch_rows}.parquet"
        assert_ok(recompute([source], target, "--batch-rows", batch_rows))
        outputs.append(pq.read_table(target, columns=["advantages", "returns"]))
    assert outputs[0].equals(outputs[1]) and outputs[0].equals(outputs[2])


@pytest.mark.parametrize("kernel", gaecli.available_kernels("cpu"))
def test_every_kernel_matches_reference_and_is_recorded(tmp_path, source, kernel):
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--kernel", kernel, "--batch-rows", 16))
    output = pq.read_table(target)
    assert_matches_reference(pq.read_table(source), output)
    assert output.schema.metadata[b"gaecli.kernel"] == kernel.encode()


@pytest.mark.parametrize("mask_name", list(MASK_TYPES))
def test_every_mask_type(tmp_path, rollouts, mask_name):
    table = rollout_table(rollouts, mask_type=MASK_TYPES[mask_name])
    source = write_table(table, tmp_path / "in.parquet", row_group_size=20)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 8))
    output = pq.read_table(target)
    assert output.schema.field("loss_mask").type == pa.list_(MASK_TYPES[mask_name])
    assert output.column("loss_mask").equals(pq.read_table(source).column("loss_mask"))
    assert_matches_reference(table, output)


def test_float64_inputs_give_float64_outputs(tmp_path, rollouts):
    table = rollout_table(rollouts, float_type=pa.float64())
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 7, gamma=1.0, lambd=0.95))
    output = pq.read_table(target)
    assert output.schema.field("advantages").type == pa.list_(pa.float64())
    assert output.schema.field("returns").type == pa.list_(pa.float64())
    assert_matches_reference(table, output, gamma=1.0, lambd=0.95, tolerance=TOLERANCE["double"])


@pytest.mark.parametrize("float_type", [pa.float32(), pa.float64()], ids=["float32", "float64"])
def test_large_list_columns_give_large_list_outputs(tmp_path, rollouts, float_type):
    table = rollout_table(rollouts, float_type=float_type, mask_type=pa.bool_(), large=True)
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 9))
    output = pq.read_table(target)
    for name in ("advantages", "returns"):
        assert output.schema.field(name).type == pa.large_list(float_type)
    for name in ("values", "rewards", "loss_mask"):
        assert output.column(name).equals(pq.read_table(source).column(name))
    assert_matches_reference(table, output)


def test_renamed_columns(tmp_path, rollouts):
    names = {"values": "critic", "rewards": "kl_rewards", "loss_mask": "mask", "terminal_reward": "score"}
    table = rollout_table(rollouts, names=names)
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(
        recompute(
            [source],
            target,
            "--values-col",
            "critic",
            "--rewards-col",
            "kl_rewards",
            "--mask-col",
            "mask",
            "--terminal-col",
            "score",
            "--advantages-col",
            "adv",
            "--returns-col",
            "ret",
            "--batch-rows",
            11,
        )
    )
    output = pq.read_table(target)
    assert output.column_names == ["critic", "kl_rewards", "mask", "score", "adv", "ret"]
    assert_matches_reference(
        table,
        output,
        values="critic",
        rewards="kl_rewards",
        loss_mask="mask",
        terminal_reward="score",
        advantages="adv",
        returns="ret",
    )
    mapping = json.loads(output.schema.metadata[b"gaecli.columns"])
    assert mapping["values"] == "critic" and mapping["rewards"] == "kl_rewards"
    assert mapping["loss_mask"] == "mask" and mapping["terminal_reward"] == "score"
    assert mapping["advantages"] == "adv" and mapping["returns"] == "ret"


@pytest.mark.parametrize("role", ["values", "rewards"])
@pytest.mark.parametrize("column_in_file", [False, True], ids=["absent", "present-ignored"])
def test_column_none_is_taken_as_zero(tmp_path, rollouts, role, column_in_file):
    table = rollout_table(rollouts, float_type=pa.float64(), names={} if column_in_file else {role: None})
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, f"--{role}-col", "none", "--batch-rows", 16))
    output = pq.read_table(target)
    assert output.schema.field("advantages").type == pa.list_(pa.float64())  # the other column's type
    assert_matches_reference(table, output, tolerance=TOLERANCE["double"], **{role: None})
    if column_in_file:
        assert output.column(role).equals(table.column(role))
    if role == "values":
        assert output.column("returns").equals(output.column("advantages"))  # returns = A + 0
    assert json.loads(output.schema.metadata[b"gaecli.columns"])[role] is None


def test_rewards_column_absent_stops_and_says_so(tmp_path, rollouts):
    source = write_table(rollout_table(rollouts, names={"rewards": None}), tmp_path / "in.parquet")
    out_dir = tmp_path / "out"
    result = recompute([source], out_dir / "out.parquet")
    assert result.exit_code == 1
    assert str(source) in result.stderr and "'rewards'" in result.stderr and "missing" in result.stderr
    assert_nothing_written(out_dir)


def test_passthrough_columns_and_metadata(tmp_path, rollouts):
    rows = len(rollouts)
    first = {
        "id": pa.array(range(1000, 1000 + rows), pa.int64()),
        "prompt": pa.array([f"prompt {i} ✓" if i % 7 else None for i in range(rows)], pa.string()),
    }
    last = {
        "meta": pa.array(
            [
                {"turns": i % 4, "tools": ["search", "python"][: i % 3], "env": {"name": "sandbox", "seed": i}}
                for i in range(rows)
            ],
            pa.struct(
                [
                    ("turns", pa.int32()),
                    ("tools", pa.list_(pa.string())),
                    ("env", pa.struct([("name", pa.string()), ("seed", pa.int64())])),
                ]
            ),
        ),
        "task": pa.array(["math", "code", "web"] * (rows // 3) + ["math"] * (rows % 3)).dictionary_encode(),
    }
    table = rollout_table(rollouts, extra_first=first, extra=last, metadata={b"run": b"ppo-7", b"step": b"1200"})
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 6))
    stored = pq.read_table(source)
    output = pq.read_table(target)
    assert output.column_names == [*table.column_names, "advantages", "returns"]
    for name in stored.column_names:
        assert output.schema.field(name) == stored.schema.field(name), name
        assert output.column(name).equals(stored.column(name)), name
    metadata = output.schema.metadata
    assert metadata[b"run"] == b"ppo-7" and metadata[b"step"] == b"1200"
    assert metadata[b"gaecli.version"].decode() == gaecli.__version__
    assert float(metadata[b"gaecli.gamma"]) == GAMMA and float(metadata[b"gaecli.lambd"]) == LAMBD
    assert metadata[b"gaecli.kernel"].decode() == gaecli.resolve_kernel("auto", "cpu") != "auto"
    assert metadata[b"gaecli.normalize"] == b"none"
    assert metadata[b"gaecli.source"] == b"in.parquet"
    mapping = json.loads(metadata[b"gaecli.columns"])
    assert {
        key: mapping[key] for key in ("values", "rewards", "loss_mask", "terminal_reward", "advantages", "returns")
    } == {
        "values": "values",
        "rewards": "rewards",
        "loss_mask": "loss_mask",
        "terminal_reward": "terminal_reward",
        "advantages": "advantages",
        "returns": "returns",
    }
    assert_matches_reference(table, output)


def test_response_length_column_that_agrees_passes(tmp_path, rollouts):
    lengths = pa.array([len(mask) for mask in rollouts.masks], pa.int32())
    table = rollout_table(rollouts, extra={"response_length": lengths})
    source = write_table(table, tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 10))
    output = pq.read_table(target)
    assert output.column("response_length").to_pylist() == lengths.to_pylist()
    assert_matches_reference(table, output)


def test_mixed_list_and_number_types(tmp_path, rollouts):
    """values list<float32>, rewards large_list<float64>, a bool mask, an int terminal
    reward: outputs in the values' type on the mask's list type."""
    table = pa.table(
        {
            "values": pa.array(rollouts.values, pa.list_(pa.float32())),
            "rewards": pa.array(rollouts.rewards, pa.large_list(pa.float64())),
            "loss_mask": pa.array([[bool(m) for m in mask] for mask in rollouts.masks], pa.list_(pa.bool_())),
            "terminal_reward": pa.array([int(z) for z in rollouts.terminal], pa.int32()),
        }
    )
    source = write_table(table, tmp_path / "in.parquet", row_group_size=10)
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--batch-rows", 6))
    output = pq.read_table(target)
    assert output.schema.field("advantages").type == pa.list_(pa.float32())
    assert_matches_reference(table, output)


def test_file_without_rows(tmp_path, rollouts):
    table = rollout_table(rollouts).slice(0, 0)
    source = write_table(table, tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    result = recompute([source], target, "--json", "-")
    assert_ok(result)
    output = pq.read_table(target)
    assert output.num_rows == 0 and output.column_names == [*table.column_names, "advantages", "returns"]
    summary = json.loads(result.stdout)["summary"]
    assert summary["samples"] == 0 and summary["tokens"] == 0 and summary["mean_terminal_credit"] is None


# ----------------------------------------------------------------------------- layout


def _write_tree(root: Path) -> dict[str, pa.Table]:
    tables = {}
    for seed, relative in enumerate(["a.parquet", "sub/b.parquet", "sub/deeper/c.parquet"]):
        tables[relative] = rollout_table(random_rollouts(12 + seed, seed=10 + seed))
        write_table(tables[relative], root / relative, row_group_size=5)
    (root / "notes.txt").write_text("not a rollout file")
    return tables


def test_directory_input_is_mirrored(tmp_path):
    tables = _write_tree(tmp_path / "in")
    out_dir = tmp_path / "out"
    assert_ok(recompute([tmp_path / "in"], out_dir, "--batch-rows", 4))
    assert files_under(out_dir) == sorted(tables)
    for relative, table in tables.items():
        output = pq.read_table(out_dir / relative)
        assert_matches_reference(table, output)
        assert output.schema.metadata[b"gaecli.source"] == Path(relative).name.encode()


def test_glob_input_is_mirrored_from_its_fixed_part(tmp_path):
    tables = _write_tree(tmp_path / "in")
    out_dir = tmp_path / "out"
    assert_ok(recompute([tmp_path / "in" / "sub" / "**" / "*.parquet"], out_dir))
    assert files_under(out_dir) == ["b.parquet", "deeper/c.parquet"]
    assert_matches_reference(tables["sub/deeper/c.parquet"], pq.read_table(out_dir / "deeper" / "c.parquet"))


def test_several_paths_go_into_a_directory(tmp_path):
    tables = _write_tree(tmp_path / "in")
    out_dir = tmp_path / "out"
    assert_ok(recompute([tmp_path / "in" / "a.parquet", tmp_path / "in" / "sub" / "b.parquet"], out_dir))
    assert files_under(out_dir) == ["a.parquet", "b.parquet"]
    assert_matches_reference(tables["sub/b.parquet"], pq.read_table(out_dir / "b.parquet"))


def test_single_file_gives_a_file(tmp_path, source):
    target = tmp_path / "results" / "fixed.parquet"
    assert_ok(recompute([source], target))
    assert files_under(tmp_path / "results") == ["fixed.parquet"]
    existing_dir = tmp_path / "into"
    existing_dir.mkdir()
    assert_ok(recompute([source], existing_dir))
    assert files_under(existing_dir) == ["rollouts.parquet"]


def test_several_inputs_refuse_a_file_as_output(tmp_path):
    _write_tree(tmp_path / "in")
    target = tmp_path / "out.parquet"
    target.write_bytes(b"x")
    result = recompute([tmp_path / "in"], target)
    assert result.exit_code == 2 and "directory" in result.stderr


# ----------------------------------------------------------------------------- normalize


def _two_files(tmp_path) -> tuple[list[Path], list[pa.Table]]:
    tables = []
    for seed, rows in ((3, 31), (4, 22)):
        data = random_rollouts(rows, seed=seed)
        rollout_ids = pa.array([f"step-{(i * 7 + seed) % 3}" for i in range(rows)])
        tables.append(rollout_table(data, float_type=pa.float64(), extra={"rollout_id": rollout_ids}))
    paths = [
        write_table(table, tmp_path / "in" / f"part{i}.parquet", row_group_size=8) for i, table in enumerate(tables)
    ]
    return paths, tables


def test_normalize_whitens_over_all_inputs(tmp_path):
    paths, tables = _two_files(tmp_path)
    out_dir = tmp_path / "out"
    assert_ok(recompute(paths, out_dir, "--normalize", "--batch-rows", 5))
    data = [rollouts_from_table(table) for table in tables]
    references = [reference_outputs(d, GAMMA, LAMBD) for d in data]
    all_advantages = references[0][0] + references[1][0]
    whitened = whiten_numpy(all_advantages, data[0].masks + data[1].masks)
    expected = [whitened[: len(data[0])], whitened[len(data[0]) :]]
    for index, path in enumerate(paths):
        output = pq.read_table(out_dir / path.name)
        assert output.schema.metadata[b"gaecli.normalize"] == b"all"
        got = output.column("advantages").to_pylist()
        assert_rows_close("whitened advantages", expected[index], got, 1e-9)
        # returns are not whitened: unwhitened advantages + values
        assert_rows_close("returns", references[index][1], output.column("returns").to_pylist(), 1e-12)
        for row, mask in enumerate(data[index].masks):
            assert all(a == 0.0 for a, m in zip(got[row], mask) if not m)
    trainable = np.concatenate(
        [np.asarray(a)[np.asarray(m, bool)] for e, d in zip(expected, data) for a, m in zip(e, d.masks) if m]
    )
    assert abs(trainable.mean()) < 1e-12 and abs(trainable.std(ddof=1) - 1.0) < 1e-6


def test_normalize_by_whitens_within_groups_across_files(tmp_path):
    paths, tables = _two_files(tmp_path)
    out_dir = tmp_path / "out"
    assert_ok(recompute(paths, out_dir, "--normalize-by", "rollout_id", "--batch-rows", 4))
    data = [rollouts_from_table(table) for table in tables]
    references = [reference_outputs(d, GAMMA, LAMBD)[0] for d in data]
    keys = [table.column("rollout_id").to_pylist() for table in tables]
    expected = [[None] * len(d) for d in data]
    for group in sorted(set(keys[0] + keys[1])):
        members = [(f, r) for f in range(2) for r in range(len(data[f])) if keys[f][r] == group]
        whitened = whiten_numpy([references[f][r] for f, r in members], [data[f].masks[r] for f, r in members])
        for (f, r), advantages in zip(members, whitened):
            expected[f][r] = advantages
    for index, path in enumerate(paths):
        output = pq.read_table(out_dir / path.name)
        assert output.schema.metadata[b"gaecli.normalize"] == b"by:rollout_id"
        assert_rows_close("group-whitened advantages", expected[index], output.column("advantages").to_pylist(), 1e-9)
        assert output.column("rollout_id").equals(tables[index].column("rollout_id"))


def test_normalize_by_a_missing_column_is_refused(tmp_path, source):
    result = recompute([source], tmp_path / "out" / "x.parquet", "--normalize-by", "rollout_id")
    assert result.exit_code == 2 and "rollout_id" in result.stderr
    assert_nothing_written(tmp_path / "out")


def test_normalize_by_a_nested_column_is_refused(tmp_path, rollouts):
    groups = pa.array([{"step": i % 2} for i in range(len(rollouts))])
    source = write_table(rollout_table(rollouts, extra={"group": groups}), tmp_path / "in.parquet")
    result = recompute([source], tmp_path / "out" / "x.parquet", "--normalize-by", "group")
    assert result.exit_code == 2 and "'group'" in result.stderr
    assert_nothing_written(tmp_path / "out")


def test_normalize_by_float_keys_with_nan_and_null(tmp_path):
    data = random_rollouts(30, seed=12)
    keys = [[0.5, math.nan, None][i % 3] for i in range(30)]
    table = rollout_table(data, float_type=pa.float64(), extra={"score_bin": pa.array(keys, pa.float64())})
    source = write_table(table, tmp_path / "in.parquet")
    assert_ok(recompute([source], tmp_path / "out.parquet", "--normalize-by", "score_bin", "--batch-rows", 7))
    data = rollouts_from_table(table)
    advantages = reference_outputs(data, GAMMA, LAMBD)[0]
    expected = [None] * 30
    for residue in range(3):
        members = list(range(residue, 30, 3))
        for row, whitened in zip(
            members, whiten_numpy([advantages[r] for r in members], [data.masks[r] for r in members])
        ):
            expected[row] = whitened
    got = pq.read_table(tmp_path / "out.parquet").column("advantages").to_pylist()
    assert_rows_close("advantages whitened per key (NaN and null are keys)", expected, got, 1e-9)


# ----------------------------------------------------------------------------- baseline and existing columns


def test_keep_baseline_writes_the_unmasked_gae(tmp_path, source):
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--keep-baseline", "--batch-rows", 9))
    output = pq.read_table(target)
    assert output.column_names[-4:] == ["advantages", "returns", "advantages_unmasked", "returns_unmasked"]
    data = rollouts_from_table(pq.read_table(source))
    as_tensors = lambda rows: [torch.tensor(row, dtype=torch.float64) for row in rows]  # noqa: E731
    expected_advantages, expected_returns = gaecli.unmasked_gae(
        as_tensors(data.values),
        as_tensors(data.rewards),
        as_tensors(data.masks),
        data.terminal,
        gamma=GAMMA,
        lambd=LAMBD,
        kernel="reference",
    )
    got = output.column("advantages_unmasked").to_pylist()
    assert_rows_close("advantages_unmasked", [t.numpy() for t in expected_advantages], got, TOLERANCE["float"])
    assert_rows_close(
        "returns_unmasked",
        [t.numpy() for t in expected_returns],
        output.column("returns_unmasked").to_pylist(),
        TOLERANCE["float"],
    )
    # and, independently, the old GAE as a plain loop on one sample with a masked tail
    row = next(i for i, m in enumerate(data.masks) if m and m[-1] == 0 and any(m))
    loop = unmasked_advantages(data.values[row], data.rewards[row], data.terminal[row], GAMMA, LAMBD)
    assert_rows_close("unmasked loop", [np.array(loop)], [got[row]], TOLERANCE["float"])
    assert_matches_reference(pq.read_table(source), output)


def test_existing_output_column_needs_replace(tmp_path, rollouts):
    stale = pa.array([[7.0] * len(mask) for mask in rollouts.masks], pa.list_(pa.float64()))
    table = rollout_table(rollouts, extra_first={"advantages": stale}, extra={"id": pa.array(range(len(rollouts)))})
    source = write_table(table, tmp_path / "in.parquet")
    out_dir = tmp_path / "out"
    result = recompute([source], out_dir / "out.parquet")
    assert result.exit_code == 2
    assert "'advantages'" in result.stderr and "--replace" in result.stderr
    assert_nothing_written(out_dir)

    assert_ok(recompute([source], out_dir / "out.parquet", "--replace"))
    output = pq.read_table(out_dir / "out.parquet")
    assert output.column_names == ["advantages", *table.column_names[1:], "returns"]  # replaced in place
    assert output.schema.field("advantages").type == pa.list_(pa.float32())  # the values' type
    assert_matches_reference(table, output)


def test_output_column_equal_to_an_input_column_is_refused(tmp_path, source):
    result = recompute([source], tmp_path / "out" / "x.parquet", "--advantages-col", "values", "--replace")
    assert result.exit_code == 2 and "'values'" in result.stderr
    assert_nothing_written(tmp_path / "out")


# ----------------------------------------------------------------------------- bad input


def _nan_value(data):
    data.values[6][1] = math.nan
    return rollout_table(data)


def _inf_reward(data):
    data.rewards[6][0] = math.inf
    return rollout_table(data)


def _length_mismatch(data):
    data.values[6] = data.values[6][:-1]
    return rollout_table(data)


def _response_length_mismatch(data):
    lengths = [len(mask) for mask in data.masks]
    lengths[6] += 1
    return rollout_table(data, extra={"response_length": pa.array(lengths, pa.int64())})


def _mask_two(data):
    data.masks[6][0] = 2
    return rollout_table(data)


def _mask_half(data):
    data.masks[6][0] = 0.5
    return rollout_table(data, mask_type=pa.float32())


def _null_list(data):
    table = rollout_table(data)
    values = table.column("values").to_pylist()
    values[6] = None
    return table.set_column(table.column_names.index("values"), "values", pa.array(values, pa.list_(pa.float32())))


def _null_in_list(data):
    table = rollout_table(data)
    rewards = table.column("rewards").to_pylist()
    rewards[6][0] = None
    return table.set_column(table.column_names.index("rewards"), "rewards", pa.array(rewards, pa.list_(pa.float32())))


def _null_in_bool_mask(data):
    table = rollout_table(data, mask_type=pa.bool_())
    masks = table.column("loss_mask").to_pylist()
    masks[6][0] = None
    return table.set_column(table.column_names.index("loss_mask"), "loss_mask", pa.array(masks, pa.list_(pa.bool_())))


def _null_terminal(data):
    table = rollout_table(data)
    terminal = table.column("terminal_reward").to_pylist()
    terminal[6] = None
    return table.set_column(
        table.column_names.index("terminal_reward"), "terminal_reward", pa.array(terminal, pa.float64())
    )


def _inf_terminal(data):
    data.terminal[6] = -math.inf
    return rollout_table(data)


def _replace(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, array)


def _values_strings(data):
    table = rollout_table(data)
    return _replace(table, "values", pa.array([[str(v) for v in row] for row in data.values], pa.list_(pa.string())))


def _values_ints(data):
    table = rollout_table(data)
    return _replace(table, "values", pa.array([[int(v) for v in row] for row in data.values], pa.list_(pa.int64())))


def _terminal_string(data):
    return _replace(rollout_table(data), "terminal_reward", pa.array([str(x) for x in data.terminal]))


def _mask_strings(data):
    return _replace(rollout_table(data), "loss_mask", pa.array([[str(m) for m in row] for row in data.masks]))


def _mask_missing(data):
    return rollout_table(data, names={"loss_mask": None})


def _terminal_missing(data):
    return rollout_table(data, names={"terminal_reward": None})


# (table maker, column named, row named (None: a file-level fault), words in the message)
BAD_INPUTS = {
    "length-mismatch": (_length_mismatch, "values", 6, "length-mismatch"),
    "response-length-mismatch": (_response_length_mismatch, "response_length", 6, "response-length-mismatch"),
    "mask-value-2": (_mask_two, "loss_mask", 6, "value 2 at token 0"),
    "mask-value-0.5": (_mask_half, "loss_mask", 6, "value 0.5 at token 0"),
    "nan-in-values": (_nan_value, "values", 6, "nan"),
    "inf-in-rewards": (_inf_reward, "rewards", 6, "inf"),
    "inf-terminal": (_inf_terminal, "terminal_reward", 6, "-inf"),
    "null-list": (_null_list, "values", 6, "null"),
    "null-in-list": (_null_in_list, "rewards", 6, "null"),
    "null-in-bool-mask": (_null_in_bool_mask, "loss_mask", 6, "null"),
    "null-terminal": (_null_terminal, "terminal_reward", 6, "null"),
    "values-list-of-string": (_values_strings, "values", None, "wrong-type"),
    "values-list-of-int": (_values_ints, "values", None, "wrong-type"),
    "mask-list-of-string": (_mask_strings, "loss_mask", None, "wrong-type"),
    "terminal-string": (_terminal_string, "terminal_reward", None, "wrong-type"),
    "mask-missing": (_mask_missing, "loss_mask", None, "missing"),
    "terminal-missing": (_terminal_missing, "terminal_reward", None, "missing"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_stops_with_file_row_and_column(tmp_path, case):
    make_table, column, row, words = BAD_INPUTS[case]
    source = write_table(make_table(random_rollouts(10, seed=5)), tmp_path / "in" / "bad.parquet", row_group_size=3)
    before = sha256(source)
    out_dir = tmp_path / "out"
    result = recompute([source], out_dir / "bad.parquet", "--batch-rows", 4)  # row 6 is in the 2nd batch
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert str(source) in message and f"column {column!r}" in message and words in message
    if row is not None:
        assert f"row {row}," in message
    else:
        assert "row " not in message
    assert_nothing_written(out_dir)
    assert sha256(source) == before


@pytest.mark.parametrize("case", ["not-parquet", "truncated", "empty-file"])
def test_unreadable_file_exits_2(tmp_path, source, case):
    bad = tmp_path / "bad.parquet"
    if case == "not-parquet":
        bad.write_text("id,values\n1,2\n" * 20)
    elif case == "truncated":
        bad.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    else:
        bad.write_bytes(b"")
    result = recompute([bad], tmp_path / "out" / "x.parquet")
    assert result.exit_code == 2
    assert str(bad) in result.stderr and "cannot read as Parquet" in result.stderr
    assert_nothing_written(tmp_path / "out")


def test_missing_input_exits_2(tmp_path):
    result = recompute([tmp_path / "nothere.parquet"], tmp_path / "x.parquet")
    assert result.exit_code == 2 and "nothere.parquet" in result.stderr


def test_existing_output_needs_overwrite(tmp_path, source):
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target))
    before = sha256(target)
    result = recompute([source], target, gamma=1.0)
    assert result.exit_code == 2 and str(target) in result.stderr and "--overwrite" in result.stderr
    assert sha256(target) == before
    assert_ok(recompute([source], target, "--overwrite", gamma=1.0))
    output = pq.read_table(target)
    assert float(output.schema.metadata[b"gaecli.gamma"]) == 1.0
    assert_matches_reference(pq.read_table(source), output, gamma=1.0)
    assert files_under(tmp_path) == sorted(["out.parquet", "in/rollouts.parquet"])


def test_output_equal_to_input_is_refused(tmp_path, source):
    before = sha256(source)
    for output, extra in ((source, ()), (source, ("--overwrite",)), (source.parent, ("--overwrite",))):
        result = recompute([source.parent if output == source.parent else source], output, *extra)
        assert result.exit_code == 2 and "replace an input" in result.stderr
    assert sha256(source) == before
    assert files_under(source.parent) == ["rollouts.parquet"]


@pytest.mark.parametrize("workers", [1, 2])
def test_invalid_row_in_second_file_writes_only_the_first(tmp_path, workers):
    """Each output appears whole once its file is done: a failing file does not take the
    others with it; the run exits 1 and names what was written and what was not."""
    good = write_table(rollout_table(random_rollouts(10, seed=6)), tmp_path / "in" / "a.parquet")
    bad = write_table(_nan_value(random_rollouts(10, seed=7)), tmp_path / "in" / "b.parquet")
    hashes = {path: sha256(path) for path in (good, bad)}
    out_dir = tmp_path / "out"
    result = recompute([tmp_path / "in"], out_dir, "--batch-rows", 4, "--workers", workers)
    assert result.exit_code == 1
    assert str(bad) in result.stderr and "row 6," in result.stderr and "'values'" in result.stderr
    assert f"written: {out_dir / 'a.parquet'}" in result.stderr
    assert f"not written: {out_dir / 'b.parquet'}" in result.stderr
    assert files_under(out_dir) == ["a.parquet"]
    assert_matches_reference(pq.read_table(good), pq.read_table(out_dir / "a.parquet"))
    assert {path: sha256(path) for path in hashes} == hashes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_matches_reference(tmp_path, source):
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target, "--device", "cuda", "--batch-rows", 7))
    output = pq.read_table(target)
    assert output.schema.metadata[b"gaecli.kernel"].decode() == gaecli.resolve_kernel("auto", "cuda")
    assert_matches_reference(pq.read_table(source), output)


def test_unknown_kernel_and_device_exit_2(tmp_path, source):
    result = recompute([source], tmp_path / "out.parquet", "--kernel", "fastest")
    assert result.exit_code == 2 and "fastest" in result.stderr
    result = recompute([source], tmp_path / "out.parquet", "--device", "gpu0")
    assert result.exit_code == 2 and "gpu0" in result.stderr
    if not torch.cuda.is_available():
        result = recompute([source], tmp_path / "out.parquet", "--device", "cuda")
        assert result.exit_code == 2 and "cuda" in result.stderr
    result = recompute([source], tmp_path / "out.parquet", "--on-invalid", "ignore")
    assert result.exit_code == 2
    assert not (tmp_path / "out.parquet").exists()


def test_gamma_and_lambd_are_required_and_bounded(tmp_path, source):
    result = gae("recompute", source, "-o", tmp_path / "out.parquet", "--lambd", 0.9)
    assert result.exit_code == 2 and "--gamma" in result.output
    result = recompute([source], tmp_path / "out.parquet", gamma=1.5)
    assert result.exit_code == 2
    assert not (tmp_path / "out.parquet").exists()


# ----------------------------------------------------------------------------- skip


def test_on_invalid_skip_writes_valid_rows_and_rejects(tmp_path):
    data = random_rollouts(10, seed=8)
    data.values[2][0] = math.nan
    data.masks[6][0] = 2
    ids = pa.array([f"sample-{i}" for i in range(10)])
    table = rollout_table(data, extra_first={"id": ids})
    source = write_table(table, tmp_path / "in" / "roll.parquet", row_group_size=3)
    out_dir = tmp_path / "out"
    result = recompute(
        [source], out_dir / "roll.parquet", "--on-invalid", "skip", "--batch-rows", 4, "--json", "-", quiet=False
    )
    assert_ok(result)
    assert files_under(out_dir) == ["roll.parquet", "roll.rejected.parquet"]
    assert "2 invalid rows rejected" in result.stderr

    valid_rows = [i for i in range(10) if i not in (2, 6)]
    output = pq.read_table(out_dir / "roll.parquet")
    assert output.column("id").to_pylist() == [f"sample-{i}" for i in valid_rows]
    assert_matches_reference(table.take(valid_rows), output)

    rejects = pq.read_table(out_dir / "roll.rejected.parquet")
    assert rejects.column_names == [*table.column_names, "reason"]
    stored = pq.read_table(source)
    for name in table.column_names:
        # repr, so that the NaN that made row 2 invalid compares equal to itself
        assert repr(rejects.column(name).to_pylist()) == repr(stored.take([2, 6]).column(name).to_pylist()), name
    reasons = rejects.column("reason").to_pylist()
    assert "values" in reasons[0] and "non-finite" in reasons[0]
    assert "loss_mask" in reasons[1] and "mask-value" in reasons[1]

    report = json.loads(result.stdout)
    assert report["rejected_rows"] == 2 and report["rows"] == 8
    assert report["files"][0]["rejects_file"] == str(out_dir / "roll.rejected.parquet")
    assert report["summary"]["samples"] == 8


def test_existing_rejects_file_needs_overwrite(tmp_path, source):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "x.rejected.parquet").write_bytes(b"old rejects")
    result = recompute([source], out_dir / "x.parquet", "--on-invalid", "skip")
    assert result.exit_code == 2 and "x.rejected.parquet" in result.stderr and "--overwrite" in result.stderr
    assert files_under(out_dir) == ["x.rejected.parquet"]


def test_on_invalid_skip_without_invalid_rows_writes_no_rejects(tmp_path, source):
    assert_ok(recompute([source], tmp_path / "out" / "x.parquet", "--on-invalid", "skip"))
    assert files_under(tmp_path / "out") == ["x.parquet"]


# ----------------------------------------------------------------------------- interruption


def test_interrupted_write_leaves_no_partial_output(tmp_path, monkeypatch):
    """Ctrl-C in the second file: the first output, finished, stays whole; the second
    leaves nothing (no output, no temp file)."""
    paths = [write_table(rollout_table(random_rollouts(20, seed=s)), tmp_path / "in" / f"p{s}.parquet") for s in (1, 2)]
    hashes = {path: sha256(path) for path in paths}
    compute_packed = gaecli.pipeline.batches.compute_packed
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:  # the old side's, one per batch of 4 rows (the new side's runs on the kernel's screen),
            # 5 batches a file: the 2nd file's 2nd batch
            temp_files = [name for name in files_under(out_dir) if ".gaecli-" in name]
            assert len(temp_files) == 1 and temp_files[0].startswith(".p2.parquet.gaecli-"), temp_files
            raise KeyboardInterrupt
        return compute_packed(*args, **kwargs)

    out_dir = tmp_path / "out"
    monkeypatch.setattr(gaecli.pipeline.batches, "compute_packed", interrupted)
    result = recompute([tmp_path / "in"], out_dir, "--batch-rows", 4, "--workers", 1)
    assert result.exit_code == 130
    assert "interrupted" in result.stderr
    assert len(calls) == 7
    assert files_under(out_dir) == ["p1.parquet"]
    assert_matches_reference(pq.read_table(paths[0]), pq.read_table(out_dir / "p1.parquet"))
    assert {path: sha256(path) for path in paths} == hashes


def test_interrupted_overwrite_keeps_the_old_output(tmp_path, source, monkeypatch):
    target = tmp_path / "out.parquet"
    assert_ok(recompute([source], target))
    before = sha256(target)
    compute_packed = gaecli.pipeline.batches.compute_packed
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return compute_packed(*args, **kwargs)

    monkeypatch.setattr(gaecli.pipeline.batches, "compute_packed", interrupted)
    result = recompute([source], target, "--overwrite", "--batch-rows", 10, gamma=1.0)
    assert result.exit_code == 130
    assert sha256(target) == before
    assert files_under(tmp_path) == ["in/rollouts.parquet", "out.parquet"]


def test_sigterm_leaves_nothing(tmp_path):
    """A real process killed (SIGTERM) in the middle of its writes: exit 130, nothing left."""
    source = write_table(rollout_table(random_rollouts(20, seed=3)), tmp_path / "in" / "x.parquet")
    before = sha256(source)
    out_dir = tmp_path / "out"
    script = (
        "import os, signal, sys\n"
        "import gaecli.pipeline.batches as r\n"
        "original, calls = r.compute_packed, []\n"
        "def killed(*a, **k):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return original(*a, **k)\n"
        "r.compute_packed = killed\n"
        "from gaecli.cli import main\n"
        f"sys.argv = ['gae', 'recompute', {str(source)!r}, '-o', {str(out_dir / 'x.parquet')!r},\n"
        "            '--gamma', '1', '--lambd', '1', '--batch-rows', '4', '--quiet']\n"
        "main()\n"
    )
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert process.returncode == 130, process.stderr
    assert "Traceback" not in process.stderr and "interrupted" in process.stderr
    assert_nothing_written(out_dir)
    assert sha256(source) == before


# ----------------------------------------------------------------------------- summary


def _hand_made(tmp_path) -> tuple[Path, Rollouts]:
    data = Rollouts(
        values=[[0.1, 0.2, 0.3, 0.4], [0.5, 0.5], [1.0], [0.2, 0.3, 0.1], []],
        rewards=[[0.0, 0.0, 0.0, 0.0], [0.1, 0.1], [0.0], [0.0, 0.5, 0.0], []],
        masks=[[1, 1, 0, 0], [1, 1], [0], [1, 0, 1], []],
        terminal=[1.0, 0.0, 1.0, 2.0, 3.0],
    )
    return write_table(rollout_table(data, float_type=pa.float64()), tmp_path / "tiny.parquet"), data


def test_json_summary_on_a_hand_made_file(tmp_path):
    source, data = _hand_made(tmp_path)
    result = recompute([source], tmp_path / "out.parquet", "--json", "-", gamma=1.0, lambd=0.5)
    assert_ok(result)
    report = json.loads(result.stdout)
    assert report["version"] == gaecli.__version__
    assert report["gamma"] == 1.0 and report["lambd"] == 0.5 and report["normalize"] == "none"
    assert report["kernel"] == gaecli.resolve_kernel("auto", "cpu")
    assert report["rows"] == 5 and report["rejected_rows"] == 0
    assert report["files"] == [
        {
            "file": str(source),
            "output": str(tmp_path / "out.parquet"),
            "rows": 5,
            "tokens": 10,
            "rejected_rows": 0,
            "rejects_file": None,
            "skipped": False,
            "recomputed": None,
        }
    ]
    summary = report["summary"]
    assert SUMMARY_KEYS <= set(summary)

    new = [
        masked_advantages(v, r, m, z, 1.0, 0.5)
        for v, r, m, z in zip(data.values, data.rewards, data.masks, data.terminal)
    ]
    old = [unmasked_advantages(v, r, z, 1.0, 0.5) for v, r, z in zip(data.values, data.rewards, data.terminal)]
    deltas = [abs(a - b) for n, o, m in zip(new, old, data.masks) for a, b, t in zip(n, o, m) if t]
    changed = sum(
        any(abs(a - b) / (1 + abs(a)) > 1e-6 for a, b, t in zip(n, o, m) if t) for n, o, m in zip(new, old, data.masks)
    )
    assert summary["samples"] == 5 and summary["tokens"] == 10 and summary["trainable_tokens"] == 6
    assert summary["changed_samples"] == changed == 2  # the masked tail and the masked gap
    assert summary["fully_masked_samples"] == 1 and summary["empty_samples"] == 1
    assert summary["masked_tail_samples"] == 1
    assert summary["mean_masked_tail_length"] == 2.0 and summary["longest_masked_tail"] == 2
    assert summary["mean_terminal_credit"] == pytest.approx(0.25, abs=1e-15)  # (γλ)^2 over the 2-token tail
    assert summary["min_terminal_credit"] == pytest.approx(0.25, abs=1e-15)
    assert summary["mean_abs_delta_advantage"] == pytest.approx(sum(deltas) / len(deltas), abs=1e-12)
    assert summary["max_abs_delta_advantage"] == pytest.approx(max(deltas), abs=1e-12)
    assert summary["baseline"] == "unmasked" and summary["tolerance"] == 1e-6


def test_json_to_a_file_and_the_human_summary(tmp_path):
    source, _ = _hand_made(tmp_path)
    report_path = tmp_path / "report.json"
    result = recompute([source], tmp_path / "out.parquet", "--json", report_path, gamma=1.0, lambd=0.5, quiet=False)
    assert_ok(result)
    assert result.stdout == ""
    summary = json.loads(report_path.read_text())["summary"]
    assert summary["masked_tail_samples"] == 1 and summary["mean_terminal_credit"] == pytest.approx(0.25)
    assert "gae recompute" in result.stderr and "masked tail" in result.stderr and "0.25" in result.stderr


def test_quiet_prints_nothing(tmp_path, source):
    result = recompute([source], tmp_path / "out.parquet", quiet=True)
    assert_ok(result)
    assert result.output == ""


def test_summary_with_whole_inputs_normalized(tmp_path):
    source, data = _hand_made(tmp_path)
    result = recompute([source], tmp_path / "out.parquet", "--normalize", "--json", "-", gamma=1.0, lambd=0.5)
    assert_ok(result)
    assert json.loads(result.stdout)["normalize"] == "all"
    new = [
        masked_advantages(v, r, m, z, 1.0, 0.5)
        for v, r, m, z in zip(data.values, data.rewards, data.masks, data.terminal)
    ]
    expected = whiten_numpy([np.array(a) for a in new], data.masks)
    assert_rows_close(
        "whitened", expected, pq.read_table(tmp_path / "out.parquet").column("advantages").to_pylist(), 1e-12
    )


# ----------------------------------------------------------------------------- library


def test_library_functions(tmp_path, source):
    options = RecomputeOptions(gamma=GAMMA, lambd=LAMBD, batch_rows=5)
    report = recompute_file(source, tmp_path / "one.parquet", options)
    assert report.kernel == gaecli.resolve_kernel("auto", "cpu")
    assert report.to_dict()["rows"] == 53 and report.summary["samples"] == 53
    assert_matches_reference(pq.read_table(source), pq.read_table(tmp_path / "one.parquet"))

    zero_values = RecomputeOptions(gamma=GAMMA, lambd=LAMBD, columns=Columns(values=None))
    recompute_files([source.parent], tmp_path / "dir", zero_values)
    assert_matches_reference(pq.read_table(source), pq.read_table(tmp_path / "dir" / source.name), values=None)

    bad = write_table(_mask_two(random_rollouts(10, seed=5)), tmp_path / "bad.parquet")
    with pytest.raises(InvalidDataError) as raised:
        recompute_file(bad, tmp_path / "bad_out.parquet", options)
    assert raised.value.finding.row == 6 and raised.value.finding.column == "loss_mask"
    assert not (tmp_path / "bad_out.parquet").exists()


# ----------------------------------------------------------------------------- entry points


def test_python_dash_m_help_and_version():
    process = subprocess.run([sys.executable, "-m", "gaecli", "--help"], capture_output=True, text=True, timeout=60)
    assert process.returncode == 0 and "recompute" in process.stdout
    console_script = Path(sys.executable).parent / "gae"
    if console_script.exists():
        process = subprocess.run([str(console_script), "--version"], capture_output=True, text=True, timeout=60)
        assert process.returncode == 0 and process.stdout.strip() == f"gae {gaecli.__version__}"
    result = gae("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"gae {gaecli.__version__}"


def test_recompute_help_lists_exit_codes():
    result = gae("recompute", "--help")
    assert result.exit_code == 0
    for option in ("--gamma", "--lambd", "--normalize-by", "--on-invalid", "--keep-baseline", "--json"):
        assert option in result.stdout
    assert "Exit codes" in result.stdout


def test_cpu_commands_never_import_torch(tmp_path):
    # Worker processes pay every import once per process: the CPU path (native kernel,
    # every baseline, validate, diff) must run without torch.
    write_table(rollout_table(random_rollouts(12, 41)), tmp_path / "in.parquet")
    script = """
import sys
from gaecli.cli import main
for argv in (
    ["recompute", "in.parquet", "-o", "out.parquet", "--keep-baseline", "--normalize"],
    ["validate", "out.parquet"],
    ["diff", "in.parquet", "--baseline", "skip-masked"],
    ["diff", "in.parquet", "--baseline", "zero-masked"],
):
    discount = [] if argv[0] == "validate" else ["--gamma", "1", "--lambd", "0.95"]
    sys.argv = ["gae", *argv, *discount, "--workers", "1", "--quiet"]
    try:
        main()
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "out.parquet").exists()


# ----------------------------------------------------------------------------- footers


def test_a_multi_file_run_reads_each_footer_once(tmp_path, monkeypatch):
    """Three inputs, --normalize-by (two passes), in this process: three footer reads, and
    the outputs equal those of a run that reads footers as it likes."""
    paths = []
    for index in range(3):
        data = random_rollouts(11, seed=60 + index)
        keys = pa.array([f"g{row % 4}" for row in range(11)])
        paths.append(write_table(rollout_table(data, extra={"prompt": keys}), tmp_path / "in" / f"f{index}.parquet"))
    reads = count_footer_reads(monkeypatch)
    options = RecomputeOptions(gamma=GAMMA, lambd=LAMBD, normalize_by="prompt", batch_rows=4)
    recompute_files(paths, tmp_path / "out", options)
    assert len(reads) == 3, reads
    monkeypatch.undo()
    recompute_files(paths, tmp_path / "again", options)
    for index in range(3):
        assert pq.read_table(tmp_path / "out" / f"f{index}.parquet").equals(
            pq.read_table(tmp_path / "again" / f"f{index}.parquet")
        )


def test_a_schema_mistake_in_the_last_file_stops_the_run_before_any_output(tmp_path):
    paths = [
        write_table(rollout_table(random_rollouts(9, seed=80 + index)), tmp_path / "in" / f"f{index}.parquet")
        for index in range(3)
    ]
    pq.write_table(pq.read_table(paths[2]).drop_columns(["values"]), paths[2])
    result = recompute(paths, tmp_path / "out", "--workers", 1)
    assert result.exit_code == 1 and "f2.parquet" in result.stderr and "'values'" in result.stderr
    assert_nothing_written(tmp_path / "out")
