"""The maths package: the spec (what it accepts and refuses), the one dispatch
(``compute_advantages`` against the float64 oracles, numpy and torch paths bitwise equal,
kernels refused for specs they cannot run), the layout helpers (numpy and torch against a
loop) and the grouped reduction (any partition gives the same bits)."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gaecli
from gaecli import AdvantageSpec, GAEInputError, KernelUnavailableError
from gaecli.advantages import kernels as kernel_table
from gaecli.advantages import layout
from gaecli.advantages.dispatch import compute
from gaecli.advantages.statistics import KeyedStatistics, Moments, merged_in_order, whitening_statistics

from helpers import (
    FAST_KERNEL_NAMES,
    assert_bitwise,
    assert_close,
    make_batch,
    oracle_batch,
    ragged_batches,
    spec_document,
)
from rollout_files import worked_example_in_a_process

SEMANTICS = ["masked", *gaecli.BASELINES]


def whitened_oracle(advantages: list[torch.Tensor], masks: list[torch.Tensor], groups: list) -> list[torch.Tensor]:
    """Whitening by a plain float64 loop: per group of samples, mean and Bessel variance over
    the trainable tokens, ``(A − mean) / sqrt(var + 1e-8)``, 0 at masked positions."""
    out = [torch.zeros(a.numel(), dtype=torch.float64) for a in advantages]
    for group in set(groups):
        numbers = [
            float(a[t]) for a, m, g in zip(advantages, masks, groups) if g == group for t in range(a.numel()) if m[t]
        ]
        mean = sum(numbers) / len(numbers)
        variance = sum((x - mean) ** 2 for x in numbers) / (len(numbers) - 1) if len(numbers) > 1 else 0.0
        for index, (a, m, g) in enumerate(zip(advantages, masks, groups)):
            if g == group:
                for t in range(a.numel()):
                    if m[t]:
                        out[index][t] = (float(a[t]) - mean) / (variance + 1e-8) ** 0.5
    return out


# ----------------------------------------------------------------------------- the spec


def test_spec_defaults_and_fields():
    spec = AdvantageSpec(0.9, 0.95)
    assert spec.to_dict() == spec_document(0.9, 0.95)
    assert spec.features == frozenset({"estimator:gae", "timestep:token"})
    assert spec.row_inputs == ()
    assert spec.normalize_label == "none"
    by = AdvantageSpec(0.9, 0.95, normalize="by", normalize_by="prompt")
    assert by.normalize_label == "by:prompt"
    assert [(i.name, i.role, i.kind) for i in by.row_inputs] == [("prompt", "normalize-key", "scalar")]


def test_spec_is_immutable_hashable_and_picklable():
    spec = AdvantageSpec(0.9, 0.95, "skip-masked", normalize="all")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gamma = 0.5
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert len({spec, AdvantageSpec(0.9, 0.95, "skip-masked", normalize="all")}) == 1
    assert dataclasses.replace(spec, semantics="masked").semantics == "masked"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"gamma": 1.5}, "gamma must be in"),
        ({"lambd": float("nan")}, "lambd must be a finite number in"),
        ({"semantics": "token-mean"}, "unknown semantics 'token-mean'; choose one of: masked, verl, openrlhf"),
        ({"normalize": "some"}, "unknown normalize 'some'"),
        ({"normalize": "by"}, "normalize='by' needs normalize_by"),
        ({"normalize_by": "prompt"}, "normalize_by needs normalize='by'"),
        ({"estimator": "sarsa"}, "unknown estimator 'sarsa'; implemented: gae, grpo"),
        ({"estimator": "grpo", "group_by": "uid"}, "estimator 'grpo' does not use gamma"),
        ({"timestep": "step"}, "unknown timestep 'step'; implemented: token, turn"),
        ({"lambd_critic": 1.5}, "lambd_critic must be in"),
        ({"lambd_alpha": 0.0}, "lambd_alpha must be > 0"),
        ({"lambd_alpha": float("inf")}, "lambd_alpha must be a finite number"),
    ],
)
def test_spec_refuses_what_cannot_be_computed(changes, message):
    with pytest.raises(GAEInputError, match=message.replace("(", r"\(")):
        AdvantageSpec(**{"gamma": 0.9, "lambd": 0.95, **changes})


# ----------------------------------------------------------------------------- kernels and the spec


@pytest.fixture
def gae_less_native(monkeypatch):
    """The kernel table with ``native`` declaring it cannot run GAE (as a critic-free
    kernel would)."""
    supports = frozenset({"estimator:grpo", "timestep:token"})
    limited = dataclasses.replace(kernel_table.KERNELS["native"], supports=supports)
    monkeypatch.setitem(kernel_table.KERNELS, "native", limited)


@pytest.mark.skipif("native" not in gaecli.available_kernels(), reason="needs numba")
def test_a_kernel_that_lacks_a_feature_is_refused_and_auto_skips_it(gae_less_native):
    spec = AdvantageSpec(0.9, 0.95)
    capable = [name for name in kernel_table.available_kernels("cpu") if name != "native"]
    assert capable[:4] == ["reference", "vanilla", "chunked", "scan"]  # (and triton where it runs)
    message = f"kernel 'native' does not support estimator:gae; kernels that do: auto, {', '.join(capable)}$"
    with pytest.raises(KernelUnavailableError, match=message):
        kernel_table.resolve_kernel("native", "cpu", spec)
    assert kernel_table.resolve_kernel("auto", "cpu", spec) == "scan"
    assert kernel_table.resolve_kernel("native", "cpu") == "native"  # no spec: nothing to refuse
    batch = make_batch(5, [4, 0, 7])
    with pytest.raises(KernelUnavailableError):
        gaecli.compute_advantages(*batch.args(), spec=spec, kernel="native")
    with pytest.raises(KernelUnavailableError):
        values, rewards, mask, offsets, terminal = (t.numpy() for t in batch.packed())
        compute(spec, values, rewards, mask, offsets, terminal.astype(values.dtype), kernel="native")


def test_no_capable_kernel_is_a_clear_error(monkeypatch):
    for name, entry in list(kernel_table.KERNELS.items()):
        monkeypatch.setitem(kernel_table.KERNELS, name, dataclasses.replace(entry, supports=frozenset()))
    with pytest.raises(KernelUnavailableError, match="no kernel usable on cpu here computes estimator:gae"):
        kernel_table.resolve_kernel("auto", "cpu", AdvantageSpec(0.9, 0.95))


# ----------------------------------------------------------------------------- compute_advantages


@pytest.mark.parametrize("semantics", SEMANTICS)
@given(batch=ragged_batches(), kernel=st.sampled_from(FAST_KERNEL_NAMES))
def test_compute_advantages_matches_the_oracles(semantics, batch, kernel):
    spec = AdvantageSpec(batch.gamma, batch.lambd, semantics)
    advantages, returns = gaecli.compute_advantages(*batch.args(), spec=spec, kernel=kernel)
    expected_advantages, expected_returns = oracle_batch(semantics, batch)
    assert_close(f"{semantics} advantages ({kernel})", expected_advantages, advantages)
    assert_close(f"{semantics} returns ({kernel})", expected_returns, returns)
    # The simple functions are this one with a spec: the same bits.
    simple = gaecli.baseline_gae(
        *batch.args(), gamma=batch.gamma, lambd=batch.lambd, semantics=semantics, kernel=kernel
    )
    for name, got, expected in (("advantages", advantages, simple[0]), ("returns", returns, simple[1])):
        for index, (a, b) in enumerate(zip(got, expected)):
            assert_bitwise(f"{semantics} {name} sample {index}", b, a)


@given(batch=ragged_batches(dtype=torch.float64))
def test_compute_advantages_whitens_over_the_input(batch):
    if not any(bool(m.any()) for m in batch.masks):
        return  # nothing to whiten: tested below
    spec = AdvantageSpec(batch.gamma, batch.lambd, normalize="all")
    advantages, returns = gaecli.compute_advantages(*batch.args(), spec=spec)
    raw, expected_returns = oracle_batch("masked", batch)
    assert_close("whitened advantages", whitened_oracle(raw, batch.masks, [0] * len(batch)), advantages, 1e-9)
    assert_close("returns are not whitened", expected_returns, returns)


@given(batch=ragged_batches(dtype=torch.float64), seed=st.integers(0, 2**16))
def test_compute_advantages_whitens_by_group(batch, seed):
    groups = np.random.default_rng(seed).choice(["a", "b", "c"], len(batch)).tolist()
    counts = {g: sum(int(m.sum()) for m, k in zip(batch.masks, groups) if k == g) for g in set(groups)}
    spec = AdvantageSpec(batch.gamma, batch.lambd, "unmasked", normalize="by", normalize_by="prompt")
    if any(count == 0 for count in counts.values()):
        with pytest.raises(GAEInputError, match="cannot normalize: group '.' has no trainable token"):
            gaecli.compute_advantages(*batch.args(), spec=spec, row_inputs={"prompt": groups})
        return
    advantages, _ = gaecli.compute_advantages(*batch.args(), spec=spec, row_inputs={"prompt": groups})
    raw, _ = oracle_batch("unmasked", batch)
    assert_close("advantages whitened per group", whitened_oracle(raw, batch.masks, groups), advantages, 1e-9)


def test_compute_advantages_hand_worked_whitening():
    # Two samples, masks [1, 0, 1] and [1]; γ = 0, so A = r + z − V on trainable tokens:
    # sample 0: A = [1 − 0, 0, 3 + 1 − 0] = [1, 0, 4]; sample 1: A = [2 + 0 − 1] = [1].
    # Whole input: trainable A = 1, 4, 1, mean 2, Bessel variance (1 + 4 + 1) / 2 = 3.
    # By group (0 → "x", 1 → "y"): group x has 1, 4 (mean 2.5, variance 4.5), group y one
    # token (variance 0, so it whitens to 0).
    values = [torch.tensor([0.0, 5.0, 0.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)]
    rewards = [torch.tensor([1.0, 7.0, 3.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)]
    masks = [torch.tensor([1, 0, 1]), torch.tensor([1])]
    terminal = [1.0, 0.0]
    spec = AdvantageSpec(0.0, 1.0, normalize="all")
    whole, _ = gaecli.compute_advantages(values, rewards, masks, terminal, spec=spec)
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    root = (3.0 + 1e-8) ** 0.5
    assert_close("whole", [f64([-1 / root, 0.0, 2 / root]), f64([-1 / root])], whole, 1e-15)
    spec = AdvantageSpec(0.0, 1.0, normalize="by", normalize_by="prompt")
    by_group, _ = gaecli.compute_advantages(
        values, rewards, masks, terminal, spec=spec, row_inputs={"prompt": torch.tensor([7, 9])}
    )
    root = (4.5 + 1e-8) ** 0.5
    assert_close("by group", [f64([-1.5 / root, 0.0, 1.5 / root]), f64([0.0])], by_group, 1e-15)
    with pytest.raises(GAEInputError, match="spec reads per-row input 'prompt'"):
        gaecli.compute_advantages(values, rewards, masks, terminal, spec=spec)
    with pytest.raises(GAEInputError, match="one key per sample"):
        gaecli.compute_advantages(values, rewards, masks, terminal, spec=spec, row_inputs={"prompt": [1]})
    with pytest.raises(GAEInputError, match="spec must be a gaecli.AdvantageSpec"):
        gaecli.compute_advantages(values, rewards, masks, terminal, spec={"gamma": 1.0})


@pytest.mark.parametrize("semantics", SEMANTICS)
@given(batch=ragged_batches())
def test_numpy_and_torch_dispatch_give_the_same_bits(semantics, batch):
    # The commands hand numpy buffers to the dispatch; the API tensors. With any kernel the
    # numpy route (native without torch, others through tensors) gives the API's bits.
    packed = batch.packed()
    spec = AdvantageSpec(batch.gamma, batch.lambd, semantics)
    values, rewards, mask, offsets, terminal = (t.numpy() for t in packed)
    for kernel in FAST_KERNEL_NAMES:
        expected = gaecli.compute_advantages_packed(*packed, spec=spec, kernel=kernel)
        got = compute(spec, values, rewards, mask, offsets, terminal.astype(values.dtype), kernel=kernel)
        assert isinstance(got[0], np.ndarray)
        assert_bitwise(f"{semantics} {kernel} advantages", expected[0], torch.from_numpy(got[0]))
        assert_bitwise(f"{semantics} {kernel} returns", expected[1], torch.from_numpy(got[1]))


@pytest.mark.skipif("native" not in gaecli.available_kernels(), reason="needs numba")
def test_numpy_dispatch_on_the_cpu_never_imports_torch():
    results, torch_loaded = worked_example_in_a_process(["masked", "unmasked", "skip-masked", "zero-masked"])
    # zero-masked on the worked example of docs/semantics.md (tests/test_baselines.py).
    assert str(results["zero-masked"][0]) == "[1.5625, 4.125, 5.25, 0.0]" and not torch_loaded


# ----------------------------------------------------------------------------- layout helpers


@given(batch=ragged_batches())
def test_layout_helpers_agree_on_numpy_and_torch_and_with_a_loop(batch):
    _, _, mask, offsets, _ = batch.packed()
    bounds = offsets.tolist()
    spans = list(zip(bounds, bounds[1:]))
    expected = {
        "segment_ids": [s for s, (a, b) in enumerate(spans) for _ in range(a, b)],
        "trainable_counts": [int(mask[a:b].sum()) for a, b in spans],
        "last_trainable_index": [max((t for t in range(a, b) if mask[t]), default=-1) for a, b in spans],
        "next_trainable_index": [
            next((u for u in range(t + 1, b) if mask[u]), -1) for a, b in spans for t in range(a, b)
        ],
    }
    for form, (m, o) in (("numpy", (mask.numpy(), offsets.numpy())), ("torch", (mask, offsets))):
        got = {
            "segment_ids": layout.segment_ids(o, mask.numel()),
            "trainable_counts": layout.trainable_counts(m, o),
            "last_trainable_index": layout.last_trainable_index(m, o),
            "next_trainable_index": layout.next_trainable_index(m, o),
        }
        for name, value in got.items():
            assert isinstance(value, np.ndarray if form == "numpy" else torch.Tensor), (form, name)
            assert value.tolist() == expected[name], (form, name)
    tails = [(b - 1 - last) if last >= 0 else b - a for (a, b), last in zip(spans, expected["last_trainable_index"])]
    assert layout.masked_tail_lengths(mask.numpy(), offsets.numpy()).tolist() == tails


# ----------------------------------------------------------------------------- grouped reduction


@given(batch=ragged_batches(dtype=torch.float64), cut=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_grouped_reduction_is_batch_invariant_and_accurate(batch, cut, seed):
    values, _, mask, offsets, _ = batch.packed()
    advantages, trainable, offsets = values.numpy(), mask.numpy(), offsets.numpy()
    rows = offsets.size - 1
    cut = min(cut, rows)
    keys = pa.array(np.random.default_rng(seed).choice(["a", "b"], rows).tolist(), pa.string())
    statistics = whitening_statistics("prompt")

    def add(result: KeyedStatistics, first: int, last: int) -> KeyedStatistics:
        start, end = offsets[first], offsets[last]
        operands = {"new": advantages[start:end], "old": -advantages[start:end]}
        result.add(operands, trainable[start:end], offsets[first : last + 1] - start, {"prompt": keys[first:last]})
        return result

    whole = add(KeyedStatistics(statistics), 0, rows)
    batched = add(add(KeyedStatistics(statistics), 0, cut), cut, rows)  # one file read in two batches
    parts = [add(KeyedStatistics(statistics), 0, cut), add(KeyedStatistics(statistics), cut, rows)]
    split, _ = merged_in_order(statistics, parts)
    for statistic, sign in zip(statistics, (1, -1)):
        moments = whole[statistic]
        codes = batched[statistic].merge(Moments())  # no-op merge: the codes stay
        assert codes.size == 0
        assert batched[statistic].table.keys().equals(moments.table.keys()) if rows else True
        for kind in ("counts", "sums", "errors"):  # bitwise, whatever the batches
            assert np.array_equal(
                getattr(batched[statistic], kind)[:, : moments.size], getattr(moments, kind)[:, : moments.size]
            )
        totals, squares = moments.totals()
        split_totals, split_squares = split[statistic].totals()
        for code in range(moments.size):
            key = moments.key(code)
            in_group = np.repeat(np.array(keys.to_pylist()) == key, np.diff(offsets)) & trainable
            numbers = advantages[in_group] * sign
            assert moments.count("counts")[code] == numbers.size
            allowed = 1e-12 * (1 + np.abs(numbers).sum())
            assert totals[code] == pytest.approx(math.fsum(numbers), abs=allowed)
            squared = numbers * numbers
            assert squares[code] == pytest.approx(math.fsum(squared), abs=1e-12 * (1 + squared.sum()))
            other = split[statistic].table.keys().to_pylist().index(key)
            assert split[statistic].count("counts")[other] == numbers.size
            assert split_totals[other] == pytest.approx(math.fsum(numbers), abs=allowed)


def test_the_python_api_example_of_compute_advantages():
    # docs/python-api.md, "compute_advantages": hand-worked there (γ = 0.5, λ = 1).
    values = [torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.5, 0.5]), torch.tensor([3.0, 1.0])]
    rewards = [torch.zeros(2), torch.zeros(3), torch.zeros(2)]
    loss_mask = [torch.tensor([1, 1]), torch.tensor([1, 0, 1]), torch.tensor([1, 0])]
    spec = AdvantageSpec(0.5, 1.0, normalize="by", normalize_by="prompt")
    advantages, returns = gaecli.compute_advantages(
        values, rewards, loss_mask, [1.0, 0.0, 2.0], spec=spec, row_inputs={"prompt": ["a", "a", "b"]}
    )
    root = (0.0625 + 1e-8) ** 0.5
    expected = [[0.125 / root, -0.375 / root], [0.125 / root, 0.0, 0.125 / root], [0.0, 0.0]]
    assert_close("advantages", [torch.tensor(x) for x in expected], advantages)
    assert [r.tolist() for r in returns] == [[0.5, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0]]
