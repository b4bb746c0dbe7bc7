"""Write the small, realistic rollout files of ``sample_data/`` (seeded, reproducible).

    python scripts/make_sample_data.py sample_data

- ``agentic/step_0000.parquet``, ``agentic/step_0001.parquet``: multi-turn tool-use
  rollouts, turns of 30–250 tokens between masked observation blocks of 10–400, KL
  rewards at every position, 15 % masked tails and one fully masked sample per file
  (shorter responses than the benchmark's, so the files stay small);
- ``single_turn.parquet``: single-turn rows, every token trainable, bool masks.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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


if __name__ == "__main__":
    main(*sys.argv[1:])
