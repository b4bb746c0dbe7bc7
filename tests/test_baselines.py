"""The generic baseline names (``unmasked``, ``skip-masked``, ``zero-masked``, aliases of the
slime, verl and OpenRLHF profiles) that the diff compares against: hand-computed small
cases, the trainers' own loops as oracles, and every kernel against the reference. The six
profiles themselves: tests/test_profiles.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import gaecli
from gaecli import GAEInputError
from gaecli.advantages import layout
from gaecli.advantages.layout import last_trainable_index, next_trainable_index
from gaecli.flat import gae_flat  # the documented public path

from helpers import (
    FAST_KERNEL_NAMES,
    KERNEL_NAMES,
    Batch,
    assert_bitwise,
    assert_close,
    make_batch,
    oracle_batch,
    ragged_batches,
)

GENERIC = ["unmasked", "skip-masked", "zero-masked"]
SEMANTICS = ["masked", *GENERIC]

# One sample, R = 4, mask [1, 0, 1, 0], V = [1, 2, 3, 4], r = [0.5, 1, 0.25, 2], z = 8,
# γ = 0.5, λ = 1 (γλ = 0.5). Every number is dyadic, so the kernels get them exactly.
HAND_VALUES = [1.0, 2.0, 3.0, 4.0]
HAND_REWARDS = [0.5, 1.0, 0.25, 2.0]
HAND_MASK = [1, 0, 1, 0]
HAND_TERMINAL = 8.0
HAND_GAMMA, HAND_LAMBD = 0.5, 1.0
HAND_EXPECTED = {
    # unmasked: every token a transition, z on token 3: r = [0.5, 1, 0.25, 10].
    #   A3 = 10 + 0.5·0 − 4                    = 6
    #   A2 = (0.25 + 0.5·4 − 3) + 0.5·6         = −0.75 + 3     = 2.25
    #   A1 = (1 + 0.5·3 − 2) + 0.5·2.25          = 0.5 + 1.125   = 1.625
    #   A0 = (0.5 + 0.5·2 − 1) + 0.5·1.625       = 0.5 + 0.8125  = 1.3125
    #   returns = A + V
    "unmasked": ([1.3125, 1.625, 2.25, 6.0], [2.3125, 3.625, 5.25, 10.0]),
    # masked (the contract): trainable subsequence V = [1, 3], r = [0.5, 0.25 + 8].
    #   A2 = 8.25 + 0.5·0 − 3                  = 5.25
    #   A0 = (0.5 + 0.5·3 − 1) + 0.5·5.25       = 1 + 2.625     = 3.625
    #   masked positions 0
    "masked": ([3.625, 0.0, 5.25, 0.0], [4.625, 0.0, 8.25, 0.0]),
    # skip-masked (= verl): z on token 3, which is masked, so it reaches no trainable token.
    #   Trainable tokens: the contract without z: A2 = 0.25 + 0.5·0 − 3 = −2.75,
    #   A0 = (0.5 + 0.5·3 − 1) + 0.5·(−2.75) = 1 − 1.375 = −0.375.
    #   Masked tokens store the carry: t=3 (after the last trainable) 0, t=1 A2 = −2.75.
    #   returns = A + V everywhere
    "skip-masked": ([-0.375, -2.75, -2.75, 0.0], [0.625, -0.75, 0.25, 4.0]),
    # zero-masked (OpenRLHF): V = [1, 0, 3, 0], r = [0.5, 0, 0.25 + 8, 0] (z on token 2).
    #   A3 = 0 + 0.5·0 − 0                     = 0
    #   A2 = (8.25 + 0.5·0 − 3) + 0.5·0         = 5.25
    #   A1 = (0 + 0.5·3 − 0) + 0.5·5.25         = 1.5 + 2.625   = 4.125
    #   A0 = (0.5 + 0.5·0 − 1) + 0.5·4.125      = −0.5 + 2.0625 = 1.5625
    #   returns = A + zeroed V
    "zero-masked": ([1.5625, 4.125, 5.25, 0.0], [2.5625, 4.125, 8.25, 0.0]),
}

# A fully masked sample, R = 2: V = [1, 2], r = [0.5, 0.25], z = 4, same γ, λ.
FULLY_MASKED_EXPECTED = {
    # unmasked: r = [0.5, 4.25]; A1 = 4.25 − 2 = 2.25; A0 = (0.5 + 0.5·2 − 1) + 0.5·2.25 = 1.625
    "unmasked": ([1.625, 2.25], [2.625, 4.25]),
    # masked: no trainable token, all zeros, z dropped.
    "masked": ([0.0, 0.0], [0.0, 0.0]),
    # skip-masked (= verl): the carry stays 0 throughout: A = 0, returns = V, z lost.
    "skip-masked": ([0.0, 0.0], [1.0, 2.0]),
    # zero-masked: everything zeroed and no last trainable token for z: all zeros.
    "zero-masked": ([0.0, 0.0], [0.0, 0.0]),
}


def hand_batch(dtype: torch.dtype) -> Batch:
    as_tensor = lambda xs: torch.tensor(xs, dtype=dtype)  # noqa: E731
    return Batch(
        [as_tensor(HAND_VALUES), as_tensor([1.0, 2.0])],
        [as_tensor(HAND_REWARDS), as_tensor([0.5, 0.25])],
        [torch.tensor(HAND_MASK, dtype=torch.bool), torch.tensor([False, False])],
        [HAND_TERMINAL, 4.0],
        HAND_GAMMA,
        HAND_LAMBD,
        dtype,
    )


def baseline(semantics: str, batch: Batch, kernel: str):
    return gaecli.baseline_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd, semantics=semantics, kernel=kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_hand_computed_case(semantics, kernel, dtype):
    advantages, returns = baseline(semantics, hand_batch(dtype), kernel)
    for sample, expected in enumerate((HAND_EXPECTED[semantics], FULLY_MASKED_EXPECTED[semantics])):
        expected_advantages, expected_returns = (torch.tensor(xs, dtype=dtype) for xs in expected)
        # Dyadic inputs and outputs: every kernel gets these exactly.
        assert_bitwise(f"{semantics} {kernel} sample {sample} advantages", expected_advantages, advantages[sample])
        assert_bitwise(f"{semantics} {kernel} sample {sample} returns", expected_returns, returns[sample])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_unmasked_gae_is_the_unmasked_baseline(kernel):
    batch = hand_batch(torch.float64)
    advantages, returns = gaecli.unmasked_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd, kernel=kernel)
    assert_bitwise(
        "unmasked_gae hand case", torch.tensor(HAND_EXPECTED["unmasked"][0], dtype=torch.float64), advantages[0]
    )
    assert_bitwise(
        "unmasked_gae hand case returns", torch.tensor(HAND_EXPECTED["unmasked"][1], dtype=torch.float64), returns[0]
    )
    random_batch = make_batch(21, [0, 13, 40, 1])
    expected = baseline("unmasked", random_batch, kernel)
    got = gaecli.unmasked_gae(*random_batch.args(), gamma=random_batch.gamma, lambd=random_batch.lambd, kernel=kernel)
    for index in range(len(random_batch)):
        assert_bitwise(f"unmasked_gae sample {index}", expected[0][index], got[0][index])


def test_masked_semantics_is_masked_gae():
    batch = make_batch(22, [5, 0, 31, 12])
    via_baseline = baseline("masked", batch, "auto")
    direct = gaecli.masked_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd)
    for index in range(len(batch)):
        assert_bitwise(f"sample {index}", direct[0][index], via_baseline[0][index])
        assert_bitwise(f"sample {index} returns", direct[1][index], via_baseline[1][index])


def test_unknown_semantics_raises():
    batch = make_batch(23, [3])
    with pytest.raises(GAEInputError, match="unknown semantics 'token-mean'"):
        baseline("token-mean", batch, "auto")


@pytest.mark.parametrize("semantics", GENERIC)
@given(batch=ragged_batches())
def test_reference_matches_the_trainers_loops(semantics, batch):
    # Oracles are the trainers' own loops in pure Python (tests/helpers.py).
    advantages, returns = baseline(semantics, batch.as_float64(), "reference")
    expected_advantages, expected_returns = oracle_batch(semantics, batch)
    assert_close(f"{semantics} advantages", expected_advantages, advantages)
    assert_close(f"{semantics} returns", expected_returns, returns)


@pytest.mark.parametrize("kernel", FAST_KERNEL_NAMES)
@pytest.mark.parametrize("semantics", GENERIC)
@given(batch=ragged_batches())
def test_every_kernel_matches_the_reference(semantics, kernel, batch):
    advantages, returns = baseline(semantics, batch, kernel)
    reference_advantages, reference_returns = baseline(semantics, batch.as_float64(), "reference")
    assert_close(f"{semantics} {kernel} advantages", reference_advantages, advantages)
    assert_close(f"{semantics} {kernel} returns", reference_returns, returns)


@pytest.mark.parametrize("semantics", GENERIC)
@given(batch=ragged_batches())
def test_packed_form_equals_list_form(semantics, batch):
    values, rewards, mask, offsets, terminals = batch.packed()
    packed = gaecli.baseline_gae_packed(
        values, rewards, mask, offsets, terminals, gamma=batch.gamma, lambd=batch.lambd, semantics=semantics
    )
    listed = baseline(semantics, batch, "auto")
    for which in range(2):
        assert_bitwise(
            f"{semantics} output {which}", packed[which], torch.cat(listed[which]) if len(batch) else packed[which][:0]
        )


@pytest.mark.parametrize("semantics", GENERIC)
def test_every_baseline_is_masked_gae_when_nothing_is_masked(semantics):
    batch = make_batch(24, [1, 9, 50, 0], ["ones"] * 4, dtype=torch.float64)
    advantages, returns = baseline(semantics, batch, "reference")
    expected_advantages, expected_returns = gaecli.masked_gae(
        *batch.args(), gamma=batch.gamma, lambd=batch.lambd, kernel="reference"
    )
    assert_close(f"{semantics} with an all-ones mask", expected_advantages, advantages)
    assert_close(f"{semantics} with an all-ones mask, returns", expected_returns, returns)


# ----------------------------------------------------------------------------- the torch-free CPU path


def flat(semantics: str, packed: tuple, gamma: float, lambd: float):
    """:func:`gaecli.flat.gae_flat` on a batch's packed tensors, as numpy (terminal rewards
    in the values' dtype, as the commands pass them); the results back as tensors."""
    values, rewards, mask, offsets, terminals = (t.numpy() for t in packed)
    advantages, returns = gae_flat(
        values, rewards, mask, offsets, terminals.astype(values.dtype), gamma=gamma, lambd=lambd, semantics=semantics
    )
    return torch.from_numpy(advantages), torch.from_numpy(returns)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_flat_hand_computed_case(semantics, dtype):
    batch = hand_batch(dtype)
    advantages, returns = flat(semantics, batch.packed(), batch.gamma, batch.lambd)
    expected_advantages = torch.cat(
        [torch.tensor(HAND_EXPECTED[semantics][0]), torch.tensor(FULLY_MASKED_EXPECTED[semantics][0])]
    ).to(dtype)
    expected_returns = torch.cat(
        [torch.tensor(HAND_EXPECTED[semantics][1]), torch.tensor(FULLY_MASKED_EXPECTED[semantics][1])]
    ).to(dtype)
    assert_bitwise(f"flat {semantics} advantages", expected_advantages, advantages)
    assert_bitwise(f"flat {semantics} returns", expected_returns, returns)


@pytest.mark.parametrize("semantics", SEMANTICS)
@given(batch=ragged_batches())
def test_flat_path_is_bitwise_the_torch_path(semantics, batch):
    # The commands compute on numpy without torch; the library on tensors: same bits.
    packed = batch.packed()
    expected = gaecli.baseline_gae_packed(
        *packed, gamma=batch.gamma, lambd=batch.lambd, semantics=semantics, kernel="native"
    )
    got = flat(semantics, packed, batch.gamma, batch.lambd)
    assert_bitwise(f"{semantics} advantages", expected[0], got[0])
    assert_bitwise(f"{semantics} returns", expected[1], got[1])


@given(batch=ragged_batches())
def test_flat_layout_helpers_match_the_torch_ones(batch):
    _, _, mask, offsets, _ = batch.packed()
    following = next_trainable_index(mask.numpy(), offsets.numpy())
    assert following.tolist() == layout.next_trainable_index(mask, offsets).tolist()
    # The last trainable token of each sample, by a plain loop.
    last = last_trainable_index(mask.numpy(), offsets.numpy())
    starts = offsets.tolist()
    expected = [max((t for t in range(a, b) if mask[t]), default=-1) for a, b in zip(starts, starts[1:])]
    assert last.tolist() == expected


def test_flat_unknown_semantics_raises():
    batch = make_batch(23, [3])
    with pytest.raises(GAEInputError, match="unknown semantics 'token-mean'"):
        flat("token-mean", batch.packed(), batch.gamma, batch.lambd)
