"""``gae import miles`` end to end: dumps written here with torch.save in the documented
shape (docs/import.md), imported through the CLI, the Parquet output read back and held
against the dumps; every refusal with its exit code and message; and the round trips
import → recompute with KL rewards (against the float64 reference on rewards computed
here in numpy) and import → diff --against trained_advantages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.errors import GAEInputError
from gaecli.importers import ImportReport, import_miles

from rollout_files import (
    Rollouts,
    assert_rows_close,
    files_under,
    gae,
    masked_advantages,
    reference_outputs,
    unmasked_advantages,
)

runner = CliRunner()
MARKER_NAME = "unpickled.marker"


def import_dumps(*inputs, output, options=()):
    return gae("import", "miles", *inputs, "-o", output, "--quiet", *options)


# ----------------------------------------------------------------------------- dumps


def rollout_data(
    seed: int, rows: int, *, float_dtype=torch.float32, mask_dtype=torch.int32, first_index: int = 0
) -> dict:
    """``rows`` samples in miles' rollout_data shape: per-token 1-D tensors, one scalar
    reward per sample, multi-turn masks (some ending masked, one fully masked when rows
    allow), and a ``tokens`` key gaecli does not import."""
    rng = np.random.default_rng(seed)
    lengths = [int(rng.integers(1, 12)) for _ in range(rows)]
    masks = []
    for row, length in enumerate(lengths):
        mask = (rng.random(length) < 0.7).astype(np.int64)
        if row == 2:
            mask[:] = 0
        masks.append(torch.from_numpy(mask).to(mask_dtype))
    tensor = lambda values: torch.from_numpy(np.asarray(values)).to(float_dtype)  # noqa: E731
    return {
        "tokens": [torch.arange(length + 3) for length in lengths],
        "values": [tensor(rng.normal(0.0, 1.0, length)) for length in lengths],
        "log_probs": [tensor(-rng.random(length) * 2.0) for length in lengths],
        "ref_log_probs": [tensor(-rng.random(length) * 2.0) for length in lengths],
        "loss_masks": masks,
        "rewards": [float(rng.choice([0.0, 1.0, -1.0, 0.5])) for _ in range(rows)],
        "response_lengths": list(lengths),
        "total_lengths": [length + 3 for length in lengths],
        "advantages": [tensor(rng.normal(0.0, 1.0, length)) for length in lengths],
        "returns": [tensor(rng.normal(0.0, 1.0, length)) for length in lengths],
        "sample_indices": list(range(first_index, first_index + rows)),
    }


def write_dump(
    path: Path, data: dict, *, rollout_id: int = 0, rank: int = 0, cp_size: int = 1, drop: tuple[str, ...] = (), **extra
) -> Path:
    """A ``--save-debug-train-data`` file: top-level keys (minus ``drop``) around ``data``."""
    dump = {
        "rollout_id": rollout_id,
        "rank": rank,
        "cp_rank": 0,
        "cp_size": cp_size,
        "qkv_format": "thd",
        "rollout_data": data,
        **extra,
    }
    for key in drop:
        dump.pop(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dump, path)
    return path


def without(data: dict, *keys: str) -> dict:
    return {key: value for key, value in data.items() if key not in keys}


def as_lists(tensors) -> list[list[float]]:
    return [[float(x) for x in tensor.double().tolist()] for tensor in tensors]


# ----------------------------------------------------------------------------- one rank


def test_one_rank_columns_types_and_values(tmp_path):
    data = rollout_data(1, 6)
    source = write_dump(tmp_path / "train_3_0.pt", data, rollout_id=3)
    output = tmp_path / "out.parquet"
    result = import_dumps(source, output=output)
    assert result.exit_code == 0, result.output
    table = pq.read_table(output)
    assert table.column_names == [
        "rollout_id",
        "rank",
        "sample_index",
        "values",
        "loss_mask",
        "terminal_reward",
        "response_length",
        "total_length",
        "log_probs",
        "ref_log_probs",
        "trained_advantages",
        "trained_returns",
    ]
    schema = table.schema
    assert schema.field("values").type == pa.list_(pa.float32())
    assert schema.field("loss_mask").type == pa.list_(pa.int32())
    assert schema.field("terminal_reward").type == pa.float64()
    assert schema.field("response_length").type == pa.int64()
    assert table.column("rollout_id").to_pylist() == [3] * 6 and table.column("rank").to_pylist() == [0] * 6
    assert table.column("sample_index").to_pylist() == data["sample_indices"]
    assert table.column("terminal_reward").to_pylist() == data["rewards"]
    assert table.column("response_length").to_pylist() == data["response_lengths"]
    assert table.column("total_length").to_pylist() == data["total_lengths"]
    assert table.column("loss_mask").to_pylist() == [mask.tolist() for mask in data["loss_masks"]]
    for column, key in [
        ("values", "values"),
        ("log_probs", "log_probs"),
        ("ref_log_probs", "ref_log_probs"),
        ("trained_advantages", "advantages"),
        ("trained_returns", "returns"),
    ]:
        assert table.column(column).to_pylist() == as_lists(data[key]), column
    metadata = schema.metadata
    assert metadata[b"gaecli.imported_from"] == b"miles"
    assert json.loads(metadata[b"gaecli.import_sources"]) == ["train_3_0.pt"]
    assert "rewards" not in table.column_names


def test_output_passes_validate(tmp_path):
    source = write_dump(tmp_path / "d.pt", rollout_data(2, 5))
    output = tmp_path / "out.parquet"
    assert import_dumps(source, output=output).exit_code == 0
    result = gae("validate", output, "--rewards-col", "none", "--kl-coef", "0.1", "--quiet")
    assert result.exit_code == 0, result.output


def test_summary_json_and_the_rewards_note(tmp_path):
    source = write_dump(tmp_path / "d.pt", rollout_data(3, 4))
    output = tmp_path / "out.parquet"
    result = gae("import", "miles", source, "-o", output, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    data = rollout_data(3, 4)
    assert document["rows"] == 4
    assert document["tokens"] == sum(mask.numel() for mask in data["loss_masks"])
    assert document["files"] == [
        {"file": str(source), "rollout_id": 0, "rank": 0, "rows": 4, "tokens": document["tokens"]}
    ]
    assert document["missing_keys"] == [] and document["ignored_keys"] == ["tokens"]
    assert document["length_mismatch_rows"] == 0
    assert "--kl-coef" in result.stderr and "--rewards-col none" in result.stderr
    assert "imported 4 samples" in result.stderr


# ----------------------------------------------------------------------------- several ranks


def test_rows_ordered_by_rollout_then_rank_then_position(tmp_path):
    dumps = tmp_path / "dumps"
    # (rollout_id, rank) -> first sample index; written and named so that path order is not row order
    layout = {(1, 0): 100, (0, 1): 10, (0, 0): 0, (1, 1): 110}
    for (rollout_id, rank), first in layout.items():
        write_dump(
            dumps / f"r{rank}_{9 - rollout_id}.pt",
            rollout_data(first, 3, first_index=first),
            rollout_id=rollout_id,
            rank=rank,
        )
    (dumps / "notes.txt").write_text("not a dump")
    output = tmp_path / "out.parquet"
    result = import_dumps(dumps, output=output)
    assert result.exit_code == 0, result.output
    table = pq.read_table(output)
    assert (
        list(zip(table.column("rollout_id").to_pylist(), table.column("rank").to_pylist()))
        == [(0, 0)] * 3 + [(0, 1)] * 3 + [(1, 0)] * 3 + [(1, 1)] * 3
    )
    assert table.column("sample_index").to_pylist() == [0, 1, 2, 10, 11, 12, 100, 101, 102, 110, 111, 112]
    expected_values = [row for first in (0, 10, 100, 110) for row in as_lists(rollout_data(first, 3)["values"])]
    assert table.column("values").to_pylist() == expected_values
    assert pq.ParquetFile(output).metadata.num_row_groups == 4


def test_globs_pth_files_and_files_named_twice(tmp_path):
    write_dump(tmp_path / "a" / "x.pt", rollout_data(1, 2), rollout_id=0, rank=0)
    write_dump(tmp_path / "a" / "y.pth", rollout_data(2, 2), rollout_id=0, rank=1)
    output = tmp_path / "out.parquet"
    result = import_dumps(tmp_path / "a", tmp_path / "a" / "x.pt", str(tmp_path / "a" / "*.pt*"), output=output)
    assert result.exit_code == 0, result.output
    assert pq.read_table(output).column("rank").to_pylist() == [0, 0, 1, 1]


def test_mixed_dtypes_are_promoted_across_files(tmp_path):
    write_dump(tmp_path / "a.pt", rollout_data(1, 2, float_dtype=torch.bfloat16, mask_dtype=torch.bool), rank=0)
    write_dump(tmp_path / "b.pt", rollout_data(2, 2, float_dtype=torch.float64, mask_dtype=torch.int8), rank=1)
    output = tmp_path / "out.parquet"
    assert import_dumps(tmp_path / "a.pt", tmp_path / "b.pt", output=output).exit_code == 0
    table = pq.read_table(output)
    assert table.schema.field("values").type == pa.list_(pa.float64())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    expected = as_lists(rollout_data(1, 2, float_dtype=torch.bfloat16)["values"]) + as_lists(
        rollout_data(2, 2, float_dtype=torch.float64)["values"]
    )
    assert table.column("values").to_pylist() == expected


def test_bfloat16_alone_becomes_float32_and_bool_masks_stay_bool(tmp_path):
    data = rollout_data(4, 3, float_dtype=torch.bfloat16, mask_dtype=torch.bool)
    write_dump(tmp_path / "a.pt", data)
    output = tmp_path / "out.parquet"
    assert import_dumps(tmp_path / "a.pt", output=output).exit_code == 0
    table = pq.read_table(output)
    assert table.schema.field("values").type == pa.list_(pa.float32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.bool_())
    assert table.column("values").to_pylist() == as_lists(data["values"])


def test_scalars_as_tensors_and_the_legacy_format(tmp_path):
    data = rollout_data(5, 3)
    data["rewards"] = [torch.tensor(r) for r in data["rewards"]]
    data["response_lengths"] = torch.tensor(data["response_lengths"])
    path = tmp_path / "legacy.pt"
    torch.save(
        {"rollout_id": torch.tensor(2), "rank": 0, "rollout_data": data}, path, _use_new_zipfile_serialization=False
    )
    output = tmp_path / "out.parquet"
    result = import_dumps(path, output=output)
    assert result.exit_code == 0, result.output
    table = pq.read_table(output)
    assert table.column("terminal_reward").to_pylist() == [float(r) for r in data["rewards"]]
    assert table.column("response_length").to_pylist() == data["response_lengths"].tolist()
    assert table.column("rollout_id").to_pylist() == [2, 2, 2]


def test_empty_rank(tmp_path):
    data = {key: [] for key in rollout_data(1, 1)}
    write_dump(tmp_path / "empty.pt", data, rank=0)
    write_dump(tmp_path / "full.pt", rollout_data(1, 2), rank=1)
    output = tmp_path / "out.parquet"
    assert import_dumps(tmp_path / "empty.pt", tmp_path / "full.pt", output=output).exit_code == 0
    assert pq.read_table(output).column("rank").to_pylist() == [1, 1]


# ----------------------------------------------------------------------------- missing keys


def test_missing_optional_keys_are_left_out(tmp_path):
    optional = (
        "log_probs",
        "ref_log_probs",
        "advantages",
        "returns",
        "sample_indices",
        "response_lengths",
        "total_lengths",
    )
    data = without(rollout_data(1, 3), *optional)
    source = write_dump(tmp_path / "d.pt", data, drop=("cp_rank", "cp_size", "qkv_format"))
    output = tmp_path / "out.parquet"
    result = gae("import", "miles", source, "-o", output, "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    assert pq.read_table(output).column_names == ["rollout_id", "rank", "values", "loss_mask", "terminal_reward"]
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["missing_keys"] == [
        "sample_indices",
        "response_lengths",
        "total_lengths",
        "log_probs",
        "ref_log_probs",
        "advantages",
        "returns",
    ]
    assert "--rewards-col none" in result.stderr and "--kl-coef" not in result.stderr


@pytest.mark.parametrize("key", ["values", "loss_masks", "rewards"])
def test_missing_required_key_lists_present_and_expected(tmp_path, key):
    source = write_dump(tmp_path / "d.pt", without(rollout_data(1, 3), key))
    output = tmp_path / "out.parquet"
    result = import_dumps(source, output=output)
    assert result.exit_code == 1, result.output
    message = " ".join(result.stderr.split())
    assert f"lacks the required key(s) {key}" in message
    assert "it has tokens," in message and "required: values, loss_masks, rewards" in message
    assert not output.exists()


def test_missing_top_level_key(tmp_path):
    source = write_dump(tmp_path / "d.pt", rollout_data(1, 2), drop=("rank",))
    result = import_dumps(source, output=tmp_path / "out.parquet")
    assert result.exit_code == 1
    message = " ".join(result.stderr.split())
    assert (
        "missing rank" in message
        and "the file has rollout_id, cp_rank" in message
        and "expected rollout_id, rank, rollout_data" in message
    )


def test_files_with_different_keys_are_refused(tmp_path):
    write_dump(tmp_path / "a.pt", rollout_data(1, 2), rank=0)
    write_dump(tmp_path / "b.pt", without(rollout_data(1, 2), "log_probs"), rank=1)
    result = import_dumps(tmp_path / "a.pt", tmp_path / "b.pt", output=tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert "differ in their keys" in result.stderr and "log_probs" in result.stderr


# ----------------------------------------------------------------------------- refusals


def test_one_context_parallel_rank_alone_is_refused(tmp_path):
    source = write_dump(tmp_path / "cp.pt", rollout_data(1, 2), cp_size=2)
    output = tmp_path / "out.parquet"
    result = import_dumps(source, output=output)
    assert result.exit_code == 1
    message = " ".join(result.stderr.split())
    assert "context-parallel group of ranks 0" in message and "no file for cp_rank 1 of cp_size 2" in message
    assert not output.exists()


class RunsCodeWhenUnpickled:
    """An arbitrary pickled object: unpickling it would write a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "this code ran"))


def test_arbitrary_pickled_object_is_refused_and_never_run(tmp_path):
    marker = tmp_path / MARKER_NAME
    data = rollout_data(1, 2)
    data["extra"] = RunsCodeWhenUnpickled(marker)
    source = write_dump(tmp_path / "evil.pt", data)
    assert not marker.exists()
    output = tmp_path / "out.parquet"
    result = import_dumps(source, output=output)
    assert result.exit_code == 1
    message = " ".join(result.stderr.split())
    assert "refused" in message and "weights_only=True" in message and "never unpickles" in message
    assert len(result.stderr.strip().splitlines()) <= 3  # one message (soft-wrapped at most)
    assert not marker.exists()
    assert files_under(tmp_path) == ["evil.pt"]


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a dump", bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))],
    ids=["text", "random-bytes"],
)
def test_not_a_torch_file(tmp_path, content):
    source = tmp_path / "notes.pt"
    source.write_bytes(content)
    result = import_dumps(source, output=tmp_path / "out.parquet")
    assert result.exit_code == 2
    assert "cannot read as a torch.save file" in result.stderr


def test_truncated_dump(tmp_path):
    source = write_dump(tmp_path / "d.pt", rollout_data(1, 2))
    source.write_bytes(source.read_bytes()[:200])
    result = import_dumps(source, output=tmp_path / "out.parquet")
    assert result.exit_code == 2
    assert "cannot read as a torch.save file" in result.stderr


def test_not_a_dict(tmp_path):
    source = tmp_path / "t.pt"
    torch.save([torch.zeros(3)], source)
    result = import_dumps(source, output=tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert "not a miles train-data dump" in result.stderr


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda data: data["values"].pop(), "rollout_data['values'] has 2 entries but 'loss_masks' has 3"),
        (lambda data: data["values"].__setitem__(1, torch.zeros(2, 2)), "rollout_data['values'][1] is a 2-D tensor"),
        (lambda data: data["log_probs"].__setitem__(0, [0.1, 0.2]), "rollout_data['log_probs'][0] is a list"),
        (lambda data: data.__setitem__("values", torch.zeros(3, 4)), "rollout_data['values'] is a 2-D tensor"),
        (lambda data: data["rewards"].__setitem__(2, None), "rollout_data['rewards'][2] is None"),
        (lambda data: data["response_lengths"].__setitem__(0, 2.5), "rollout_data['response_lengths'][0] is 2.5"),
    ],
    ids=["short-list", "2d-entry", "not-a-tensor", "padded-tensor", "null-reward", "float-length"],
)
def test_malformed_rollout_data(tmp_path, change, expected):
    data = rollout_data(1, 3)
    change(data)
    source = write_dump(tmp_path / "d.pt", data)
    output = tmp_path / "out.parquet"
    result = import_dumps(source, output=output)
    assert result.exit_code == 1, result.output
    assert expected in " ".join(result.stderr.split())
    assert files_under(tmp_path) == ["d.pt"]


def test_two_files_for_one_rollout_and_rank(tmp_path):
    write_dump(tmp_path / "a.pt", rollout_data(1, 2), rollout_id=4, rank=1)
    write_dump(tmp_path / "b.pt", rollout_data(2, 2), rollout_id=4, rank=1)
    result = import_dumps(tmp_path / "a.pt", tmp_path / "b.pt", output=tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert "both hold rollout 4, rank 1" in " ".join(result.stderr.split())


def test_existing_output_needs_overwrite(tmp_path):
    source = write_dump(tmp_path / "d.pt", rollout_data(1, 2))
    output = tmp_path / "out.parquet"
    output.write_text("keep me")
    result = import_dumps(source, output=output)
    assert result.exit_code == 2 and "--overwrite" in result.stderr
    assert output.read_text() == "keep me"
    assert import_dumps(source, output=output, options=["--overwrite"]).exit_code == 0
    assert pq.read_table(output).num_rows == 2


def test_paths_that_name_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    result = import_dumps(tmp_path / "empty", output=tmp_path / "out.parquet")
    assert result.exit_code == 2 and "*.pt or *.pth" in result.stderr
    result = import_dumps(tmp_path / "missing.pt", output=tmp_path / "out.parquet")
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_a_bad_later_file_leaves_nothing_behind(tmp_path):
    write_dump(tmp_path / "in" / "a.pt", rollout_data(1, 2), rank=0)
    broken = rollout_data(2, 2)
    broken["rewards"][1] = "1.0"  # found while converting, after rank 0's rows were written
    write_dump(tmp_path / "in" / "b.pt", broken, rank=1)
    output = tmp_path / "out" / "rollouts.parquet"
    result = import_dumps(tmp_path / "in", output=output)
    assert result.exit_code == 1
    assert "rollout_data['rewards'][1] is '1.0'" in result.stderr
    assert files_under(tmp_path / "out") == []


def test_library_api(tmp_path):
    data = rollout_data(1, 3)
    data["loss_masks"][0] = data["loss_masks"][0][:-1]  # one token short of the response
    source = write_dump(tmp_path / "d.pt", data)
    report = import_miles([source], tmp_path / "out.parquet")
    assert isinstance(report, ImportReport)
    assert report.rows == 3 and report.length_mismatch_rows == 1
    assert any("gae validate" in line for line in report.summary_lines())
    with pytest.raises(GAEInputError, match="no file for cp_rank 1"):
        import_miles([write_dump(tmp_path / "cp.pt", rollout_data(1, 2), cp_size=2)], tmp_path / "cp.parquet")
    validated = gae("validate", tmp_path / "out.parquet", "--rewards-col", "none", "--json", "-", "--quiet")
    assert validated.exit_code == 1
    assert {f["code"] for f in json.loads(validated.stdout)["findings"]} >= {
        "length-mismatch",
        "response-length-mismatch",
    }


# ----------------------------------------------------------------------------- round trips

GAMMA, LAMBD, KL_COEF = 0.95, 0.9, 0.1
K3_OPTIONS = ("--gamma", GAMMA, "--lambd", LAMBD, "--kl-coef", KL_COEF, "--kl-estimator", "k3")


def k3_rewards(log_probs: list[float], ref_log_probs: list[float]) -> list[float]:
    """−C · k3 per token, by hand: k3 = exp(−x) − 1 + x with x = log_probs − ref_log_probs."""
    return [-KL_COEF * (math.exp(-(lp - ref)) - 1.0 + (lp - ref)) for lp, ref in zip(log_probs, ref_log_probs)]


def two_rank_dumps(tmp_path: Path) -> tuple[Path, list[dict]]:
    datas = [rollout_data(7, 5, first_index=0), rollout_data(8, 4, first_index=5)]
    for rank, data in enumerate(datas):
        write_dump(tmp_path / "dumps" / f"train_0_{rank}.pt", data, rollout_id=0, rank=rank)
    output = tmp_path / "rollouts.parquet"
    result = import_dumps(tmp_path / "dumps", output=output)
    assert result.exit_code == 0, result.output
    return output, datas


def test_import_then_recompute_with_k3_rewards(tmp_path):
    imported, datas = two_rank_dumps(tmp_path)
    recomputed = tmp_path / "recomputed.parquet"
    result = gae("recompute", imported, "-o", recomputed, *K3_OPTIONS, "--quiet")
    assert result.exit_code == 0, result.output
    values = [row for data in datas for row in as_lists(data["values"])]
    masks = [[int(m) for m in mask.tolist()] for data in datas for mask in data["loss_masks"]]
    log_probs = [row for data in datas for row in as_lists(data["log_probs"])]
    ref_log_probs = [row for data in datas for row in as_lists(data["ref_log_probs"])]
    rewards = [k3_rewards(lp, ref) for lp, ref in zip(log_probs, ref_log_probs)]
    terminal = [r for data in datas for r in data["rewards"]]
    expected_advantages, expected_returns = reference_outputs(Rollouts(values, rewards, masks, terminal), GAMMA, LAMBD)
    output = pq.read_table(recomputed)
    assert_rows_close("advantages", expected_advantages, output.column("advantages").to_pylist(), 2e-5)
    assert_rows_close("returns", expected_returns, output.column("returns").to_pylist(), 2e-5)
    columns = json.loads(output.schema.metadata[b"gaecli.columns"])
    assert columns["kl_coef"] == KL_COEF and columns["kl_estimator"] == "k3" and columns["rewards"] is None
    assert output.column("trained_advantages").equals(pq.read_table(imported).column("trained_advantages"))


def _diff_registered() -> bool:
    return runner.invoke(app, ["diff", "--help"]).exit_code == 0


def test_import_then_diff_against_trained_advantages(tmp_path):
    if not _diff_registered():
        pytest.skip("gae diff is not registered yet")
    datas = [rollout_data(9, 6)]
    data = datas[0]
    rewards = [k3_rewards(lp, ref) for lp, ref in zip(as_lists(data["log_probs"]), as_lists(data["ref_log_probs"]))]
    values = as_lists(data["values"])
    masks = [[int(m) for m in mask.tolist()] for mask in data["loss_masks"]]
    # The run trained on masked GAE for every sample but one that ends in masked tokens,
    # which got the old unmasked GAE.
    wrong = next(row for row, mask in enumerate(masks) if any(mask) and not mask[-1])
    trained = [
        masked_advantages(v, r, m, z, GAMMA, LAMBD) for v, r, m, z in zip(values, rewards, masks, data["rewards"])
    ]
    trained[wrong] = unmasked_advantages(values[wrong], rewards[wrong], data["rewards"][wrong], GAMMA, LAMBD)
    data["advantages"] = [torch.tensor(row, dtype=torch.float64) for row in trained]
    data["returns"] = [torch.tensor(row, dtype=torch.float64) for row in trained]
    write_dump(tmp_path / "train_0_0.pt", data)
    imported = tmp_path / "rollouts.parquet"
    assert import_dumps(tmp_path / "train_0_0.pt", output=imported).exit_code == 0
    result = gae("diff", imported, *K3_OPTIONS, "--against", "trained_advantages", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    correct = masked_advantages(values[wrong], rewards[wrong], masks[wrong], data["rewards"][wrong], GAMMA, LAMBD)
    expected_max = max(abs(a - b) for a, b, m in zip(correct, trained[wrong], masks[wrong]) if m)
    assert expected_max > 1e-3
    assert summary["samples"] == 6
    assert summary["changed_samples"] == 1
    assert summary["max_abs_delta_advantage"] == pytest.approx(expected_max, rel=1e-6)
