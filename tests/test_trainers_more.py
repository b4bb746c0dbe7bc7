"""The SkyRL, AReaL, NeMo-RL and ROLL drop-ins of gaecli.trainers against each trainer's loop
written out in tests/trainer_loops_more.py, in each trainer's own padded layout (tool tokens
and padding masked, responses ending masked, a fully masked row, the outcome on the last
response token): the contract and the profile, at every position."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch
from trainer_loops import masked_whiten
from trainer_loops_more import (
    areal_token_row,
    areal_turn_contract_row,
    areal_turn_row,
    contract_row,
    nemo_rl_contract_row,
    nemo_rl_gae_row,
    nemo_rl_length_lambda,
    nemo_rl_token_rewards,
    nemo_rl_whiten,
    plain_gae_row,
    roll_row,
)

import gaecli
from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.trainers import areal, nemo_rl, roll, skyrl

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
CLOSE = {"rtol": 1e-10, "atol": 1e-12}


def _tensors(device, *arrays):
    return [torch.tensor(array, dtype=torch.float64, device=device) for array in arrays]


def _rows(array):
    return [list(map(float, row)) for row in np.asarray(array)]


def _close(got, expected):
    np.testing.assert_allclose(got.cpu().numpy(), np.asarray(expected, dtype=np.float64), **CLOSE)


def _response(rng, mask, start: int, end: int, row: int) -> None:
    """Trainable tokens ``[start, end)`` of ``row``, a masked tool block inside most, the last masked in some."""
    mask[row, start:end] = 1
    if row % 2 == 0 and end - start > 3:
        block = int(rng.integers(start + 1, end - 1))
        mask[row, block : block + int(rng.integers(1, 3))] = 0
    if row % 3 == 0:
        mask[row, end - 1] = 0  # ends in a tool output


def _skyrl_batch(seed: int, rows: int = 8, length: int = 12):
    """SkyRL's layout: responses right-aligned (leading padding: response_mask 0, values of
    their own), tool tokens in the response with loss_mask 0, the outcome on column T − 1."""
    rng = np.random.default_rng(seed)
    rewards, values = np.zeros((rows, length)), rng.normal(size=(rows, length))
    response, loss = np.zeros((rows, length)), np.zeros((rows, length))
    for i in range(rows):
        start = length - int(rng.integers(2, length + 1))
        response[i, start:] = 1
        _response(rng, loss, start, length, i)
        rewards[i, start:] = rng.normal(size=length - start) * 0.05 * loss[i, start:]
        rewards[i, -1] += float(rng.choice([0.0, 1.0]))
    loss[rows - 1] = 0  # fully masked (its response still counts in SkyRL's whitening)
    return rewards, values, response, loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lambd", [(1.0, 0.95), (0.9, 0.7), (0.0, 1.0)])
def test_skyrl_gae_contract_and_profile(device, gamma, lambd):
    rewards, values, response, loss = _skyrl_batch(seed=int(gamma * 10 + lambd * 100))
    r, v, rm, lm = _tensors(device, rewards, values, response, loss)
    advantages, returns = skyrl.compute_gae_advantage_return(r, v, rm, gamma, lambd, loss_mask=lm, index=None)
    rows = [contract_row(vv, rr, mm, gamma, lambd) for vv, rr, mm in zip(_rows(values), _rows(rewards), _rows(loss))]
    _close(advantages, masked_whiten([a for a, _ in rows], _rows(loss), everywhere=False))
    _close(returns, [ret for _, ret in rows])
    assert (advantages[lm == 0] == 0).all() and (returns[lm == 0] == 0).all()
    assert advantages.device == v.device and advantages.dtype == torch.float64
    advantages, returns = skyrl.compute_gae_advantage_return(r, v, rm, gamma, lambd, loss_mask=lm, semantics="skyrl")
    rows = [plain_gae_row(rr, vv, gamma, lambd) for rr, vv in zip(_rows(rewards), _rows(values))]
    _close(advantages, masked_whiten([a for a, _ in rows], _rows(response), everywhere=True))
    _close(returns, [ret for _, ret in rows])


def test_skyrl_without_a_loss_mask_every_response_token_is_trainable():
    rewards, values, response, _ = _skyrl_batch(seed=3)
    r, v, rm = _tensors("cpu", rewards, values, response)
    advantages, returns = skyrl.compute_gae_advantage_return(r, v, rm, 0.99, 0.9)
    rows = [contract_row(vv, rr, mm, 0.99, 0.9) for vv, rr, mm in zip(_rows(values), _rows(rewards), _rows(response))]
    _close(advantages, masked_whiten([a for a, _ in rows], _rows(response), everywhere=False))
    _close(returns, [ret for _, ret in rows])
    assert (advantages[rm == 0] == 0).all()  # the padding columns


def _areal_batch(seed: int, rows: int = 8, length: int = 14, full=(0,)):
    """AReaL's layout (``PPOActor._compute_advantages``): prompt and response from column 0,
    right padding; the loss mask and the turn ids rolled by one (ids −1 at the last column);
    KL-like rewards at trainable tokens, 0 at ``seqlens − 1``, the outcome at ``seqlens − 2``;
    the rows ``full`` fill the width (no EOS: AReaL bootstraps them; row 0 by default), the rows
    ``i % 3 == 0`` end in a tool output; the last row fully masked."""
    rng = np.random.default_rng(seed)
    rewards, values = np.zeros((rows, length)), rng.normal(size=(rows, length))
    mask, ids = np.zeros((rows, length)), np.full((rows, length), -1, dtype=np.int64)
    seqlens = np.zeros(rows, dtype=np.int64)
    for i in range(rows):
        prompt = int(rng.integers(1, 4))
        seqlens[i] = length if i in full else prompt + int(rng.integers(2, length - prompt + 1))
        _response(rng, mask, prompt, int(seqlens[i]), i)
        turn = np.cumsum(np.diff(np.concatenate([[0], mask[i]])) > 0) - 1  # a turn per run of trainable tokens
        ids[i] = np.where(mask[i] > 0, turn, -1)
    mask[rows - 1] = 0
    ids[rows - 1] = -1
    mask, ids = np.roll(mask, -1, axis=1), np.roll(ids, -1, axis=1)
    ids[:, -1] = -1
    for i in range(rows):
        rewards[i] = rng.normal(size=length) * 0.05 * mask[i]
        rewards[i, seqlens[i] - 1] = 0.0
        rewards[i, seqlens[i] - 2] += float(rng.choice([0.0, 1.0, -0.5]))
    return rewards, values, mask, ids, seqlens == length


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.7), (0.0, 1.0)])
def test_areal_token_level_contract_and_profile(device, gamma, lam):
    rewards, values, mask, _, no_eos = _areal_batch(seed=int(gamma * 10 + lam * 100))
    r, v, m = _tensors(device, rewards, values, mask)
    flags = torch.tensor(no_eos, device=device)
    advantages, returns = areal.compute_token_level_gae(r, v, m, flags, gamma, lam)
    steps = mask.copy()
    steps[:, -1] = 0  # the last column is no timestep
    cut = rewards.copy()
    cut[:, -1] = 0
    rows = [contract_row(vv, rr, mm, gamma, lam) for vv, rr, mm in zip(_rows(values), _rows(cut), _rows(steps))]
    _close(advantages, [a for a, _ in rows])
    _close(returns, [ret for _, ret in rows])
    assert (advantages[m == 0] == 0).all() and (returns[m == 0] == 0).all() and advantages.device == v.device
    advantages, returns = areal.compute_token_level_gae(r, v, m, flags, gamma, lam, semantics="areal")
    rows = [
        areal_token_row(rr, vv, mm, flag, gamma, lam)
        for rr, vv, mm, flag in zip(_rows(rewards), _rows(values), _rows(mask), no_eos)
    ]
    _close(advantages, [a for a, _ in rows])
    _close(returns, [ret for _, ret in rows])


TRUNCATED_ROWS = (0, 3, 4, 7)
"""Rows of an AReaL batch that fill its width (no EOS): row 3 ends in a tool output, row 7 is
fully masked."""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.7), (0.0, 1.0)])
def test_areal_token_level_profile_is_baseline_gae_bit_for_bit(device, dtype, gamma, lam):
    """semantics="areal": baseline_gae_packed's areal profile with the no-EOS rows truncated and
    ``values[:, T − 1]`` as their bootstrap value, the same bits; and AReaL's loop."""
    rewards, values, mask, _, no_eos = _areal_batch(seed=int(gamma * 10 + lam * 100) + 5, full=TRUNCATED_ROWS)
    r, v, m = (torch.tensor(array, dtype=dtype, device=device) for array in (rewards, values, mask))
    flags = torch.tensor(no_eos, device=device)
    advantages, returns = areal.compute_token_level_gae(r, v, m, flags, gamma, lam, semantics="areal")
    steps, cut = m != 0, r.clone()
    steps[:, -1], cut[:, -1] = False, 0.0  # the last column is no timestep; its reward is not read
    rows, length = v.shape
    offsets = torch.arange(rows + 1, device=device) * length
    expected = gaecli.baseline_gae_packed(
        v.reshape(-1), cut.reshape(-1), steps.reshape(-1), offsets, torch.zeros(rows, dtype=dtype, device=device),
        gamma=gamma, lambd=lam, semantics="areal", truncated=flags, bootstrap_values=v[:, -1],
    )  # fmt: skip
    assert advantages.dtype == dtype and advantages.device == v.device
    assert torch.equal(advantages.reshape(-1), expected[0]) and torch.equal(returns.reshape(-1), expected[1])
    inputs = zip(_rows(r.double().cpu()), _rows(v.double().cpu()), _rows(mask), no_eos)
    loops = [areal_token_row(rr, vv, mm, flag, gamma, lam) for rr, vv, mm, flag in inputs]
    tolerance = CLOSE if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    np.testing.assert_allclose(advantages.double().cpu().numpy(), [a for a, _ in loops], **tolerance)
    np.testing.assert_allclose(returns.double().cpu().numpy(), [ret for _, ret in loops], **tolerance)
    assert no_eos[list(TRUNCATED_ROWS)].all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("semantics", ["masked", "areal"])
def test_areal_token_level_with_a_lambda_per_row(device, semantics):
    rewards, values, mask, _, no_eos = _areal_batch(seed=11, full=TRUNCATED_ROWS)
    r, v, m = _tensors(device, rewards, values, mask)
    lambdas = np.linspace(0.5, 1.0, len(rewards))
    lam = torch.tensor(lambdas, dtype=torch.float64, device=device)
    flags = torch.tensor(no_eos, device=device)
    advantages, returns = areal.compute_token_level_gae(r, v, m, flags, 0.9, lam, semantics=semantics)
    if semantics == "masked":
        steps, cut = mask.copy(), rewards.copy()
        steps[:, -1], cut[:, -1] = 0, 0
        rows = zip(_rows(values), _rows(cut), _rows(steps), lambdas)
        expected = [contract_row(vv, rr, mm, 0.9, float(lam_i)) for vv, rr, mm, lam_i in rows]
    else:
        rows = zip(_rows(rewards), _rows(values), _rows(mask), no_eos, lambdas)
        expected = [areal_token_row(rr, vv, mm, flag, 0.9, float(lam_i)) for rr, vv, mm, flag, lam_i in rows]
    _close(advantages, [a for a, _ in expected])
    _close(returns, [ret for _, ret in expected])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.7)])
def test_areal_turn_level_contract_and_profile(device, gamma, lam):
    rewards, values, mask, ids, no_eos = _areal_batch(seed=int(gamma * 10 + lam * 100) + 1, full=TRUNCATED_ROWS)
    r, v, m = _tensors(device, rewards, values, mask)
    turn_ids, flags = torch.tensor(ids, device=device), torch.tensor(no_eos, device=device)
    advantages, returns = areal.compute_turn_level_gae(r, v, m, turn_ids, flags, gamma, lam)
    rows = [
        areal_turn_contract_row(rr, vv, mm, tt, gamma, lam)
        for rr, vv, mm, tt in zip(_rows(rewards), _rows(values), _rows(mask), ids.tolist())
    ]
    _close(advantages, [a for a, _ in rows])
    _close(returns, [ret for _, ret in rows])
    assert (advantages[m == 0] == 0).all() and (returns[m == 0] == 0).all()
    lambdas = torch.full((len(rewards),), lam, dtype=torch.float64, device=device)
    for lambd in (lam, lambdas):  # a number, and the same λ as a tensor per row
        advantages, returns = areal.compute_turn_level_gae(r, v, m, turn_ids, flags, gamma, lambd, semantics="areal")
        rows = [
            areal_turn_row(rr, vv, mm, tt, flag, gamma, lam)
            for rr, vv, mm, tt, flag in zip(_rows(rewards), _rows(values), _rows(mask), ids.tolist(), no_eos)
        ]
        _close(advantages, [a for a, _ in rows])
        _close(returns, [ret for _, ret in rows])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_row", [False, True], ids=["one-lambda", "lambda-per-row"])
def test_credit_metrics_of_areal_read_its_bootstrap(device, per_row):
    """gaecli.trainers.credit_metrics on AReaL's layout: the mean |A_areal − A_masked| over the
    steps, AReaL's side with its bootstrap on the no-EOS rows (its loop), the contract's without."""
    from gaecli.trainers import credit_metrics

    rewards, values, mask, _, no_eos = _areal_batch(seed=9, full=TRUNCATED_ROWS)
    r, v, m = _tensors(device, rewards, values, mask)
    lam = torch.full((len(rewards),), 0.9, dtype=torch.float64, device=device) if per_row else 0.9
    flags = torch.tensor(no_eos, device=device)
    metrics = credit_metrics(r, v, m, flags, 0.95, lam, layout="areal", delta_rows=None, delta_tokens=10**6)
    steps, cut = mask.copy(), rewards.copy()
    steps[:, -1], cut[:, -1] = 0, 0
    old = [areal_token_row(rr, vv, mm, flag, 0.95, 0.9)[0]
           for rr, vv, mm, flag in zip(_rows(rewards), _rows(values), _rows(mask), no_eos)]  # fmt: skip
    new = [contract_row(vv, rr, mm, 0.95, 0.9)[0] for vv, rr, mm in zip(_rows(values), _rows(cut), _rows(steps))]
    differences = [abs(o[t] - n[t]) for o, n, marks in zip(old, new, steps) for t in range(len(marks)) if marks[t]]
    assert float(metrics.mean_abs_delta) == pytest.approx(sum(differences) / len(differences), rel=1e-12)


def test_areal_turn_ids_out_of_order_and_low_precision_values():
    rewards, values, mask, ids, no_eos = _areal_batch(seed=4)
    r, v, m = _tensors("cpu", rewards, values, mask)
    flags = torch.tensor(no_eos)
    backwards = torch.tensor(ids)
    row = 1
    first, last = np.flatnonzero(mask[row])[[0, -1]]
    backwards[row, first], backwards[row, last] = 1, 0
    with pytest.raises(GAEInputError, match="turn_ids of row 1"):
        areal.compute_turn_level_gae(r, v, m, backwards, flags, 1.0, 1.0)
    with pytest.raises(GAEInputError, match="integer dtype"):
        areal.compute_turn_level_gae(r, v, m, torch.tensor(ids).double(), flags, 1.0, 1.0)
    advantages, _ = areal.compute_token_level_gae(r.bfloat16(), v.bfloat16(), m, flags, 1.0, 1.0)
    assert advantages.dtype == torch.float32  # AReaL's accumulators are float32


def _nemo_batch(seed: int, rows: int = 8, length: int = 14):
    """NeMo-RL's layout: the prompt-and-response sequence right-padded, the mask 1 at the
    response's tokens (0 at the prompt, tool tokens and padding), one reward per sample,
    log-probs of the policy and the reference; the last row fully masked."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, length))
    for i in range(rows):
        prompt = int(rng.integers(1, 4))
        _response(rng, mask, prompt, prompt + int(rng.integers(2, length - prompt + 1)), i)
    mask[rows - 1] = 0
    rewards = rng.choice([0.0, 1.0, 0.5], size=rows)
    logprobs, references = rng.normal(size=(rows, length)) * 0.3 - 1.0, rng.normal(size=(rows, length)) * 0.3 - 1.0
    return rewards, rng.normal(size=(rows, length)), mask, logprobs, references


NEMO_CONFIGS = {
    "plain": ({"gae_lambda": 0.95, "gae_gamma": 0.99}, False, 0.0, "k3"),
    "kl-k3-whitened": ({"gae_lambda": 0.9, "gae_gamma": 1.0, "normalize_advantages": True}, True, 0.1, "k3"),
    "decoupled-k1": ({"gae_lambda": 0.9, "gae_gamma": 0.9, "gae_lambda_value": 1.0, "gae_lambda_policy": 0.8}, True, 0.2, "k1"),  # noqa: E501
    "length-adaptive-k2": ({"gae_lambda": 0.95, "gae_gamma": 0.5, "length_adaptive_alpha": 0.25, "normalize_advantages": True}, True, 0.05, "k2"),  # noqa: E501
}  # fmt: skip


def _nemo_estimator(name: str, semantics: str):
    given, use_kl, coef, kl_type = NEMO_CONFIGS[name]
    config = {"normalize_advantages": False, "gae_lambda_value": None, "gae_lambda_policy": None}
    config.update({"length_adaptive_alpha": 0.0, **given})
    loss = types.SimpleNamespace(
        use_kl_in_reward=use_kl, reference_policy_kl_penalty=coef, reference_policy_kl_type=kl_type
    )
    return nemo_rl.GeneralizedAdvantageEstimator(config, loss, semantics=semantics), config, coef if use_kl else 0.0


def _nemo_lambdas(config, masks):
    """The λ of the returns and, per row, of the advantages, as NeMo-RL resolves them."""
    value = config["gae_lambda"] if config["gae_lambda_value"] is None else config["gae_lambda_value"]
    if config["length_adaptive_alpha"] > 0:
        return value, [float(nemo_rl_length_lambda(config["length_adaptive_alpha"], row)) for row in masks]
    policy = config["gae_lambda"] if config["gae_lambda_policy"] is None else config["gae_lambda_policy"]
    return value, [policy] * len(masks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(NEMO_CONFIGS))
def test_nemo_rl_estimator_contract_and_profile(device, name):
    rewards, values, mask, logprobs, references = _nemo_batch(seed=len(name))
    v, m, lp, ref = _tensors(device, values, mask, logprobs, references)
    z = torch.tensor(rewards, dtype=torch.float64, device=device)
    masks = _rows(mask)
    for semantics in ("masked", "nemo-rl"):
        estimator, config, coef = _nemo_estimator(name, semantics)
        advantages, returns = estimator.compute_advantage(None, z, m, v, reference_logprobs=ref, logprobs=lp)
        lam_value, lam_policy = _nemo_lambdas(config, masks)
        gamma, kl_type = config["gae_gamma"], NEMO_CONFIGS[name][3]
        rows = list(zip(rewards, _rows(values), masks, _rows(logprobs), _rows(references), lam_policy))
        if semantics == "masked":
            expected_returns = [nemo_rl_contract_row(z_i, vv, mm, lp_i, ref_i, coef, kl_type, gamma, lam_value)[1]
                                for z_i, vv, mm, lp_i, ref_i, _ in rows]  # fmt: skip
            expected = [nemo_rl_contract_row(z_i, vv, mm, lp_i, ref_i, coef, kl_type, gamma, lam_i)[0]
                        for z_i, vv, mm, lp_i, ref_i, lam_i in rows]  # fmt: skip
        else:
            tokens = [nemo_rl_token_rewards(z_i, mm, lp_i, ref_i, coef, kl_type) for z_i, _, mm, lp_i, ref_i, _ in rows]
            expected_returns = [nemo_rl_gae_row(t, row[1], row[2], gamma, lam_value)[1] for t, row in zip(tokens, rows)]
            expected = [nemo_rl_gae_row(t, row[1], row[2], gamma, row[5])[0] for t, row in zip(tokens, rows)]
        if config["normalize_advantages"]:  # NeMo-RL's whitening, its mean Σ/(n + 1e-8), in both modes
            expected = nemo_rl_whiten(expected, masks)
        _close(advantages, [[a * mm for a, mm in zip(row, ms)] for row, ms in zip(expected, masks)])
        _close(returns, expected_returns)
        assert (advantages[m == 0] == 0).all() and advantages.device == v.device
        if semantics == "masked":
            assert (returns[m == 0] == 0).all()


def _whitening_estimator(semantics: str):
    """NeMo-RL's GAE with γ = λ = 1, no KL, ``normalize_advantages`` on."""
    config = {"gae_lambda": 1.0, "gae_gamma": 1.0, "normalize_advantages": True, "gae_lambda_value": None,
              "gae_lambda_policy": None, "length_adaptive_alpha": 0.0}  # fmt: skip
    loss = types.SimpleNamespace(use_kl_in_reward=False, reference_policy_kl_penalty=0.0, reference_policy_kl_type="k3")
    return nemo_rl.GeneralizedAdvantageEstimator(config, loss, semantics=semantics)


@pytest.mark.parametrize("semantics", ["masked", "nemo-rl"])
def test_nemo_rl_whitening_divides_by_the_count_plus_its_epsilon(semantics):
    # γ = λ = 1: A_t = z − V_t at the three mask-1 tokens, 999.75, 1000.5 and 1000.25. Their mean
    # is some 2600 std: NeMo-RL's 1e-8 on n = 3 moves the whitened values by about 1e-5.
    values = np.array([[0.0, 0.25, -0.5, 0.0], [0.75, 0.0, 0.0, 0.0]])
    mask = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    rewards = np.array([1000.0, 1001.0])
    raw = [[0.0, 999.75, 1000.5, 0.0], [1000.25, 0.0, 0.0, 0.0]]
    v, m, z = _tensors("cpu", values, mask, rewards)
    advantages, _ = _whitening_estimator(semantics).compute_advantage(None, z, m, v)
    got = advantages.numpy()
    np.testing.assert_allclose(got, nemo_rl_whiten(raw, _rows(mask)), rtol=1e-12, atol=1e-12)
    trainable = [999.75, 1000.5, 1000.25]
    mean = math.fsum(trainable) / 3
    scale = math.sqrt(math.fsum((a - mean) ** 2 for a in trainable) / 2 + 1e-8)
    exact_mean = [(a - mean) / scale for a in trainable]  # the mean Σ/n: what the review found
    assert np.abs(got[mask == 1] - exact_mean).max() > 1e-6


def test_nemo_rl_whitening_of_one_token_gives_zeros():
    values, mask = np.array([[0.5, 0.0, 0.0]]), np.array([[0.0, 1.0, 0.0]])
    v, m, z = _tensors("cpu", values, mask, [3.0])
    for semantics in ("masked", "nemo-rl"):
        advantages, _ = _whitening_estimator(semantics).compute_advantage(None, z, m, v)
        # NeMo-RL's n/(n − 1) makes the variance infinite: rsqrt gives 0
        assert advantages.tolist() == nemo_rl_whiten([[0.0, 3.0, 0.0]], _rows(mask)) == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("semantics", ["masked", "nemo-rl"])
def test_nemo_rl_whitening_in_float32(semantics):
    # NeMo-RL's own dtypes: float32 values and mask, where its n + 1e-8 rounds to n
    rewards, values, mask, _, _ = _nemo_batch(seed=11)
    v, m, z = (torch.tensor(array, dtype=torch.float32) for array in (values, mask, rewards))
    advantages, _ = _whitening_estimator(semantics).compute_advantage(None, z, m, v)
    assert advantages.dtype == torch.float32
    masks = _rows(mask)
    if semantics == "masked":
        raw = [nemo_rl_contract_row(z_i, vv, mm, None, None, 0.0, "k3", 1.0, 1.0)[0]
               for z_i, vv, mm in zip(rewards, _rows(values), masks)]  # fmt: skip
    else:
        tokens = [nemo_rl_token_rewards(z_i, mm, None, None, 0.0, "k3") for z_i, mm in zip(rewards, masks)]
        raw = [nemo_rl_gae_row(t, vv, mm, 1.0, 1.0)[0] for t, vv, mm in zip(tokens, _rows(values), masks)]
    expected = nemo_rl_whiten(raw, masks, np.float32)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-5, atol=1e-6)


def _roll_batch(seed: int, rows: int = 8, length: int = 14):
    """ROLL's layout (the sequence after its first token): a left-padded prompt, the response,
    right padding; the response mask 1 at the response's tokens but tool tokens; KL-like
    rewards at trainable tokens and the outcome on the response's last token, masked or not."""
    rng = np.random.default_rng(seed)
    rewards, values, mask = np.zeros((rows, length)), rng.normal(size=(rows, length)), np.zeros((rows, length))
    for i in range(rows):
        start = int(rng.integers(0, 4))
        end = start + int(rng.integers(2, length - start + 1))
        _response(rng, mask, start, end, i)
        rewards[i, start:end] = rng.normal(size=end - start) * 0.05 * mask[i, start:end]
        rewards[i, end - 1] += float(rng.choice([0.0, 1.0]))
    mask[rows - 1] = 0
    return rewards, values, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lambd", [(1.0, 0.95), (0.9, 0.7), (0.0, 1.0)])
def test_roll_gae_contract_and_profile(device, gamma, lambd):
    rewards, values, mask = _roll_batch(seed=int(gamma * 10 + lambd * 100))
    r, v, m = _tensors(device, rewards, values, mask)
    advantages, returns = roll.compute_gae_advantage_return(r, v, gamma, lambd, response_mask=m)
    rows = [contract_row(vv, rr, mm, gamma, lambd) for vv, rr, mm in zip(_rows(values), _rows(rewards), _rows(mask))]
    _close(advantages, [a for a, _ in rows])
    _close(returns, [ret for _, ret in rows])
    assert (advantages[m == 0] == 0).all() and (returns[m == 0] == 0).all() and advantages.device == v.device
    advantages, returns = roll.compute_gae_advantage_return(r, v, gamma, lambd, response_mask=m, semantics="roll")
    rows = [roll_row(rr, vv, mm, gamma, lambd) for rr, vv, mm in zip(_rows(rewards), _rows(values), _rows(mask))]
    _close(advantages, [a for a, _ in rows])
    _close(returns, [ret for _, ret in rows])
    plain = [plain_gae_row(rr, vv, gamma, lambd) for rr, vv in zip(_rows(rewards), _rows(values))]
    for semantics in ("masked", "roll"):  # without a mask: ROLL's function alone, in both
        advantages, returns = roll.compute_gae_advantage_return(r, v, gamma, lambd, semantics=semantics)
        _close(advantages, [a for a, _ in plain])
        _close(returns, [ret for _, ret in plain])


def test_roll_profile_gives_the_worked_example_of_semantics_md():
    r = torch.tensor([[0.5, 1.0, 0.25, 2.0 + 8.0]], dtype=torch.float64)  # z = 8 on token R − 1
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    advantages, returns = roll.compute_gae_advantage_return(r, v, 0.5, 1.0, response_mask=m, semantics="roll")
    assert advantages.tolist() == [[-0.4375, 0.0, -2.75, 0.0]] and returns.tolist() == [[0.5625, 0.125, 0.25, 0.0]]
    advantages, returns = roll.compute_gae_advantage_return(r, v, 0.5, 1.0, response_mask=m)
    assert advantages.tolist() == [[1.0 + 0.5 * 7.25, 0.0, 7.25, 0.0]]  # the outcome (2 + 8) on token 2


def test_bad_semantics_and_shapes_raise():
    r = torch.zeros(2, 3, dtype=torch.float64)
    ones = torch.ones(2, 3)
    with pytest.raises(InvalidOptionError, match="semantics='verl'"):
        roll.compute_gae_advantage_return(r, r, 1.0, 1.0, semantics="verl")
    with pytest.raises(InvalidOptionError, match="semantics='slime'"):
        skyrl.compute_gae_advantage_return(r, r, ones, 1.0, 1.0, semantics="slime")
    with pytest.raises(InvalidOptionError, match="semantics='skyrl'"):
        areal.compute_token_level_gae(r, r, ones, None, 1.0, 1.0, semantics="skyrl")
    with pytest.raises(InvalidOptionError, match="semantics='roll'"):
        _nemo_estimator("plain", "roll")
    with pytest.raises(GAEInputError, match="shapes"):
        skyrl.compute_gae_advantage_return(r, r, ones, 1.0, 1.0, loss_mask=torch.ones(2, 4))
    with pytest.raises(GAEInputError, match="no trainable token"):
        skyrl.compute_gae_advantage_return(r, r, ones, 1.0, 1.0, loss_mask=torch.zeros(2, 3))
    with pytest.raises(GAEInputError, match=r"\[batch\] tensor"):
        areal.compute_token_level_gae(r, r, ones, None, 1.0, torch.ones(3, dtype=torch.float64))
    estimator, _, _ = _nemo_estimator("plain", "masked")
    with pytest.raises(GAEInputError, match="rewards must be"):
        estimator.compute_advantage(None, torch.zeros(3), ones, r)


@pytest.fixture
def fake_skyrl(monkeypatch):
    """A stand-in for SkyRL's ``ppo_utils``: ``register_advantage_estimator`` over a registry
    that refuses a name twice, as SkyRL's ``AdvantageEstimatorRegistry.register`` does."""
    name = skyrl.PPO_UTILS[0]
    module = types.ModuleType(name)
    registry = {}

    def register_advantage_estimator(estimator):
        def decorator(fn):
            if estimator in registry:
                raise ValueError(f"advantage estimator '{estimator}' already registered")
            registry[estimator] = fn
            return fn

        return decorator

    module.register_advantage_estimator, module.registry = register_advantage_estimator, registry
    parts = name.split(".")
    for depth in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_register_adds_the_drop_in_to_skyrls_registry_and_skyrl_refuses_it_twice(fake_skyrl):
    function = skyrl.register("gaecli_gae")
    assert fake_skyrl.registry["gaecli_gae"] is function
    rewards, values, response, loss = _skyrl_batch(seed=8)
    r, v, rm, lm = _tensors("cpu", rewards, values, response, loss)
    got = function(token_level_rewards=r, response_mask=rm, index=np.arange(len(r)), values=v,
                   grpo_norm_by_std=True, gamma=1.0, lambd=0.95, config=None, loss_mask=lm)  # fmt: skip
    expected = skyrl.compute_gae_advantage_return(r, v, rm, 1.0, 0.95, loss_mask=lm)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    with pytest.raises(ValueError, match="already registered"):
        skyrl.register("gaecli_gae")


def test_without_skyrl_register_says_how_to_install_it(monkeypatch):
    for name in ("skyrl", "skyrl_train"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install skyrl"):
        skyrl.register()
