"""Synthetic rollout Parquet files in gaecli's format, built from the seeded workloads of
``workloads.py``: used by ``make_sample_data.py`` and the end-to-end benchmarks.

Columns: ``sample_id`` (string), ``rollout_id`` (int64), ``prompt`` (string), ``values``,
``rewards`` (list<float32>), ``loss_mask`` (list<int8>, or list<bool>), ``terminal_reward``
(float32), ``response_length`` (int64) and a ``meta`` struct passed through untouched.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import Workload, make_workload  # noqa: E402


def workload_table(
    workload: Workload, rollout_id: int, *, mask_type: pa.DataType = pa.int8(), large_lists: bool = False
) -> pa.Table:
    """One row per sample of ``workload``, list columns sharing its offsets."""
    batch = workload.num_samples
    list_class = pa.LargeListArray if large_lists else pa.ListArray
    offsets = pa.array(workload.offsets, pa.int64() if large_lists else pa.int32())

    def as_list(flat: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
        return list_class.from_arrays(offsets, pa.array(flat, arrow_type))

    lengths = workload.lengths
    trainable = workload.trainable_lengths
    index = np.arange(batch)
    sample_ids = pa.array(
        [f"r{rollout_id:04d}-s{i:05d}" for i in index]
    )  # string ids: a loop over rows, data generation only
    prompts = pa.array([f"task {i % 97}: use the tools to answer question {i}" for i in index])
    meta = pa.StructArray.from_arrays(
        [
            pa.array(np.where(trainable == lengths, 1, 1 + (lengths - trainable) // 200), pa.int32()),
            pa.array(["search" if i % 3 else "python" for i in index]),
        ],
        names=["turns", "tool"],
    )
    return pa.table(
        {
            "sample_id": sample_ids,
            "rollout_id": pa.array(np.full(batch, rollout_id), pa.int64()),
            "prompt": prompts,
            "values": as_list(workload.values, pa.float32()),
            "rewards": as_list(workload.rewards, pa.float32()),
            "loss_mask": as_list(
                workload.loss_mask.astype(np.int8) if mask_type != pa.bool_() else workload.loss_mask, mask_type
            ),
            "terminal_reward": pa.array(workload.terminal_rewards, pa.float32()),
            "response_length": pa.array(lengths, pa.int64()),
            "meta": meta,
        },
        metadata={"producer": "gaecli synthetic rollouts", "workload": workload.name},
    )


def write_rollout_file(
    path: Path,
    workload_name: str,
    num_samples: int,
    seed: int,
    rollout_id: int,
    *,
    row_group_size: int = 1024,
    compression: str = "zstd",
    **table_options,
) -> pa.Table:
    """Generate and write one file; returns its table."""
    table = workload_table(make_workload(workload_name, num_samples, seed), rollout_id, **table_options)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, compression=compression)
    return table
