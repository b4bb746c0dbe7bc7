"""``gae import nemo-rl``: ``train_data_step{N}.jsonl`` files written here the way NeMo-RL's
``Logger.log_batched_dict_as_jsonl`` writes them (one JSON object per sample, every field a
one-element list, plus ``idx``), imported and held against the response cut by a
per-row loop written here; streaming in small batches; the round trips to recompute
(critic-free) and diff; every refusal names file, line and key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gaecli.importers import import_nemo_rl

from rollout_files import Rollouts, files_under, gae, reference_outputs

PAD = 4


def batch(seed: int, rows: int, *, filtered: bool = False) -> list[dict]:
    """A training batch as NeMo-RL logs it: prompt + multi-turn response + right padding;
    token_loss_mask 1 on generated assistant tokens only; one row with no trainable token,
    one whose response is one token."""
    rng = np.random.default_rng(seed)
    samples = []
    for row in range(rows):
        prompt, turns = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        mask = [0] * prompt
        for _ in range(turns):
            mask += [1] * int(rng.integers(1, 5)) + [0] * int(rng.integers(0, 3))  # assistant, then tool output
        if row == 1:
            mask = [0] * len(mask)
        if row == 2:
            mask = [0] * prompt + [1]
        length = len(mask)
        padded = length + PAD
        sample = {
            "content": [[{"role": "user", "content": "hi"}]],
            "rewards": [float(rng.choice([0.0, 1.0]))],
            "input_lengths": [length],
            "token_ids": [list(range(padded))],
            "token_loss_mask": [mask + [0] * PAD],
            "sample_loss_mask": [1.0 if row != 3 else 0.0],
            "advantages": [rng.normal(0.0, 1.0, padded).astype(np.float32).tolist()],
            "generation_logprobs": [(-rng.random(padded)).tolist()],
            "prev_logprobs": [(-rng.random(padded)).astype(np.float32).tolist()],
        }
        if filtered:
            sample["filtered_rewards"] = [sample["rewards"][0] * 0.5]
        samples.append(sample)
    return samples


def write_step(directory: Path, step: int, samples: list[dict]) -> Path:
    path = directory / f"train_data_step{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file:
        for i, sample in enumerate(samples):
            file.write(json.dumps({**sample, "idx": i}) + "\n")
    return path


def import_after_a_bad_line(tmp_path: Path, line: str):
    """``gae import nemo-rl`` of a step file of two good lines and then ``line`` (line 3):
    (the step file, the result)."""
    path = write_step(tmp_path, 7, batch(7, 2))
    with open(path, "a") as file:
        file.write(line + "\n")
    return path, gae("import", "nemo-rl", path, "-o", tmp_path / "out.parquet", "--quiet")


def expected_rows(step: int, samples: list[dict], groups: dict | None = None) -> list[dict]:
    """The import, one row at a time: response = [s, L) with s the first trainable token;
    ``prompt_group`` the place of (step, token_ids[:s]) among the distinct ones met so far
    (``groups``, shared by the steps in import order)."""
    groups = {} if groups is None else groups
    rows = []
    for i, sample in enumerate(samples):
        length = sample["input_lengths"][0]
        mask = sample["token_loss_mask"][0][:length]
        start = next((t for t, m in enumerate(mask) if m), length)
        reward = sample.get("filtered_rewards", sample["rewards"])[0]
        rows.append(
            {
                "rollout_id": step,
                "sample_index": i,
                "loss_mask": [float(m) * sample["sample_loss_mask"][0] for m in mask[start:]],
                "terminal_reward": reward,
                "response_length": length - start,
                "total_length": length,
                "log_probs": sample["prev_logprobs"][0][start:length],
                "trained_advantages": sample["advantages"][0][start:length],
                "prompt_group": groups.setdefault((step, tuple(sample["token_ids"][0][:start])), len(groups)),
            }
        )
    return rows


def test_rows_columns_and_numeric_step_order(tmp_path):
    steps = {10: batch(1, 6), 2: batch(2, 5, filtered=True), 9: batch(3, 4)}
    for step, samples in steps.items():
        write_step(tmp_path / "logs", step, samples)
    result = gae("import", "nemo-rl", tmp_path / "logs", "-o", tmp_path / "out.parquet", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "out.parquet")
    groups: dict = {}
    expected = [row for step in (2, 9, 10) for row in expected_rows(step, steps[step], groups)]
    assert table.to_pylist() == expected
    assert table.schema.metadata[b"gaecli.imported_from"] == b"nemo-rl"
    report = json.loads(result.stdout)
    assert [(f["rollout_id"], f["rows"]) for f in report["files"]] == [(2, 5), (9, 4), (10, 6)]
    assert report["tokens"] == sum(row["response_length"] for row in expected)
    assert "filtered_rewards" in " ".join(report["notes"])
    assert set(report["ignored_keys"]) == {"content", "generation_logprobs"}
    empty = [row for row in table.to_pylist() if row["response_length"] == 0]
    assert empty and all(row["loss_mask"] == [] for row in empty)


def test_small_batches_give_the_same_file(tmp_path):
    write_step(tmp_path, 1, batch(4, 11))
    whole = import_nemo_rl([tmp_path / "train_data_step1.jsonl"], tmp_path / "a.parquet")
    streamed = import_nemo_rl([tmp_path / "train_data_step1.jsonl"], tmp_path / "b.parquet", batch_rows=3)
    assert whole.rows == streamed.rows == 11
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    assert pq.ParquetFile(tmp_path / "b.parquet").num_row_groups == 4


def test_recompute_needs_values_col_none_and_then_matches_the_reference(tmp_path):
    samples = batch(5, 6)
    write_step(tmp_path, 3, samples)
    imported = tmp_path / "rollouts.parquet"
    assert gae("import", "nemo-rl", tmp_path / "train_data_step3.jsonl", "-o", imported, "--quiet").exit_code == 0

    def recompute(*options):
        curve = ("--gamma", 1, "--lambd", 0.95)
        return gae("recompute", imported, "-o", tmp_path / "r.parquet", *curve, "--rewards-col", "none", *options, "-q")

    refused = recompute()
    assert refused.exit_code == 1
    message = " ".join(refused.stderr.split())
    assert "column 'values' is missing" in message and "--values-col none" in message
    result = recompute("--values-col", "none")
    assert result.exit_code == 0, result.output
    rows = expected_rows(3, samples)
    masks = [[int(m != 0) for m in row["loss_mask"]] for row in rows]
    zeros = [[0.0] * row["response_length"] for row in rows]
    terminal = [row["terminal_reward"] for row in rows]
    advantages, _ = reference_outputs(Rollouts(zeros, zeros, masks, terminal), 1.0, 0.95)
    output = pq.read_table(tmp_path / "r.parquet").column("advantages").to_pylist()
    for got, want, mask in zip(output, advantages, masks):
        assert [g for g, m in zip(got, mask) if m] == pytest.approx([w for w, m in zip(want, mask) if m], abs=1e-6)


def sample_line(drop: str = "", **changes) -> str:
    """One line as NeMo-RL writes it, with ``changes`` (``drop``: a key left out)."""
    sample = batch(6, 1)[0] | changes | {"idx": 1}
    return json.dumps({key: value for key, value in sample.items() if key != drop})


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "not a JSON line"),
        ("[1, 2]", "holds a list, expected a JSON object"),
        (sample_line(drop="advantages"), "key 'advantages' is missing"),
        (sample_line(rewards=[1.0, 2.0]), "'rewards' is a list of 2, expected a one-element list"),
        (sample_line(input_lengths=[99]), "'token_loss_mask' has"),
        (sample_line(rewards=["x"]), "'rewards' holds 'x', expected a number"),
        (sample_line(prev_logprobs=[[None] * 40]), "'prev_logprobs' holds null, expected numbers"),
        (sample_line(drop="idx"), "key 'idx' is missing"),
        (sample_line(drop="token_ids"), "key 'token_ids' is missing"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "missing-key",
        "two-elements",
        "short-list",
        "reward-string",
        "null-token",
        "no-idx",
        "no-token-ids",
    ],
)
def test_bad_lines_are_named_with_file_line_and_key(tmp_path, line, expected):
    _, result = import_after_a_bad_line(tmp_path, line)
    assert result.exit_code == 1, result.output
    assert f"train_data_step7.jsonl:3: {expected}" in " ".join(result.stderr.split())
    assert files_under(tmp_path) == ["train_data_step7.jsonl"]


def test_a_file_name_without_the_step_is_refused(tmp_path):
    source = tmp_path / "batch.jsonl"
    source.write_text("")
    result = gae("import", "nemo-rl", source, "-o", tmp_path / "out.parquet", "--quiet")
    assert result.exit_code == 2 and "train_data_step{N}.jsonl" in result.stderr


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 64])
def test_lines_across_chunk_boundaries(chunk_bytes):
    import io

    from gaecli.importers.nemo_rl import _lines

    text = b'{"a": 1}\n\n{"bb": [1, 2, 3]}\nlast'
    assert list(_lines(io.BytesIO(text), chunk_bytes)) == text.split(b"\n")
    assert list(_lines(io.BytesIO(text + b"\n"), chunk_bytes)) == text.split(b"\n")


def prompted_batch(prompts: list[list[int]], rewards: list[float]) -> list[dict]:
    """A GRPO batch of the given prompts (token ids), each followed by a response of three
    trainable tokens and a masked tool output, then padding."""
    samples = []
    for row, (prompt, reward) in enumerate(zip(prompts, rewards)):
        response = [100 + row, 101, 102, 7, 103]
        mask = [0] * len(prompt) + [1, 1, 0, 1, 1]
        padded = len(mask) + PAD
        samples.append(
            {
                "rewards": [reward],
                "input_lengths": [len(mask)],
                "token_ids": [prompt + response + [0] * PAD],
                "token_loss_mask": [mask + [0] * PAD],
                "sample_loss_mask": [1.0],
                "advantages": [[0.0] * padded],
                "prev_logprobs": [[-0.5] * padded],
            }
        )
    return samples


def test_repeated_prompts_of_a_step_share_a_group_and_grpo_runs_on_them(tmp_path):
    a, b, c = [1, 2, 3], [1, 2, 4], [1, 2]  # b and c share a's first tokens: only whole prompts match
    write_step(tmp_path / "logs", 1, prompted_batch([a, b, a, c, b, a], [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    write_step(tmp_path / "logs", 2, prompted_batch([a, a, b, b], [0.0, 1.0, 1.0, 0.0]))
    imported = tmp_path / "out.parquet"
    result = gae("import", "nemo-rl", tmp_path / "logs", "-o", imported, "--quiet")
    assert result.exit_code == 0, result.output
    groups = pq.read_table(imported).column("prompt_group").to_pylist()
    # step 1: a → 0, b → 1, c → 2; step 2 starts its own groups: a → 3, b → 4
    assert groups == [0, 1, 0, 2, 1, 0, 3, 3, 4, 4]
    out = tmp_path / "grpo.parquet"
    result = gae("recompute", imported, "-o", out, "--estimator", "grpo", "--group-col", "prompt_group",
                 "--rewards-col", "none", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    first = [row[0] for row in table.column("advantages").to_pylist()]  # the first token is trainable
    rewards = table.column("terminal_reward").to_pylist()
    for group in set(groups) - {2}:  # c (group 2) is alone in its group
        members = [row for row, g in enumerate(groups) if g == group]
        group_rewards = np.array([rewards[row] for row in members])
        # GRPO within the group alone: (r − mean) / (unbiased std + ε)
        expected = (group_rewards - group_rewards.mean()) / (group_rewards.std(ddof=1) + 1e-6)
        assert [first[row] for row in members] == pytest.approx(expected.tolist(), abs=1e-5)


def test_a_dump_without_token_ids_has_no_groups_and_says_so(tmp_path):
    samples = [{k: v for k, v in sample.items() if k != "token_ids"} for sample in batch(8, 3)]
    write_step(tmp_path, 4, samples)
    result = gae("import", "nemo-rl", tmp_path / "train_data_step4.jsonl", "-o", tmp_path / "o.parquet",
                 "--json", "-", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "prompt_group" not in pq.read_schema(tmp_path / "o.parquet").names
    assert "no prompt_group column" in " ".join(json.loads(result.stdout)["notes"])
