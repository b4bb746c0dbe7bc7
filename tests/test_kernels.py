"""Every masked-GAE kernel against the contract (docs/semantics.md): its six behaviours on
hand-computed numbers, random ragged batches against the float64 reference, bitwise batch
invariance, and accuracy on one long sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gaecli
from gaecli.advantages.kernels.chunked import chunked_gae
from gaecli.advantages.kernels.reference import reference_gae

from helpers import (
    FAST_KERNEL_NAMES,
    KERNEL_NAMES,
    Batch,
    alternating_blocks,
    assert_bitwise,
    assert_close,
    make_batch,
    make_mask,
    oracle_batch,
    plain_gae,
    ragged_batches,
)


def run(kernel: str, batch: Batch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return gaecli.masked_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd, kernel=kernel)


def one_sample(values, rewards, mask, terminal=0.0, *, gamma: float, lambd: float) -> Batch:
    """A float64 batch of one sample from Python lists."""
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    mask = torch.tensor(mask, dtype=torch.bool)
    return Batch([as_tensor(values)], [as_tensor(rewards)], [mask], [terminal], gamma, lambd, torch.float64)


def test_kernel_table_lists_every_kernel():
    assert KERNEL_NAMES[0] == "reference"
    assert {"reference", "vanilla", "chunked", "scan"} <= set(KERNEL_NAMES)
    assert "auto" not in KERNEL_NAMES


# ----------------------------------------------------------------------------- the six behaviours


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_compressed_sequence_equals_plain_gae_on_trainable_tokens(kernel):
    # A masked sample's trainable outputs are plain GAE on the trainable subsequence.
    rng = np.random.default_rng(7)
    length = 97
    mask = make_mask("blocks", length, rng)
    values = torch.from_numpy(rng.normal(size=length))
    rewards = torch.from_numpy(rng.normal(size=length))
    terminal, gamma, lambd = 1.5, 0.9, 0.8
    batch = Batch([values], [rewards], [mask], [terminal], gamma, lambd, torch.float64)
    advantages, returns = run(kernel, batch)

    trainable = mask.nonzero().flatten()
    sub_rewards = rewards[trainable].tolist()
    sub_rewards[-1] += terminal
    expected = torch.tensor(plain_gae(values[trainable].tolist(), sub_rewards, gamma, lambd), dtype=torch.float64)
    assert_close(f"{kernel} trainable advantages", expected, advantages[0][trainable])
    assert_close(f"{kernel} trainable returns", expected + values[trainable], returns[0][trainable])
    assert not advantages[0][~mask].any() and not returns[0][~mask].any()

    reference_advantages, reference_returns = run("reference", batch)
    assert_close(f"{kernel} vs reference", reference_advantages[0], advantages[0])
    assert_close(f"{kernel} vs reference returns", reference_returns[0], returns[0])


@pytest.mark.parametrize("gap", [1, 5], ids=["gap1", "gap5"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_carry_crosses_a_masked_gap_with_one_decay(kernel, gap):
    # mask [1, 0 * gap, 1]; the masked tokens hold junk (V = 100, r = 7) that must not leak.
    # γ = λ = 0.5 (γλ = 0.25), all numbers dyadic so the arithmetic is exact:
    #   after the gap: A = r + γ·0 − V = 1 − 2 = −1            (zero bootstrap)
    #   before it:     δ = r + γ·V_after − V = 0.25 + 0.5·2 − 0.5 = 0.75
    #                  A = δ + γλ·A_after = 0.75 + 0.25·(−1) = 0.5   (one γλ, any gap)
    values = [0.5] + [100.0] * gap + [2.0]
    rewards = [0.25] + [7.0] * gap + [1.0]
    mask = [True] + [False] * gap + [True]
    batch = one_sample(values, rewards, mask, gamma=0.5, lambd=0.5)
    advantages, returns = run(kernel, batch)
    expected_advantages = torch.tensor([0.5] + [0.0] * gap + [-1.0], dtype=torch.float64)
    expected_returns = torch.tensor([1.0] + [0.0] * gap + [1.0], dtype=torch.float64)
    assert_close(f"{kernel} gap {gap}", expected_advantages, advantages[0])
    assert_close(f"{kernel} gap {gap} returns", expected_returns, returns[0])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_masked_tail_with_gamma_zero_puts_terminal_on_last_trainable_token(kernel):
    # mask [1, 1, 0, 0, 0], z = 3, γ = 0 (each A is its own δ = r − V):
    #   last trainable (token 1): A = z + r − V = 3 + 0.25 − 2 = 1.25
    #   token 0:                  A = r − V = 0.5 − 1 = −0.5
    # (placed on token R-1 = 4, a masked token, the terminal reward would be lost.)
    batch = one_sample(
        [1.0, 2.0, 5.0, 5.0, 5.0], [0.5, 0.25, 9.0, 9.0, 9.0], [1, 1, 0, 0, 0], 3.0, gamma=0.0, lambd=0.95
    )
    advantages, returns = run(kernel, batch)
    assert_close(kernel, torch.tensor([-0.5, 1.25, 0.0, 0.0, 0.0], dtype=torch.float64), advantages[0])
    assert_close(f"{kernel} returns", torch.tensor([0.5, 3.25, 0.0, 0.0, 0.0], dtype=torch.float64), returns[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_fully_masked_sample_is_zero_and_leaves_neighbours_untouched(kernel, dtype):
    batch = make_batch(11, [17, 9, 33], ["random", "zeros", "blocks"], gamma=0.97, lambd=0.9, dtype=dtype)
    batch.terminals[1] = 5.0  # dropped: the sample has no trainable token
    advantages, returns = run(kernel, batch)
    assert_bitwise(f"{kernel} fully masked advantages", torch.zeros(9, dtype=dtype), advantages[1])
    assert_bitwise(f"{kernel} fully masked returns", torch.zeros(9, dtype=dtype), returns[1])

    without = run(kernel, batch.subset([0, 2]))
    for position, sample in ((0, 0), (1, 2)):
        assert_bitwise(f"{kernel} neighbour {sample} advantages", without[0][position], advantages[sample])
        assert_bitwise(f"{kernel} neighbour {sample} returns", without[1][position], returns[sample])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_all_ones_mask_equals_plain_gae(kernel):
    batch = make_batch(3, [1, 40, 129], ["ones"] * 3, gamma=0.99, lambd=0.95, dtype=torch.float64)
    advantages, returns = run(kernel, batch)
    for index, (values, rewards, terminal) in enumerate(zip(batch.values, batch.rewards, batch.terminals)):
        shifted = rewards.tolist()
        shifted[-1] += terminal
        expected = torch.tensor(plain_gae(values.tolist(), shifted, batch.gamma, batch.lambd), dtype=torch.float64)
        assert_close(f"{kernel} sample {index}", expected, advantages[index])
        assert_close(f"{kernel} sample {index} returns", expected + values, returns[index])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_gamma_lambda_one_telescopes_to_reward_to_go(kernel, dtype):
    # γ = λ = 1: A_t = Σ_{trainable k ≥ t} r_k + z − V_t (zero bootstrap, truncated or not).
    batch = make_batch(5, [50, 64, 7], ["blocks", "masked-tail", "random"], gamma=1.0, lambd=1.0, dtype=dtype)
    advantages, returns = run(kernel, batch)
    for index, (values, rewards, mask, terminal) in enumerate(zip(*batch.args())):
        trainable = mask.nonzero().flatten()
        sub_rewards = rewards[trainable].double()
        reward_to_go = sub_rewards.flip(0).cumsum(0).flip(0) + terminal
        expected = torch.zeros(mask.numel(), dtype=torch.float64)
        expected[trainable] = reward_to_go - values[trainable].double()
        assert_close(f"{kernel} sample {index}", expected, advantages[index])
        expected_returns = torch.zeros(mask.numel(), dtype=torch.float64)
        expected_returns[trainable] = reward_to_go
        assert_close(f"{kernel} sample {index} returns", expected_returns, returns[index])


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@given(batch=ragged_batches())
def test_matches_float64_reference_on_random_batches(kernel, batch):
    advantages, returns = run(kernel, batch)
    reference_advantages, reference_returns = run("reference", batch.as_float64())
    assert_close(f"{kernel} advantages", reference_advantages, advantages)
    assert_close(f"{kernel} returns", reference_returns, returns)
    for sample_advantages in advantages:
        assert sample_advantages.dtype == batch.dtype


@given(batch=ragged_batches())
def test_reference_matches_pure_python_oracle(batch):
    # The oracle shares no code with gaecli: compress, textbook GAE, scatter.
    advantages, returns = run("reference", batch.as_float64())
    expected_advantages, expected_returns = oracle_batch("masked", batch)
    assert_close("reference advantages", expected_advantages, advantages)
    assert_close("reference returns", expected_returns, returns)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@given(batch=ragged_batches(), data=st.data(), order_seed=st.integers(0, 2**16))
def test_batch_invariance_is_bitwise(kernel, batch, data, order_seed):
    # A sample's outputs are identical alone, in its batch, and shuffled among other samples.
    others = data.draw(ragged_batches(dtype=batch.dtype), label="others")
    together = run(kernel, batch)
    mixed_values = batch.values + others.values
    mixed = Batch(
        mixed_values,
        batch.rewards + others.rewards,
        batch.masks + others.masks,
        batch.terminals + others.terminals,
        batch.gamma,
        batch.lambd,
        batch.dtype,
    )
    order = np.random.default_rng(order_seed).permutation(len(mixed_values)).tolist()
    shuffled = run(kernel, mixed.subset(order))
    for index in range(len(batch)):
        alone = run(kernel, batch.subset([index]))
        position = order.index(index)
        for which, name in ((0, "advantages"), (1, "returns")):
            assert_bitwise(f"{kernel} sample {index} {name} in batch", alone[which][0], together[which][index])
            assert_bitwise(f"{kernel} sample {index} {name} shuffled", alone[which][0], shuffled[which][position])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@given(batch=ragged_batches())
def test_packed_form_equals_list_form_and_masked_positions_are_zero(kernel, batch):
    values, rewards, mask, offsets, terminals = batch.packed()
    packed_advantages, packed_returns = gaecli.masked_gae_packed(
        values, rewards, mask, offsets, terminals, gamma=batch.gamma, lambd=batch.lambd, kernel=kernel
    )
    advantages, returns = run(kernel, batch)
    assert len(advantages) == len(returns) == len(batch)
    assert_bitwise(
        f"{kernel} advantages", packed_advantages, torch.cat(advantages) if advantages else packed_advantages[:0]
    )
    assert_bitwise(f"{kernel} returns", packed_returns, torch.cat(returns) if returns else packed_returns[:0])
    # Exactly 0 at masked positions; returns = advantages + values (up to one rounding) elsewhere.
    assert torch.equal(packed_advantages[~mask], torch.zeros_like(packed_advantages[~mask]))
    assert torch.equal(packed_returns[~mask], torch.zeros_like(packed_returns[~mask]))
    expected_returns = packed_advantages[mask].double() + values[mask].double()
    assert_close(f"{kernel} returns = advantages + values", expected_returns, packed_returns[mask])


# ----------------------------------------------------------------------------- accuracy


def long_sample(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """131,072 tokens, about half masked in blocks of 1..1000 tokens: float32 values
    ~ N(0, 3), rewards ~ N(0, 1) (the γ = λ = 1 reward-to-go random-walks to ~±100)."""
    rng = np.random.default_rng(seed)
    length = 131_072
    mask = alternating_blocks(length, 1000, rng)
    values = torch.from_numpy(rng.normal(0.0, 3.0, length)).float()
    rewards = torch.from_numpy(rng.normal(0.0, 1.0, length)).float()
    return values, rewards, torch.from_numpy(mask)


@pytest.fixture(scope="module")
def long_case():
    values, rewards, mask = long_sample(2024)
    assert 0.4 < mask.float().mean() < 0.6
    offsets = torch.tensor([0, values.numel()])
    terminal = torch.tensor([1.0])
    references = {
        discount: reference_gae(
            values.double(), rewards.double(), mask, offsets, terminal.double(), gamma=discount[0], lambd=discount[1]
        )
        for discount in ((0.999, 0.99), (1.0, 1.0))
    }
    return values, rewards, mask, offsets, terminal, references


# ``triton`` here runs under Triton's interpreter, too slowly for this sample; test_triton.py
# holds it to the same tolerances on samples of up to 16,384 tokens (16 chunks).
@pytest.mark.parametrize("discount", [(0.999, 0.99), (1.0, 1.0)], ids=["g0.999-l0.99", "g1-l1"])
@pytest.mark.parametrize("kernel", [name for name in FAST_KERNEL_NAMES if name != "triton"])
def test_long_sample_accuracy(kernel, discount, long_case):
    values, rewards, mask, offsets, terminal, references = long_case
    reference_advantages, reference_returns = references[discount]
    gamma, lambd = discount
    advantages, returns = gaecli.masked_gae_packed(
        values, rewards, mask, offsets, terminal, gamma=gamma, lambd=lambd, kernel=kernel
    )
    assert advantages.dtype == torch.float32
    assert_close(f"{kernel} float32 advantages, 131072 tokens", reference_advantages, advantages, 2e-5)
    assert_close(f"{kernel} float32 returns, 131072 tokens", reference_returns, returns, 2e-5)

    advantages64, returns64 = gaecli.masked_gae_packed(
        values.double(), rewards.double(), mask, offsets, terminal.double(), gamma=gamma, lambd=lambd, kernel=kernel
    )
    assert advantages64.dtype == torch.float64
    assert_close(f"{kernel} float64 advantages, 131072 tokens", reference_advantages, advantages64, 1e-10)
    assert_close(f"{kernel} float64 returns, 131072 tokens", reference_returns, returns64, 1e-10)


# ----------------------------------------------------------------------------- chunked


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 128])
@given(batch=ragged_batches(max_length=300))
def test_chunked_chunk_sizes_match_reference(chunk_size, batch):
    values, rewards, mask, offsets, terminals = batch.packed()
    terminals = terminals.to(batch.dtype)
    advantages, returns = chunked_gae(
        values, rewards, mask, offsets, terminals, gamma=batch.gamma, lambd=batch.lambd, chunk_size=chunk_size
    )
    reference_advantages, reference_returns = reference_gae(
        values.double(), rewards.double(), mask, offsets, terminals.double(), gamma=batch.gamma, lambd=batch.lambd
    )
    split = lambda flat: list(torch.split(flat, (offsets[1:] - offsets[:-1]).tolist()))  # noqa: E731
    assert_close(f"chunked C={chunk_size}", split(reference_advantages), split(advantages))
    assert_close(f"chunked C={chunk_size} returns", split(reference_returns), split(returns))


# ----------------------------------------------------------------------------- CUDA


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("kernel", gaecli.available_kernels("cuda") if torch.cuda.is_available() else [])
def test_cuda_kernels_match_reference_and_are_batch_invariant(kernel):
    batch = make_batch(13, [0, 1, 60, 517, 2048, 33], gamma=0.999, lambd=0.95)
    to_cuda = lambda xs: [x.cuda() for x in xs]  # noqa: E731
    on_device = Batch(
        to_cuda(batch.values), to_cuda(batch.rewards), to_cuda(batch.masks), batch.terminals, batch.gamma, batch.lambd
    )
    advantages, returns = run(kernel, on_device)
    assert all(a.is_cuda for a in advantages)
    reference_advantages, _ = run("reference", batch.as_float64())
    assert_close(f"{kernel} cuda", reference_advantages, [a.cpu() for a in advantages])
    for index in range(len(batch)):
        alone = run(kernel, on_device.subset([index]))
        assert_bitwise(f"{kernel} cuda sample {index}", alone[0][0], advantages[index])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_serial_and_parallel_runs_are_bitwise_equal(monkeypatch, dtype):
    # A batch under SERIAL_TOKENS runs on the calling thread, a larger one in the thread
    # pool: the same bits either way, and the float64 reference's numbers.
    from gaecli.advantages.kernels import native

    lengths = np.random.default_rng(3).integers(0, 300, 200).tolist()
    batch = make_batch(11, lengths, dtype=dtype)
    monkeypatch.setattr(native, "SERIAL_TOKENS", 1 << 62)
    serial = run("native", batch)
    monkeypatch.setattr(native, "SERIAL_TOKENS", 0)
    parallel = run("native", batch)
    reference = run("reference", batch.as_float64())
    for which, name in ((0, "advantages"), (1, "returns")):
        for index in range(len(batch)):
            assert_bitwise(f"sample {index} {name}", serial[which][index], parallel[which][index])
        assert_close(f"native {name}", reference[which], serial[which])
