"""``gae import slime``: format-2 dumps written here the way slime's ``_build_dump_payload``
lays them out (samples from every data-parallel shard, one dict each, in rollout order;
``dp_shards`` beside them), imported and held against the miles import of the same data
per rank, against the samples themselves, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from test_import import rollout_data, write_dump

from gaecli.errors import GAEInputError
from gaecli.importers import import_slime

from rollout_files import files_under, gae

PER_SAMPLE = (
    "values",
    "log_probs",
    "ref_log_probs",
    "loss_masks",
    "rewards",
    "response_lengths",
    "total_lengths",
    "advantages",
    "returns",
    "tokens",
)


def slime_samples(shards: list[dict]) -> list[dict]:
    """One dict per sample, shard after shard, with slime's id keys (``sample_indices`` →
    ``sample_index``, rollout position) and a per-token ``kl`` gaecli does not import."""
    samples, position = [], 0
    for dp_rank, data in enumerate(shards):
        for i in range(len(data["loss_masks"])):
            sample = {
                "data_parallel_rank": dp_rank,
                "sample_index": data["sample_indices"][i],
                "rollout_position": position,
                "kl": torch.zeros(data["response_lengths"][i]),
            }
            sample.update({key: data[key][i] for key in PER_SAMPLE})
            samples.append(sample)
            position += 1
    return samples


def write_slime(path: Path, rollout_id: int, sample_dicts: list[dict], **changes) -> Path:
    payload = {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": sample_dicts,
        "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_index": None, "micro_batch_indices": [[0]]}],
        "raw_reward": [1.0],
    }
    payload.update(changes)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def test_slime_import_equals_the_miles_import_of_the_same_shards(tmp_path):
    runs = {
        rollout_id: [
            rollout_data(10 * rollout_id + rank, rows, first_index=4 * rank) for rank, rows in enumerate((4, 3))
        ]
        for rollout_id in (2, 11)
    }
    for rollout_id, shards in runs.items():
        write_slime(tmp_path / "slime" / f"{rollout_id}.pt", rollout_id, slime_samples(shards))
        for rank, data in enumerate(shards):
            write_dump(tmp_path / "miles" / f"{rollout_id}_{rank}.pt", data, rollout_id=rollout_id, rank=rank)
    result = gae("import", "slime", tmp_path / "slime", "-o", tmp_path / "slime.parquet", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    assert gae("import", "miles", tmp_path / "miles", "-o", tmp_path / "miles.parquet", "--quiet").exit_code == 0
    slime, miles = pq.read_table(tmp_path / "slime.parquet"), pq.read_table(tmp_path / "miles.parquet")
    assert slime.schema.remove_metadata() == miles.schema.remove_metadata()
    for name in miles.column_names:
        assert slime.column(name).equals(miles.column(name)), name
    assert slime.schema.metadata[b"gaecli.imported_from"] == b"slime"
    report = json.loads(result.stdout)
    assert report["format"] == "slime" and [f["rollout_id"] for f in report["files"]] == [2, 11]
    assert [f["rows"] for f in report["files"]] == [7, 7]
    assert set(report["ignored_keys"]) == {"kl", "rollout_position", "tokens", "(top level) raw_reward"}


def test_rows_keep_the_files_order_and_null_sample_indices(tmp_path):
    samples = slime_samples([rollout_data(1, 3), rollout_data(2, 2, first_index=3)])
    samples = [samples[i] for i in (3, 0, 4, 2, 1)]  # slime sorted them by rollout_position: keep this order
    samples[1]["sample_index"] = None
    for sample in samples:
        del sample["values"]  # a run without a critic
    source = write_slime(tmp_path / "5.pt", 5, samples)
    report = import_slime([source], tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("rank").to_pylist() == [1, 0, 1, 0, 0]
    assert table.column("sample_index").to_pylist() == [3, None, 4, 2, 1]
    assert table.column("loss_mask").to_pylist() == [s["loss_masks"].tolist() for s in samples]
    assert table.column("terminal_reward").to_pylist() == [s["rewards"] for s in samples]
    assert "values" not in table.column_names and report.missing_keys == ["values"]
    assert any("--values-col none" in step for step in report.next_steps())


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(format_version=1), "format_version is 1; gae import slime reads format_version 2"),
        (dict(samples={"a": 1}), "samples is a dict, expected a list of per-sample dicts"),
        (dict(samples=[torch.zeros(2)]), "samples[0] is a 1-D tensor of shape (2,), expected a dict"),
    ],
    ids=["version", "samples-not-a-list", "sample-not-a-dict"],
)
def test_bad_top_level_is_refused(tmp_path, change, expected):
    write_slime(tmp_path / "0.pt", 0, slime_samples([rollout_data(1, 2)]), **change)
    result = gae("import", "slime", tmp_path / "0.pt", "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 1, result.output
    assert f"0.pt: {expected}" in " ".join(result.stderr.split())
    assert files_under(tmp_path) == ["0.pt"]


def test_a_miles_layout_dump_points_to_gae_import_miles(tmp_path):
    write_dump(tmp_path / "0.pt", rollout_data(1, 2))
    with pytest.raises(GAEInputError, match="read it with gae import miles"):
        import_slime([tmp_path / "0.pt"], tmp_path / "out.parquet")


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda s: s[2].pop("loss_masks"), "samples[2] lacks loss_masks, unlike samples[0]"),
        (lambda s: [sample.pop("rewards") for sample in s], "samples[0] lacks the required key(s) rewards"),
        (lambda s: s[1].__setitem__("values", torch.zeros(2, 2)), "samples[1]['values'] is a 2-D tensor"),
        (lambda s: s[0].__setitem__("rewards", "high"), "samples[0]['rewards'] is 'high', expected a number"),
        (lambda s: s[2].__setitem__("data_parallel_rank", 0.5), "samples[2]['data_parallel_rank'] is 0.5"),
    ],
    ids=["key-missing-in-one", "required-missing", "2d-tensor", "reward-not-a-number", "rank-not-an-integer"],
)
def test_bad_samples_are_named(tmp_path, change, expected):
    samples = slime_samples([rollout_data(1, 3)])
    change(samples)
    write_slime(tmp_path / "0.pt", 0, samples)
    result = gae("import", "slime", tmp_path / "0.pt", "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 1, result.output
    assert f"0.pt: {expected}" in " ".join(result.stderr.split())
    assert not (tmp_path / "out.parquet").exists()


def test_two_files_of_one_rollout_are_refused(tmp_path):
    write_slime(tmp_path / "a" / "4.pt", 4, slime_samples([rollout_data(1, 2)]))
    write_slime(tmp_path / "b" / "4.pt", 4, slime_samples([rollout_data(2, 2)]))
    result = gae("import", "slime", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 1 and "both hold rollout 4" in " ".join(result.stderr.split())


def test_pickled_objects_are_refused(tmp_path):
    write_slime(tmp_path / "0.pt", 0, slime_samples([rollout_data(1, 2)]), dp_shards=[Path("x")])
    result = gae("import", "slime", tmp_path / "0.pt", "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 1 and "refused" in result.stderr
