"""Benchmark of the masked-GAE kernels on the synthetic workloads: best-of-N wall time,
tokens per second and the speed-up over the padded ``chunked`` kernel, one table per
workload, all measured in one run; then the fastest kernel's throughput (or the packed
API's into preallocated buffers, when that is faster) as a fraction of this machine's
memory-copy bandwidth.

    python scripts/bench_kernels.py                 # every workload
    python scripts/bench_kernels.py --repeat 20 --workload agentic

Every kernel is called through its public signature, so ``chunked`` and ``vanilla`` include
their compression, padding and scattering. Each kernel is called once before timing (numba
compilation and first-touch effects excluded), then at least ``--repeat`` times and until
``--min-time`` seconds have passed (at most 1,000 calls); the best call counts, which keeps
a busy shared machine from inflating the numbers. The two API rows and the kernel they are
held against (``native``) are timed in turns, call by call, so that a changing load falls on
all three alike; so are the variant rows with plain ``native``. A ceiling over ``native``
is judged on the median of the per-round ratios (each round's call over the ``native``
call of the same round): a ratio of two best calls follows whichever row had one lucky
call (native's best on single-turn once came in at 2.12 ms against its usual 2.96-3.04,
and two ceilings read MISSES on that call alone). Best over best is printed beside it.
The floors against ``chunked`` compare best calls (those rows are timed apart).
``reference`` (a Python loop) is skipped.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gaecli.advantages.kernels import KERNELS, available_kernels  # noqa: E402
from scripts.workloads import GAMMA, LAMBD, WORKLOADS, Workload, make_workload  # noqa: E402

BASELINE = "chunked"
SKIPPED = {"reference"}
# The trainers' own chunked scan applies the intra-chunk decay matrix with one GEMM. The
# project's ``chunked`` kernel uses elementwise doubling passes instead (a GEMM is not batch
# invariant under MKL); this row measures the GEMM form too, so the speed-ups can be read
# against both.
GEMM_BASELINE = "chunked-gemm"
# Speed-up of the fastest kernel over ``chunked`` that this project asks for, per workload.
FLOORS = {"agentic": 10.0, "single-turn": 3.0, "long": 3.0}
# The public API on a list of per-sample float32 tensors (as a trainer passes them), checks
# included: its speed-up over ``chunked`` asked for, per workload, and how much slower than
# the packed kernel alone it may be.
API_ROW = "masked_gae (list API)"
PACKED_API_ROW = "masked_gae_packed (API)"
# The packed API writing into the caller's preallocated buffers (out=), as a trainer reusing
# its buffers calls it: no fresh outputs, so none of their page faults.
PACKED_OUT_ROW = "masked_gae_packed (API, out=)"
API_FLOORS = {"agentic": 15.0, "single-turn": 10.0, "long": 10.0}
API_KERNEL = "native"
API_OVER_KERNEL = 2.0
# The GAE variants on the native kernel (docs/variants.md): each row's time may be at most
# VARIANT_OVER_KERNEL times plain native's.
VARIANT_ROWS = {
    "native, per-sample λ (lambd_alpha)": {"lambd_alpha": 0.05},
    "native, turn mode (timestep turn)": {"timestep": "turn"},
    "native, turn mode + λ_alpha + λ_critic": {"timestep": "turn", "lambd_alpha": 0.05, "lambd_critic": 1.0},
}
VARIANT_OVER_KERNEL = 2.0
MAX_CALLS = 1000


@dataclass(frozen=True)
class Timing:
    best: float  # seconds
    median: float  # seconds
    calls: int
    times: tuple[float, ...] = ()  # every timed call, in order (for calls timed in turns: one per round)


def paired_ratio(timing: Timing, against: Timing) -> float:
    """The median over rounds of ``timing``'s call over ``against``'s call of the same round
    (both timed in turns by :func:`best_of_each`): the two calls of a round ran side by side,
    under the same load, and one lucky call of either row does not move the median."""
    return statistics.median(mine / theirs for mine, theirs in zip(timing.times, against.times, strict=True))


def best_of(call: Callable[[], object], repeat: int, min_time: float) -> Timing:
    """Wall time of ``call`` after one warm-up call: at least ``repeat`` calls, more until
    ``min_time`` seconds have passed (at most MAX_CALLS)."""
    call()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - began < min_time and len(times) < MAX_CALLS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return Timing(min(times), statistics.median(times), len(times))


def best_of_each(calls: dict[str, Callable[[], object]], repeat: int, min_time: float) -> dict[str, Timing]:
    """:func:`best_of` for several calls timed in turns, one call of each per round (after one
    warm-up call each): a shared machine's load falls on them alike, so their ratio holds
    even when the load changes during the run."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    began = time.perf_counter()
    rounds = 0
    while rounds < repeat or (time.perf_counter() - began < min_time and rounds < MAX_CALLS):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
        rounds += 1
    return {
        name: Timing(min(spent), statistics.median(spent), len(spent), tuple(spent)) for name, spent in times.items()
    }


def traffic_bytes(workload: Workload) -> tuple[int, int]:
    """(bytes read, bytes written) by a kernel that touches each input and output once:
    values, rewards, loss_mask, offsets, terminal rewards in; advantages, returns out."""
    read = sum(
        array.nbytes
        for array in (
            workload.values,
            workload.rewards,
            workload.loss_mask,
            workload.offsets,
            workload.terminal_rewards,
        )
    )
    written = 2 * workload.values.nbytes
    return read, written


def copy_time(num_bytes: int, repeat: int, min_time: float) -> tuple[float, str]:
    """Best time of a plain copy of a ``num_bytes`` buffer into a preallocated one: the
    faster of ``numpy.copyto`` (one thread) and ``torch.Tensor.copy_`` (torch's threads)."""
    source = np.random.default_rng(0).integers(0, 256, size=num_bytes, dtype=np.uint8)
    target = np.empty_like(source)
    numpy_best = best_of(lambda: np.copyto(target, source), repeat, min_time).best
    source_tensor, target_tensor = torch.from_numpy(source), torch.from_numpy(target)
    torch_best = best_of(lambda: target_tensor.copy_(source_tensor), repeat, min_time).best
    if torch_best < numpy_best:
        return torch_best, "torch copy_"
    return numpy_best, "numpy.copyto"


def machine_header() -> str:
    import numba

    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable_cores = os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "\n".join(
        [
            f"machine: {cpu}, {os.cpu_count()} logical cores ({usable_cores} usable), {platform.system()} "
            f"{platform.release()}",
            f"python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads, "
            f"layer {numba.config.THREADING_LAYER}), numpy {np.__version__}",
            f"gamma = {GAMMA}, lambda = {LAMBD}; float32 inputs; best call after one warm-up call",
            load_line(),
        ]
    )


def load_line(before_run: bool = True) -> str:
    """The 1-minute load average; before the run, a warning when other work competes for
    the cores (after it, the number includes this benchmark)."""
    try:
        one_minute = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not available
        return "load average: unknown"
    cores = os.cpu_count() or 1
    busy = before_run and one_minute > 0.5 * cores
    warning = " (busy machine: timings, above all the torch kernels', are inflated)" if busy else ""
    return f"load average (1 min): {one_minute:.2f} on {cores} cores{warning}"


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def chunked_gemm_gae(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma, lambd, chunk_size=64):
    """The trainers' chunked scan: compress, pad, intra-chunk GEMM with the decay matrix,
    serial carry between chunks, scatter. Same results as ``chunked`` up to rounding."""
    from gaecli.advantages.layout import compress, pad_compressed, scatter_compressed

    layout = compress(loss_mask, offsets)
    padded_values, padded_rewards = pad_compressed(values, rewards, terminal_rewards, layout, layout.width)
    batch, width = padded_values.shape
    decay = gamma * lambd
    chunks = max(-(-width // chunk_size), 1)
    next_values = padded_values.new_zeros(batch, chunks * chunk_size)
    next_values[:, : max(width - 1, 0)] = padded_values[:, 1:]
    deltas = padded_values.new_zeros(batch, chunks * chunk_size)
    deltas[:, :width] = padded_rewards + gamma * next_values[:, :width] - padded_values
    index = torch.arange(chunk_size, dtype=torch.float64)
    exponent = index[None, :] - index[:, None]
    matrix = torch.where(exponent >= 0, decay ** exponent.clamp(min=0), 0.0).to(values.dtype)
    local = deltas.view(batch, chunks, chunk_size) @ matrix.T
    carry_in = local.new_zeros(batch, chunks)
    carry = local.new_zeros(batch)
    for k in range(chunks - 1, -1, -1):
        carry_in[:, k] = carry
        carry = local[:, k, 0] + decay**chunk_size * carry
    tail = (decay ** torch.arange(chunk_size, 0, -1, dtype=torch.float64)).to(values.dtype)
    advantages = (local + carry_in.unsqueeze(-1) * tail).view(batch, -1)[:, :width]
    return scatter_compressed(advantages, values, layout)


def bench_api(workload: Workload, inputs: dict, repeat: int, min_time: float, with_kernel: bool) -> dict[str, Timing]:
    """The public API with its checks: ``masked_gae`` on a list of per-sample tensors (copies,
    as a trainer holds them) and ``masked_gae_packed`` on the packed tensors, timed in turns
    with the kernel they are held against (API_KERNEL alone, whose row this gives too)."""
    import gaecli

    lengths = workload.lengths.tolist()
    values, rewards, masks = (
        [piece.clone() for piece in torch.split(inputs[key], lengths)] for key in ("values", "rewards", "loss_mask")
    )
    terminal = inputs["terminal_rewards"]
    packed = (inputs["values"], inputs["rewards"], inputs["loss_mask"], inputs["offsets"], terminal)
    buffers = (torch.empty_like(inputs["values"]), torch.empty_like(inputs["values"]))
    calls = {
        API_ROW: lambda: gaecli.masked_gae(values, rewards, masks, terminal, gamma=GAMMA, lambd=LAMBD),
        PACKED_API_ROW: lambda: gaecli.masked_gae_packed(*packed, gamma=GAMMA, lambd=LAMBD),
        PACKED_OUT_ROW: lambda: gaecli.masked_gae_packed(*packed, gamma=GAMMA, lambd=LAMBD, out=buffers),
    }
    if with_kernel:
        kernel = KERNELS[API_KERNEL].function
        calls[API_KERNEL] = lambda: kernel(**inputs, gamma=GAMMA, lambd=LAMBD)
    return best_of_each(calls, repeat, min_time)


def bench_variants(inputs: dict, repeat: int, min_time: float) -> tuple[dict[str, Timing], Timing]:
    """The native kernel with the GAE variants of :data:`VARIANT_ROWS` (the kernel's own
    keywords: its numpy pass, the turn table and the per-sample λ included), timed in turns
    with plain native. Returns the variants' timings and plain native's of the same rounds."""
    function = KERNELS[API_KERNEL].function
    calls = {API_KERNEL: lambda: function(**inputs, gamma=GAMMA, lambd=LAMBD)}
    for row, keywords in VARIANT_ROWS.items():
        calls[row] = lambda keywords=keywords: function(**inputs, gamma=GAMMA, lambd=LAMBD, **keywords)
    timings = best_of_each(calls, repeat, min_time)
    return {row: timings[row] for row in VARIANT_ROWS}, timings[API_KERNEL]


def bench_workload(name: str, repeat: int, min_time: float) -> str:
    workload = make_workload(name)
    inputs = workload.as_tensors()
    kernels = [kernel for kernel in available_kernels("cpu") if kernel not in SKIPPED]
    timings: dict[str, Timing] = {}
    for kernel in kernels:
        if kernel == API_KERNEL:
            continue  # timed in turns with the API (bench_api)
        function = KERNELS[kernel].function
        timings[kernel] = best_of(
            lambda function=function: function(**inputs, gamma=GAMMA, lambd=LAMBD), repeat, min_time
        )
    timings[GEMM_BASELINE] = best_of(lambda: chunked_gemm_gae(**inputs, gamma=GAMMA, lambd=LAMBD), repeat, min_time)
    kernels.append(GEMM_BASELINE)
    timings.update(bench_api(workload, inputs, repeat, min_time, with_kernel=API_KERNEL in kernels))
    api_rows = [API_ROW, PACKED_API_ROW, PACKED_OUT_ROW]
    variant_rows, native_beside_variants = (
        bench_variants(inputs, repeat, min_time) if API_KERNEL in timings else ({}, None)
    )
    api_rows.extend(variant_rows)
    timings.update(variant_rows)
    gemm_baseline = timings[GEMM_BASELINE].best

    tokens = workload.num_tokens
    baseline = timings[BASELINE].best if BASELINE in timings else None
    ranked = sorted(kernels, key=lambda k: timings[k].best)
    rows = []
    for kernel in sorted([*kernels, *api_rows], key=lambda k: timings[k].best):
        timing = timings[kernel]
        speedup = f"{baseline / timing.best:.1f}x" if baseline else "-"
        rows.append(
            [
                kernel,
                f"{timing.best * 1e3:.2f}",
                f"{timing.median * 1e3:.2f}",
                str(timing.calls),
                f"{tokens / timing.best / 1e6:.1f}",
                speedup,
                f"{gemm_baseline / timing.best:.1f}x",
            ]
        )
    lengths = workload.lengths
    lines = [
        f"workload {name}: {workload.num_samples} samples, {tokens:,} tokens "
        f"({workload.loss_mask.mean():.0%} trainable), lengths {int(lengths.min()):,}..{int(lengths.max()):,} "
        f"(median {int(np.median(lengths)):,})",
        render_table(
            ["kernel", "best ms", "median ms", "calls", "Mtok/s", f"vs {BASELINE}", f"vs {GEMM_BASELINE}"], rows
        ),
    ]

    fastest = ranked[0]
    if baseline and name in FLOORS:
        speedup = min(baseline, gemm_baseline) / timings[fastest].best
        verdict = "meets" if speedup >= FLOORS[name] else "MISSES"
        lines.append(
            f"floor: {fastest} is {speedup:.1f}x the faster chunked form; {verdict} the {FLOORS[name]:g}x floor"
        )
    if baseline and name in API_FLOORS and API_KERNEL in timings:
        api = timings[API_ROW].best
        speedup = min(baseline, gemm_baseline) / api
        over_kernel = paired_ratio(timings[API_ROW], timings[API_KERNEL])
        versus_chunked = "meets" if speedup >= API_FLOORS[name] else "MISSES"
        versus_kernel = "meets" if over_kernel <= API_OVER_KERNEL else "MISSES"
        lines.append(
            f"API floors: {API_ROW} is {speedup:.1f}x the faster chunked form ({versus_chunked} the "
            f"{API_FLOORS[name]:g}x floor) and {over_kernel:.2f}x the time of {API_KERNEL} alone, median of "
            f"{timings[API_ROW].calls} rounds ({versus_kernel} the {API_OVER_KERNEL:g}x ceiling; best over best "
            f"{api / timings[API_KERNEL].best:.2f}x)"
        )

    if variant_rows:
        ratios = {row: paired_ratio(timings[row], native_beside_variants) for row in variant_rows}
        worst = max(ratios.values())
        verdict = "meets" if worst <= VARIANT_OVER_KERNEL else "MISSES"
        listed = "; ".join(
            f"{row}: {ratio:.2f}x (best over best {timings[row].best / native_beside_variants.best:.2f}x)"
            for row, ratio in ratios.items()
        )
        lines.append(
            f"variant ceilings (time over plain {API_KERNEL}, median of {native_beside_variants.calls} rounds): "
            f"{listed}; {verdict} the {VARIANT_OVER_KERNEL:g}x ceiling"
        )

    read, written = traffic_bytes(workload)
    moved = read + written
    kernel_time = timings[fastest].best
    if timings[PACKED_OUT_ROW].best < kernel_time:  # into preallocated buffers, checks included
        fastest, kernel_time = PACKED_OUT_ROW, timings[PACKED_OUT_ROW].best
    copied, copier = copy_time(moved, repeat, min_time)
    # Bandwidth counts bytes read plus bytes written, for the kernel and the copy alike
    # (a copy of an S-byte buffer moves 2S bytes).
    kernel_bandwidth = moved / kernel_time
    copy_bandwidth = 2 * moved / copied
    lines.append(
        f"memory: {fastest} moves {moved / 1e6:.1f} MB (read {read / 1e6:.1f} + write {written / 1e6:.1f}) "
        f"in {kernel_time * 1e3:.2f} ms = {kernel_bandwidth / 1e9:.1f} GB/s; "
        f"{copier} of a {moved / 1e6:.1f} MB buffer: {copied * 1e3:.2f} ms = {copy_bandwidth / 1e9:.1f} GB/s "
        f"read+write; {fastest} runs at {kernel_bandwidth / copy_bandwidth:.0%} of copy bandwidth"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=5, help="least number of timed calls per kernel (the best counts); default 5"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=0.5,
        help="keep calling a kernel until this many seconds have passed; default 0.5",
    )
    parser.add_argument(
        "--workload", choices=list(WORKLOADS), action="append", help="workload to run (repeatable); default all"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    print(machine_header())
    for name in args.workload or list(WORKLOADS):
        print()
        print(bench_workload(name, args.repeat, args.min_time), flush=True)
    print()
    print(f"after the run, {load_line(before_run=False)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
