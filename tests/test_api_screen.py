"""The input checks folded into the kernel's pass: whatever path computes, a bad value or
mask entry raises the same one-line message naming the first offending sample and token (the
expected messages below are written by hand), ``validate=False`` lets non-finite numbers
through but never bad mask values, and numpy arrays are taken where the list API takes
tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gaecli
from gaecli import GAEInputError

from helpers import assert_close, masked_gae_oracle

GAMMA, LAMBD = 0.9, 0.8

# Three samples of 4, 5 and 3 tokens; trainable (1) and masked (0) positions per sample.
MASKS = [[1, 0, 1, 1], [0, 1, 1, 0, 1], [1, 1, 0]]
VALUES = [[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.5, 3.0, 1.0], [2.5, -2.0, 0.75]]
REWARDS = [[0.0, 1.0, 0.0, 0.5], [0.25, 0.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0]]
TERMINALS = [1.0, -1.0, 0.5]

# (what is broken, sample, token, bad value, the message expected).
CASES = [
    ("values", 0, 0, math.nan, "sample 0: values is nan at token 0 (must be finite)"),  # first, trainable
    ("values", 0, 1, math.inf, "sample 0: values is inf at token 1 (must be finite)"),  # first, masked
    ("rewards", 1, 0, -math.inf, "sample 1: rewards is -inf at token 0 (must be finite)"),  # middle, masked
    ("rewards", 1, 2, math.nan, "sample 1: rewards is nan at token 2 (must be finite)"),  # middle, trainable
    ("values", 2, 2, math.nan, "sample 2: values is nan at token 2 (must be finite)"),  # last, masked
    ("rewards", 2, 1, math.inf, "sample 2: rewards is inf at token 1 (must be finite)"),  # last, trainable
    ("mask", 0, 3, 2, "sample 0: loss_mask value 2 at token 3 is not 0 or 1"),
    ("mask", 1, 1, -1, "sample 1: loss_mask value -1 at token 1 is not 0 or 1"),
    ("mask", 2, 0, 0.5, "sample 2: loss_mask value 0.5 at token 0 is not 0 or 1"),
    ("mask", 1, 4, math.nan, "sample 1: loss_mask value nan at token 4 is not 0 or 1"),
]


def batch(dtype, broken=None, sample=0, token=0, bad=0.0, mask_dtype=None):
    """The batch above as lists of tensors, with one entry broken."""
    if mask_dtype is None:  # integer masks, float where the bad mask value needs one
        mask_dtype = torch.float32 if broken == "mask" and not float(bad).is_integer() else torch.int64
    values = [torch.tensor(v, dtype=dtype) for v in VALUES]
    rewards = [torch.tensor(r, dtype=dtype) for r in REWARDS]
    masks = [torch.tensor(m, dtype=mask_dtype) for m in MASKS]
    target = {"values": values, "rewards": rewards, "mask": masks}.get(broken)
    if target is not None:
        target[sample][token] = bad
    return values, rewards, masks


def call(form, values, rewards, masks, **options):
    if form == "list":
        return gaecli.masked_gae(values, rewards, masks, TERMINALS, gamma=GAMMA, lambd=LAMBD, **options)
    offsets = torch.tensor([0, 4, 9, 12])
    return gaecli.masked_gae_packed(
        torch.cat(values),
        torch.cat(rewards),
        torch.cat(masks),
        offsets,
        TERMINALS,
        gamma=GAMMA,
        lambd=LAMBD,
        **options,
    )


@pytest.mark.parametrize("kernel", ["auto", "native", "scan"])
@pytest.mark.parametrize("form", ["list", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_first_offending_sample_and_token_named(case, dtype, form, kernel):
    broken, sample, token, bad, message = case
    values, rewards, masks = batch(dtype, broken, sample, token, bad)
    # A second offence of the same kind further on must not be the one named (values are
    # checked before rewards, and the mask before both, over the whole batch).
    if (sample, token) != (2, 2):
        {"values": values, "rewards": rewards, "mask": masks}[broken][2][2] = 3 if broken == "mask" else math.inf
    with pytest.raises(GAEInputError) as raised:
        call(form, values, rewards, masks, kernel=kernel)
    assert str(raised.value) == message


@pytest.mark.parametrize("form", ["list", "packed"])
@pytest.mark.parametrize("bad", [2, -1], ids=["2", "-1"])
def test_bad_integer_and_bool_free_masks(form, bad):
    values, rewards, masks = batch(torch.float32, "mask", 1, 3, bad, mask_dtype=torch.int32)
    with pytest.raises(GAEInputError) as raised:
        call(form, values, rewards, masks)
    assert str(raised.value) == f"sample 1: loss_mask value {bad} at token 3 is not 0 or 1"


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_validate_false_lets_non_finite_numbers_through(bad):
    values, rewards, masks = batch(torch.float64, "values", 1, 0, bad)  # masked position of sample 1
    advantages, returns = call("packed", values, rewards, masks, validate=False)
    # Masked positions are 0 whatever they hold; the other samples are untouched by sample 1.
    assert advantages[4].item() == 0.0 and returns[4].item() == 0.0
    clean_advantages, _ = call("packed", *batch(torch.float64))
    assert torch.equal(advantages[:4], clean_advantages[:4]) and torch.equal(advantages[9:], clean_advantages[9:])


def test_validate_false_still_checks_mask_values():
    values, rewards, masks = batch(torch.float32, "mask", 2, 1, 0.5)
    with pytest.raises(GAEInputError) as raised:
        call("packed", values, rewards, masks, validate=False)
    assert str(raised.value) == "sample 2: loss_mask value 0.5 at token 1 is not 0 or 1"


@pytest.mark.parametrize(
    "mask_dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_mask_dtype_gives_the_oracle(dtype, mask_dtype):
    values, rewards, masks = batch(dtype, mask_dtype=mask_dtype)
    advantages, returns = gaecli.masked_gae(values, rewards, masks, TERMINALS, gamma=GAMMA, lambd=LAMBD)
    for index, (value, reward, mask, terminal) in enumerate(zip(VALUES, REWARDS, MASKS, TERMINALS)):
        expected_advantages, expected_returns = masked_gae_oracle(value, reward, mask, terminal, GAMMA, LAMBD)
        assert advantages[index].dtype == returns[index].dtype == dtype
        assert_close(f"advantages {index}", torch.tensor(expected_advantages, dtype=torch.float64), advantages[index])
        assert_close(f"returns {index}", torch.tensor(expected_returns, dtype=torch.float64), returns[index])


def test_numpy_arrays_and_lists_are_taken_like_tensors():
    values, rewards, masks = batch(torch.float32, mask_dtype=torch.bool)
    from_tensors = gaecli.masked_gae(values, rewards, masks, TERMINALS, gamma=GAMMA, lambd=LAMBD)
    from_numpy = gaecli.masked_gae(
        [v.numpy() for v in values],
        [r.numpy() for r in rewards],
        [m.numpy() for m in masks],
        np.array(TERMINALS),
        gamma=GAMMA,
        lambd=LAMBD,
    )
    for got, want in zip(from_numpy[0] + from_numpy[1], from_tensors[0] + from_tensors[1]):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    from_lists = gaecli.masked_gae([[1.0, 2.0]], [[0.0, 1.0]], [[1, 1]], [0.0], gamma=1.0, lambd=1.0)
    # Hand-worked: A_1 = 1 - 2 = -1, A_0 = 0 + 2 - 1 + (-1) = 0 (γ = λ = 1).
    assert from_lists[0][0].tolist() == [0.0, -1.0]


def test_non_array_sample_named():
    values, rewards, masks = batch(torch.float32)
    values[1] = object()
    with pytest.raises(GAEInputError) as raised:
        gaecli.masked_gae(values, rewards, masks, TERMINALS, gamma=GAMMA, lambd=LAMBD)
    assert str(raised.value) == "sample 1: values must be a 1-D tensor or array"
