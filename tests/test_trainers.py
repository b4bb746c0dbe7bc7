"""The drop-ins of gaecli.trainers against each trainer's loop written out in
tests/trainer_loops.py, in the trainer's padded layout (tool tokens and padding masked, rows
fully masked, rewards on the last response token, masked or not): the contract and the profile."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch
from trainer_loops import (
    contract_row,
    group_scores,
    masked_whiten,
    openrlhf_cumulative_row,
    openrlhf_gae_row,
    verl_gae_row,
)

from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.trainers import openrlhf, verl

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def _batch(seed: int, rows: int = 9, length: int = 14):
    """A padded batch: per row a response of random length (then padding), a masked tool block
    in most, some ending masked, one fully masked row; per-token rewards (a KL-like term at
    trainable tokens) and the outcome on the response's last token."""
    rng = np.random.default_rng(seed)
    rewards = np.zeros((rows, length))
    values = rng.normal(size=(rows, length))
    mask = np.zeros((rows, length))
    for i in range(rows):
        n = int(rng.integers(2, length + 1))
        mask[i, :n] = 1
        if i % 2 == 0 and n > 3:
            start = int(rng.integers(1, n - 1))
            mask[i, start : start + int(rng.integers(1, 3))] = 0
        if i % 3 == 0:
            mask[i, n - 1] = 0  # ends in a tool output
        rewards[i, :n] = rng.normal(size=n) * 0.05 * mask[i, :n]
        rewards[i, n - 1] += float(rng.choice([0.0, 1.0]))
    mask[rows - 1] = 0  # fully masked
    return rewards, values, mask


def _tensors(device, *arrays):
    return [torch.tensor(array, dtype=torch.float64, device=device) for array in arrays]


def _rows(array):
    return [list(map(float, row)) for row in array]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.7), (0.0, 1.0)])
def test_verl_gae_contract_and_profile(device, gamma, lam):
    rewards, values, mask = _batch(seed=int(gamma * 10 + lam * 100))
    r, v, m = _tensors(device, rewards, values, mask)
    masks = _rows(mask)
    # the contract
    advantages, returns = verl.compute_gae_advantage_return(r, v, m, gamma, lam)
    rows = [contract_row(vv, rr, mm, gamma, lam) for vv, rr, mm in zip(_rows(values), _rows(rewards), masks)]
    expected = masked_whiten([a for a, _ in rows], masks, everywhere=False)
    np.testing.assert_allclose(advantages.cpu().numpy(), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(returns.cpu().numpy(), [ret for _, ret in rows], rtol=1e-10, atol=1e-12)
    assert (advantages[m == 0] == 0).all() and (returns[m == 0] == 0).all()
    assert advantages.device == r.device and advantages.dtype == torch.float64
    # verl's own
    advantages, returns = verl.compute_gae_advantage_return(r, v, m, gamma, lam, semantics="verl")
    rows = [verl_gae_row(rr, vv, mm, gamma, lam) for rr, vv, mm in zip(_rows(rewards), _rows(values), masks)]
    np.testing.assert_allclose(advantages.cpu().numpy(), masked_whiten([a for a, _ in rows], masks, True), atol=1e-10)
    np.testing.assert_allclose(returns.cpu().numpy(), [ret for _, ret in rows], atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_openrlhf_gae_and_cumulative_returns(device):
    rewards, values, mask = _batch(seed=5)
    r, v, m = _tensors(device, rewards, values, mask)
    masks = _rows(mask)
    advantages, returns = openrlhf.get_advantages_and_returns(v, r, m, 0.99, 0.9, semantics="openrlhf")
    rows = [openrlhf_gae_row(vv, rr, mm, 0.99, 0.9) for vv, rr, mm in zip(_rows(values), _rows(rewards), masks)]
    np.testing.assert_allclose(advantages.cpu().numpy(), [a for a, _ in rows], atol=1e-10)
    np.testing.assert_allclose(returns.cpu().numpy(), [ret for _, ret in rows], atol=1e-10)
    advantages, returns = openrlhf.get_advantages_and_returns(v, r, m, 0.99, 0.9)  # the contract, not whitened
    rows = [contract_row(vv, rr, mm, 0.99, 0.9) for vv, rr, mm in zip(_rows(values), _rows(rewards), masks)]
    np.testing.assert_allclose(advantages.cpu().numpy(), [a for a, _ in rows], atol=1e-10)
    cumulative = openrlhf.get_cumulative_returns(r, m, 0.9, semantics="openrlhf")
    np.testing.assert_allclose(
        cumulative.cpu().numpy(), [openrlhf_cumulative_row(rr, mm, 0.9) for rr, mm in zip(_rows(rewards), masks)]
    )
    contract = openrlhf.get_cumulative_returns(r, m, 0.9)
    zeros = [[0.0] * len(row) for row in masks]
    expected = [contract_row(z, rr, mm, 0.9, 1.0)[1] for z, rr, mm in zip(zeros, _rows(rewards), masks)]
    np.testing.assert_allclose(contract.cpu().numpy(), expected, atol=1e-12)


def test_the_outcome_of_a_response_ending_masked_reaches_its_last_trainable_token():
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)  # the outcome on a tool token
    v = torch.zeros_like(r)
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]])
    _, returns = openrlhf.get_advantages_and_returns(v, r, m, 1.0, 1.0)
    assert returns.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]  # verl's and ROLL's layout would lose it
    _, lost = verl.compute_gae_advantage_return(r, v, m, 1.0, 1.0, semantics="verl")
    assert lost[0, :2].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("estimator, norm", [("grpo", True), ("dr-grpo", False), ("rloo", None)])
def test_verl_outcome_estimators(estimator, norm):
    rewards, _, mask = _batch(seed=7)
    r, m = _tensors("cpu", rewards, mask)
    index = np.array(["a", "a", "a", "b", "b", "c", "c", "c", "d"])  # d: a group of one
    if estimator == "rloo":
        advantages, same = verl.compute_rloo_outcome_advantage(r, m, index, semantics="verl")
    else:
        advantages, same = verl.compute_grpo_outcome_advantage(
            r, m, index, norm_adv_by_std_in_grpo=norm, semantics="verl"
        )
    scores = [math.fsum(row) for row in _rows(rewards)]  # verl sums every token
    values = group_scores(scores, list(index), estimator)
    expected = [[value * mm for mm in row] for value, row in zip(values, _rows(mask))]
    np.testing.assert_allclose(advantages.numpy(), expected, atol=1e-12)
    assert same is advantages
    if estimator != "grpo":
        return
    # the contract: the score sums the rewards at trainable tokens and the outcome (after the last of them)
    contract, _ = verl.compute_grpo_outcome_advantage(r, m, index)
    scores = []
    for rr, row in zip(_rows(rewards), _rows(mask)):
        last = max((t for t, mm in enumerate(row) if mm), default=-1)
        scores.append(math.fsum(x for x, mm in zip(rr, row) if mm) + math.fsum(rr[last + 1 :]))
    values = group_scores(scores, list(index), "grpo")
    expected = [[value * mm for mm in row] for value, row in zip(values, _rows(mask))]
    np.testing.assert_allclose(contract.numpy(), expected, atol=1e-12)


def test_a_batch_without_a_trainable_token_and_a_bad_semantics_raise():
    r = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(GAEInputError, match="no trainable token"):
        verl.compute_gae_advantage_return(r, r, torch.zeros(2, 3), 1.0, 1.0)
    with pytest.raises(InvalidOptionError, match="semantics='hf'"):
        verl.compute_gae_advantage_return(r, r, torch.ones(2, 3), 1.0, 1.0, semantics="hf")
    with pytest.raises(GAEInputError, match="shapes"):
        openrlhf.get_advantages_and_returns(r, torch.zeros(2, 4, dtype=torch.float64), None, 1.0, 1.0)


@pytest.fixture
def fake_verl(monkeypatch):
    """A stand-in for ``verl.trainer.ppo.core_algos``: its GAE and its registry, which refuses a name twice."""
    module = types.ModuleType("verl.trainer.ppo.core_algos")
    registry = {}

    def register_adv_est(name):
        def decorator(fn):
            if name in registry and registry[name] is not fn:
                raise ValueError(f"Adv estimator {name} has already been registered")
            registry[name] = fn
            return fn

        return decorator

    def original(token_level_rewards, values, response_mask, gamma, lam):
        return "verl's"

    module.register_adv_est, module.compute_gae_advantage_return, module.registry = register_adv_est, original, registry
    for name in ("verl", "verl.trainer", "verl.trainer.ppo"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.core_algos", module)
    yield module
    verl.unpatch()


def test_patch_swaps_verls_gae_and_unpatch_restores_it(fake_verl):
    rewards, values, mask = _batch(seed=9)
    r, v, m = _tensors("cpu", rewards, values, mask)
    verl.patch()
    verl.patch()  # twice: the original is still verl's
    patched = fake_verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)
    torch.testing.assert_close(patched[0], verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)[0])
    verl.unpatch()
    assert fake_verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95) == "verl's"


def test_register_adds_a_name_and_verl_refuses_it_twice(fake_verl):
    function = verl.register("gaecli_gae", semantics="masked")
    rewards, values, mask = _batch(seed=10)
    r, v, m = _tensors("cpu", rewards, values, mask)
    config = types.SimpleNamespace(gamma=1.0, lam=0.95)
    got = fake_verl.registry["gaecli_gae"](token_level_rewards=r, response_mask=m, values=v, config=config)
    torch.testing.assert_close(got[0], verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)[0])
    assert function is fake_verl.registry["gaecli_gae"]
    with pytest.raises(ValueError, match="already been registered"):
        verl.register("gaecli_gae")


def test_without_verl_the_hooks_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl", None)
    with pytest.raises(ImportError, match="pip install verl"):
        verl.patch()
