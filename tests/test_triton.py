"""The Triton kernel beyond the shared kernel grid of test_kernels.py: samples that span many
chunks (the second and third passes) against the float64 reference, bitwise batch
invariance of such samples, and how the kernel is offered (never by ``auto``; without
Triton, an error that says how to install it, exit 2 from the CLI).

Without CUDA the kernel runs under Triton's interpreter on CPU tensors (conftest.py turns it
on), so the samples here stay at most 16,384 tokens long; with CUDA it runs compiled. Without
Triton the tests that run the kernel are skipped, and the others check the error it gives.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gaecli
from gaecli.advantages.kernels import KERNELS
from gaecli.advantages.kernels.reference import reference_gae
from gaecli.advantages.kernels.triton import CHUNK_LENGTH, triton_gae
from gaecli.errors import KernelUnavailableError

from helpers import Batch, alternating_blocks, assert_bitwise, assert_close, make_batch
from rollout_files import files_under, gae, random_rollouts, rollout_table, write_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INSTALLED = importlib.util.find_spec("triton") is not None
runs_here = pytest.mark.skipif(
    "triton" not in gaecli.available_kernels(DEVICE),
    reason="needs Triton (pip install 'gaecli[gpu]'), on CUDA or under its interpreter (conftest.py)",
)
installed = pytest.mark.skipif(not INSTALLED, reason="needs Triton: pip install 'gaecli[gpu]'")


def run_triton(packed, gamma: float, lambd: float, **chunking) -> tuple[torch.Tensor, torch.Tensor]:
    """The triton kernel on ``(values, rewards, mask, offsets, terminals)`` on DEVICE; CPU results."""
    values, rewards, mask, offsets, terminals = (tensor.to(DEVICE) for tensor in packed)
    advantages, returns = triton_gae(
        values, rewards, mask, offsets, terminals.to(values.dtype), gamma=gamma, lambd=lambd, **chunking
    )
    return advantages.cpu(), returns.cpu()


def run_reference(packed, gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    values, rewards, mask, offsets, terminals = packed
    return reference_gae(values.double(), rewards.double(), mask, offsets, terminals.double(), gamma=gamma, lambd=lambd)


def split(flat: torch.Tensor, offsets: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.split(flat, (offsets[1:] - offsets[:-1]).tolist()))


def block_masked_sample(seed: int, length: int, dtype: torch.dtype) -> Batch:
    """One sample of ``length`` tokens, about half masked in blocks of 1..600 tokens (so whole
    chunks are masked, and gaps cross chunk boundaries), values ~ N(0, 3), rewards ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    mask = alternating_blocks(length, 600, rng)
    values = torch.from_numpy(rng.normal(0.0, 3.0, length)).to(dtype)
    rewards = torch.from_numpy(rng.normal(0.0, 1.0, length)).to(dtype)
    return Batch([values], [rewards], [torch.from_numpy(mask)], [1.0], 0.0, 0.0, dtype)


# ----------------------------------------------------------------------------- many chunks


@runs_here
@pytest.mark.parametrize("discount", [(0.999, 0.99), (1.0, 1.0)], ids=["g0.999-l0.99", "g1-l1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_sample_of_sixteen_chunks_matches_reference(dtype, discount):
    # 16 production chunks: pass 1 writes the last, passes 2 and 3 the other 15.
    length = 16 * CHUNK_LENGTH
    packed = block_masked_sample(5, length, dtype).packed()
    gamma, lambd = discount
    advantages, returns = run_triton(packed, gamma, lambd)
    reference_advantages, reference_returns = run_reference(packed, gamma, lambd)
    assert advantages.dtype == dtype
    tolerance = 2e-5 if dtype == torch.float32 else 1e-10
    assert_close(f"triton {length} tokens", reference_advantages, advantages, tolerance)
    assert_close(f"triton {length} tokens returns", reference_returns, returns, tolerance)
    mask = packed[2]
    assert not advantages[~mask].any() and not returns[~mask].any()


@runs_here
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("discount", [(0.99, 0.95), (0.0, 0.9), (0.9, 0.0), (1.0, 1.0)], ids=str)
def test_small_chunks_match_reference(dtype, discount):
    # Chunks of 8 tokens and 2 chunk maps per scan of the second pass: lengths on and next to
    # chunk boundaries, whole chunks masked in the middle and at the end (the terminal reward
    # then lands in an earlier chunk), masked heads, a fully masked and an empty sample.
    lengths = [0, 1, 7, 8, 9, 16, 17, 40, 64, 3, 57]
    kinds = [
        "ones",
        "ones",
        "random",
        "ones",
        "masked-tail",
        "blocks",
        "masked-head",
        "blocks",
        "masked-tail",
        "zeros",
        "random",
    ]
    batch = make_batch(21, lengths, kinds, dtype=dtype)
    batch.masks[7] = torch.tensor([True] * 5 + [False] * 30 + [True] * 3 + [False] * 2)  # chunks 1..3 masked
    batch.masks[8] = torch.tensor([True] * 10 + [False] * 54)  # chunks 2..7 masked: z on token 9
    packed = batch.packed()
    gamma, lambd = discount
    advantages, returns = run_triton(packed, gamma, lambd, chunk_length=8, carry_block=2)
    reference_advantages, reference_returns = run_reference(packed, gamma, lambd)
    offsets = packed[3]
    assert_close("triton C=8", split(reference_advantages, offsets), split(advantages, offsets))
    assert_close("triton C=8 returns", split(reference_returns, offsets), split(returns, offsets))
    assert_bitwise("fully masked sample", torch.zeros(3, dtype=dtype), split(advantages, offsets)[9])


@runs_here
def test_terminal_reward_crosses_masked_chunks_exactly():
    # mask [1, 1, then 14 masked]: chunks of 4 tokens, the last three fully masked. γ = λ = 0.5,
    # dyadic numbers (exact): token 1: A = r + z − V = 0.5 + 2 − 1 = 1.5;
    # token 0: A = r + γ·V_1 − V_0 + γλ·A_1 = 0.25 + 0.5 − 0.5 + 0.25·1.5 = 0.625.
    values = torch.tensor([0.5, 1.0] + [9.0] * 14, dtype=torch.float64)
    rewards = torch.tensor([0.25, 0.5] + [3.0] * 14, dtype=torch.float64)
    mask = torch.tensor([True, True] + [False] * 14)
    packed = (values, rewards, mask, torch.tensor([0, 16]), torch.tensor([2.0], dtype=torch.float64))
    advantages, returns = run_triton(packed, 0.5, 0.5, chunk_length=4, carry_block=2)
    assert_bitwise("advantages", torch.tensor([0.625, 1.5] + [0.0] * 14, dtype=torch.float64), advantages)
    assert_bitwise("returns", torch.tensor([1.125, 2.5] + [0.0] * 14, dtype=torch.float64), returns)


@runs_here
def test_same_results_with_the_interpreters_own_scan(monkeypatch):
    # The suite gives the interpreter a log-step scan (tests/triton_interpreter.py); the
    # interpreter's own one-element-at-a-time scan must give the same results, to rounding.
    if DEVICE == "cuda":
        pytest.skip("compiled on CUDA: no interpreter")
    from triton.runtime.interpreter import ScanOps

    kinds = ["ones", "random", "blocks", "masked-tail", "blocks"]
    batch = make_batch(17, [0, 5, 8, 23, 40], kinds, dtype=torch.float64)
    packed = batch.packed()
    log_step = run_triton(packed, 0.97, 0.9, chunk_length=8, carry_block=2)
    monkeypatch.setattr(ScanOps, "generic_scan", ScanOps.one_at_a_time_scan)
    one_at_a_time = run_triton(packed, 0.97, 0.9, chunk_length=8, carry_block=2)
    reference_advantages, _ = run_reference(packed, 0.97, 0.9)
    assert_close("interpreter's own scan", reference_advantages, one_at_a_time[0])
    assert_close("log-step scan vs the interpreter's own", one_at_a_time[0], log_step[0])
    assert_close("log-step scan vs the interpreter's own, returns", one_at_a_time[1], log_step[1])


# ----------------------------------------------------------------------------- batch invariance


@runs_here
@pytest.mark.parametrize("chunking", [{}, {"chunk_length": 16, "carry_block": 4}], ids=["production", "C16-block4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_many_chunk_sample_is_bitwise_the_same_alone_and_in_a_batch(dtype, chunking):
    chunk = chunking.get("chunk_length", CHUNK_LENGTH)
    long = block_masked_sample(9, 5 * chunk + 3, dtype)
    others = make_batch(4, [0, 2 * chunk + 1, 30, chunk, 5], dtype=dtype)
    alone = run_triton(long.packed(), 0.99, 0.95, **chunking)
    for order in ([0, 1, 2, 3, 4, 5], [3, 5, 0, 1, 4, 2]):
        members = [long, *(others.subset([i]) for i in range(len(others)))]
        mixed = Batch(
            [members[i].values[0] for i in order],
            [members[i].rewards[0] for i in order],
            [members[i].masks[0] for i in order],
            [members[i].terminals[0] for i in order],
            0.99,
            0.95,
            dtype,
        )
        packed = mixed.packed()
        advantages, returns = run_triton(packed, 0.99, 0.95, **chunking)
        where = order.index(0)
        offsets = packed[3]
        assert_bitwise(f"advantages, order {order}", alone[0], split(advantages, offsets)[where])
        assert_bitwise(f"returns, order {order}", alone[1], split(returns, offsets)[where])


# ----------------------------------------------------------------------------- compiled for CUDA

# Compiles the three kernels to a cubin for sm_90 (H100/H200) as a launch would, for float32
# and float64 input, without a GPU; the interpreter does not compile anything.
COMPILE_FOR_CUDA = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import gaecli.advantages.kernels.triton as kernels

for data, accumulate in (("fp32", tl.float32), ("fp64", tl.float64)):
    wide = "fp64" if accumulate == tl.float64 else "fp32"
    types = {"loss_mask": "*u8", "offsets": "*i64", "chunk_base": "*i64"}
    types.update({name: "*" + data for name in ("values", "rewards", "advantages", "returns")})
    types.update({name: "*" + wide for name in ("terminal_rewards", "discounts", "chunk_c", "chunk_d", "carries")})
    constants = {"CHUNK": kernels.CHUNK_LENGTH, "BLOCK": kernels.CARRY_BLOCK, "ACCUMULATE": accumulate}
    for function in (kernels._local_pass, kernels._carry_pass, kernels._finish_pass):
        signature = {name: types.get(name, "constexpr") for name in function.arg_names}
        used = {name: value for name, value in constants.items() if name in function.arg_names}
        compiled = triton.compile(
            ASTSource(function, signature, used), target=GPUTarget("cuda", 90, 32), options=kernels.COMPILE_OPTIONS
        )
        assert len(compiled.asm["cubin"]) > 1000, function.__name__
        print(function.__name__, data, "compiled")
"""


@installed
def test_kernels_compile_for_cuda():
    root = Path(__file__).resolve().parent.parent
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = os.pathsep.join([str(root), environment.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_CUDA], cwd=root, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == 6, done.stdout


# ----------------------------------------------------------------------------- how it is offered


def test_auto_never_picks_triton():
    assert gaecli.resolve_kernel("auto", "cuda") == "scan"
    assert gaecli.resolve_kernel("auto", "cpu") != "triton"
    assert ("triton" in gaecli.available_kernels("cuda")) == INSTALLED


@installed
def test_on_cpu_only_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "triton" not in gaecli.available_kernels("cpu")
    with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
        gaecli.resolve_kernel("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "triton" in gaecli.available_kernels("cpu")


@pytest.fixture
def without_triton(monkeypatch):
    """The kernel table as it is where Triton is not installed."""
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else found(name, *a))
    entry = KERNELS["triton"]
    monkeypatch.setitem(KERNELS, "triton", dataclasses.replace(entry))  # a fresh entry: usable is not cached


def test_without_triton_the_error_says_how_to_install_it(without_triton):
    assert "triton" not in gaecli.available_kernels("cuda")
    assert "triton" not in gaecli.available_kernels("cpu")
    for device in ("cpu", "cuda"):
        with pytest.raises(KernelUnavailableError, match=r"pip install 'gaecli\[gpu\]'"):
            gaecli.resolve_kernel("triton", device)


def test_without_triton_the_cli_exits_2(without_triton, tmp_path):
    source = write_table(rollout_table(random_rollouts(5, seed=3)), tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    result = gae("recompute", source, "-o", target, "--gamma", 1, "--lambd", 0.95, "--kernel", "triton", "--quiet")
    assert result.exit_code == 2, result.output
    assert "pip install 'gaecli[gpu]'" in result.stderr
    assert files_under(tmp_path) == ["in.parquet"]
