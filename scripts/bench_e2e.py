"""End-to-end benchmark: whole ``gae`` processes against the copy limit, side by side.

    python scripts/bench_e2e.py [--rows 16000] [--small-rows 4000] [--data bench_data]

Generates (once, cached under ``--data``) a zstd rollout file of ``--rows`` agentic
rollouts (~70 M tokens at 16,000 rows) and a smaller one (~18 M tokens), then times, each
as its own process:

- copy limit: a pyarrow script that reads the file whole, appends two list<float32>
  columns of the values' shape and writes it with the same codec;
- ``gae recompute`` (γ = 1, λ = 0.95);
- ``gae validate`` against a plain pyarrow read of the file (when the command exists);
- ``gae diff`` against ``gae recompute`` (when the command exists);
- ``gae --help`` start-up.

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
    parser.add_argument("--data", default="bench_data")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    gae = str(Path(sys.executable).with_name("gae"))
    data = Path(args.data)
    files = {"small": data / f"agentic_{args.small_rows}.parquet", "large": data / f"agentic_{args.rows}.parquet"}
    for label, path in files.items():
        if not path.exists():
            print(f"generating {path} ...", flush=True)
            make_file(path, args.rows if label == "large" else args.small_rows, seed=1 if label == "large" else 2)

    has = {name: subprocess.run([gae, name, "--help"], capture_output=True).returncode == 0 for name in ("validate", "diff")}
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    rows = []
    with tempfile.TemporaryDirectory(dir=data) as scratch:
        out = Path(scratch)
        for label, path in files.items():
            tokens = tokens_of(path)
            size_mb = path.stat().st_size / 1e6
            copy_time, copy_rss = best_of(args.repeat, [sys.executable, "-c", COPY_LIMIT, str(path), str(out / "copy.parquet")])
            recompute = [gae, "recompute", str(path), "-o", str(out / "gae.parquet"), "--gamma", "1", "--lambd", "0.95", "--overwrite", "--quiet"]
            gae_time, gae_rss = best_of(args.repeat, recompute)
            rows.append((f"{label}: {tokens / 1e6:.1f} M tokens, {size_mb:.0f} MB", "copy limit (read, append 2 cols, write)", copy_time, copy_rss, None))
            rows.append(("", "gae recompute", gae_time, gae_rss, gae_time / copy_time))
            if has["validate"]:
                read_time, read_rss = best_of(args.repeat, [sys.executable, "-c", READ_ONLY, str(path)])
                validate_time, validate_rss = best_of(args.repeat, [gae, "validate", str(path), "--quiet"])
                rows.append(("", "pyarrow read", read_time, read_rss, None))
                rows.append(("", "gae validate (vs read)", validate_time, validate_rss, validate_time / read_time))
            if has["diff"]:
                diff_time, diff_rss = best_of(args.repeat, [gae, "diff", str(path), "--gamma", "1", "--lambd", "0.95", "--quiet"])
                rows.append(("", "gae diff (vs recompute)", diff_time, diff_rss, diff_time / gae_time))
        help_time, help_rss = best_of(5, [gae, "--help"])
        rows.append(("start-up", "gae --help", help_time, help_rss, None))
        shutil.rmtree(out, ignore_errors=True)

    print(f"{'file':<34} {'process':<40} {'wall s':>8} {'peak RSS MB':>12} {'ratio':>7}")
    for file_label, process, seconds, rss, ratio in rows:
        ratio_text = f"{ratio:.2f}x" if ratio is not None else ""
        print(f"{file_label:<34} {process:<40} {seconds:>8.2f} {rss:>12.0f} {ratio_text:>7}")
    print("floors: recompute <= 1.5x copy limit and peak RSS <= 1 GB on the large file; "
          "validate <= 2x read; diff <= 2x recompute; gae --help <= 0.5 s")


if __name__ == "__main__":
    main()
