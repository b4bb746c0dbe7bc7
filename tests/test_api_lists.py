"""The list API reading each sample where it lies (no concatenation): bitwise equal to the
packed API and to the float64 reference kernel, within tolerance of the pure-Python oracle,
on random ragged lists (empty and fully masked samples, every mask dtype, float32 and
float64, strided tensors, numpy arrays, tensors with their negative bit set); the inputs
untouched; bad input named by sample and token as before; input the path does not take
(mixed dtypes) computed by the general path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gaecli
import gaecli.advantages.api as api
from gaecli import GAEInputError

from helpers import MASK_KINDS, assert_bitwise, assert_close, make_batch, oracle_batch

LENGTHS = [7, 0, 1, 33, 2, 0, 64, 5, 129, 3, 18, 0, 250, 1]


@pytest.fixture
def in_place_only(monkeypatch):
    """Fail if the list API concatenates: proves the path under test is the in-place one."""

    def refuse(*arguments, **keywords):
        raise AssertionError("the list API concatenated its input")

    monkeypatch.setattr(api, "pack_lists", refuse)


def packed_split(batch, masks, kernel="native"):
    """The packed API on the batch concatenated, split back per sample."""
    values, rewards, _, offsets, terminal = batch.packed()
    advantages, returns = gaecli.masked_gae_packed(
        values, rewards, torch.cat(masks), offsets, terminal, gamma=batch.gamma, lambd=batch.lambd, kernel=kernel
    )
    lengths = [v.numel() for v in batch.values]
    return list(torch.split(advantages, lengths)), list(torch.split(returns, lengths))


def ragged(seed, dtype, lengths=LENGTHS):
    kinds = [MASK_KINDS[i % len(MASK_KINDS)] for i in range(len(lengths))]  # "zeros": fully masked samples
    return make_batch(seed, lengths, kinds, dtype=dtype)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8, torch.int64, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_place_equals_packed_reference_and_oracle(seed, dtype, mask_dtype, request):
    batch = ragged(seed, dtype)
    masks = [mask.to(mask_dtype) for mask in batch.masks]
    expected_advantages, expected_returns = packed_split(batch, masks)
    # The reference kernel (a float64 loop) on float64 inputs, rounded once to the dtype.
    batch64 = batch.as_float64()
    reference = gaecli.masked_gae(*batch64.args(), gamma=batch.gamma, lambd=batch.lambd, kernel="reference")
    request.getfixturevalue("in_place_only")
    advantages, returns = gaecli.masked_gae(
        batch.values, batch.rewards, masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    assert [a.numel() for a in advantages] == LENGTHS
    for index in range(len(LENGTHS)):
        assert_bitwise(f"advantages {index}", expected_advantages[index], advantages[index])
        assert_bitwise(f"returns {index}", expected_returns[index], returns[index])
        assert_bitwise(f"reference advantages {index}", reference[0][index].to(dtype), advantages[index])
        assert_bitwise(f"reference returns {index}", reference[1][index].to(dtype), returns[index])
    oracle_advantages, oracle_returns = oracle_batch("masked", batch)
    assert_close("advantages", oracle_advantages, advantages)
    assert_close("returns", oracle_returns, returns)
    for index, kind in enumerate(batch.kinds):
        if kind == "zeros":  # a fully masked sample is all 0
            assert not advantages[index].any() and not returns[index].any()


def test_strided_tensors_read_as_their_elements(in_place_only):
    batch = ragged(3, torch.float32)
    expected = gaecli.masked_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd)

    def strided(tensors):  # every other element of a buffer twice as long, the rest garbage
        views = []
        for tensor in tensors:
            buffer = torch.full((2 * tensor.numel(),), 7, dtype=tensor.dtype)
            buffer[::2] = tensor
            views.append(buffer[::2])
        return views

    values, rewards, masks = strided(batch.values), strided(batch.rewards), strided(batch.masks)
    assert any(not tensor.is_contiguous() for tensor in values + rewards + masks)
    snapshot = [tensor.clone() for tensor in values + rewards + masks]
    advantages, returns = gaecli.masked_gae(
        values, rewards, masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    for index in range(len(LENGTHS)):
        assert_bitwise(f"advantages {index}", expected[0][index], advantages[index])
        assert_bitwise(f"returns {index}", expected[1][index], returns[index])
    for before, after in zip(snapshot, values + rewards + masks):
        assert torch.equal(before, after)  # the input untouched


def test_many_samples_of_equal_power_of_two_length(in_place_only):
    # Separately allocated samples 4 KiB apart (the lanes' separation) and a ragged tail.
    lengths = [1024] * 24 + [4096] * 6 + list(range(0, 3000, 97))
    batch = make_batch(4, lengths, dtype=torch.float32)
    masks = [mask.to(torch.uint8) for mask in batch.masks]
    snapshot = [tensor.clone() for tensor in batch.values + batch.rewards + masks]
    advantages, returns = gaecli.masked_gae(
        batch.values, batch.rewards, masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    expected_advantages, expected_returns = packed_split(batch, masks)
    for index in range(len(lengths)):
        assert_bitwise(f"advantages {index}", expected_advantages[index], advantages[index])
        assert_bitwise(f"returns {index}", expected_returns[index], returns[index])
    oracle_advantages, oracle_returns = oracle_batch("masked", batch.subset(range(0, len(lengths), 7)))
    assert_close("advantages", oracle_advantages, advantages[::7])
    assert_close("returns", oracle_returns, returns[::7])
    for before, after in zip(snapshot, batch.values + batch.rewards + masks):
        assert torch.equal(before, after)


def test_numpy_arrays_read_in_place(in_place_only):
    batch = ragged(5, torch.float64)
    expected = packed_split(batch, batch.masks)
    got = gaecli.masked_gae(
        [v.numpy() for v in batch.values],
        [r.numpy() for r in batch.rewards],
        [m.numpy() for m in batch.masks],
        np.array(batch.terminals),
        gamma=batch.gamma,
        lambd=batch.lambd,
    )
    for expected_part, got_part in zip(expected, got):
        for index, (want, have) in enumerate(zip(expected_part, got_part)):
            assert_bitwise(f"sample {index}", want, have)


def test_only_empty_samples_and_no_samples():
    advantages, returns = gaecli.masked_gae(
        [torch.zeros(0), torch.zeros(0)], [torch.zeros(0), torch.zeros(0)], [torch.zeros(0)] * 2, [1.0, 2.0],
        gamma=0.9, lambd=0.9,
    )  # fmt: skip
    assert [a.numel() for a in advantages] == [0, 0] and [r.numel() for r in returns] == [0, 0]
    assert gaecli.masked_gae([], [], [], [], gamma=0.9, lambd=0.9) == ([], [])


def test_mixed_dtypes_take_the_general_path():
    # float32 and float64 samples: values promote to float64, as torch.cat promotes them.
    batch = ragged(6, torch.float32)
    values = [v.double() if i % 2 else v for i, v in enumerate(batch.values)]
    advantages, returns = gaecli.masked_gae(
        values, batch.rewards, batch.masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    flat_values, flat_rewards, flat_mask, offsets, terminal = batch.packed()
    expected = gaecli.masked_gae_packed(
        torch.cat(values), flat_rewards, flat_mask, offsets, terminal, gamma=batch.gamma, lambd=batch.lambd
    )
    assert_bitwise("advantages", expected[0], torch.cat(advantages))
    assert_bitwise("returns", expected[1], torch.cat(returns))


@pytest.mark.parametrize(
    "column, sample, token, bad, message",
    [
        ("values", 8, 100, math.nan, "sample 8: values is nan at token 100 (must be finite)"),
        ("rewards", 12, 0, -math.inf, "sample 12: rewards is -inf at token 0 (must be finite)"),
        ("values", 13, 0, math.inf, "sample 13: values is inf at token 0 (must be finite)"),
        ("mask", 6, 63, 2, "sample 6: loss_mask value 2 at token 63 is not 0 or 1"),
        ("terminal", 3, None, math.nan, "sample 3: terminal reward is nan (must be finite)"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_first_offending_sample_and_token_named(dtype, column, sample, token, bad, message):
    batch = ragged(7, dtype)
    masks = [mask.to(torch.int32) for mask in batch.masks]
    terminals = list(batch.terminals)
    if column == "terminal":
        terminals[sample] = bad
    else:
        target = {"values": batch.values, "rewards": batch.rewards, "mask": masks}[column]
        target[sample][token] = bad
        if sample < 12:
            target[12][200] = 5 if column == "mask" else math.nan  # a later offence, not the one named
    snapshot = [tensor.clone() for tensor in batch.values + batch.rewards + masks]
    with pytest.raises(GAEInputError) as raised:
        gaecli.masked_gae(batch.values, batch.rewards, masks, terminals, gamma=batch.gamma, lambd=batch.lambd)
    assert str(raised.value) == message
    for before, after in zip(snapshot, batch.values + batch.rewards + masks):
        torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)  # the input untouched


def test_parameters_that_require_grad_read_in_place(in_place_only):
    batch = ragged(8, torch.float32)
    expected = gaecli.masked_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd)
    values = [torch.nn.Parameter(value.clone()) for value in batch.values]
    advantages, returns = gaecli.masked_gae(
        values, batch.rewards, batch.masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    for index in range(len(LENGTHS)):
        assert not advantages[index].requires_grad
        assert_bitwise(f"advantages {index}", expected[0][index], advantages[index])
        assert_bitwise(f"returns {index}", expected[1][index], returns[index])


def negative_bit(tensor, sign=1, strided=False):
    """``sign * tensor`` as a tensor whose memory holds it negated, with its negative bit set
    (``is_neg()``), made without a copy: contiguous by ``torch._neg_view`` (the case a kernel
    reading memory by address meets), or with ``strided`` as the imaginary part of a
    conjugate view (stride 2)."""
    if strided:
        view = torch.complex(torch.zeros_like(tensor), -sign * tensor).conj().imag
    else:
        view = torch._neg_view(-sign * tensor)
    assert view.is_neg() and view.is_contiguous() != strided and torch.equal(view, sign * tensor)
    return view


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_tensors_with_the_negative_bit_read_as_their_numbers(dtype, in_place_only):
    batch = ragged(9, dtype)
    masks = [mask.to(dtype) for mask in batch.masks]
    expected = packed_split(batch, masks)  # the packed API on tensors without the bit
    values = [negative_bit(value, strided=index == 3) for index, value in enumerate(batch.values)]
    rewards = [negative_bit(reward) if index % 2 else reward for index, reward in enumerate(batch.rewards)]
    negative_masks = [negative_bit(mask) for mask in masks]
    oracle_advantages, oracle_returns = oracle_batch("masked", batch)
    for mask_column in (masks, negative_masks):
        advantages, returns = gaecli.masked_gae(
            values, rewards, mask_column, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
        )
        for index in range(len(LENGTHS)):
            assert_bitwise(f"advantages {index}", expected[0][index], advantages[index])
            assert_bitwise(f"returns {index}", expected[1][index], returns[index])
        assert_close("advantages", oracle_advantages, advantages)
        assert_close("returns", oracle_returns, returns)
    # The packed form on flat tensors with the bit: the same numbers.
    _, _, _, offsets, terminal = batch.packed()
    flat = [negative_bit(torch.cat(column)) for column in (batch.values, batch.rewards, masks)]
    packed = gaecli.masked_gae_packed(*flat, offsets, terminal, gamma=batch.gamma, lambd=batch.lambd)
    assert_bitwise("packed advantages", torch.cat(expected[0]), packed[0])
    assert_bitwise("packed returns", torch.cat(expected[1]), packed[1])
    for before, after in zip(batch.values + batch.rewards + masks, values + rewards + negative_masks):
        assert torch.equal(before, after)  # the input untouched


def test_a_negated_mask_value_is_named():
    # The mask's memory holds 1 and its negative bit is set: the value is -1, not 0 or 1.
    batch = ragged(10, torch.float32)
    masks = [mask.float() for mask in batch.masks]
    masks[4] = negative_bit(torch.ones(LENGTHS[4]), sign=-1)
    with pytest.raises(GAEInputError) as raised:
        gaecli.masked_gae(batch.values, batch.rewards, masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd)
    assert str(raised.value) == "sample 4: loss_mask value -1.0 at token 0 is not 0 or 1"


def test_a_tensor_without_memory_is_read_as_zeros():
    # torch's ZeroTensor (autograd makes them) has no memory (address 0): never read by address.
    batch = ragged(11, torch.float32)
    values = list(batch.values)
    values[3] = torch._efficientzerotensor(LENGTHS[3])
    assert values[3].data_ptr() == 0 and LENGTHS[3] > 0
    expected_values = list(batch.values)
    expected_values[3] = torch.zeros(LENGTHS[3])
    expected = gaecli.masked_gae(
        expected_values, batch.rewards, batch.masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd
    )
    got = gaecli.masked_gae(values, batch.rewards, batch.masks, batch.terminals, gamma=batch.gamma, lambd=batch.lambd)
    for expected_part, got_part in zip(expected, got):
        for index, (want, have) in enumerate(zip(expected_part, got_part)):
            assert_bitwise(f"sample {index}", want, have)
