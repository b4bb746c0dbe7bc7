"""gaecli.trainers.check and credit_metrics on batches built in each trainer's layout, against
what the batch was built to hold (which rows end masked, how long their tails are) and against
the trainers' float64 loops of tests/trainer_loops*.py for the mean |Δ advantage|."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from trainer_loops import contract_row, openrlhf_gae_row, verl_gae_row
from trainer_loops_slime import slime_row

import gaecli.trainers as trainers
from gaecli.errors import GAEInputError, InvalidOptionError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def _batch(seed: int = 3, rows: int = 12, length: int = 16):
    """A padded batch and what it holds: per row a response of ``n`` tokens then padding, a masked
    tool block in some, the rows ``i % 3 == 0`` ending in masked tokens (``tails[i]`` of them),
    the last row fully masked; small rewards at trainable tokens, an outcome of ±1 on the
    response's last token."""
    rng = np.random.default_rng(seed)
    rewards, values, mask = np.zeros((rows, length)), rng.normal(size=(rows, length)), np.zeros((rows, length))
    lengths, tails = [], []
    for i in range(rows):
        n = int(rng.integers(6, length + 1))
        mask[i, :n] = 1
        if i % 2 == 1:
            mask[i, 2:4] = 0
        tail = 0
        if i % 3 == 0:
            tail = int(rng.integers(1, 3))
            mask[i, n - tail : n] = 0
        rewards[i, :n] = rng.normal(size=n) * 0.05 * mask[i, :n]
        rewards[i, n - 1] += float(rng.choice([-1.0, 1.0]))
        lengths.append(n)
        tails.append(tail)
    mask[rows - 1] = 0
    tails[rows - 1] = lengths[rows - 1]
    return rewards, values, mask, lengths, tails


def _tensors(device, *arrays):
    return [torch.tensor(array, dtype=torch.float64, device=device) for array in arrays]


def _outcomes(rewards, mask):
    """The rewards after each row's last trainable token, summed."""
    outcomes = []
    for row, marks in zip(rewards, mask):
        trainable = np.flatnonzero(marks)
        last = trainable[-1] if trainable.size else -1
        outcomes.append(math.fsum(row[last + 1 :]))
    return np.array(outcomes)


@pytest.mark.parametrize("device", DEVICES)
def test_check_warns_on_each_tail_and_the_fully_masked_row(device):
    rewards, values, mask, _, tails = _batch()
    r, v, m = _tensors(device, rewards, values, mask)
    findings = trainers.check(r, v, m, 1.0, 0.95, layout="verl")
    rows = len(tails)
    assert [(f.code, f.row, f.column) for f in findings if f.code == "fully-masked"] == [
        ("fully-masked", rows - 1, "response_mask")
    ]
    tailed = [(f.row, f.message) for f in findings if f.code == "masked-tail"]
    expected = [i for i in range(rows - 1) if tails[i]]
    assert [row for row, _ in tailed] == expected
    for row, message in tailed:
        assert f"ends in {tails[row]} masked tokens" in message
    assert {f.severity for f in findings} == {"warning"}


@pytest.mark.parametrize("device", DEVICES)
def test_check_raises_on_a_mask_value_naming_row_and_column(device):
    rewards, values, mask, _, _ = _batch()
    mask[2, 1] = 0.5
    r, v, m = _tensors(device, rewards, values, mask)
    with pytest.raises(GAEInputError) as raised:
        trainers.check(r, v, m, 1.0, 0.95, layout="verl")
    expected = "verl batch, row 2, column 'response_mask': response_mask[2, 1] is 0.5, not 0 or 1 [mask-value]"
    assert str(raised.value) == expected


def test_check_returns_non_finite_findings_at_most_max_per_rule():
    rewards, values, mask, _, _ = _batch()
    for row in (1, 4, 5, 7):
        values[row, row] = np.nan
    values[4, 0] = np.inf  # the row's first fault is named
    r, v, m = _tensors("cpu", rewards, values, mask)
    findings = trainers.check(r, v, m, 1.0, 0.95, layout="verl", errors="return", max_findings=3)
    faults = [(f.row, f.column, f.message) for f in findings if f.code == "non-finite"]
    assert faults == [(1, "values", "values[1, 1] is nan"), (4, "values", "values[4, 0] is inf"),
                      (5, "values", "values[5, 5] is nan")]  # fmt: skip
    assert len([f for f in findings if f.code == "masked-tail"]) == 3


def test_check_integer_and_bool_masks():
    rewards, values, mask, _, _ = _batch()
    r, v = _tensors("cpu", rewards, values)
    assert all(f.severity == "warning" for f in trainers.check(r, v, torch.tensor(mask).bool(), 1.0, 0.9))
    bad = torch.tensor(mask, dtype=torch.int64)
    bad[6, 3] = 2
    with pytest.raises(GAEInputError, match=r"row 6, column 'response_mask': response_mask\[6, 3\] is 2"):
        trainers.check(r, v, bad, 1.0, 0.9)


def test_check_lists_of_slime_and_miles():
    rewards, values, mask, lengths, _ = _batch()
    as_list = lambda array: [torch.tensor(row[:n]) for row, n in zip(array, lengths)]  # noqa: E731
    r, v, m = as_list(rewards), as_list(values), as_list(mask)
    r[1][2] = float("nan")
    with pytest.raises(GAEInputError, match=r"row 1, column 'rewards_list': rewards_list\[1\]\[2\] is nan"):
        trainers.check(lengths, lengths, v, r, 1.0, 0.95, loss_masks=m, layout="slime")
    r[1][2] = 0.0
    terminal = [1.0] * len(lengths)
    terminal[5] = float("inf")
    findings = trainers.check(lengths, lengths, v, r, terminal, None, None, m, 1.0, 0.95, layout="miles",
                              errors="return")  # fmt: skip
    assert [(f.row, f.column) for f in findings if f.code == "non-finite"] == [(5, "terminal_rewards")]
    short = list(v)
    short[3] = short[3][:-1]
    with pytest.raises(GAEInputError, match="sample 3"):
        trainers.check(lengths, lengths, short, r, 1.0, 0.95, loss_masks=m, layout="slime")


def test_check_refuses_unknown_layouts_and_arguments():
    rewards, values, mask, _, _ = _batch()
    r, v, m = _tensors("cpu", rewards, values, mask)
    with pytest.raises(InvalidOptionError, match="layout='vrl'"):
        trainers.check(r, v, m, 1.0, 0.9, layout="vrl")
    with pytest.raises(InvalidOptionError, match="pass the arguments of its drop-in"):
        trainers.check(r, v, m, 1.0, layout="verl")
    for args, kwargs in (((r, v, m, 1.0, 0.9, 0.5), {}), ((r, v, m, 1.0), {"gamma": 1.0}), ((r, v), {"mask": m})):
        with pytest.raises(InvalidOptionError, match="pass the arguments of its drop-in"):
            trainers.check(*args, layout="verl", **kwargs)


@pytest.mark.parametrize(
    "layout, args, kwargs",
    [
        ("verl", ("r", "v", "m", 1.0, 0.9), {}),
        ("verl", ("r",), {"values": "v", "response_mask": "m", "gamma": 1.0, "lam": 0.9}),
        ("skyrl", ("r", "v", "m", 1.0, 0.9), {"loss_mask": "m", "extra": 1}),
        ("nemo-rl", ("self", None, "s", "m", "v"), {"logprobs": None}),
        ("slime", ([2], [2], "v", "r", 1.0, 0.9), {"loss_masks": "m"}),
        ("areal", ("r", "v", "m", None), {"discount": 1.0, "gae_lambda": 0.9}),
    ],
)
def test_arguments_are_bound_as_the_drop_ins_signature_binds_them(layout, args, kwargs):
    """The drop-in's arguments by name, as ``inspect.Signature.bind`` gives them (defaults
    applied), whether matched directly or through the signature."""
    import inspect

    from gaecli.trainers.layouts import _bound, _drop_in

    expected = inspect.signature(_drop_in(layout)).bind(*args, **kwargs)
    expected.apply_defaults()
    got = _bound(layout, args, kwargs)
    assert {k: v for k, v in got.items() if k != "kwargs"} == {
        k: v for k, v in expected.arguments.items() if k != "kwargs"
    }


def _response_ends(rewards, mask):
    """One past each row's last trainable token or last non-zero reward after it."""
    ends = []
    for row, marks in zip(rewards, mask):
        marked = [t for t in range(len(row)) if marks[t] or row[t] != 0]
        ends.append(marked[-1] + 1 if marked else 0)
    return ends


def _oracle_delta(old_rows, new_rows, mask, picked, windows):
    """Mean |old − new| over the trainable tokens of the picked rows, from ``windows[i]`` on."""
    differences = [abs(old_rows[i][t] - new_rows[i][t]) for i in picked for t in range(windows[i], len(mask[i]))
                   if mask[i][t]]  # fmt: skip
    return math.fsum(differences) / len(differences) if differences else 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.0), (1.0, 1.0)])
def test_credit_metrics_of_verl_against_its_loop(device, gamma, lam):
    rewards, values, mask, lengths, tails = _batch()
    r, v, m = _tensors(device, rewards, values, mask)
    metrics = trainers.credit_metrics(r, v, m, gamma, lam, layout="verl", delta_rows=None, delta_tokens=10**6)
    rows = len(lengths)
    expected_lost = [mask[i, lengths[i] - 1] == 0 for i in range(rows)]
    assert metrics.lost.tolist() == expected_lost
    assert metrics.masked_tail.tolist() == tails
    outcomes = _outcomes(rewards, mask)
    lost_reward = math.fsum(abs(outcomes[i]) for i in range(rows) if expected_lost[i])
    assert float(metrics.lost_reward) == pytest.approx(lost_reward)
    old = [verl_gae_row(rr, vv, mm, gamma, lam)[0] for rr, vv, mm in zip(rewards, values, mask)]
    new = [contract_row(vv, rr, mm, gamma, lam)[0] for rr, vv, mm in zip(rewards, values, mask)]
    expected = _oracle_delta(old, new, mask, range(rows), [0] * rows)
    assert float(metrics.mean_abs_delta) == pytest.approx(expected, rel=1e-12)
    assert metrics.rows_compared == rows
    logged = metrics.as_dict()
    assert logged["gaecli/lost_terminal_samples"] == sum(expected_lost)
    assert logged["gaecli/masked_tail_samples"] == sum(1 for tail in tails if tail)
    assert logged["gaecli/masked_tail_tokens_mean"] == pytest.approx(np.mean([t for t in tails if t]))


@pytest.mark.parametrize("device", DEVICES)
def test_credit_metrics_of_verl_cover_every_row_whatever_the_window(device):
    """verl differs from the contract only in the outcome it loses (on a masked tail, KL terms
    there included): Δ is taken over every trainable token of every row, whatever
    ``delta_rows`` and ``delta_tokens`` say (they size the windows of the other profiles)."""
    rewards, values, mask, lengths, _ = _batch(seed=17)
    for i in range(len(lengths)):  # KL-like terms on every token of the response, masked ones too
        rewards[i, : lengths[i]] += 0.01 * np.sin(np.arange(lengths[i]) + i)
    r, v, m = _tensors(device, rewards, values, mask)
    metrics = trainers.credit_metrics(r, v, m, 0.99, 0.9, layout="verl", delta_rows=2, delta_tokens=3)
    old = [verl_gae_row(rr, vv, mm, 0.99, 0.9)[0] for rr, vv, mm in zip(rewards, values, mask)]
    new = [contract_row(vv, rr, mm, 0.99, 0.9)[0] for rr, vv, mm in zip(rewards, values, mask)]
    rows = len(lengths)
    assert float(metrics.mean_abs_delta) == pytest.approx(_oracle_delta(old, new, mask, range(rows), [0] * rows),
                                                          rel=1e-12)  # fmt: skip
    assert metrics.rows_compared == rows


@pytest.mark.parametrize("delta_rows, delta_tokens", [(4, 20), (5, 12), (12, 6)])
def test_credit_metrics_suffix_windows_are_exact(delta_rows, delta_tokens):
    """Δ on a few rows' response ends equals the full rows' Δ restricted to those tokens."""
    rewards, values, mask, _, _ = _batch(seed=11)
    r, v, m = _tensors("cpu", rewards, values, mask)
    metrics = trainers.credit_metrics(v, r, m, 1.0, 0.9, layout="openrlhf", delta_rows=delta_rows,
                                      delta_tokens=delta_tokens)  # fmt: skip
    rows = len(mask)
    picked = sorted(set(int(round(x)) for x in np.linspace(0, rows - 1, delta_rows)))
    window = max(1, delta_tokens // len(picked))  # at least a token a row
    ends = _response_ends(rewards, mask)
    starts = [max(0, ends[i] - window) for i in range(rows)]
    old = [openrlhf_gae_row(vv, rr, mm, 1.0, 0.9)[0] for rr, vv, mm in zip(rewards, values, mask)]
    new = [contract_row(vv, rr, mm, 1.0, 0.9)[0] for rr, vv, mm in zip(rewards, values, mask)]
    assert float(metrics.mean_abs_delta) == pytest.approx(_oracle_delta(old, new, mask, picked, starts), rel=1e-12)
    assert metrics.rows_compared == len(picked)


@pytest.mark.parametrize("lam", [0.95, 0.0])
def test_credit_metrics_of_slime_lists(lam):
    """slime's every-token GAE decays an outcome on a masked tail to the last trainable token
    (lost only with γλ = 0); the fully masked sample loses it either way."""
    rewards, values, mask, lengths, tails = _batch(seed=5)
    as_list = lambda array: [torch.tensor(row[:n]) for row, n in zip(array, lengths)]  # noqa: E731
    metrics = trainers.credit_metrics(lengths, lengths, as_list(values), as_list(rewards), 1.0, lam,
                                      loss_masks=as_list(mask), layout="slime", delta_rows=None)  # fmt: skip
    rows = len(lengths)
    expected_lost = [i == rows - 1 or (lam == 0 and tails[i] > 0) for i in range(rows)]
    assert metrics.lost.tolist() == expected_lost
    assert metrics.masked_tail.tolist() == tails
    old = [slime_row(list(vv[:n]), list(rr[:n]), 1.0, lam)[0] for rr, vv, n in zip(rewards, values, lengths)]
    new = [contract_row(list(vv[:n]), list(rr[:n]), list(mm[:n]), 1.0, lam)[0]
           for rr, vv, mm, n in zip(rewards, values, mask, lengths)]  # fmt: skip
    trimmed = [list(mm[:n]) for mm, n in zip(mask, lengths)]
    assert float(metrics.mean_abs_delta) == pytest.approx(_oracle_delta(old, new, trimmed, range(rows), [0] * rows))


def test_credit_metrics_of_miles_own_and_pre_fix():
    rewards, values, mask, lengths, _ = _batch(seed=7)
    as_list = lambda array: [torch.tensor(row[:n]) for row, n in zip(array, lengths)]  # noqa: E731
    zeros = [torch.zeros(n, dtype=torch.float64) for n in lengths]
    terminal = [2.0] * len(lengths)
    arguments = (lengths, lengths, as_list(values), zeros, terminal, None, None, as_list(mask), 1.0, 0.95)
    own = trainers.credit_metrics(*arguments, layout="miles")
    assert own.profile == "masked" and float(own.mean_abs_delta) == 0.0
    assert own.lost.tolist() == [i == len(lengths) - 1 for i in range(len(lengths))]
    assert float(own.lost_reward) == 2.0
    pre_fix = trainers.credit_metrics(*arguments, layout="miles", profile="slime", delta_rows=None)
    assert float(pre_fix.mean_abs_delta) > 0.0


def test_credit_metrics_of_nemo_rl_lose_the_fully_masked_reward():
    from gaecli.trainers.nemo_rl import GeneralizedAdvantageEstimator

    class Loss:
        use_kl_in_reward, reference_policy_kl_penalty, reference_policy_kl_type = False, 0.0, "k3"

    config = {"gae_lambda": 0.95, "gae_gamma": 1.0, "normalize_advantages": False, "gae_lambda_value": None,
              "gae_lambda_policy": None, "length_adaptive_alpha": 0.0}  # fmt: skip
    estimator = GeneralizedAdvantageEstimator(config, Loss())
    _, values, mask, _, _ = _batch()
    v, m = _tensors("cpu", values, mask)
    scores = torch.arange(1.0, len(mask) + 1, dtype=torch.float64)
    metrics = trainers.credit_metrics(estimator, None, scores, m, v, layout="nemo-rl", delta_rows=None)
    assert metrics.lost.tolist() == [i == len(mask) - 1 for i in range(len(mask))]
    assert float(metrics.lost_reward) == float(len(mask))
    assert float(metrics.mean_abs_delta) == 0.0  # NeMo-RL's advantages at trainable tokens are the contract's
