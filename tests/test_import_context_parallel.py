"""``gae import miles`` of context-parallel dumps: files written here the way miles lays them
out (one per global rank, Megatron's rank order, each rank-local tensor cut to the rank's
zigzag share by a per-position loop written here), imported, and held bitwise against the
import of the same data dumped with ``cp_size = 1``; tensor-parallel copies, earlier
pipeline stages, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from gaecli.errors import GAEInputError
from gaecli.importers import import_miles
from gaecli.importers.miles import zigzag_response_parts

from rollout_files import files_under, gae

RANK_LOCAL = ("values", "log_probs", "ref_log_probs", "advantages", "returns")


def owner_order(total: int, response: int, cp_size: int, cp_rank: int, chunk: int) -> list[int]:
    """The response indices rank ``cp_rank`` holds, in its order, one position at a time:
    logit position p (predicting token p + 1) lies in chunk p // chunk; rank r owns chunks
    r and 2·cp − 1 − r, the first before the second; response index = p − (P − 1)."""
    prompt = total - response
    first, second = [], []
    for position in range(prompt - 1, total - 1):
        index = position // chunk
        if index == cp_rank:
            first.append(position - (prompt - 1))
        elif index == 2 * cp_size - 1 - cp_rank:
            second.append(position - (prompt - 1))
    return first + second


def samples(seed: int, shapes: list[tuple[int, int]], first_index: int) -> dict:
    """Full-length rollout_data (cp_size = 1) for samples of (prompt, response) lengths."""
    rng = np.random.default_rng(seed)
    data: dict = {key: [] for key in (*RANK_LOCAL, "loss_masks", "tokens")}
    for prompt, response in shapes:
        for key in RANK_LOCAL:
            data[key].append(torch.from_numpy(rng.normal(0.0, 1.0, response)).to(torch.float32))
        data["loss_masks"].append(torch.from_numpy((rng.random(response) < 0.7).astype(np.int32)))
        data["tokens"].append(torch.arange(prompt + response))
    data["rewards"] = [float(rng.choice([0.0, 1.0, -1.0])) for _ in shapes]
    data["response_lengths"] = [response for _, response in shapes]
    data["total_lengths"] = [prompt + response for prompt, response in shapes]
    data["sample_indices"] = list(range(first_index, first_index + len(shapes)))
    return data


def share(data: dict, cp_size: int, cp_rank: int, qkv_format: str, max_seq_len: int = 0) -> dict:
    """What rank ``cp_rank`` of a context-parallel group dumps: rank-local keys cut to its share."""
    local = dict(data)
    for key in RANK_LOCAL:
        local[key] = []
        for tensor, total, response in zip(data[key], data["total_lengths"], data["response_lengths"]):
            length = max_seq_len if qkv_format == "bshd" else total
            chunk = -(-length // (2 * cp_size))
            local[key].append(tensor[owner_order(total, response, cp_size, cp_rank, chunk)].clone())
    if qkv_format == "bshd":
        local["max_seq_lens"] = [max_seq_len] * len(data["rewards"])
    return local


# prompt + response not a multiple of 2·cp, one-token responses, a sample whose response
# lies wholly in one chunk; group 2 is one sample every rank but one holds nothing of.
GROUPS = [
    [(3, 9), (5, 1), (2, 14), (7, 6)],
    [(1, 1), (4, 11), (9, 2)],
    [(4, 1)],
]


def dump(
    path: Path, rollout_id: int, rank: int, data: dict, cp_rank: int = 0, cp_size: int = 1, qkv_format: str = "thd"
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "rollout_id": rollout_id,
            "rank": rank,
            "rollout_data": data,
            "cp_rank": cp_rank,
            "cp_size": cp_size,
            "qkv_format": qkv_format,
        },
        path,
    )


def write_run(
    directory: Path,
    cp_size: int,
    *,
    tp: int = 1,
    pp: int = 1,
    qkv_format: str = "thd",
    rollouts: tuple[int, ...] = (0, 1),
) -> None:
    """Every rank's file of a run, named ``{rollout_id}_{rank}.pt`` as miles does, with
    rank = tp_rank + tp·(cp_rank + cp·dp_rank) on the last pipeline stage (earlier stages
    first, without values and log-probs)."""
    per_stage = tp * cp_size * len(GROUPS)
    for rollout_id in rollouts:
        first_index = 0
        for dp_rank, shapes in enumerate(GROUPS):
            data = samples(100 * rollout_id + dp_rank, shapes, first_index)
            first_index += len(shapes)
            max_seq_len = max(data["total_lengths"]) + 3
            for cp_rank in range(cp_size):
                local = share(data, cp_size, cp_rank, qkv_format, max_seq_len) if cp_size > 1 else data
                for tp_rank in range(tp):
                    for stage in range(pp):
                        rank = stage * per_stage + tp_rank + tp * (cp_rank + cp_size * dp_rank)
                        held = local if stage == pp - 1 else {k: v for k, v in local.items() if k not in RANK_LOCAL}
                        dump(
                            directory / f"{rollout_id}_{rank}.pt", rollout_id, rank, held, cp_rank, cp_size, qkv_format
                        )


def imported(directory: Path, output: Path, *options) -> tuple[object, dict]:
    result = gae("import", "miles", directory, "-o", output, "--quiet", "--json", "-", *options)
    assert result.exit_code == 0, result.output
    return pq.read_table(output), json.loads(result.stdout)


@pytest.mark.parametrize("cp_size, qkv_format", [(2, "thd"), (4, "thd"), (2, "bshd"), (4, "bshd")])
def test_context_parallel_import_equals_the_cp1_import_bitwise(tmp_path, cp_size, qkv_format):
    write_run(tmp_path / "cp1", 1)
    write_run(tmp_path / "cp", cp_size, qkv_format=qkv_format)
    plain, _ = imported(tmp_path / "cp1", tmp_path / "plain.parquet")
    parallel, report = imported(tmp_path / "cp", tmp_path / "parallel.parquet")
    assert plain.column("rank").to_pylist() == ([0] * 4 + [1] * 3 + [2]) * 2
    assert parallel.schema.remove_metadata() == plain.schema.remove_metadata()
    for name in plain.column_names:
        assert parallel.column(name).equals(plain.column(name)), name
    assert report["rows"] == 16 and len(report["files"]) == 2 * 3 * cp_size
    entry = next(f for f in report["files"] if f["rank"] == cp_size + 1)  # dp 1, cp 1 of rollout 0
    assert entry["cp_rank"] == 1 and entry["data_parallel_rank"] == 1 and entry["rows"] == 0


def test_a_rank_with_an_empty_share(tmp_path):
    # group 2's only sample (prompt 4, response 1, cp 4, chunk 1): logit position 3 is chunk 3,
    # cp_rank 3's; cp_ranks 0-2 (ranks 8-10) hold nothing
    write_run(tmp_path / "cp", 4, rollouts=(0,))
    for rank in (8, 9, 10):
        data = torch.load(tmp_path / "cp" / f"0_{rank}.pt", weights_only=True)["rollout_data"]
        assert [t.numel() for t in data["values"]] == [0]
    table, _ = imported(tmp_path / "cp", tmp_path / "out.parquet")
    full = samples(2, GROUPS[2], 7)
    assert table.column("rank").to_pylist()[-1] == 2
    assert table.column("values").to_pylist()[-1] == full["values"][0].tolist()


def test_tensor_parallel_copies_are_read_once_and_earlier_stages_skipped(tmp_path):
    write_run(tmp_path / "cp1", 1)
    write_run(tmp_path / "cp", 2, tp=2, pp=2)
    plain, _ = imported(tmp_path / "cp1", tmp_path / "plain.parquet")
    parallel, report = imported(tmp_path / "cp", tmp_path / "parallel.parquet")
    for name in plain.column_names:
        assert parallel.column(name).equals(plain.column(name)), name
    notes = " ".join(report["notes"])
    assert "skipped 12 dump(s) without values" in notes and "tensor-parallel copies" in notes
    notes = [f.get("note", "") for f in report["files"]]
    assert sum(note.startswith("skipped: no values") for note in notes) == 24
    assert sum(note.startswith("tensor-parallel copy of") for note in notes) == 12
    assert len(report["files"]) == 2 * 2 * 2 * 3 * 2


def test_zigzag_parts_partition_every_response(tmp_path):
    for cp_size in (2, 3, 4):
        for total in range(2, 30):
            for response in range(0, total):
                chunk = -(-total // (2 * cp_size))
                held = []
                for cp_rank in range(cp_size):
                    starts, stops = zigzag_response_parts(
                        np.array([total]), np.array([response]), np.array([chunk]), cp_size, cp_rank
                    )
                    order = [i for start, stop in zip(starts[0], stops[0]) for i in range(start, stop)]
                    assert order == owner_order(total, response, cp_size, cp_rank, chunk)
                    held.extend(order)
                assert sorted(held) == list(range(response))


# ----------------------------------------------------------------------------- refusals


def refused(directory: Path, tmp_path: Path) -> str:
    result = gae("import", "miles", directory, "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 1, result.output
    assert not (tmp_path / "out.parquet").exists()
    return " ".join(result.stderr.split())


def test_missing_cp_rank_is_refused_naming_group_and_rank(tmp_path):
    write_run(tmp_path / "cp", 4, rollouts=(3,))
    (tmp_path / "cp" / "3_6.pt").unlink()  # dp 1, cp 2
    message = refused(tmp_path / "cp", tmp_path)
    assert "rollout 3, context-parallel group of ranks 4, 5, 7" in message
    assert "sample_indices 4…6" in message and "no file for cp_rank 2 of cp_size 4" in message


def test_duplicate_cp_rank_with_other_data_is_refused(tmp_path):
    write_run(tmp_path / "cp", 2, rollouts=(0,))
    other = torch.load(tmp_path / "cp" / "0_1.pt", weights_only=True)
    other["rank"] = 9
    other["rollout_data"]["values"][0] = other["rollout_data"]["values"][0] + 1.0
    torch.save(other, tmp_path / "cp" / "0_9.pt")
    message = refused(tmp_path / "cp", tmp_path)
    assert "two different files for cp_rank 1" in message and "0_1.pt" in message and "0_9.pt" in message


def test_share_of_the_wrong_length_is_refused(tmp_path):
    write_run(tmp_path / "cp", 2, rollouts=(0,))
    broken = torch.load(tmp_path / "cp" / "0_1.pt", weights_only=True)
    broken["rollout_data"]["log_probs"][2] = broken["rollout_data"]["log_probs"][2][:-1]
    torch.save(broken, tmp_path / "cp" / "0_1.pt")
    with pytest.raises(GAEInputError, match=r"0_1.pt: rollout_data\['log_probs'\]\[2\] holds \d+ tokens, but"):
        import_miles([tmp_path / "cp"], tmp_path / "out.parquet")
    assert files_under(tmp_path / "cp") == sorted(f"0_{rank}.pt" for rank in range(6))


def test_context_parallel_dump_without_sample_indices_is_refused(tmp_path):
    write_run(tmp_path / "cp", 2, rollouts=(0,))
    broken = torch.load(tmp_path / "cp" / "0_0.pt", weights_only=True)
    del broken["rollout_data"]["sample_indices"]
    torch.save(broken, tmp_path / "cp" / "0_0.pt")
    message = refused(tmp_path / "cp", tmp_path)
    assert "0_0.pt: rollout_data lacks the required key(s) sample_indices (cp_size 2" in message


def test_bshd_without_max_seq_lens_is_refused(tmp_path):
    write_run(tmp_path / "cp", 2, rollouts=(0,), qkv_format="bshd")
    broken = torch.load(tmp_path / "cp" / "0_2.pt", weights_only=True)
    del broken["rollout_data"]["max_seq_lens"]
    torch.save(broken, tmp_path / "cp" / "0_2.pt")
    assert "0_2.pt: rollout_data lacks the required key(s) max_seq_lens" in refused(tmp_path / "cp", tmp_path)


def test_a_stage_without_values_and_no_last_stage_is_refused(tmp_path):
    write_run(tmp_path / "cp", 2, rollouts=(0,), pp=2)
    for rank in range(6, 12):
        (tmp_path / "cp" / f"0_{rank}.pt").unlink()
    assert "lacks the required key(s) values" in refused(tmp_path / "cp", tmp_path)
