"""End-to-end benchmark: whole ``gae`` processes against the copy limit, side by side.

    python scripts/bench_e2e.py [--rows 16000] [--small-rows 4000] [--data bench_data] [--scale 1.0]
                                [--files small,large,short,groups]

Generates (once, cached under ``--data``) a zstd rollout file of ``--rows`` agentic
rollouts (~70 M tokens at 16,000 rows) and a smaller one (~18 M tokens), a many-short-rows
file (1,000,000 single-turn rows of 8–120 tokens, ~64 M tokens) and a million-group file
(2,000,000 rows of 2–8 tokens, a ``prompt_uid`` string column with 1,000,000 groups of two
consecutive rows, GRPO-style); ``--scale`` multiplies every row count (a quicker run on a
busy machine). Then times, each as its own process:

- copy limit: a pyarrow script that reads the file whole, appends two list<float32>
  columns of the values' shape and writes it with the same codec;
- ``gae recompute`` (γ = 1, λ = 0.95);
- ``gae validate`` against a plain pyarrow read of the file (when the command exists);
- ``gae diff`` against ``gae recompute`` (when the command exists);
- ``gae --help`` start-up;
- on the short-rows file, ``gae recompute`` and ``gae recompute --normalize`` against the
  copy limit;
- on the million-group file, ``gae recompute --normalize-by prompt_uid`` against ``gae
  recompute --normalize``, and ``gae diff --group-by prompt_uid --json F`` (its peak RSS).

Prints wall time, peak RSS (of that process and its children) and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

COPY_LIMIT = r"""
import sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
source, target = sys.argv[1], sys.argv[2]
codec = pq.ParquetFile(source).metadata.row_group(0).column(0).compression.lower()
table = pq.read_table(source)
values = table.column("values").combine_chunks()
flat = values.values.to_numpy()
for name in ("advantages", "returns"):
    column = pa.ListArray.from_arrays(values.offsets, pa.array(flat + np.float32(1.0)))
    table = table.append_column(name, column)
pq.write_table(table, target, compression=codec)
"""

READ_ONLY = r"""
import sys
import pyarrow.parquet as pq
pq.read_table(sys.argv[1])
"""


def make_file(path: Path, rows: int, seed: int) -> None:
    """Write ``rows`` agentic rollouts in chunks of 1,024 rows (bounded memory)."""
    import pyarrow.parquet as pq

    from rollout_files import workload_table
    from workloads import agentic

    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    writer = None
    for chunk, start in enumerate(range(0, rows, 1024)):
        table = workload_table(agentic(num_samples=min(1024, rows - start), seed=seed * 1000 + chunk), rollout_id=chunk)
        if writer is None:
            writer = pq.ParquetWriter(temp, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=1024)
    writer.close()
    temp.rename(path)


def write_chunks(path: Path, rows: int, chunk_rows: int, make_chunk) -> None:
    """Write ``make_chunk(start, rows)`` tables of ``chunk_rows`` rows (bounded memory)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    writer = None
    for start in range(0, rows, chunk_rows):
        table = make_chunk(start, min(chunk_rows, rows - start))
        if writer is None:
            writer = pq.ParquetWriter(temp, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=chunk_rows)
    writer.close()
    temp.rename(path)


def short_rows_table(start: int, rows: int, shortest: int, longest: int, group_rows: int = 0):
    """``rows`` single-turn rows of ``shortest``–``longest`` tokens (vectorised): float32
    values and rewards, an int8 mask trainable but for a masked tail on 10 % of rows (the
    first token always trainable), float32 terminal rewards; with ``group_rows`` a
    ``prompt_uid`` string column, one value per ``group_rows`` consecutive rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(start + 17)
    lengths = rng.integers(shortest, longest + 1, rows)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = int(offsets[-1])
    position = np.arange(tokens) - np.repeat(offsets[:-1], lengths)
    tail = np.where(rng.random(rows) < 0.1, rng.integers(1, shortest, rows), 0)
    mask = (position < np.repeat(lengths - tail, lengths)).astype(np.int8)

    def as_list(flat, arrow_type):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, arrow_type))

    columns = {
        "values": as_list(rng.normal(size=tokens).astype(np.float32), pa.float32()),
        "rewards": as_list(np.zeros(tokens, np.float32), pa.float32()),
        "loss_mask": as_list(mask, pa.int8()),
        "terminal_reward": pa.array(rng.normal(size=rows).astype(np.float32), pa.float32()),
        "response_length": pa.array(lengths, pa.int64()),
    }
    if group_rows:
        uids = pa.array((start + np.arange(rows)) // group_rows, pa.int64()).cast(pa.string())
        columns["prompt_uid"] = pc.binary_join_element_wise("uid-", uids, "")
    return pa.table(columns)


def run(command: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MB (the process tree's largest), exit code."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.stderr.write(process.stderr.read().decode())
    return elapsed, usage.ru_maxrss / 1024.0, process.returncode


def best_of(repeat: int, command: list[str]) -> tuple[float, float]:
    times, peaks = [], []
    for _ in range(repeat):
        elapsed, peak, code = run(command)
        if code != 0:
            raise SystemExit(f"command failed ({code}): {' '.join(command)}")
        times.append(elapsed)
        peaks.append(peak)
    return min(times), max(peaks)


def tokens_of(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(sum(pq.read_table(path, columns=["response_length"]).column("response_length").to_numpy()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_000)
    parser.add_argument("--small-rows", type=int, default=4_000)
    parser.add_argument("--short-rows", type=int, default=1_000_000)
    parser.add_argument("--group-rows", type=int, default=2_000_000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every file's row count")
    parser.add_argument("--files", default="small,large,short,groups", help="which files to run, comma-separated")
    parser.add_argument("--data", default="bench_data")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    gae = str(Path(sys.executable).with_name("gae"))
    data = Path(args.data)
    scaled = lambda rows: max(int(rows * args.scale), 2)  # noqa: E731
    counts = {
        "small": scaled(args.small_rows),
        "large": scaled(args.rows),
        "short": scaled(args.short_rows),
        "groups": scaled(args.group_rows),
    }
    names = {"small": "agentic", "large": "agentic", "short": "short_rows", "groups": "million_groups"}
    wanted = [label for label in args.files.split(",") if label]
    files = {label: data / f"{names[label]}_{counts[label]}.parquet" for label in wanted}
    for label, path in files.items():
        if not path.exists():
            print(f"generating {path} ...", flush=True)
            if label in ("small", "large"):
                make_file(path, counts[label], seed=1 if label == "large" else 2)
            elif label == "short":
                write_chunks(path, counts[label], 65_536, lambda start, rows: short_rows_table(start, rows, 8, 120))
            else:
                write_chunks(path, counts[label], 65_536, lambda start, rows: short_rows_table(start, rows, 2, 8, 2))

    has = {
        name: subprocess.run([gae, name, "--help"], capture_output=True).returncode == 0
        for name in ("validate", "diff")
    }
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, scale {args.scale}")
    rows = []
    with tempfile.TemporaryDirectory(dir=data) as scratch:
        out = Path(scratch)
        for label, path in files.items():
            tokens = tokens_of(path)
            size_mb = path.stat().st_size / 1e6
            title = f"{label}: {tokens / 1e6:.1f} M tokens, {size_mb:.0f} MB"
            recompute = [
                gae,
                "recompute",
                str(path),
                "-o",
                str(out / "gae.parquet"),
                "--gamma",
                "1",
                "--lambd",
                "0.95",
                "--overwrite",
                "--quiet",
            ]
            if label == "groups":
                normalize_time, normalize_rss = best_of(args.repeat, [*recompute, "--normalize"])
                by_time, by_rss = best_of(args.repeat, [*recompute, "--normalize-by", "prompt_uid"])
                rows.append((title, "gae recompute --normalize", normalize_time, normalize_rss, None))
                rows.append(("", "gae recompute --normalize-by prompt_uid", by_time, by_rss, by_time / normalize_time))
                if has["diff"]:
                    group_diff = [gae, "diff", str(path), "--gamma", "1", "--lambd", "0.95", "--quiet"]
                    group_diff += ["--group-by", "prompt_uid", "--json", str(out / "diff.json")]
                    diff_time, diff_rss = best_of(args.repeat, group_diff)
                    rows.append(("", "gae diff --group-by prompt_uid --json F", diff_time, diff_rss, None))
                continue
            copy_time, copy_rss = best_of(
                args.repeat, [sys.executable, "-c", COPY_LIMIT, str(path), str(out / "copy.parquet")]
            )
            gae_time, gae_rss = best_of(args.repeat, recompute)
            rows.append((title, "copy limit (read, append 2 cols, write)", copy_time, copy_rss, None))
            rows.append(("", "gae recompute", gae_time, gae_rss, gae_time / copy_time))
            if label == "short":
                normalize_time, normalize_rss = best_of(args.repeat, [*recompute, "--normalize"])
                rows.append(
                    ("", "gae recompute --normalize", normalize_time, normalize_rss, normalize_time / copy_time)
                )
                continue
            if has["validate"]:
                read_time, read_rss = best_of(args.repeat, [sys.executable, "-c", READ_ONLY, str(path)])
                validate_time, validate_rss = best_of(args.repeat, [gae, "validate", str(path), "--quiet"])
                rows.append(("", "pyarrow read", read_time, read_rss, None))
                rows.append(("", "gae validate (vs read)", validate_time, validate_rss, validate_time / read_time))
            if has["diff"]:
                diff_time, diff_rss = best_of(
                    args.repeat, [gae, "diff", str(path), "--gamma", "1", "--lambd", "0.95", "--quiet"]
                )
                rows.append(("", "gae diff (vs recompute)", diff_time, diff_rss, diff_time / gae_time))
        help_time, help_rss = best_of(5, [gae, "--help"])
        rows.append(("start-up", "gae --help", help_time, help_rss, None))
        shutil.rmtree(out, ignore_errors=True)

    print(f"{'file':<34} {'process':<40} {'wall s':>8} {'peak RSS MB':>12} {'ratio':>7}")
    for file_label, process, seconds, rss, ratio in rows:
        ratio_text = f"{ratio:.2f}x" if ratio is not None else ""
        print(f"{file_label:<34} {process:<40} {seconds:>8.2f} {rss:>12.0f} {ratio_text:>7}")
    print(
        "targets: recompute <= 0.76x copy limit and peak RSS <= 512 MB on the large file; "
        "short rows: recompute <= 1.0x, --normalize <= 1.3x copy limit; "
        "million groups: --normalize-by <= 2x --normalize and peak RSS <= 1 GB, diff --group-by peak RSS <= 1 GB; "
        "validate <= 2x read; diff <= 2x recompute; gae --help <= 0.5 s"
    )


if __name__ == "__main__":
    main()
