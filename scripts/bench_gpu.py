"""GPU benchmark of the masked-GAE kernels: ``triton``, ``scan``, ``chunked`` (padded) and
``vanilla`` (padded) side by side on the three workloads of ``scripts/bench_kernels.py``, as
best-of-N wall times and ratios, in one table. Needs a CUDA device.

    python scripts/bench_gpu.py                     # every workload
    python scripts/bench_gpu.py --check             # first verify every kernel on small batches
    python scripts/bench_gpu.py --workload long --repeat 50

The inputs are on the GPU before timing; a call is timed from launch to
``torch.cuda.synchronize()``, so it includes each kernel's host work (``chunked`` and
``vanilla`` compress, pad and scatter; ``scan`` and ``triton`` read the longest sample's
length). Each kernel is called once first (Triton compiles then), then at least ``--repeat``
times and until ``--min-time`` seconds have passed; the best call counts. The ratios are
each kernel's best time over ``triton``'s: above 1, ``triton`` is faster. The last column is
``triton``'s bytes moved per second as a share of a device-to-device copy of as many bytes.

``--check`` holds every kernel, before any timing, to the float64 reference on a few samples
of each workload (within ``2e-5 · (1 + max |A|)`` per sample, the test suite's float32
tolerance) and checks that each of the first samples is bitwise the same alone as in the
batch; it exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gaecli.advantages.kernels import KERNELS, available_kernels  # noqa: E402
from gaecli.advantages.kernels.reference import reference_gae  # noqa: E402
from scripts.bench_kernels import Timing, best_of, render_table, traffic_bytes  # noqa: E402
from scripts.workloads import GAMMA, LAMBD, WORKLOADS, Workload, make_workload  # noqa: E402

KERNEL_NAMES = ("triton", "scan", "chunked", "vanilla")
BASELINE = "triton"
TOLERANCE = 2e-5  # float32, relative to 1 + max |A| of the sample (tests/helpers.py)
CHECK_SAMPLES = {"agentic": 24, "single-turn": 8, "long": 2}  # per workload in --check
INVARIANCE_SAMPLES = 3  # first samples of each --check batch also run alone


def on_device(workload: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in workload.as_tensors().items()}


def machine_header(device: torch.device) -> str:
    import triton

    properties = torch.cuda.get_device_properties(device)
    return "\n".join(
        [
            f"device: {properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
            f"{properties.multi_processor_count} SMs; host {platform.machine()}, "
            f"{platform.system()} {platform.release()}",
            f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"triton {triton.__version__}",
            f"gamma = {GAMMA}, lambda = {LAMBD}; float32 inputs on the device; best call after one warm-up call",
        ]
    )


# ----------------------------------------------------------------------------- --check


def check_workload(name: str, device: torch.device) -> list[str]:
    """Failures (one line each) of every kernel on a few samples of workload ``name``."""
    workload = make_workload(name, num_samples=CHECK_SAMPLES[name], seed=1)
    inputs = workload.as_tensors()
    reference, _ = reference_gae(
        **{key: (value.double() if value.is_floating_point() else value) for key, value in inputs.items()},
        gamma=GAMMA,
        lambd=LAMBD,
    )
    offsets = inputs["offsets"]
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    expected = torch.split(reference, lengths)
    failures = []
    for kernel in KERNEL_NAMES:
        function = KERNELS[kernel].function
        advantages, _ = function(**on_device(workload, device), gamma=GAMMA, lambd=LAMBD)
        got = torch.split(advantages.cpu(), lengths)
        worst = 0.0
        for ref, actual in zip(expected, got):
            if ref.numel() == 0:
                continue
            error = float((actual.double() - ref).abs().max())
            worst = max(worst, error / (TOLERANCE * (1.0 + float(ref.abs().max()))))
        if not worst <= 1.0:
            failures.append(f"{name}: {kernel} is {worst:.2f}x the allowed error against the reference")
        for sample in range(min(INVARIANCE_SAMPLES, workload.num_samples)):
            start, end = int(offsets[sample]), int(offsets[sample + 1])
            alone = {
                "values": inputs["values"][start:end],
                "rewards": inputs["rewards"][start:end],
                "loss_mask": inputs["loss_mask"][start:end],
                "offsets": torch.tensor([0, end - start]),
                "terminal_rewards": inputs["terminal_rewards"][sample : sample + 1],
            }
            alone_advantages, _ = function(**{k: v.to(device) for k, v in alone.items()}, gamma=GAMMA, lambd=LAMBD)
            if not torch.equal(alone_advantages.cpu(), got[sample]):
                failures.append(f"{name}: {kernel} sample {sample} differs alone and in the batch")
    return failures


# ----------------------------------------------------------------------------- timing


def bench_workload(name: str, device: torch.device, repeat: int, min_time: float) -> list[str]:
    """One table row: the workload, each kernel's best time, ratios over ``triton``, and
    ``triton``'s share of copy bandwidth."""
    workload = make_workload(name)
    inputs = on_device(workload, device)
    timings: dict[str, Timing] = {}
    for kernel in KERNEL_NAMES:
        function = KERNELS[kernel].function

        def call(function=function) -> None:
            function(**inputs, gamma=GAMMA, lambd=LAMBD)
            torch.cuda.synchronize(device)

        timings[kernel] = best_of(call, repeat, min_time)
    read, written = traffic_bytes(workload)
    moved = read + written
    copy_time = copy_best(moved, device, repeat, min_time)
    # A copy of an S-byte buffer moves 2S bytes (read + write); the kernel moves `moved`.
    share = (moved / timings[BASELINE].best) / (2 * moved / copy_time)
    baseline = timings[BASELINE].best
    return [
        name,
        f"{workload.num_samples} x {int(workload.lengths.mean()):,}",
        f"{workload.num_tokens / 1e6:.1f}M",
        *(f"{timings[kernel].best * 1e3:.3f}" for kernel in KERNEL_NAMES),
        *(f"{timings[kernel].best / baseline:.2f}" for kernel in KERNEL_NAMES if kernel != BASELINE),
        f"{share:.0%}",
    ]


def copy_best(num_bytes: int, device: torch.device, repeat: int, min_time: float) -> float:
    """Best time of a device-to-device copy of ``num_bytes`` into a preallocated buffer."""
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)

    def call() -> None:
        target.copy_(source)
        torch.cuda.synchronize(device)

    return best_of(call, repeat, min_time).best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="least number of timed calls per kernel; default 20")
    parser.add_argument(
        "--min-time", type=float, default=0.5, help="keep calling a kernel this many seconds; default 0.5"
    )
    parser.add_argument(
        "--workload", choices=list(WORKLOADS), action="append", help="workload to run (repeatable); default all"
    )
    parser.add_argument("--check", action="store_true", help="verify every kernel against the reference first")
    parser.add_argument("--device", default="cuda", help="CUDA device; default cuda")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not torch.cuda.is_available():
        print(
            "bench_gpu.py needs a CUDA device, and torch sees none here (scripts/bench_kernels.py times the CPU)",
            file=sys.stderr,
        )
        return 2
    missing = [kernel for kernel in KERNEL_NAMES if kernel not in available_kernels("cuda")]
    if missing:
        print(
            f"kernels not usable here: {', '.join(missing)} (the triton kernel needs: pip install 'gaecli[gpu]')",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    workloads = args.workload or list(WORKLOADS)
    print(machine_header(device))
    if args.check:
        failures = [line for name in workloads for line in check_workload(name, device)]
        for line in failures:
            print(f"check failed: {line}", file=sys.stderr)
        if failures:
            return 1
        print(f"check: {', '.join(KERNEL_NAMES)} match the reference and are batch invariant on {', '.join(workloads)}")
    rows = [bench_workload(name, device, args.repeat, args.min_time) for name in workloads]
    header = [
        "workload",
        "samples x mean",
        "tokens",
        *(f"{kernel} ms" for kernel in KERNEL_NAMES),
        *(f"{kernel}/{BASELINE}" for kernel in KERNEL_NAMES if kernel != BASELINE),
        f"{BASELINE} of copy BW",
    ]
    print()
    print(render_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
