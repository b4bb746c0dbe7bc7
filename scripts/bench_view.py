"""How fast ``gae view`` answers on a generated run: the time from the command's start to its run
page (the file list and the footers' counts), a sample page's latency (row groups read cold and
warm, while the step figures are computed in the background), and with ``--normalize`` the
whole-run pass first, then the sample latency after it. Prints one table.

    python scripts/bench_view.py [--files 50] [--rows 2000] [--length 2048] [--samples 20] [--keep DIR]

The issue's figures: a run page ≤ 2 s after start, a sample page ≤ 300 ms (after the whole-run
pass where one is needed). The default run is 50 files of about 40 MB (row groups of at most
64 MB); ``--rows 10000`` makes them about 200 MB."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def write_step(path: Path, rows: int, length: int, seed: int) -> None:
    """One step: ``rows`` samples of about ``length`` tokens (float32 values and rewards,
    alternating trainable and masked blocks), row groups of at most 64 MB."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 2, length * 3 // 2, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = int(offsets[-1])
    position = np.arange(tokens) - np.repeat(offsets[:-1], lengths)
    mask = ((position // 96) % 2 == 0).astype(np.int8)
    values = pa.ListArray.from_arrays(offsets, rng.normal(0, 1, tokens).astype(np.float32))
    rewards = pa.ListArray.from_arrays(offsets, rng.normal(0, 0.05, tokens).astype(np.float32))
    table = pa.table(
        {
            "prompt_id": np.arange(rows) // 8,
            "values": values,
            "rewards": rewards,
            "loss_mask": pa.ListArray.from_arrays(offsets, mask),
            "terminal_reward": rng.choice([0.0, 1.0], rows),
        }
    )
    bytes_per_row = max(1, table.nbytes // rows)
    pq.write_table(table, path, row_group_size=max(1, (64 << 20) // bytes_per_row))


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return json.loads(answer.read())


def start(inputs: Path, *options: str) -> tuple[subprocess.Popen, str, float]:
    """``gae view`` started on a free port: the process, its URL, and the seconds from its start
    to its first run page with every file listed."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gaecli", "view", str(inputs), "--port", "0", *options],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    while not any(line.startswith("gae view: http") for line in lines):
        if process.poll() is not None:
            raise SystemExit("gae view stopped: " + "".join(lines))
        time.sleep(0.005)
    url = next(line for line in lines if line.startswith("gae view: http")).split()[2]
    while True:
        try:
            run = get(url + "api/run")
            if all(entry["rows"] is not None for entry in run["files"]):
                return process, url, time.perf_counter() - began
        except OSError:
            time.sleep(0.005)


def sample_latencies(url: str, files: int, rows: int, count: int, seed: int) -> list[float]:
    """Seconds per sample page of ``count`` random samples (each file's row groups read cold
    first, then a neighbour of each, warm), the page waited for until it is ready."""
    rng = np.random.default_rng(seed)
    picks = [(int(rng.integers(files)), int(rng.integers(rows))) for _ in range(count)]
    picks += [(step, min(row + 1, rows - 1)) for step, row in picks]
    latencies = []
    for step, row in picks:
        began = time.perf_counter()
        while not get(f"{url}api/sample/{step}/{row}").get("ready"):
            pass
        latencies.append(time.perf_counter() - began)
    return latencies


def wait_statistics(url: str) -> float:
    began = time.perf_counter()
    while get(url + "api/run")["progress"]["phase"] in ("statistics", "scores", "view"):
        time.sleep(0.05)
    return time.perf_counter() - began


def latency_rows(name: str, latencies: list[float]) -> list[tuple[str, float, float]]:
    """The median, 95th percentile and largest of ``latencies``, each against the 300 ms limit."""
    return [
        (f"{name}, median", float(np.median(latencies)), 0.3),
        (f"{name}, p95", float(np.percentile(latencies, 95)), 0.3),
        (f"{name}, max", float(max(latencies)), 0.3),
    ]


def stop(process: subprocess.Popen) -> None:
    process.send_signal(2)
    process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    arguments = parser.parse_args()
    folder = arguments.keep or Path(tempfile.mkdtemp(prefix="bench_view_"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"step_{step:04d}.parquet" for step in range(arguments.files)]
    for step, path in enumerate(paths):
        if not path.exists():
            write_step(path, arguments.rows, arguments.length, step)
    size = sum(os.path.getsize(path) for path in paths) / arguments.files / 1e6
    print(f"run: {arguments.files} files of {size:.0f} MB, {arguments.rows} rows of ~{arguments.length} tokens")
    rows = []
    gae = ("--gamma", "1", "--lambd", "0.95")
    process, url, run_page = start(folder, *gae)
    try:
        latencies = sample_latencies(url, arguments.files, arguments.rows, arguments.samples, 1)
    finally:
        stop(process)
    rows.append(("run page after start", run_page, 2.0))
    rows += latency_rows("sample page", latencies)
    process, url, run_page = start(folder, *gae, "--normalize")
    try:
        whole = wait_statistics(url)
        latencies = sample_latencies(url, arguments.files, arguments.rows, arguments.samples, 2)
    finally:
        stop(process)
    rows.append(("--normalize: run page after start", run_page, 2.0))
    rows.append(("--normalize: whole-run pass", whole, None))
    rows += latency_rows("--normalize: sample page", latencies)
    print(f"{'measure':<36} {'seconds':>9} {'limit':>7} {'ratio':>7}")
    for name, seconds, limit in rows:
        ratio = "" if limit is None else f"{seconds / limit:7.2f}"
        print(f"{name:<36} {seconds:9.3f} {'' if limit is None else f'{limit:7.1f}':>7} {ratio:>7}")
    over = [name for name, seconds, limit in rows if limit is not None and seconds > limit]
    print("all within their limits" if not over else "over the limit: " + ", ".join(over))
    raise SystemExit(1 if over else 0)


if __name__ == "__main__":
    main()
