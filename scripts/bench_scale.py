"""Scale-out benchmark: ``gae recompute`` over 8 files with 1 and 2 local workers and with
Ray on 2 CPUs, each a whole process, in one run.

    python scripts/bench_scale.py [--files 8] [--rows 1000] [--data bench_data/scale] [--repeat 1]

Generates (once, cached under ``--data``) ``--files`` zstd rollout files of ``--rows``
agentic rollouts each, then times ``gae recompute DIR -o OUT --gamma 1 --lambd 0.95`` with
``--workers 1``, ``--workers 2``, ``--workers 1`` pinned to one core, and ``--engine ray
--workers 2`` (Ray started by the command, as a user would run it; its start-up is part of
the time). Prints wall times, CPU time, the peak RSS of the largest process (the CLI or one
of its workers), the 1-worker / 2-worker ratio (each free to use every core),
the per-core scaling (one worker on one core against two workers on two) and Ray's time
against 2 local workers, and checks that every run wrote bitwise-equal advantages and
returns (by their SHA-256).
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


def make_data(directory: Path, files: int, rows: int) -> list[Path]:
    from rollout_files import write_rollout_file

    paths = [directory / f"rollouts-{index:02d}.parquet" for index in range(files)]
    for index, path in enumerate(paths):
        if not path.exists():
            write_rollout_file(path, "agentic", rows, seed=100 + index, rollout_id=index)
    return paths


def timed(command: list[str], cores: int | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system of the command and the processes it waited
    for: its workers; not Ray's daemons and workers) and the peak RSS in MB of the largest
    of those processes. ``cores``: run the command (and its children) on that many cores,
    with ``taskset``. Run it from a small process (see ``main``): Linux counts the memory of
    the process that forks a command in the command's peak RSS."""
    if cores is not None:
        command = ["taskset", "-c", f"0-{cores - 1}", *command]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: no buffer held here
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"failed ({process.returncode}): {' '.join(command)}\n{errors.read().decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def output_digests(directory: Path) -> dict:
    """SHA-256 of every output's advantages and returns bytes (digests, not the bytes: this
    process stays small, so the commands it forks do not inherit a large peak RSS)."""
    import hashlib

    import pyarrow.parquet as pq

    found = {}
    for path in sorted(directory.rglob("*.parquet")):
        table = pq.read_table(path, columns=["advantages", "returns"])
        found[path.relative_to(directory)] = tuple(
            hashlib.sha256(table.column(c).combine_chunks().flatten().to_numpy().tobytes()).hexdigest()
            for c in ("advantages", "returns")
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--data", type=Path, default=Path("bench_data/scale"))
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (the best is kept)")
    args = parser.parse_args()

    data = args.data / f"{args.files}x{args.rows}"
    paths = make_data(data, args.files, args.rows)
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(p).num_rows for p in paths)
    size = sum(p.stat().st_size for p in paths)
    gae = [sys.executable, "-m", "gaecli"]
    # (name, options, cores the process may use: None = all)
    configurations = [
        ("local, 1 worker", ["--workers", "1"], None),
        ("local, 2 workers", ["--workers", "2"], None),
        ("local, 1 worker, 1 core", ["--workers", "1"], 1),
        ("ray, 2 CPUs", ["--engine", "ray", "--workers", "2"], None),
    ]
    try:
        import ray  # noqa: F401
    except ImportError:
        configurations.pop()
        print("ray is not installed: pip install 'gaecli[ray]' to include it")
    print(f"{args.files} files, {rows:,} rows, {size / 1e6:,.1f} MB zstd, agentic workload; {os.cpu_count()} cores")
    times, cpus, peaks, outputs = {}, {}, {}, {}
    # Commands start from a fresh, small process: started from this one (which reads the
    # outputs back) they would inherit its peak RSS.
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    launcher = ProcessPoolExecutor(1, mp_context=get_context("spawn"))
    with launcher, tempfile.TemporaryDirectory(prefix="gae-bench-scale-") as scratch:
        for name, options, cores in configurations:
            best = (float("inf"), 0.0, 0.0)
            for attempt in range(args.repeat):
                out = Path(scratch) / f"out-{len(times)}-{attempt}"
                command = [
                    *gae,
                    "recompute",
                    str(data),
                    "-o",
                    str(out),
                    "--gamma",
                    "1",
                    "--lambd",
                    "0.95",
                    "--quiet",
                    *options,
                ]
                best = min(best, launcher.submit(timed, command, cores).result())
                outputs[name] = output_digests(out)
                shutil.rmtree(out)
            times[name], cpus[name], peaks[name] = best
    print(f"{'configuration':<24} {'wall s':>8} {'CPU s':>7} {'cores busy':>10} {'rows/s':>8} {'peak RSS MB':>11}")
    for name, seconds in times.items():
        # Ray's processes are not the command's children (and some are forked from it)
        peak = "-" if name.startswith("ray") else f"{peaks[name]:,.0f}"
        print(
            f"{name:<24} {seconds:>8.2f} {cpus[name]:>7.2f} {cpus[name] / seconds:>10.2f} "
            f"{rows / seconds:>8,.0f} {peak:>11}"
        )
    one, two, pinned = times["local, 1 worker"], times["local, 2 workers"], times["local, 1 worker, 1 core"]
    print(
        f"speed-up 1 worker / 2 workers: {one / two:.2f}x (aim >= 1.7x); one worker already keeps "
        f"{cpus['local, 1 worker'] / one:.2f} cores busy (reading, the kernel's threads and the background "
        f"writer overlap), so {os.cpu_count()} cores allow at most "
        f"{os.cpu_count() * one / cpus['local, 1 worker']:.2f}x"
    )
    print(f"per-core scaling, 1 worker on 1 core / 2 workers on 2 cores: {pinned / two:.2f}x")
    if "ray, 2 CPUs" in times:
        ray_time = times["ray, 2 CPUs"]
        print(f"ray / local 2 workers: {ray_time / two:.2f}x ({ray_time - two:+.2f} s, Ray start-up included)")
    reference = outputs["local, 1 worker"]
    same = all(other == reference for other in outputs.values())
    print(f"advantages and returns bitwise equal across configurations: {same}")


if __name__ == "__main__":
    main()
