"""The public API around the kernels: edge cases (empty batch, empty and one-token samples,
dtypes, mask and terminal-reward types), input errors naming the sample, kernel names, and
whitening."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import gaecli
from gaecli import GAEInputError, KernelUnavailableError

from helpers import KERNEL_NAMES, assert_bitwise, assert_close, make_batch, oracle_batch

GAMMA, LAMBD = 0.9, 0.8


def gae(values, rewards, masks, terminals, kernel="auto", **discount):
    discount = {"gamma": GAMMA, "lambd": LAMBD, **discount}
    return gaecli.masked_gae(values, rewards, masks, terminals, kernel=kernel, **discount)


def tensors(*lists, dtype=torch.float32):
    return [torch.tensor(xs, dtype=dtype) for xs in lists]


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("kernel", ["auto", *KERNEL_NAMES])
def test_empty_batch_gives_empty_lists(kernel):
    assert gae([], [], [], [], kernel=kernel) == ([], [])
    advantages, returns = gaecli.masked_gae_packed(
        torch.zeros(0),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.bool),
        torch.zeros(1, dtype=torch.int64),
        [],
        gamma=GAMMA,
        lambd=LAMBD,
        kernel=kernel,
    )
    assert advantages.shape == returns.shape == (0,)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_empty_sample_among_others(kernel):
    values = tensors([1.0, 2.0], [], [0.5], [])
    rewards = tensors([0.25, 0.5], [], [1.0], [])
    masks = tensors([1, 1], [], [1], [], dtype=torch.bool)
    advantages, returns = gae(values, rewards, masks, [1.0, 9.0, 2.0, 9.0], kernel=kernel)
    assert [a.shape[0] for a in advantages] == [r.shape[0] for r in returns] == [2, 0, 1, 0]
    # Sample 0 (γ = 0.9, λ = 0.8, z = 1):
    #   A1 = 0.5 + 1 − 2 = −0.5
    #   A0 = (0.25 + 0.9·2 − 1) + 0.72·(−0.5) = 1.05 − 0.36 = 0.69
    # Sample 2 (one token): A = 1 + 2 − 0.5 = 2.5
    assert_close(kernel, torch.tensor([0.69, -0.5], dtype=torch.float64), advantages[0])
    assert_close(kernel, torch.tensor([2.5], dtype=torch.float64), advantages[2])
    assert_close(kernel, torch.tensor([1.69, 1.5], dtype=torch.float64), returns[0])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_one_token_samples(kernel):
    # Trainable: A = r + z − V = 0.5 + 2 − 1.5 = 1, return = r + z = 2.5. Masked: zeros.
    values, rewards = tensors([1.5], [1.5]), tensors([0.5], [0.5])
    masks = tensors([1], [0], dtype=torch.bool)
    advantages, returns = gae(values, rewards, masks, [2.0, 2.0], kernel=kernel)
    assert advantages[0].item() == 1.0 and returns[0].item() == 2.5
    assert advantages[1].item() == 0.0 and returns[1].item() == 0.0


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_all_zero_masks_give_zeros(kernel):
    batch = make_batch(1, [5, 12], ["zeros", "zeros"])
    advantages, returns = gae(*batch.args(), kernel=kernel)
    for index, length in enumerate((5, 12)):
        assert_bitwise(f"{kernel} sample {index}", torch.zeros(length), advantages[index])
        assert_bitwise(f"{kernel} sample {index} returns", torch.zeros(length), returns[index])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_float64_inputs_keep_float64(kernel):
    batch = make_batch(2, [7, 0, 30], gamma=GAMMA, lambd=LAMBD, dtype=torch.float64)
    advantages, returns = gae(*batch.args(), kernel=kernel)
    assert all(a.dtype == torch.float64 for a in advantages)
    assert all(r.dtype == torch.float64 for r in returns)
    expected, _ = oracle_batch("masked", batch)
    assert_close(kernel, expected, advantages)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_bool_int_and_float_masks_agree(kernel):
    batch = make_batch(3, [9, 20, 0, 4])
    results = {
        dtype: gae(batch.values, batch.rewards, [m.to(dtype) for m in batch.masks], batch.terminals, kernel=kernel)
        for dtype in (torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64)
    }
    expected_advantages, expected_returns = results[torch.bool]
    for dtype, (advantages, returns) in results.items():
        for index in range(len(batch)):
            assert_bitwise(f"{kernel} {dtype} mask, sample {index}", expected_advantages[index], advantages[index])
            assert_bitwise(f"{kernel} {dtype} mask, sample {index} returns", expected_returns[index], returns[index])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_terminal_rewards_as_ints_list_or_tensor_agree(kernel):
    batch = make_batch(4, [6, 11, 3], ["ones", "blocks", "random"])
    as_floats = gae(batch.values, batch.rewards, batch.masks, [1.0, -2.0, 3.0], kernel=kernel)
    variants = {
        "int list": [1, -2, 3],
        "int tensor": torch.tensor([1, -2, 3]),
        "float32 tensor": torch.tensor([1.0, -2.0, 3.0]),
        "float64 tensor": torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64),
        "tuple": (1.0, -2.0, 3.0),
    }
    for name, terminals in variants.items():
        advantages, returns = gae(batch.values, batch.rewards, batch.masks, terminals, kernel=kernel)
        for index in range(len(batch)):
            assert_bitwise(f"{kernel} {name} sample {index}", as_floats[0][index], advantages[index])
            assert_bitwise(f"{kernel} {name} sample {index} returns", as_floats[1][index], returns[index])


def test_inputs_are_untouched():
    batch = make_batch(5, [8, 8])
    before = [v.clone() for v in batch.values], [r.clone() for r in batch.rewards], [m.clone() for m in batch.masks]
    gae(*batch.args())
    for originals, now in zip(before, (batch.values, batch.rewards, batch.masks)):
        for original, tensor in zip(originals, now):
            assert torch.equal(original, tensor)


# ----------------------------------------------------------------------------- errors


def good_batch():
    return make_batch(6, [4, 5, 6, 3], ["ones", "random", "blocks", "ones"])


def test_input_error_is_a_value_error():
    assert issubclass(GAEInputError, ValueError)
    assert issubclass(KernelUnavailableError, ValueError)


@pytest.mark.parametrize("which", ["values", "rewards", "masks"])
def test_length_mismatch_names_the_sample(which):
    batch = good_batch()
    getattr(batch, which)[2] = getattr(batch, which)[2][:-1]
    with pytest.raises(GAEInputError, match="sample 2"):
        gae(*batch.args())


def test_sample_count_mismatch():
    batch = good_batch()
    with pytest.raises(GAEInputError, match="terminal_rewards"):
        gae(batch.values, batch.rewards, batch.masks, batch.terminals[:-1])
    with pytest.raises(GAEInputError, match="rewards"):
        gae(batch.values, batch.rewards[:-1], batch.masks, batch.terminals)


@pytest.mark.parametrize("bad", [2.0, 0.5, -1.0, math.nan], ids=["2", "0.5", "-1", "nan"])
def test_bad_mask_value_names_the_sample(bad):
    batch = good_batch()
    masks = [m.float() for m in batch.masks]
    masks[1][3] = bad
    with pytest.raises(GAEInputError, match="sample 1.*loss_mask"):
        gae(batch.values, batch.rewards, masks, batch.terminals)


def test_integer_mask_value_two_names_the_sample():
    batch = good_batch()
    masks = [m.long() for m in batch.masks]
    masks[3][0] = 2
    with pytest.raises(GAEInputError, match="sample 3"):
        gae(batch.values, batch.rewards, masks, batch.terminals)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("which", ["values", "rewards"])
def test_non_finite_inputs_name_the_sample(which, bad):
    batch = good_batch()
    getattr(batch, which)[2][1] = bad
    with pytest.raises(GAEInputError, match=f"sample 2: {which}"):
        gae(*batch.args())


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_terminal_reward_names_the_sample(bad):
    batch = good_batch()
    batch.terminals[3] = bad
    with pytest.raises(GAEInputError, match="sample 3: terminal"):
        gae(*batch.args())
    with pytest.raises(GAEInputError, match="sample 3: terminal"):
        gae(batch.values, batch.rewards, batch.masks, torch.tensor(batch.terminals))


@pytest.mark.parametrize(
    "discount",
    [{"gamma": -0.1}, {"gamma": 1.01}, {"lambd": -1e-9}, {"lambd": 2.0}, {"gamma": math.nan}, {"lambd": math.inf}],
    ids=["gamma<0", "gamma>1", "lambd<0", "lambd>1", "gamma-nan", "lambd-inf"],
)
def test_discount_outside_unit_interval(discount):
    batch = good_batch()
    name = next(iter(discount))
    with pytest.raises(GAEInputError, match=name):
        gae(*batch.args(), **discount)


def test_unknown_kernel_raises():
    batch = good_batch()
    with pytest.raises(KernelUnavailableError, match="unknown kernel 'fastest'"):
        gae(*batch.args(), kernel="fastest")
    with pytest.raises(KernelUnavailableError):
        gaecli.resolve_kernel("no-such-kernel")


def test_kernel_names_resolve():
    assert gaecli.available_kernels() == KERNEL_NAMES
    assert gaecli.resolve_kernel("auto", "cpu") in KERNEL_NAMES
    assert gaecli.resolve_kernel("auto", "cpu") == ("native" if "native" in KERNEL_NAMES else "scan")
    assert gaecli.resolve_kernel("auto", "cuda") == "scan"
    assert "native" not in gaecli.available_kernels("cuda")
    for name in KERNEL_NAMES:
        assert gaecli.resolve_kernel(name) == name
    if "native" in KERNEL_NAMES:
        with pytest.raises(KernelUnavailableError, match="cannot run on cuda"):
            gaecli.resolve_kernel("native", "cuda")


def test_packed_offsets_are_checked():
    values = torch.zeros(5)
    mask = torch.ones(5, dtype=torch.bool)
    for offsets, message in (
        (torch.tensor([0, 3]), "end at len"),
        (torch.tensor([1, 5]), "start at 0"),
        (torch.tensor([0, 4, 2, 5]), "sample 1: offsets decrease"),
        (torch.tensor([0.0, 5.0]), "integer"),
    ):
        terminals = torch.zeros(offsets.numel() - 1)
        with pytest.raises(GAEInputError, match=message):
            gaecli.masked_gae_packed(values, values, mask, offsets, terminals, gamma=GAMMA, lambd=LAMBD)


# ----------------------------------------------------------------------------- whiten


def numpy_whiten(advantages: np.ndarray, mask: np.ndarray) -> np.ndarray:
    trainable = advantages[mask]
    mean = trainable.mean()
    variance = trainable.var(ddof=1) if trainable.size > 1 else 0.0
    return np.where(mask, (advantages - mean) / np.sqrt(variance + 1e-8), 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_whiten_matches_numpy(dtype):
    batch = make_batch(8, [30, 0, 17, 44], ["blocks", "ones", "zeros", "random"], dtype=dtype)
    advantages, _ = gae(*batch.args())
    whitened = gaecli.whiten(advantages, batch.masks)
    flat_advantages = torch.cat(advantages).double().numpy()
    flat_mask = torch.cat(batch.masks).numpy()
    expected = numpy_whiten(flat_advantages, flat_mask)
    assert all(w.dtype == dtype for w in whitened)
    assert_close("whiten list form", torch.from_numpy(expected), torch.cat(whitened))
    whitened_trainable = torch.cat(whitened).double()[torch.from_numpy(flat_mask)]
    assert abs(float(whitened_trainable.mean())) < 1e-6
    assert abs(float(whitened_trainable.std()) - 1.0) < 1e-6

    flat = gaecli.whiten(torch.cat(advantages), torch.cat(batch.masks))
    assert_bitwise("whiten flat form = list form", torch.cat(whitened), flat)


def test_whiten_keeps_masked_positions_zero():
    advantages = torch.tensor([3.0, 100.0, -1.0, 7.0, 50.0])
    mask = torch.tensor([1, 0, 1, 1, 0])
    whitened = gaecli.whiten(advantages, mask)
    assert whitened[1].item() == 0.0 and whitened[4].item() == 0.0
    # Trainable [3, −1, 7]: mean 3, Bessel variance (0 + 16 + 16) / 2 = 16, std 4.
    expected = torch.tensor([0.0, 0.0, -1.0, 1.0, 0.0], dtype=torch.float64) * (4 / math.sqrt(16 + 1e-8))
    assert_close("whiten by hand", expected, whitened)


def test_whiten_one_trainable_token_is_zero():
    whitened = gaecli.whiten([torch.tensor([5.0, 2.0]), torch.tensor([9.0])], [torch.tensor([0, 1]), torch.tensor([0])])
    assert torch.equal(whitened[0], torch.zeros(2)) and torch.equal(whitened[1], torch.zeros(1))


def test_whiten_without_trainable_tokens_raises():
    with pytest.raises(GAEInputError, match="no trainable"):
        gaecli.whiten(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]))
    with pytest.raises(GAEInputError, match="no trainable"):
        gaecli.whiten([torch.tensor([1.0])], [torch.tensor([False])])


def test_whiten_rejects_bad_masks():
    with pytest.raises(GAEInputError):
        gaecli.whiten(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.5]))
    with pytest.raises(GAEInputError):
        gaecli.whiten(torch.tensor([1.0, 2.0]), torch.tensor([1, 1, 0]))


# ----------------------------------------------------------------------------- docs


def test_python_api_doc_example_runs(capsys):
    # The example of docs/python-api.md runs, and prints what its comments say.
    document = (Path(__file__).resolve().parent.parent / "docs" / "python-api.md").read_text()
    example = document.split("## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example, "docs/python-api.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    commented = [
        line.split("# ", 1)[1]
        for line in example.splitlines()
        if line.startswith("print(") or line.startswith("    print(")
    ]
    assert len(printed) == len(commented)
    for got, expected in zip(printed, commented):
        if expected.startswith("native"):
            assert got == gaecli.resolve_kernel("auto")
        else:
            assert got == expected
