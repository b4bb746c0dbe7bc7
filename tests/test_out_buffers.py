"""``out=``: the packed API and the drop-ins write into a caller's buffers, the numbers those of
the trainers' float64 loops (tests/trainer_loops.py), and refuse buffers that cannot hold them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trainer_loops import contract_row, masked_whiten, openrlhf_gae_row, verl_gae_row

import gaecli
from gaecli.errors import GAEInputError
from gaecli.trainers import openrlhf, roll, skyrl, verl


def _batch(rows: int = 6, length: int = 12, seed: int = 2):
    rng = np.random.default_rng(seed)
    mask = np.ones((rows, length))
    rewards = np.zeros((rows, length))
    for i in range(rows):
        n = int(rng.integers(4, length + 1))
        mask[i, n:] = 0
        mask[i, 1 + i % 3 : 3 + i % 3] = 0
        rewards[i, n - 1] = 1.0
    values = rng.normal(size=(rows, length))
    return [torch.tensor(array) for array in (rewards, values, mask)]


def _fresh(shape, dtype=torch.float64):
    return torch.full(shape, 7.0, dtype=dtype), torch.full(shape, 7.0, dtype=dtype)


@pytest.mark.parametrize("semantics", ["masked", "verl"])
def test_verl_writes_into_out(semantics):
    r, v, m = _batch()
    buffers = _fresh(r.shape)
    addresses = [b.data_ptr() for b in buffers]
    advantages, returns = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.9, semantics=semantics, out=buffers)
    assert advantages is buffers[0] and returns is buffers[1]
    assert [b.data_ptr() for b in buffers] == addresses
    rows = [(list(map(float, x)), list(map(float, y)), list(map(float, z))) for x, y, z in zip(r, v, m)]
    if semantics == "masked":
        loops = [contract_row(vv, rr, mm, 1.0, 0.9) for rr, vv, mm in rows]
    else:
        loops = [verl_gae_row(rr, vv, mm, 1.0, 0.9) for rr, vv, mm in rows]
    expected = masked_whiten([a for a, _ in loops], [mm for _, _, mm in rows], everywhere=semantics != "masked")
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), [ret for _, ret in loops], rtol=1e-10, atol=1e-12)


def test_openrlhf_roll_and_skyrl_write_into_out():
    r, v, m = _batch(seed=4)
    buffers = _fresh(r.shape)
    openrlhf.get_advantages_and_returns(v, r, m, 0.95, 0.9, semantics="openrlhf", out=buffers)
    expected = [openrlhf_gae_row(list(vv), list(rr), list(mm), 0.95, 0.9) for rr, vv, mm in zip(r, v, m)]
    np.testing.assert_allclose(buffers[0].numpy(), [a for a, _ in expected], rtol=1e-10, atol=1e-12)
    for call in (
        lambda out: roll.compute_gae_advantage_return(r, v, 1.0, 0.9, response_mask=m, out=out),
        lambda out: skyrl.compute_gae_advantage_return(r, v, m, 1.0, 0.9, out=out),
    ):
        buffers = _fresh(r.shape)
        written = call(buffers)
        alone = call(None)
        assert written[0] is buffers[0]
        assert torch.equal(buffers[0], alone[0]) and torch.equal(buffers[1], alone[1])


@pytest.mark.parametrize("semantics", ["masked", "verl", "slime"])
def test_packed_api_writes_into_out(semantics):
    r, v, m = (t.reshape(-1) for t in _batch(seed=6))
    offsets = torch.arange(0, r.numel() + 1, 12)
    terminal = torch.zeros(offsets.numel() - 1, dtype=torch.float64)
    buffers = _fresh((r.numel(),))
    advantages, returns = gaecli.baseline_gae_packed(v, r, m, offsets, terminal, gamma=1.0, lambd=0.9,
                                                     semantics=semantics, out=buffers)  # fmt: skip
    assert advantages is buffers[0] and returns is buffers[1]
    alone = gaecli.baseline_gae_packed(v, r, m, offsets, terminal, gamma=1.0, lambd=0.9, semantics=semantics)
    assert torch.equal(advantages, alone[0]) and torch.equal(returns, alone[1])
    if semantics == "masked":  # 0 at masked positions, whatever the buffer held
        assert bool((advantages[m == 0] == 0).all())


def test_out_that_cannot_hold_the_outputs_is_refused():
    r, v, m = (t.reshape(-1) for t in _batch())
    offsets = torch.arange(0, r.numel() + 1, 12)
    terminal = torch.zeros(offsets.numel() - 1, dtype=torch.float64)
    call = lambda out: gaecli.masked_gae_packed(v, r, m, offsets, terminal, gamma=1.0, lambd=0.9, out=out)  # noqa: E731
    with pytest.raises(GAEInputError, match=r"out\[0\] is torch.float32, the outputs torch.float64"):
        call(_fresh((r.numel(),), torch.float32))
    with pytest.raises(GAEInputError, match=r"out\[1\] has shape \(5,\)"):
        call((torch.empty(r.numel(), dtype=torch.float64), torch.empty(5, dtype=torch.float64)))
    shared = torch.empty(r.numel(), dtype=torch.float64)
    with pytest.raises(GAEInputError, match="one buffer"):
        call((shared, shared))
    r2, v2, m2 = _batch()
    with pytest.raises(GAEInputError, match="contiguous"):
        verl.compute_gae_advantage_return(r2, v2, m2, 1.0, 0.9, out=(torch.empty(12, 6).t(), torch.empty(6, 12)))
