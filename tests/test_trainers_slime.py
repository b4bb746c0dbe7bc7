"""The slime and miles drop-ins (gaecli.trainers.slime, gaecli.trainers.miles) against slime's
and miles' GAE written out in tests/trainer_loops_slime.py, in their layout: lists of per-sample
response tensors with masked tool blocks, responses ending masked, fully masked and empty
samples, a KL-like reward at every token; slime's outcome on token R−1, miles' given apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trainer_loops_slime import (
    chunked_gae_row,
    contract_in_slime_layout,
    miles_row,
    pre_fix_miles_row,
    slime_row,
    vanilla_gae_row,
)

import gaecli
from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.trainers import miles, slime

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
GAMMAS = [(1.0, 0.95), (0.9, 0.7), (0.0, 1.0), (1.0, 1.0)]


def _samples(seed: int, batch: int = 11, longest: int = 40):
    """Per sample ``(values, kl, mask, terminal)`` as float lists: a masked tool block in most,
    some ending masked, one fully masked, one empty; the KL-like reward at every token (slime
    and miles compute it at masked tokens too)."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(batch):
        length = 0 if i == batch - 1 else int(rng.integers(1, longest + 1))
        mask = np.ones(length)
        if i % 2 == 0 and length > 3:
            start = int(rng.integers(1, length - 1))
            mask[start : start + int(rng.integers(1, 6))] = 0
        if i % 3 == 0 and length > 1:
            mask[-int(rng.integers(1, 3)) :] = 0  # ends in a tool output
        if i == batch - 2:
            mask[:] = 0  # fully masked
        values = rng.normal(size=length)
        kl = rng.normal(size=length) * 0.05
        samples.append((values.tolist(), kl.tolist(), mask.tolist(), float(rng.choice([0.0, 1.0, -0.5]))))
    return samples


def _with_outcome(kl, terminal):
    """slime's rewards: the KL term at every token, the outcome added to the last."""
    rewards = list(kl)
    if rewards:
        rewards[-1] += terminal
    return rewards


def _tensors(rows, device, dtype=torch.float64):
    return [torch.tensor(row, dtype=dtype, device=device) for row in rows]


def _lengths(samples):
    return [len(values) for values, *_ in samples]


def _assert_rows(got, expected, lengths, device, dtype=torch.float64):
    """Every sample's tensor: 1-D of its response length, on ``device`` in ``dtype``, equal to the loop's."""
    assert isinstance(got, list) and len(got) == len(expected)
    for tensor, row, length in zip(got, expected, lengths):
        assert tensor.shape == (length,) and tensor.device.type == device and tensor.dtype == dtype
        np.testing.assert_allclose(tensor.cpu().numpy(), np.asarray(row, dtype=float), rtol=1e-10, atol=1e-12)


def _assert_zero_at_masked(outputs, masks):
    """Exactly 0 (not merely close) at every masked position."""
    for tensor, mask in zip(outputs, masks):
        assert all(x == 0.0 for x, m in zip(tensor.cpu().tolist(), mask) if not m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("gamma, lambd", GAMMAS)
def test_slime_profile_is_slimes_loop_at_every_position(device, chunked, gamma, lambd):
    samples = _samples(seed=int(gamma * 10 + lambd * 100))
    lengths = _lengths(samples)
    rewards = [_with_outcome(kl, z) for _, kl, _, z in samples]
    values_list = _tensors([s[0] for s in samples], device)
    rewards_list = _tensors(rewards, device)
    masks = _tensors([s[2] for s in samples], device)
    totals = [length + 7 for length in lengths]
    advantages, returns = slime.get_advantages_and_returns_batch(
        totals, lengths, values_list, rewards_list, gamma, lambd, chunked, loss_masks=masks, semantics="slime"
    )
    rows = [slime_row(s[0], r, gamma, lambd) for s, r in zip(samples, rewards)]
    _assert_rows(advantages, [a for a, _ in rows], lengths, device)
    _assert_rows(returns, [ret for _, ret in rows], lengths, device)
    # bit for bit as gaecli's profile gives it, with or without the masks (slime reads none)
    offsets = torch.tensor(np.cumsum([0, *lengths]), device=device)
    flat = gaecli.baseline_gae_packed(
        torch.cat(values_list), torch.cat(rewards_list), torch.cat(masks), offsets,
        torch.zeros(len(lengths), dtype=torch.float64, device=device), gamma=gamma, lambd=lambd, semantics="slime",
    )  # fmt: skip
    assert torch.equal(torch.cat(advantages), flat[0]) and torch.equal(torch.cat(returns), flat[1])
    unmasked = slime.get_advantages_and_returns_batch(
        totals, lengths, values_list, rewards_list, gamma, lambd, semantics="slime"
    )
    assert all(torch.equal(a, b) for a, b in zip(unmasked[0], advantages))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("gamma, lambd", GAMMAS)
def test_slime_masked_is_the_contract_with_the_outcome_moved(device, chunked, gamma, lambd):
    samples = _samples(seed=int(gamma * 10 + lambd * 100) + 1)
    lengths = _lengths(samples)
    rewards = [_with_outcome(kl, z) for _, kl, _, z in samples]
    masks = [s[2] for s in samples]
    advantages, returns = slime.get_advantages_and_returns_batch(
        lengths, lengths, _tensors([s[0] for s in samples], device), _tensors(rewards, device), gamma, lambd,
        chunked=chunked, loss_masks=_tensors(masks, device),
    )  # fmt: skip
    rows = [contract_in_slime_layout(s[0], r, s[2], gamma, lambd) for s, r in zip(samples, rewards)]
    _assert_rows(advantages, [a for a, _ in rows], lengths, device)
    _assert_rows(returns, [ret for _, ret in rows], lengths, device)
    _assert_zero_at_masked(advantages, masks)
    _assert_zero_at_masked(returns, masks)
    # the outcome given apart (the rewards without it): miles' numbers
    advantages, returns = slime.get_advantages_and_returns_batch(
        lengths, lengths, _tensors([s[0] for s in samples], device), _tensors([s[1] for s in samples], device),
        gamma, lambd, loss_masks=_tensors(masks, device), terminal_rewards=[s[3] for s in samples],
    )  # fmt: skip
    rows = [miles_row(v, kl, m, z, gamma, lambd) for v, kl, m, z in samples]
    _assert_rows(advantages, [a for a, _ in rows], lengths, device)
    _assert_rows(returns, [ret for _, ret in rows], lengths, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("gamma, lambd", GAMMAS)
def test_miles_is_miles_loop_and_its_pre_fix_profile(device, chunked, gamma, lambd):
    samples = _samples(seed=int(gamma * 10 + lambd * 100) + 2)
    lengths = _lengths(samples)
    values_list = _tensors([s[0] for s in samples], device)
    kl_list = _tensors([s[1] for s in samples], device)
    masks = [s[2] for s in samples]
    terminal = [s[3] for s in samples]
    arguments = (lengths, lengths, values_list, kl_list, terminal, "thd", None, _tensors(masks, device), gamma, lambd)
    advantages, returns = miles.get_advantages_and_returns_batch(*arguments, chunked=chunked)
    rows = [miles_row(v, kl, m, z, gamma, lambd) for v, kl, m, z in samples]
    _assert_rows(advantages, [a for a, _ in rows], lengths, device)
    _assert_rows(returns, [ret for _, ret in rows], lengths, device)
    _assert_zero_at_masked(advantages, masks)
    _assert_zero_at_masked(returns, masks)
    # miles before its fix: slime's profile with the terminal reward on token R−1
    advantages, returns = miles.get_advantages_and_returns_batch(*arguments, chunked=chunked, semantics="slime")
    rows = [pre_fix_miles_row(v, kl, z, gamma, lambd) for v, kl, _, z in samples]
    _assert_rows(advantages, [a for a, _ in rows], lengths, device)
    _assert_rows(returns, [ret for _, ret in rows], lengths, device)


def test_the_chunked_scan_and_the_loop_give_the_same_numbers():
    """What ``chunked`` switches between: the same numbers, so the drop-ins read it not."""
    rng = np.random.default_rng(3)
    for length, chunk in [(1, 4), (7, 4), (8, 4), (301, 128), (50, 7)]:
        values, rewards = rng.normal(size=length).tolist(), rng.normal(size=length).tolist()
        for gamma, lambd in GAMMAS:
            loop = vanilla_gae_row(values, rewards, gamma, lambd)
            scan = chunked_gae_row(values, rewards, gamma, lambd, chunk_size=chunk)
            np.testing.assert_allclose(scan[0], loop[0], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(scan[1], loop[1], rtol=1e-10, atol=1e-12)


def test_the_worked_example():
    """docs/semantics.md's example (mask [1, 0, 1, 0], z = 8, γ = 0.5, λ = 1) and its fully masked sample."""
    values = _tensors([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]], "cpu")
    rewards = _tensors([[0.5, 1.0, 0.25, 2.0], [0.5, 0.25]], "cpu")
    masks = [torch.tensor([1, 0, 1, 0]), torch.tensor([0, 0])]
    advantages, returns = miles.get_advantages_and_returns_batch(
        [5, 3], [4, 2], values, rewards, [8.0, 4.0], "thd", None, masks, 0.5, 1.0
    )
    assert [a.tolist() for a in advantages] == [[3.625, 0.0, 5.25, 0.0], [0.0, 0.0]]
    assert [r.tolist() for r in returns] == [[4.625, 0.0, 8.25, 0.0], [0.0, 0.0]]
    with_outcome = _tensors([[0.5, 1.0, 0.25, 10.0], [0.5, 4.25]], "cpu")
    advantages, returns = slime.get_advantages_and_returns_batch(
        [5, 3], [4, 2], values, with_outcome, 0.5, 1.0, semantics="slime"
    )
    assert [a.tolist() for a in advantages] == [[1.3125, 1.625, 2.25, 6.0], [1.625, 2.25]]
    assert [r.tolist() for r in returns] == [[2.3125, 3.625, 5.25, 10.0], [2.625, 4.25]]


def test_an_outcome_on_a_masked_last_token_reaches_the_last_trainable_one():
    """γ = 0: slime's own loop leaves the outcome on the tool token, where no trainable token sees it."""
    values = _tensors([[0.5, -0.2, 0.3, 0.9, 0.9]], "cpu")
    rewards = _tensors([[0.1, 0.2, 0.3, 0.0, 10.0]], "cpu")
    mask = [torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])]
    advantages, _ = slime.get_advantages_and_returns_batch([6], [5], values, rewards, 0.0, 0.0, loss_masks=mask)
    np.testing.assert_allclose(advantages[0].numpy(), [0.1 - 0.5, 0.2 + 0.2, 0.3 + 10.0 - 0.3, 0.0, 0.0])
    lost, _ = slime.get_advantages_and_returns_batch([6], [5], values, rewards, 0.0, 0.0, semantics="slime")
    assert lost[0][2].item() == pytest.approx(0.0)


def test_dtype_layout_and_degenerate_batches():
    values = [torch.randn(3), torch.randn(0), torch.randn(2)]
    rewards = [torch.randn(3), torch.randn(0), torch.randn(2)]
    masks = [torch.tensor([True, False, True]), torch.zeros(0, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)]
    advantages, returns = miles.get_advantages_and_returns_batch(
        [4, 1, 3], [3, 0, 2], values, rewards, torch.tensor([1.0, 2.0, 3.0]), "bshd", [8, 8, 8], masks, 1.0, 0.95
    )
    assert [a.shape for a in advantages] == [(3,), (0,), (2,)] and all(a.dtype == torch.float32 for a in advantages)
    assert advantages[0][1] == 0 and returns[2].tolist() == [0.0, 0.0]  # masked; fully masked
    half = slime.get_advantages_and_returns_batch([3], [3], [values[0].bfloat16()], [rewards[0]], 1.0, 1.0)
    assert half[0][0].dtype == torch.bfloat16
    assert slime.get_advantages_and_returns_batch([], [], [], [], 1.0, 1.0) == ([], [])
    nothing = miles.get_advantages_and_returns_batch(
        [3], [2], values[2:], rewards[2:], [1.0], "thd", None, masks[2:], 1.0, 1.0
    )
    assert nothing[0][0].tolist() == [0.0, 0.0]  # a batch with no trainable token: zeros, as miles gives


def test_bad_inputs_name_the_sample():
    values = [torch.randn(3), torch.randn(2)]
    rewards = [torch.randn(3), torch.randn(2)]
    shard = r"sample 1: values_list\[1\] has shape \(2,\), expected \(4,\).*all_gather_with_cp"
    with pytest.raises(GAEInputError, match=shard):
        slime.get_advantages_and_returns_batch([4, 5], [3, 4], values, rewards, 1.0, 1.0)  # a CP rank's shard
    with pytest.raises(GAEInputError, match="rewards_list has 1 samples"):
        slime.get_advantages_and_returns_batch([4, 3], [3, 2], values, rewards[:1], 1.0, 1.0)
    with pytest.raises(GAEInputError, match="terminal_rewards has 3 samples"):
        miles.get_advantages_and_returns_batch(
            [4, 3], [3, 2], values, rewards, [1.0, 2.0, 3.0], "thd", None, [torch.ones(3), torch.ones(2)], 1.0, 1.0
        )
    half_mask = [torch.ones(3), torch.tensor([1.0, 0.5])]
    with pytest.raises(GAEInputError, match="sample 1"):
        miles.get_advantages_and_returns_batch(
            [4, 3], [3, 2], values, rewards, [1.0, 2.0], "thd", None, half_mask, 1, 1
        )
    with pytest.raises(InvalidOptionError, match="semantics='miles'"):
        slime.get_advantages_and_returns_batch([4, 3], [3, 2], values, rewards, 1.0, 1.0, semantics="miles")
