"""Write the small, realistic rollout files of ``sample_data/`` (seeded, reproducible).

    python scripts/make_sample_data.py sample_data

- ``agentic/step_0000.parquet``, ``agentic/step_0001.parquet``: multi-turn tool-use
  rollouts, turns of 30–250 tokens between masked observation blocks of 10–400, KL
  rewards at every position, 15 % masked tails and one fully masked sample per file
  (shorter responses than the benchmark's, so the files stay small);
- ``single_turn.parquet``: single-turn rows, every token trainable, bool masks;
- ``critic_free/grpo_step_0000.parquet``: a critic-free (GRPO-style) dump of multi-turn
  rollouts, no values column: 8 prompts (``prompt_id``) × 4 samples, 0/1 outcome rewards
  (two prompts all correct or all wrong), zero per-token rewards, a ``step`` column
  (docs/estimators.md);
- ``turn_rows.parquet``: turn rows of an agent run (docs/episodes.md), one row per turn: 8
  episodes (``episode_id``) of 2–4 turns (``turn``) in 2 groups (``group_id``), each turn's
  anchor state (``state``) and reward (``step_score``), the episode's 0/1 outcome on each of
  its rows, no values column, rows in the order the turns finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from rollout_files import workload_table  # noqa: E402
from workloads import agentic, single_turn  # noqa: E402


def main(out_dir: str = "sample_data") -> None:
    root = Path(out_dir)
    for step in range(2):
        workload = agentic(
            num_samples=40,
            seed=100 + step,
            median_length=900,
            max_length=6_000,
            turn=(30, 250),
            observation=(10, 400),
            masked_tail_share=0.15,
            fully_masked_share=0.025,
        )
        table = workload_table(workload, rollout_id=step)
        path = root / "agentic" / f"step_{step:04d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=16, compression="zstd")
        print(f"{path}: {table.num_rows} rows, {int(workload.offsets[-1]):,} tokens")
    table = workload_table(single_turn(num_samples=12, seed=7), rollout_id=2, mask_type=pa.bool_())
    path = root / "single_turn.parquet"
    pq.write_table(table, path, compression="zstd")
    print(f"{path}: {table.num_rows} rows")
    write_critic_free(root / "critic_free" / "grpo_step_0000.parquet")
    write_turn_rows(root / "turn_rows.parquet")


def write_turn_rows(path: Path, groups: int = 2, episodes_per_group: int = 4) -> None:
    """The turn-row sample: each turn's response an action of 8–40 tokens, some with a masked
    span (a tool's output echoed into the response), grouped by episode and group."""
    rng = np.random.default_rng(401)
    rows = []
    for episode in range(groups * episodes_per_group):
        outcome = float(rng.random() < 0.5)
        for turn in range(int(rng.integers(2, 5))):
            length = int(rng.integers(8, 41))
            mask = np.ones(length, np.int8)
            if rng.random() < 0.4:
                start = int(rng.integers(1, length - 4))
                mask[start : start + int(rng.integers(2, 5))] = 0
            finished = episode * 0.7 + turn + rng.random()  # when the turn finished
            rows.append((finished, {
                "episode_id": f"ep{episode:02d}", "turn": turn, "group_id": f"task{episode // episodes_per_group}",
                "state": f"t{turn}-s{int(rng.integers(0, 2))}", "step_score": float(rng.choice([0.0, 0.1, 0.5])),
                "rewards": np.zeros(length, np.float32), "loss_mask": mask, "terminal_reward": outcome,
                "response_length": length,
            }))  # fmt: skip
    rows = [row for _, row in sorted(rows, key=lambda item: item[0])]
    table = pa.table({
        "episode_id": pa.array([row["episode_id"] for row in rows]),
        "turn": pa.array([row["turn"] for row in rows], pa.int32()),
        "group_id": pa.array([row["group_id"] for row in rows]),
        "state": pa.array([row["state"] for row in rows]),
        "step_score": pa.array([row["step_score"] for row in rows], pa.float32()),
        "rewards": pa.array([row["rewards"] for row in rows], pa.list_(pa.float32())),
        "loss_mask": pa.array([row["loss_mask"] for row in rows], pa.list_(pa.int8())),
        "terminal_reward": pa.array([row["terminal_reward"] for row in rows], pa.float32()),
        "response_length": pa.array([row["response_length"] for row in rows], pa.int64()),
    })  # fmt: skip
    pq.write_table(table, path, compression="zstd")
    print(f"{path}: {table.num_rows} turn rows, {len(set(table.column('episode_id').to_pylist()))} episodes")


def write_critic_free(path: Path, prompts: int = 8, group_size: int = 4) -> None:
    """The critic-free sample: agentic rollouts without values, grouped by prompt."""
    workload = agentic(
        num_samples=prompts * group_size,
        seed=300,
        median_length=400,
        max_length=2_000,
        turn=(30, 200),
        observation=(10, 200),
        masked_tail_share=0.15,
        fully_masked_share=0.03,
    )
    table = workload_table(workload, rollout_id=3)
    rng = np.random.default_rng(301)
    solve_rate = rng.uniform(0.2, 0.8, prompts)
    solve_rate[:2] = (1.0, 0.0)  # one prompt always solved, one never: their groups give exactly 0
    correct = rng.random((prompts, group_size)) < solve_rate[:, None]
    rewards = table.column("rewards").combine_chunks()
    zeros = pa.ListArray.from_arrays(rewards.offsets, pa.array(np.zeros(len(rewards.values), np.float32)))
    table = (
        table.drop_columns(["values"])
        .set_column(table.schema.get_field_index("rewards") - 1, "rewards", zeros)
        .set_column(
            table.schema.get_field_index("terminal_reward") - 1,
            "terminal_reward",
            pa.array(correct.reshape(-1).astype(np.float32)),
        )
        .append_column("prompt_id", pa.array([f"q{i // group_size:03d}" for i in range(table.num_rows)]))
        .append_column("step", pa.array(np.zeros(table.num_rows, np.int64)))
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    print(f"{path}: {table.num_rows} rows, {len(set(table.column('prompt_id').to_pylist()))} prompts")


if __name__ == "__main__":
    main(*sys.argv[1:])
