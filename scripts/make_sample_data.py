"""Write the small, realistic rollout files of ``sample_data/`` (seeded, reproducible).

    python scripts/make_sample_data.py sample_data

- ``agentic/step_0000.parquet``, ``agentic/step_0001.parquet``: multi-turn tool-use
  rollouts, observation blocks masked, KL rewards at every position, about 10 % masked
  tails and one fully masked sample per file; the response lengths are a fifth of the
  benchmark's so the files stay small;
- ``single_turn.parquet``: single-turn rows, every token trainable, bool masks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_files import workload_table  # noqa: E402
from workloads import Workload, agentic, single_turn  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def shrink(workload: Workload, factor: int) -> Workload:
    """Every sample cut to its first ``1/factor`` tokens (at least 8), mask kept; a sample
    that ended in a masked tail keeps one."""
    lengths = np.maximum(workload.lengths // factor, np.minimum(workload.lengths, 8))
    starts = workload.offsets[:-1]
    positions = np.arange(workload.num_tokens) - np.repeat(starts, workload.lengths)
    keep = positions < np.repeat(lengths, workload.lengths)
    mask = workload.loss_mask[keep]
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Samples whose original ended masked end masked here too: mask their last 1–40 tokens.
    ended_masked = ~workload.loss_mask[workload.offsets[1:] - 1]
    tail = np.minimum(np.maximum(lengths // 10, 1), 40)
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    in_tail = position >= np.repeat(lengths - tail, lengths)
    mask = mask & ~(in_tail & np.repeat(ended_masked, lengths))
    return Workload(workload.name, workload.values[keep], workload.rewards[keep], mask, offsets, workload.terminal_rewards)


def main(out_dir: str = "sample_data") -> None:
    root = Path(out_dir)
    for step in range(2):
        workload = shrink(agentic(num_samples=40, seed=100 + step), 5)
        table = workload_table(workload, rollout_id=step)
        path = root / "agentic" / f"step_{step:04d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=16, compression="zstd")
        print(f"{path}: {table.num_rows} rows, {int(workload.offsets[-1]):,} tokens")
    table = workload_table(shrink(single_turn(num_samples=24, seed=7), 8), rollout_id=2, mask_type=pa.bool_())
    path = root / "single_turn.parquet"
    pq.write_table(table, path, compression="zstd")
    print(f"{path}: {table.num_rows} rows")


if __name__ == "__main__":
    main(*sys.argv[1:])
