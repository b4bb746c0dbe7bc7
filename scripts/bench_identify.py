"""Benchmark of ``gae identify`` beside ``gae diff --baseline all`` on the same file, as whole processes.

    python scripts/bench_identify.py [--rows 1000000] [--repeat 3] [--data bench_data]

Generates (once, cached under ``--data``) a file of ``--rows`` single-turn rows of 8–120
tokens (bench_e2e.py's ``short`` rows: float32 values, a masked tail on 10 % of rows) with a
stored ``advantages`` column: verl's profile (γ = 1, λ = 0.95) whitened over the batch,
computed by gaecli in numpy. Then times, interleaved ``--repeat`` times: ``gae identify``
(which reads the first 4,096 rows: its default sample), ``gae identify --sample-rows 65536``,
and ``gae diff --baseline all`` (seven profiles, every row), and prints the medians and each
identify's ratio to the diff (the goal: at most 3). Each command runs once untimed first (its
kernels compiled and cached, the file in the page cache).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GOAL = 3.0


def _stored_chunk(start: int, rows: int):
    """bench_e2e's short rows with verl's advantages (γ = 1, λ = 0.95) before whitening."""
    import numpy as np
    import pyarrow as pa
    from bench_e2e import short_rows_table

    from gaecli.advantages.dispatch import gae_flat

    table = short_rows_table(start, rows)
    mask = table.column("loss_mask").combine_chunks()
    offsets = np.asarray(mask.offsets, dtype=np.int64)

    def flat(name):
        return np.asarray(table.column(name).combine_chunks().values, dtype=np.float64)

    trainable = flat("loss_mask") != 0
    terminal = np.asarray(table.column("terminal_reward"), dtype=np.float64)
    advantages, _ = gae_flat(
        flat("values"), flat("rewards"), trainable, offsets, terminal, gamma=1.0, lambd=0.95, semantics="verl"
    )
    column = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(advantages, pa.float64()))
    return table.append_column("advantages", column)


def make_file(path: Path, rows: int) -> None:
    """The benchmark file: the raw advantages written, then whitened over every trainable token."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from bench_e2e import write_chunks

    if path.exists():
        return
    raw = path.with_suffix(".raw.parquet")
    write_chunks(raw, rows, 65_536, _stored_chunk)
    total = count = 0.0
    square = 0.0
    parquet = pq.ParquetFile(raw)
    for batch in parquet.iter_batches(columns=["advantages", "loss_mask"]):
        values = np.asarray(batch.column(0).values, dtype=np.float64)
        trainable = np.asarray(batch.column(1).values) != 0
        total += values[trainable].sum()
        square += (values[trainable] ** 2).sum()
        count += trainable.sum()
    mean = total / count
    std = np.sqrt((square - count * mean * mean) / (count - 1) + 1e-8)
    writer = None
    for batch in parquet.iter_batches(batch_size=65_536):
        column = batch.column("advantages")
        whitened = (np.asarray(column.values, dtype=np.float64) - mean) / std
        batch = batch.set_column(
            batch.schema.get_field_index("advantages"),
            "advantages",
            pa.ListArray.from_arrays(column.offsets, pa.array(whitened.astype(np.float32))),
        )
        if writer is None:
            writer = pq.ParquetWriter(path, batch.schema, compression="zstd")
        writer.write_batch(batch, row_group_size=65_536)
    writer.close()
    raw.unlink()


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench_data"))
    arguments = parser.parse_args()
    path = arguments.data / f"identify_{arguments.rows}.parquet"
    make_file(path, arguments.rows)
    gae = [sys.executable, "-m", "gaecli"]
    commands = {
        "gae identify": [*gae, "identify", str(path), "--quiet"],
        "gae identify --sample-rows 65536": [*gae, "identify", str(path), "--sample-rows", "65536", "--quiet"],
        "gae diff --baseline all": [
            *gae, "diff", str(path), "--baseline", "all", "--gamma", "1", "--lambd", "0.95", "--quiet",
        ],  # fmt: skip
    }
    for command in commands.values():
        timed(command)
    times = {name: [] for name in commands}
    for _ in range(arguments.repeat):
        for name, command in commands.items():
            times[name].append(timed(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    diff = medians["gae diff --baseline all"]
    print(f"{arguments.rows:,} rows, median of {arguments.repeat} runs; ratio = command / gae diff --baseline all")
    print(f"| {'command':<34} | {'seconds':>8} | {'ratio':>6} | {'goal':>5} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 8}|{'-' * 7}|")
    for name, median in medians.items():
        goal = f"≤ {GOAL:g}" if name.startswith("gae identify") else ""
        print(f"| {name:<34} | {median:8.2f} | {median / diff:6.2f} | {goal:>5} |")


if __name__ == "__main__":
    main()
