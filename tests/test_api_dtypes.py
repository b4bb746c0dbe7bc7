"""The tensor API on the dtypes and layouts trainers hand it: float16 and bfloat16 computed
in float32 and returned in the input's dtype (held against the float64 oracle on the
rounded inputs), complex and ``meta`` tensors refused naming the argument, numpy views with
a negative stride taken as the arrays they are, and ``whiten`` refusing non-finite input as
the other entry points do. Every entry point: masked_gae (list), masked_gae_packed,
compute_advantages (list and packed), baseline_gae, whiten."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gaecli
from gaecli import AdvantageSpec, GAEInputError

from helpers import assert_close, make_batch, oracle_batch

GAMMA, LAMBD = 0.99, 0.95
LENGTHS = [7, 0, 1, 33, 12, 64]
ENTRY_POINTS = ["masked_gae", "masked_gae_packed", "compute_advantages", "compute_advantages_packed", "baseline_gae"]


def call(entry: str, values, rewards, masks, terminals):
    """One entry point on list-form samples (packed ones get them concatenated); returns
    list-form advantages and returns and the semantics it computes."""
    lengths = [len(v) for v in values]
    offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    spec = AdvantageSpec(GAMMA, LAMBD, "masked")
    options = {"gamma": GAMMA, "lambd": LAMBD}
    if entry == "masked_gae":
        return (*gaecli.masked_gae(values, rewards, masks, terminals, **options), "masked")
    if entry == "baseline_gae":
        return (*gaecli.baseline_gae(values, rewards, masks, terminals, semantics="unmasked", **options), "unmasked")
    if entry == "compute_advantages":
        return (*gaecli.compute_advantages(values, rewards, masks, terminals, spec=spec), "masked")
    packed = (torch.cat(values), torch.cat(rewards), torch.cat(masks), offsets, terminals)
    if entry == "masked_gae_packed":
        advantages, returns = gaecli.masked_gae_packed(*packed, **options)
    else:
        advantages, returns = gaecli.compute_advantages_packed(*packed, spec=spec)
    return list(advantages.split(lengths)), list(returns.split(lengths)), "masked"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(entry, dtype):
    batch = make_batch(26, LENGTHS, dtype=dtype)
    advantages, returns, semantics = call(entry, *batch.args())
    assert {a.dtype for a in advantages} | {r.dtype for r in returns} == {dtype}
    expected_advantages, expected_returns = oracle_batch(semantics, batch)  # float64, on the rounded inputs
    # float32 arithmetic, then one rounding to the output's precision: half an ulp of the largest output.
    assert_close(f"{entry} advantages ({dtype})", expected_advantages, advantages)
    assert_close(f"{entry} returns ({dtype})", expected_returns, returns)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("form", ["list", "flat"])
def test_whiten_of_half_precision(dtype, form):
    batch = make_batch(27, LENGTHS, dtype=dtype)
    advantages = batch.values
    flat = torch.cat(advantages).double()
    mask = torch.cat(batch.masks)
    chosen = flat[mask].numpy()
    expected = torch.where(mask, (flat - chosen.mean()) / np.sqrt(chosen.var(ddof=1) + 1e-8), 0.0)
    if form == "list":
        got = torch.cat(gaecli.whiten(advantages, batch.masks))
    else:
        got = gaecli.whiten(torch.cat(advantages), mask)
    assert got.dtype == dtype
    assert_close(f"whiten ({dtype})", expected, got)


def complex_samples(name: str):
    batch = make_batch(28, [4, 3])
    arguments = {"values": batch.values, "rewards": batch.rewards}
    arguments[name] = [sample.to(torch.complex64) + 1j for sample in arguments[name]]
    return arguments["values"], arguments["rewards"], batch.masks, batch.terminals


def meta_samples(name: str):
    batch = make_batch(29, [4, 3])
    arguments = {"values": batch.values, "rewards": batch.rewards, "loss_mask": batch.masks}
    arguments[name] = [sample.to("meta") for sample in arguments[name]]
    return arguments["values"], arguments["rewards"], arguments["loss_mask"], batch.terminals


REFUSED = [
    ("complex-values", lambda: complex_samples("values"), "values must hold real numbers, got a torch.complex64"),
    ("complex-rewards", lambda: complex_samples("rewards"), "rewards must hold real numbers, got a torch.complex64"),
    ("meta-values", lambda: meta_samples("values"), "values is a meta tensor"),
    ("meta-rewards", lambda: meta_samples("rewards"), "rewards is a meta tensor"),
    ("meta-mask", lambda: meta_samples("loss_mask"), "loss_mask is a meta tensor"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("arguments, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_complex_and_meta_tensors_are_refused_naming_the_argument(entry, arguments, message):
    with _no_warning():
        with pytest.raises(GAEInputError, match=message.replace("(", r"\(")):
            call(entry, *arguments())


class _no_warning:
    """Asserts the block emits no warning (a cast that drops the imaginary part warns)."""

    def __enter__(self):
        import warnings

        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self._catcher.__exit__(*exc)
        assert not self._caught, [str(w.message) for w in self._caught]
        return False


@pytest.mark.parametrize("entry", ["masked_gae", "compute_advantages", "baseline_gae"])
def test_numpy_views_with_a_negative_stride_are_taken(entry):
    batch = make_batch(30, [5, 8, 3], dtype=torch.float64)
    reversed_views = [
        [np.ascontiguousarray(sample.numpy()[::-1])[::-1] for sample in column]  # the sample, by a negative stride
        for column in (batch.values, batch.rewards, batch.masks)
    ]
    assert all(view.strides[0] < 0 for column in reversed_views for view in column)
    copies = [[torch.from_numpy(view.copy()) for view in column] for column in reversed_views]
    expected = call(entry, *copies, batch.terminals)
    got = call(entry, *reversed_views, batch.terminals)
    for expected_samples, got_samples in zip(expected[:2], got[:2]):
        for want, have in zip(expected_samples, got_samples):
            assert torch.equal(want, have)


def test_whiten_refuses_non_finite_advantages():
    with pytest.raises(GAEInputError, match=r"^advantages is nan at position 1 \(must be finite\)$"):
        gaecli.whiten(torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([1, 0, 1]))
    samples = [torch.tensor([1.0, 2.0]), torch.tensor([0.5, float("inf"), 2.0])]
    with pytest.raises(GAEInputError, match=r"^sample 1: advantages is inf at token 1 \(must be finite\)$"):
        gaecli.whiten(samples, [torch.ones(2), torch.ones(3)])
    with pytest.raises(GAEInputError, match="advantages must hold real numbers"):
        gaecli.whiten(torch.ones(3, dtype=torch.complex64), torch.ones(3))
