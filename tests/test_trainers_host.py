"""The padded drop-ins' compiled host path (gaecli.trainers.host) against the loops of
tests/trainer_loops.py: float32 and float64, masks of every dtype, long padding (the tail read
block by block), the whitening's merged row moments, the buffers given with ``out=``, and the
fall-back to the general path where the kernel's screen saw a bad number."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from trainer_loops import contract_row, masked_whiten

from gaecli.advantages.layout import TAIL_BLOCK, row_tails
from gaecli.errors import GAEInputError
from gaecli.trainers import openrlhf, verl
from gaecli.trainers.host import masked_gae_padded, whiten_in_place


def _padded(seed: int, rows: int = 12, length: int = 3 * TAIL_BLOCK + 7):
    """Rows of random response lengths (some shorter than a tail block, one empty), tool blocks
    masked, some responses ending masked (the outcome on a tool token), a KL-like reward at
    trainable tokens, a stray reward in one row's padding, then padding (mask 0, reward 0)."""
    rng = np.random.default_rng(seed)
    rewards, values, mask = np.zeros((rows, length)), rng.normal(size=(rows, length)), np.zeros((rows, length))
    for i in range(rows - 1):
        n = int(rng.integers(1, length + 1))
        mask[i, :n] = 1
        start = int(rng.integers(0, n))
        mask[i, start : start + int(rng.integers(0, 2 * TAIL_BLOCK))] = 0
        if i % 3 == 0:
            mask[i, max(n - TAIL_BLOCK - 2, 0) : n] = 0  # a long tool output at the end
        rewards[i, :n] = rng.normal(size=n) * 0.05 * mask[i, :n]
        rewards[i, n - 1] += float(rng.choice([0.0, 1.0, -0.5]))
    rewards[1, -2] = 0.25  # in the padding: the tail's sum holds it
    return rewards, values, mask


def _rows(array):
    return [list(map(float, row)) for row in np.asarray(array, dtype=np.float64)]


def _expected(rewards, values, mask, gamma, lam):
    rows = [contract_row(v, r, m, gamma, lam) for v, r, m in zip(_rows(values), _rows(rewards), _rows(mask))]
    return [a for a, _ in rows], [g for _, g in rows]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool, torch.int64])
def test_the_host_path_gives_the_contract(dtype, tolerance, mask_dtype):
    rewards, values, mask = _padded(seed=3)
    r, v = (torch.tensor(array, dtype=dtype) for array in (rewards, values))
    m = torch.tensor(mask).to(mask_dtype)
    assert masked_gae_padded(v, r, m, 0.99, 0.9) is not None  # the compiled path applies here
    advantages, returns = _expected(rewards, values, mask, 0.99, 0.9)
    got_advantages, got_returns = openrlhf.get_advantages_and_returns(v, r, m, 0.99, 0.9)
    np.testing.assert_allclose(got_advantages.double().numpy(), advantages, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(got_returns.double().numpy(), returns, rtol=tolerance, atol=tolerance)
    whitened, _ = verl.compute_gae_advantage_return(r, v, m, 0.99, 0.9)
    np.testing.assert_allclose(
        whitened.double().numpy(), masked_whiten(advantages, _rows(mask), everywhere=False), rtol=tolerance,
        atol=tolerance,
    )  # fmt: skip
    assert (whitened[m == 0] == 0).all() and (got_returns[m == 0] == 0).all()
    assert whitened.dtype == dtype and got_returns.dtype == dtype


def test_the_host_path_and_the_general_path_agree():
    """A transposed copy (not contiguous) takes the general path: the same numbers (the returns
    bit for bit: the one kernel on the one terminal reward)."""
    rewards, values, mask = _padded(seed=5)
    r, v, m = (torch.tensor(array, dtype=torch.float32) for array in (rewards, values, mask))
    strided = [t.t().contiguous().t() for t in (r, v, m)]
    assert masked_gae_padded(strided[1], strided[0], strided[2], 1.0, 0.95) is None
    fast = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)
    general = verl.compute_gae_advantage_return(*strided, 1.0, 0.95)
    assert torch.equal(fast[1], general[1])
    torch.testing.assert_close(fast[0], general[0], rtol=1e-6, atol=1e-6)


def test_out_buffers_are_written_by_the_host_path():
    rewards, values, mask = _padded(seed=7)
    r, v, m = (torch.tensor(array) for array in (rewards, values, mask))
    buffers = (torch.full_like(v, 7.0), torch.full_like(v, 7.0))
    got = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.9, out=buffers)
    assert got[0] is buffers[0] and got[1] is buffers[1]
    fresh = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.9)
    assert torch.equal(got[0], fresh[0]) and torch.equal(got[1], fresh[1])


def test_a_bad_number_falls_back_to_the_general_path():
    """A NaN reward at a masked token between trainable ones is dropped (the contract), as the
    general path drops it; a NaN value at a trainable token is named by sample and token."""
    rewards, values, mask = _padded(seed=11)
    mask[0, :4] = [1, 0, 1, 1]  # token 1: masked between trainable ones
    poisoned = rewards.copy()
    poisoned[0, 1] = np.nan
    r, p, v, m = (torch.tensor(array) for array in (rewards, poisoned, values, mask))
    assert masked_gae_padded(v, p, m, 1.0, 0.95) is None
    clean = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)
    dropped = verl.compute_gae_advantage_return(p, v, m, 1.0, 0.95)
    assert torch.equal(clean[0], dropped[0]) and torch.equal(clean[1], dropped[1])
    bad = values.copy()
    bad[2, int(np.flatnonzero(mask[2])[0])] = np.inf
    with pytest.raises(GAEInputError, match="sample 2"):
        verl.compute_gae_advantage_return(r, torch.tensor(bad), m, 1.0, 0.95)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_bad_value_in_a_rows_tail_falls_back_to_the_general_path(bad):
    """The masked tail after a row's last trainable token (padding included) takes no step of
    the recursion on the host path: its outputs are written 0 and its values screened apart. A
    non-finite value there (past the last trainable token, at the row's very end, or in a fully
    masked row) is still found and named by sample and token; a clean batch writes 0 there."""
    rewards, values, mask = _padded(seed=5)
    r, v, m = (torch.tensor(array) for array in (rewards, values, mask))
    buffers = (torch.full_like(v, 7.0), torch.full_like(v, 7.0))
    advantages, returns = verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95, out=buffers)
    assert not advantages[m == 0].any() and not returns[m == 0].any()
    ending = [i for i in range(len(mask)) if mask[i].any() and not mask[i, -1]]
    first, other = ending[0], ending[1]
    mask[first + 1] = 0
    past_last = int(np.flatnonzero(mask[first])[-1]) + 1
    for row, token in ((first, past_last), (other, mask.shape[1] - 1), (first + 1, 0)):
        poisoned = values.copy()
        poisoned[row, token] = bad
        assert masked_gae_padded(v, r, torch.tensor(mask), 1.0, 0.95) is not None
        assert masked_gae_padded(torch.tensor(poisoned), r, torch.tensor(mask), 1.0, 0.95) is None
        with pytest.raises(GAEInputError, match=f"sample {row}: values is {bad} at token {token}"):
            verl.compute_gae_advantage_return(r, torch.tensor(poisoned), torch.tensor(mask), 1.0, 0.95)


def test_the_tail_read_block_by_block_matches_a_token_loop():
    """``row_tails`` (blocks of padding passed over at once) against a loop over the tokens:
    the last trainable index, the last non-zero reward at or after it, the tail's sum — with
    long zero runs, a NaN and a -0.0 among the rewards."""
    rng = np.random.default_rng(2)
    rows, length = 40, 5 * TAIL_BLOCK + 3
    mask = (rng.random((rows, length)) < 0.3).astype(np.float32)
    for i in range(rows):
        mask[i, int(rng.integers(0, length + 1)) :] = 0
    rewards = np.where(rng.random((rows, length)) < 0.05, rng.normal(size=(rows, length)), 0.0).astype(np.float32)
    rewards[3, -1], rewards[4, -TAIL_BLOCK - 1], rewards[5, 0] = np.nan, -0.0, 2.0
    offsets = np.arange(rows + 1, dtype=np.int64) * length
    last, last_reward, tail = row_tails(mask.reshape(-1), rewards.reshape(-1), offsets)
    for i in range(rows):
        marked = np.flatnonzero(mask[i])
        end = int(marked[-1]) if marked.size else -1
        after = rewards[i, end + 1 :]
        nonzero = [t for t in range(max(end, 0), length) if rewards[i, t] != 0]
        assert last[i] == (i * length + end if end >= 0 else -1)
        assert last_reward[i] == (i * length + nonzero[-1] if nonzero else -1)
        expected = np.float32(0.0)
        for x in after[::-1]:
            expected = np.float32(expected + x)
        assert (math.isnan(tail[i]) and math.isnan(expected)) or tail[i] == expected


@pytest.mark.parametrize("every", [False, True])
def test_whitening_in_place_merges_the_rows_moments(every):
    """Far from 0 (a mean of 1000, a spread of 0.01) the merged row moments still give the
    mean and Bessel variance of a float64 two-pass over the trainable tokens."""
    rng = np.random.default_rng(4)
    advantages = 1000.0 + 0.01 * rng.normal(size=(6, 50))
    mask = (rng.random((6, 50)) < 0.6).astype(np.float64)
    mask[2] = 0  # a row without a trainable token
    tokens = advantages[mask != 0]
    mean, variance = tokens.mean(), tokens.var(ddof=1)
    expected = (advantages - mean) / math.sqrt(variance + 1e-8)
    if not every:
        expected = np.where(mask != 0, expected, 0.0)
    got = torch.tensor(advantages)
    assert whiten_in_place(got, torch.tensor(mask), every)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_whitening_in_place_declines_what_it_cannot_do():
    untouched = torch.ones(2, 3)
    assert not whiten_in_place(untouched, torch.zeros(2, 3), every=False)  # no trainable token
    assert not whiten_in_place(untouched.half(), torch.ones(2, 3), every=False)
    assert not whiten_in_place(untouched.t(), torch.ones(3, 2), every=False)  # not contiguous
    assert torch.equal(untouched, torch.ones(2, 3))


def test_check_and_credit_metrics_read_what_the_drop_in_saw_and_see_a_change_since():
    """After the drop-in, ``check`` and ``credit_metrics`` on the same tensors take its screen
    and tails (the same findings and figures as on fresh copies, which are read again); a
    tensor changed in place since (its version moved) is read again, and the fault found."""
    from gaecli.trainers import check, credit_metrics

    rewards, values, mask = _padded(seed=13)
    r, v, m = (torch.tensor(array, dtype=torch.float32) for array in (rewards, values, mask))
    verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)
    copies = [t.clone() for t in (r, v, m)]
    seen = check(r, v, m, 1.0, 0.95, layout="verl")
    fresh = check(*copies, 1.0, 0.95, layout="verl")
    assert [f.line() for f in seen] == [f.line() for f in fresh] and seen  # masked tails, a fully masked row
    figures = credit_metrics(r, v, m, 1.0, 0.95, layout="verl").as_dict()
    assert figures == credit_metrics(*copies, 1.0, 0.95, layout="verl").as_dict()
    assert figures["gaecli/lost_terminal_samples"] > 0
    verl.compute_gae_advantage_return(r, v, m, 1.0, 0.95)
    v[2, 0] = float("nan")  # in place, after the drop-in
    with pytest.raises(GAEInputError, match=r"values\[2, 0\]"):
        check(r, v, m, 1.0, 0.95, layout="verl")


@pytest.mark.parametrize("estimator", ["grpo", "dr-grpo", "rloo"])
def test_verls_profile_of_the_outcome_estimators_on_the_host_matches_the_general_path(estimator):
    """``semantics="verl"`` (every token's reward scored, written through the mask): the
    compiled host path gives the general path's numbers (a transposed copy takes that)."""
    rewards, _, mask = _padded(seed=19)
    r, m = (torch.tensor(array, dtype=torch.float32) for array in (rewards, mask))
    index = np.arange(r.shape[0]) // 4
    if estimator == "rloo":
        call = lambda rr, mm: verl.compute_rloo_outcome_advantage(rr, mm, index, semantics="verl")  # noqa: E731
    else:
        norm = estimator == "grpo"
        call = lambda rr, mm: verl.compute_grpo_outcome_advantage(  # noqa: E731
            rr, mm, index, norm_adv_by_std_in_grpo=norm, semantics="verl"
        )
    fast, _ = call(r, m)
    general, _ = call(r.t().contiguous().t(), m.t().contiguous().t())
    assert torch.equal(fast, general)


@pytest.mark.parametrize("estimator", ["grpo", "dr-grpo", "rloo"])
def test_the_outcome_estimators_host_path_matches_the_general_path_and_the_loop(estimator):
    """verl's GRPO, Dr. GRPO and RLOO on a float32 batch with a float mask: the compiled host
    path (scores, the estimator on the scores, one write) gives the general path's numbers
    bit for bit (a transposed copy takes that), and the loop's of tests/trainer_loops.py."""
    from trainer_loops import group_scores

    from gaecli.trainers.host import outcome_padded

    rewards, _, mask = _padded(seed=17)
    r, m = (torch.tensor(array, dtype=torch.float32) for array in (rewards, mask))
    index = np.arange(r.shape[0]) // 3
    if estimator == "rloo":
        call = lambda rr, mm: verl.compute_rloo_outcome_advantage(rr, mm, index)  # noqa: E731
    else:
        norm = estimator == "grpo"
        call = lambda rr, mm: verl.compute_grpo_outcome_advantage(rr, mm, index, norm_adv_by_std_in_grpo=norm)  # noqa: E731
    from gaecli.advantages.spec import AdvantageSpec

    assert outcome_padded(AdvantageSpec(estimator=estimator, group_by="index"), r, m, {"index": index}) is not None
    fast, same = call(r, m)
    general, _ = call(r.t().contiguous().t(), m.t().contiguous().t())
    assert fast is same and torch.equal(fast, general)
    scores = []
    for row, marks in zip(_rows(rewards.astype(np.float32)), _rows(mask)):
        trainable = [t for t, x in enumerate(marks) if x]
        last = trainable[-1] if trainable else -1
        scores.append(math.fsum(row[t] for t in trainable) + math.fsum(row[last + 1 :]))
    per_row = group_scores(scores, list(index), estimator)
    expected = [[per_row[i] if x else 0.0 for x in marks] for i, marks in enumerate(_rows(mask))]
    np.testing.assert_allclose(fast.double().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows, length", [(5, 40), (64, 2048)])  # the serial path, then the parallel one
def test_the_kernel_reads_the_tails_and_records_the_moments_as_the_separate_passes_do(rows, length):
    """Asked for them, the native kernel reads each sample's tail first (its terminal reward the
    tail's sum) and records its whitening moments as it ends: the same advantages and returns as
    with the tails read apart (``row_tails``) and given as terminal rewards, the same tails (indices
    in the sample's own tokens), and the moments of ``row_moments`` over each row."""
    from gaecli.advantages.kernels.native import native_gae_screened
    from gaecli.trainers.host import _row_moments

    rng = np.random.default_rng(rows)
    mask = (rng.random((rows, length)) < 0.6).astype(np.float32)
    for i in range(rows):
        mask[i, int(rng.integers(0, length + 1)) :] = 0
    rewards = np.where(rng.random((rows, length)) < 0.1, rng.normal(size=(rows, length)), 0).astype(np.float32)
    values = rng.normal(size=(rows, length)).astype(np.float32)
    flat = [array.reshape(-1) for array in (values, rewards, mask)]
    offsets = np.arange(rows + 1, dtype=np.int64) * length
    last, last_reward, tail = row_tails(flat[2], flat[1], offsets)
    apart = native_gae_screened(*flat, offsets, tail, gamma=0.99, lambd=0.9)
    found = (np.full(rows, -1), np.full(rows, -1), np.zeros(rows, dtype=np.float32))
    moments = np.zeros((3, rows))
    fused = native_gae_screened(*flat, offsets, np.zeros(rows), gamma=0.99, lambd=0.9, moments=moments, tails=found)
    assert apart[2] and fused[2]
    assert np.array_equal(apart[0], fused[0]) and np.array_equal(apart[1], fused[1])
    starts = offsets[:-1]
    assert np.array_equal(np.where(found[0] >= 0, found[0] + starts, -1), last)
    assert np.array_equal(np.where(found[1] >= 0, found[1] + starts, -1), last_reward)
    assert np.array_equal(found[2], tail)
    np.testing.assert_allclose(moments, np.stack(_row_moments(apart[0], flat[2], rows, length)), rtol=1e-12, atol=1e-9)
