"""The GAE variants (docs/variants.md): decoupled λ (``lambd_critic``), length-adaptive λ
(``lambd_alpha``), per-turn rewards, turn-level GAE (``timestep="turn"``) and the
truncation bootstrap, against hand-worked numbers and the independent float64 loop
:func:`tests.helpers.variant_oracle`; ``reference`` and ``native`` bitwise equal and batch
invariant; the other kernels refuse; invalid per-row inputs rejected naming the sample."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gaecli
from gaecli import AdvantageSpec
from gaecli.advantages import compute_advantages, compute_advantages_packed
from gaecli.advantages.dispatch import compute
from gaecli.advantages.kernels import KERNELS, resolve_kernel
from gaecli.advantages.layout import turn_table
from gaecli.advantages.variants import adaptive_lambd
from gaecli.checks import check_batch
from gaecli.errors import GAEInputError, InvalidOptionError, KernelUnavailableError
from gaecli.io.format import Columns
from tests.helpers import assert_bitwise, assert_close, make_batch, ragged_batches, variant_oracle

needs_native = pytest.mark.skipif("native" not in gaecli.available_kernels(), reason="needs numba")
VARIANT_KERNELS = [name for name in ("reference", "native") if name in gaecli.available_kernels()]

# The contract's worked example (docs/semantics.md): trainable tokens 0 and 2, two turns.
EXAMPLE = dict(values=[1.0, 2.0, 3.0, 4.0], rewards=[0.5, 1.0, 0.25, 2.0], mask=[1, 0, 1, 0], terminal=8.0)
# Two turns of two tokens: turns [0, 1] and [3, 4].
TURNS = dict(values=[1.0, 2.0, 3.0, 4.0, 5.0], rewards=[0.1, 0.2, 0.3, 0.4, 0.5], mask=[1, 1, 0, 1, 1], terminal=2.0)


def run_one(example, spec, kernel="auto", **data):
    """Advantages and returns (lists of floats) of one sample under ``spec``."""
    tensors = [torch.tensor(example[name], dtype=torch.float64) for name in ("values", "rewards")]
    mask = torch.tensor(example["mask"], dtype=torch.bool)
    advantages, returns = compute_advantages(
        [tensors[0]], [tensors[1]], [mask], [example["terminal"]], spec=spec, kernel=kernel, **data
    )
    return advantages[0].tolist(), returns[0].tolist()


# ----------------------------------------------------------------------------- hand-worked examples

HAND_WORKED = [
    # (example, spec fields, data keywords, advantages, returns)
    ("plain", EXAMPLE, {}, {}, [3.625, 0, 5.25, 0], [4.625, 0, 8.25, 0]),
    # returns: GAE(γ, 0) + V; advantages keep λ = 1
    ("lambd_critic", EXAMPLE, {"lambd_critic": 0.0}, {}, [3.625, 0, 5.25, 0], [2.0, 0, 8.25, 0]),
    # L = 2 trainable tokens, α·L = 0.5 → λ = 0: advantages are the TD errors; returns keep λ = 1
    ("lambd_alpha small", EXAMPLE, {"lambd_alpha": 0.25}, {}, [1.0, 0, 5.25, 0], [4.625, 0, 8.25, 0]),
    # α·L = 2 → λ = 0.5, γλ = 0.25: A_0 = 1 + 0.25·5.25
    ("lambd_alpha", EXAMPLE, {"lambd_alpha": 1.0}, {}, [2.3125, 0, 5.25, 0], [4.625, 0, 8.25, 0]),
    # turn rewards 1 and 2 on the turns' last tokens 0 and 2: r' = [1.5, ·, 10.25]
    ("turn rewards", EXAMPLE, {}, {"turn_rewards": [[1.0, 2.0]]}, [5.625, 0, 7.25, 0], [6.625, 0, 10.25, 0]),
    # turns: V = [1, 3], rewards [0, 8]: A_1 = 5, A_0 = 0.5 + 0.5·5 = 3; + r[t] per token
    ("turn", EXAMPLE, {"timestep": "turn"}, {}, [3.5, 0, 5.25, 0], [4.0, 0, 8.0, 0]),
    ("turn + rewards", EXAMPLE, {"timestep": "turn"}, {"turn_rewards": [[1.0, 2.0]]}, [5.5, 0, 7.25, 0], [6, 0, 10, 0]),
    # bootstrap 2 after token 2: δ_2 = 8.25 + 0.5·2 − 3 = 6.25
    (
        "bootstrap",
        EXAMPLE,
        {},
        {"truncated": [True], "bootstrap_values": [2.0]},
        [4.125, 0, 6.25, 0],
        [5.125, 0, 9.25, 0],
    ),
    # not truncated: the bootstrap value is not read (even NaN)
    (
        "not truncated",
        EXAMPLE,
        {},
        {"truncated": [False], "bootstrap_values": [float("nan")]},
        [3.625, 0, 5.25, 0],
        [4.625, 0, 8.25, 0],
    ),
    # γ = λ = 0.5 below. Turns V = [1, 4], rewards [2, 3 + z = 5]: A_1 = 1, A_0 = 3 + 0.25·1
    (
        "turn, two-token turns",
        TURNS,
        {"timestep": "turn"},
        {"turn_rewards": [[2.0, 3.0]]},
        [3.35, 3.45, 0, 1.4, 1.5],
        [4.25, 4.25, 0, 5, 5],
    ),
    # bootstrap 6 after the last turn: δ_1 = 5 + 0.5·6 − 4 = 4, A_0 = 3 + 0.25·4
    (
        "turn + bootstrap",
        TURNS,
        {"timestep": "turn"},
        {"turn_rewards": [[2.0, 3.0]], "truncated": [True], "bootstrap_values": [6.0]},
        [4.1, 4.2, 0, 4.4, 4.5],
        [5, 5, 0, 8, 8],
    ),
    # L = 2 turns, α·L = 0.5 → λ = 0: A_u = δ_u; returns with λ_critic = 1: G_0 = 3 + 0.5·1
    (
        "turn + alpha + critic",
        TURNS,
        {"timestep": "turn", "lambd_alpha": 0.25, "lambd_critic": 1.0},
        {"turn_rewards": [[2.0, 3.0]]},
        [3.1, 3.2, 0, 1.4, 1.5],
        [4.5, 4.5, 0, 5, 5],
    ),
    # token mode with turn rewards: r' = [0.1, 0.2 + 2, ·, 0.4, 0.5 + 3 + 2], γ = λ = 0.5
    # δ_4 = 5.5 − 5 = 0.5; δ_3 = 0.4 + 2.5 − 4 = −1.1; δ_1 = 2.2 + 2 − 2 = 2.2; δ_0 = 0.1 + 1 − 1 = 0.1
    # A_4 = 0.5, A_3 = −1.1 + 0.125 = −0.975, A_1 = 2.2 − 0.24375 = 1.95625, A_0 = 0.1 + 0.4890625
    (
        "token, two-token turns",
        TURNS,
        {},
        {"turn_rewards": [[2.0, 3.0]]},
        [0.5890625, 1.95625, 0, -0.975, 0.5],
        [1.5890625, 3.95625, 0, 3.025, 5.5],
    ),
]


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize(
    "name, example, fields, data, advantages, returns", HAND_WORKED, ids=[c[0] for c in HAND_WORKED]
)
def test_hand_worked(kernel, name, example, fields, data, advantages, returns):
    gamma, lambd = (0.5, 1.0) if example is EXAMPLE else (0.5, 0.5)
    spec = AdvantageSpec(gamma, lambd, **fields)
    got_advantages, got_returns = run_one(example, spec, kernel, **data)
    assert got_advantages == pytest.approx(advantages, abs=1e-12)
    assert got_returns == pytest.approx(returns, abs=1e-12)
    oracle = variant_oracle(
        example["values"],
        example["rewards"],
        example["mask"],
        example["terminal"],
        gamma,
        lambd,
        **fields,
        turn_rewards=data.get("turn_rewards", [None])[0],
        truncated=data.get("truncated", [False])[0],
        bootstrap=data.get("bootstrap_values", [0.0])[0],
    )
    assert oracle[0] == pytest.approx(advantages, abs=1e-12) and oracle[1] == pytest.approx(returns, abs=1e-12)


def test_adaptive_lambd_clamps_and_gives_zero_for_no_timestep():
    lengths = np.array([0, 10, 20, 40, 10**9])
    expected = [0.0, 0.0, 0.0, 0.5, 1.0 - 1.0 / (0.05 * 10**9)]
    assert adaptive_lambd(0.05, lengths).tolist() == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
def test_degenerate_rows_give_zeros(kernel):
    """A fully masked row (its turn list empty) and an empty row give zeros, truncated or not."""
    values = [torch.tensor([1.0, 2.0], dtype=torch.float64), torch.zeros(0, dtype=torch.float64)]
    rewards = [torch.tensor([0.5, 0.25], dtype=torch.float64), torch.zeros(0, dtype=torch.float64)]
    masks = [torch.tensor([False, False]), torch.zeros(0, dtype=torch.bool)]
    spec = AdvantageSpec(0.9, 0.9, timestep="turn", lambd_alpha=0.1, lambd_critic=1.0)
    for timestep in ("token", "turn"):
        advantages, returns = compute_advantages(
            values,
            rewards,
            masks,
            [3.0, 1.0],
            spec=AdvantageSpec(0.9, 0.9, timestep=timestep, lambd_alpha=0.1, lambd_critic=1.0),
            kernel=kernel,
            turn_rewards=[[], []],
            truncated=[True, True],
            bootstrap_values=[5.0, 7.0],
        )
        assert [a.tolist() for a in advantages] == [[0.0, 0.0], []]
        assert [r.tolist() for r in returns] == [[0.0, 0.0], []]
    assert spec.features >= {"timestep:turn", "lambd_alpha", "lambd_critic"}


# ----------------------------------------------------------------------------- random batches


COMBINATIONS = [
    {"lambd_critic": 1.0},
    {"lambd_critic": 0.3},
    {"lambd_alpha": 0.05},
    {"lambd_alpha": 0.5},
    {"timestep": "turn"},
    {"turn": True},
    {"bootstrap": True},
    {"timestep": "turn", "turn": True},
    {"timestep": "turn", "lambd_alpha": 0.05, "lambd_critic": 1.0},
    {"timestep": "turn", "lambd_alpha": 0.3, "lambd_critic": 0.9, "turn": True, "bootstrap": True},
    {"lambd_alpha": 0.02, "lambd_critic": 0.7, "turn": True, "bootstrap": True},
]


def variant_inputs(batch, seed: int, turn: bool, bootstrap: bool) -> dict:
    """Random per-row inputs that fit ``batch``: one turn reward per turn of each sample, a
    truncated flag and a bootstrap value per sample (NaN where not truncated)."""
    rng = np.random.default_rng(seed)
    data = {}
    if turn:
        data["turn_rewards"] = []
        for mask in batch.masks:
            counts = np.diff(turn_table(mask.numpy(), np.array([0, mask.numel()]))[2])
            data["turn_rewards"].append(rng.normal(0.0, 1.0, int(counts[0])).tolist())
    if bootstrap:
        flags = rng.random(len(batch)) < 0.6
        data["truncated"] = flags.tolist()
        data["bootstrap_values"] = np.where(flags, rng.normal(0.0, 2.0, len(batch)), np.nan).tolist()
    return data


def split_fields(combination: dict) -> tuple[dict, bool, bool]:
    fields = {key: value for key, value in combination.items() if key not in ("turn", "bootstrap")}
    return fields, combination.get("turn", False), combination.get("bootstrap", False)


def oracle_of(batch, fields: dict, data: dict):
    advantages, returns = [], []
    for index, (values, rewards, mask, terminal) in enumerate(zip(*batch.args())):
        sample_advantages, sample_returns = variant_oracle(
            values,
            rewards,
            mask,
            terminal,
            batch.gamma,
            batch.lambd,
            **fields,
            turn_rewards=data["turn_rewards"][index] if "turn_rewards" in data else None,
            truncated=data["truncated"][index] if "truncated" in data else False,
            bootstrap=data["bootstrap_values"][index] if "truncated" in data else 0.0,
        )
        advantages.append(torch.tensor(sample_advantages, dtype=torch.float64))
        returns.append(torch.tensor(sample_returns, dtype=torch.float64))
    return advantages, returns


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_against_the_float64_loop(kernel, combination, dtype):
    fields, turn, bootstrap = split_fields(combination)
    batch = make_batch(7, [0, 1, 2, 9, 30, 64, 17, 5], dtype=dtype, gamma=0.97, lambd=0.9)
    data = variant_inputs(batch, 11, turn, bootstrap)
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    advantages, returns = compute_advantages(*batch.args(), spec=spec, kernel=kernel, **data)
    expected_advantages, expected_returns = oracle_of(batch, fields, data)
    assert_close(f"{kernel} advantages", expected_advantages, advantages)
    assert_close(f"{kernel} returns", expected_returns, returns)


@needs_native
@settings(max_examples=40, deadline=None)
@given(
    batch=ragged_batches(max_samples=6, max_length=40),
    combination=st.sampled_from(COMBINATIONS),
    seed=st.integers(0, 2**16),
)
def test_native_is_bitwise_the_reference(batch, combination, seed):
    fields, turn, bootstrap = split_fields(combination)
    data = variant_inputs(batch, seed, turn, bootstrap)
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    expected = compute_advantages(*batch.args(), spec=spec, kernel="reference", **data)
    got = compute_advantages(*batch.args(), spec=spec, kernel="native", **data)
    for name, want, have in zip(("advantages", "returns"), expected, got):
        for index, (a, b) in enumerate(zip(want, have)):
            assert_bitwise(f"{name} of sample {index}", a, b)


@needs_native
@pytest.mark.parametrize("combination", COMBINATIONS[-3:], ids=["turn-alpha-critic", "everything", "token-everything"])
def test_batch_invariance(combination):
    """Every sample's bits are the same alone, in any sub-batch and in any order."""
    fields, turn, bootstrap = split_fields(combination)
    batch = make_batch(3, [50, 0, 7, 300, 1, 64, 128, 9, 33], dtype=torch.float32)
    data = variant_inputs(batch, 5, turn, bootstrap)
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    whole = compute_advantages(*batch.args(), spec=spec, kernel="native", **data)
    order = [4, 8, 1, 3, 0]
    for indices in ([5], order, list(reversed(range(len(batch))))):
        part = batch.subset(indices)
        part_data = {key: [values[i] for i in indices] for key, values in data.items()}
        got = compute_advantages(*part.args(), spec=spec, kernel="native", **part_data)
        for position, index in enumerate(indices):
            assert_bitwise(f"advantages of sample {index}", whole[0][index], got[0][position])
            assert_bitwise(f"returns of sample {index}", whole[1][index], got[1][position])


@needs_native
def test_variants_that_change_nothing_give_the_plain_bits():
    """λ_critic = λ, every row not truncated and zero turn rewards: the plain kernel's bits."""
    batch = make_batch(9, [20, 0, 5, 77, 3], dtype=torch.float64)
    plain = compute_advantages(*batch.args(), spec=AdvantageSpec(batch.gamma, batch.lambd), kernel="native")
    spec = AdvantageSpec(batch.gamma, batch.lambd, lambd_critic=batch.lambd)
    same = compute_advantages(
        *batch.args(), spec=spec, kernel="native", truncated=[False] * 5, bootstrap_values=[1.0] * 5
    )
    for want, have in zip(plain, same):
        for a, b in zip(want, have):
            assert_bitwise("plain vs variant", a, b)


@needs_native
def test_packed_form_takes_flat_turn_rewards_and_turn_offsets():
    batch = make_batch(2, [12, 0, 30, 8], dtype=torch.float64)
    data = variant_inputs(batch, 1, True, True)
    spec = AdvantageSpec(batch.gamma, batch.lambd, timestep="turn", lambd_alpha=0.1)
    listed = compute_advantages(*batch.args(), spec=spec, **data)
    values, rewards, mask, offsets, terminal = batch.packed()
    turn_offsets = torch.tensor([0, *itertools.accumulate(len(turns) for turns in data["turn_rewards"])])
    flat = torch.tensor([x for turns in data["turn_rewards"] for x in turns], dtype=torch.float64)
    advantages, returns = compute_advantages_packed(
        values,
        rewards,
        mask,
        offsets,
        terminal,
        spec=spec,
        turn_rewards=flat,
        turn_offsets=turn_offsets,
        truncated=torch.tensor(data["truncated"]),
        bootstrap_values=torch.tensor(data["bootstrap_values"], dtype=torch.float64),
    )
    assert_bitwise("advantages", torch.cat(listed[0]), advantages)
    assert_bitwise("returns", torch.cat(listed[1]), returns)
    # the same inputs named by the spec and given as row_inputs
    named = AdvantageSpec(
        batch.gamma,
        batch.lambd,
        timestep="turn",
        lambd_alpha=0.1,
        turn_rewards="tr",
        truncated="t",
        bootstrap_values="b",
    )
    row_inputs = {"tr": data["turn_rewards"], "t": data["truncated"], "b": data["bootstrap_values"]}
    again = compute_advantages_packed(values, rewards, mask, offsets, terminal, spec=named, row_inputs=row_inputs)
    assert_bitwise("advantages by name", advantages, again[0])


@needs_native
def test_turn_mode_whitening_whitens_the_advantages_as_defined():
    batch = make_batch(4, [10, 20, 6], dtype=torch.float64)
    spec = AdvantageSpec(batch.gamma, batch.lambd, timestep="turn")
    raw, _ = compute_advantages(*batch.args(), spec=spec)
    whitened, _ = compute_advantages(
        *batch.args(), spec=AdvantageSpec(batch.gamma, batch.lambd, "masked", "all", None, timestep="turn")
    )
    trainable = torch.cat(batch.masks)
    flat = torch.cat(raw)[trainable]
    expected = (flat - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8)  # Bessel (docs/semantics.md)
    assert torch.allclose(torch.cat(whitened)[trainable], expected, atol=1e-12)


# ----------------------------------------------------------------------------- kernels and the spec


def test_only_reference_and_native_support_the_variants_and_auto_picks_one():
    spec = AdvantageSpec(0.9, 0.9, timestep="turn", lambd_critic=1.0)
    for name in ("vanilla", "chunked", "scan"):
        with pytest.raises(
            KernelUnavailableError, match=f"kernel '{name}' does not support lambd_critic, timestep:turn"
        ):
            resolve_kernel(name, "cpu", spec)
        assert issubclass(KernelUnavailableError, InvalidOptionError)
    assert resolve_kernel("auto", "cpu", spec) in ("native", "reference")
    assert "timestep:turn" in KERNELS["native"].supports and "timestep:turn" not in KERNELS["scan"].supports
    batch = make_batch(5, [4, 7])
    with pytest.raises(KernelUnavailableError):
        compute_advantages(*batch.args(), spec=spec, kernel="scan")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"lambd_alpha": -1.0}, "lambd_alpha must be > 0"),
        ({"lambd_alpha": float("nan")}, "lambd_alpha must be a finite number"),
        ({"lambd_critic": -0.1}, "lambd_critic must be in"),
        ({"truncated": "t"}, "truncated and bootstrap_values go together"),
        ({"bootstrap_values": "b"}, "truncated and bootstrap_values go together"),
        ({"turn_rewards": ""}, "turn_rewards names a per-row input"),
        ({"timestep": "turn", "semantics": "verl"}, "apply to the masked contract only"),
        ({"lambd_critic": 1.0, "estimator": "grpo"}, "estimator"),
    ],
)
def test_spec_refuses_bad_variant_fields(fields, message):
    with pytest.raises(InvalidOptionError, match=message):
        AdvantageSpec(0.9, 0.9, **fields)


def test_spec_records_every_variant_field_and_reads_its_inputs():
    spec = AdvantageSpec(
        0.9,
        0.8,
        timestep="turn",
        lambd_critic=1.0,
        lambd_alpha=0.05,
        turn_rewards="tr",
        truncated="t",
        bootstrap_values="b",
    )
    assert spec.to_dict()["lambd_alpha"] == 0.05 and spec.to_dict()["turn_rewards"] == "tr"
    assert spec.features == {
        "estimator:gae",
        "timestep:turn",
        "lambd_critic",
        "lambd_alpha",
        "turn_rewards",
        "truncated",
        "bootstrap_values",
    }
    assert [(i.name, i.role, i.kind) for i in spec.row_inputs] == [
        ("tr", "turn_rewards", "list"),
        ("t", "truncated", "scalar"),
        ("b", "bootstrap_values", "scalar"),
    ]
    assert AdvantageSpec(0.9, 0.8).variants == ()


# ----------------------------------------------------------------------------- invalid per-row inputs


@pytest.mark.parametrize(
    "data, message",
    [
        ({"turn_rewards": [[1.0]]}, "sample 0: turn_rewards has 1 values, the sample has 2 turns"),
        ({"turn_rewards": [[1.0, 2.0, 3.0]]}, "sample 0: turn_rewards has 3 values, the sample has 2 turns"),
        ({"turn_rewards": [[1.0, float("nan")]]}, "sample 0: turn_rewards is nan at turn 1"),
        ({"turn_rewards": [None]}, "sample 0: turn_rewards is None"),
        ({"truncated": [True], "bootstrap_values": [float("inf")]}, "sample 0: truncated, but bootstrap_values is inf"),
        ({"truncated": [2], "bootstrap_values": [1.0]}, "sample 0: truncated is 2.0, not a flag"),
        ({"truncated": [True, False], "bootstrap_values": [1.0, 1.0]}, "truncated must hold one value per sample"),
    ],
)
def test_invalid_per_row_inputs_name_the_sample(data, message):
    with pytest.raises(GAEInputError, match=message.replace("(", r"\(")):
        run_one(EXAMPLE, AdvantageSpec(0.5, 1.0), **data)


def test_the_row_checks_find_bad_turn_lists_and_bootstraps():
    schema = pa.schema(
        [
            ("values", pa.list_(pa.float32())),
            ("rewards", pa.list_(pa.float32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("terminal_reward", pa.float64()),
            ("turns", pa.list_(pa.float64())),
            ("truncated", pa.bool_()),
            ("bootstrap", pa.float64()),
        ]
    )
    good = {
        "values": [1.0, 2.0, 3.0],
        "rewards": [0.0, 0.0, 0.0],
        "loss_mask": [1, 0, 1],
        "terminal_reward": 1.0,
        "turns": [0.5, 0.5],
        "truncated": True,
        "bootstrap": 1.0,
    }
    rows = [
        good,
        {**good, "turns": [0.5]},
        {**good, "turns": None},
        {**good, "turns": [0.5, None]},
        {**good, "turns": [0.5, float("inf")]},
        {**good, "truncated": None},
        {**good, "bootstrap": None},
        {**good, "bootstrap": float("nan")},
        {**good, "truncated": False, "bootstrap": None},
        {**good, "loss_mask": [0, 0, 0], "turns": []},
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    spec = AdvantageSpec(0.9, 0.9, turn_rewards="turns", truncated="truncated", bootstrap_values="bootstrap")
    check = check_batch(batch, Columns(), "f.parquet", 100, row_inputs=spec.row_inputs)
    assert [(f.row, f.column, f.code) for f in check.findings] == [
        (101, "turns", "turn-rewards-length"),
        (102, "turns", "turn-rewards-null"),
        (103, "turns", "turn-rewards-null"),
        (104, "turns", "turn-rewards-non-finite"),
        (105, "truncated", "truncated-null"),
        (106, "bootstrap", "bootstrap-invalid"),
        (107, "bootstrap", "bootstrap-invalid"),
    ]
    assert check.invalid.tolist() == [False] + [True] * 7 + [False, False]
    assert check.findings[0].line() == (
        "f.parquet, row 101, column 'turns': 'turns' has 1 rewards, the row has 2 turns [turn-rewards-length]"
    )



@pytest.mark.parametrize("flag_type", [pa.int8(), pa.int64()], ids=["int8", "int64"])
def test_an_integer_truncated_flag_other_than_0_or_1_is_invalid(flag_type):
    # the API refuses such a flag (a GAEInputError); a column holding one is invalid data
    schema = pa.schema([("values", pa.list_(pa.float64())), ("rewards", pa.list_(pa.float64())),
                        ("loss_mask", pa.list_(pa.int8())), ("terminal_reward", pa.float64()),
                        ("cut", flag_type), ("boot", pa.float64())])  # fmt: skip
    good = {"values": [1.0, 2.0], "rewards": [0.0, 0.5], "loss_mask": [1, 1], "terminal_reward": 1.0}
    flags = [0, 1, 2, -1, None, 1]
    rows = [{**good, "cut": flag, "boot": 1.0} for flag in flags]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    spec = AdvantageSpec(0.9, 0.9, truncated="cut", bootstrap_values="boot")
    check = check_batch(batch, Columns(), "f.parquet", 10, row_inputs=spec.row_inputs)
    assert [(f.row, f.column, f.code) for f in check.findings] == [
        (12, "cut", "truncated-value"),
        (13, "cut", "truncated-value"),
        (14, "cut", "truncated-null"),
    ]
    line = "f.parquet, row 12, column 'cut': the truncated flag is 2, not 0 or 1 [truncated-value]"
    assert check.findings[0].line() == line
    assert check.invalid.tolist() == [False, False, True, True, True, False]

def test_the_truncation_rules_read_numpy_and_tensors_alike():
    """One home for the truncation's row rules (the commands', the API's on the host and on a
    device): a flag neither 0 nor 1, a truncated row without a finite bootstrap value."""
    from gaecli.advantages.faults import not_flags, truncated_without_bootstrap

    flags = np.array([0, 1, 2, -1, 1, 0.5])
    boots = np.array([np.nan, 1.0, 0.0, 0.0, np.inf, 2.0])
    assert not_flags(flags).tolist() == [False, False, True, True, False, True]
    assert not_flags(torch.tensor(flags)).tolist() == not_flags(flags).tolist()
    truncated = flags == 1
    assert truncated_without_bootstrap(truncated, boots).tolist() == [False, False, False, False, True, False]
    assert truncated_without_bootstrap(torch.tensor(truncated), torch.tensor(boots)).tolist() == [
        False, False, False, False, True, False
    ]  # fmt: skip


def test_turn_table_numpy_and_torch_agree():
    mask = np.array([1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1], dtype=bool)
    offsets = np.array([0, 4, 4, 7, 11])
    starts, ends, turn_offsets = turn_table(mask, offsets)
    # sample 0: [0, 2), [3, 4); sample 1 empty; sample 2 (4..6): [6, 7); sample 3 (7..10): [7, 9), [10, 11)
    assert starts.tolist() == [0, 3, 6, 7, 10] and ends.tolist() == [2, 4, 7, 9, 11]
    assert turn_offsets.tolist() == [0, 2, 2, 3, 5]
    torch_parts = turn_table(torch.from_numpy(mask), torch.from_numpy(offsets))
    assert [part.tolist() for part in torch_parts] == [starts.tolist(), ends.tolist(), turn_offsets.tolist()]
    integer_parts = turn_table(mask.astype(np.uint8), offsets)  # a 0/1 mask reads as its truth
    assert [part.tolist() for part in integer_parts] == [starts.tolist(), ends.tolist(), turn_offsets.tolist()]


def _turns_by_loop(mask, offsets):
    """The turn table by a Python walk over each sample's tokens."""
    starts, ends, counts = [], [], [0]
    for row in range(len(offsets) - 1):
        for t in range(offsets[row], offsets[row + 1]):
            if mask[t] and (t == offsets[row] or not mask[t - 1]):
                starts.append(t)
            if mask[t] and (t == offsets[row + 1] - 1 or not mask[t + 1]):
                ends.append(t + 1)
        counts.append(len(starts))
    return starts, ends, counts


def test_turn_table_matches_a_loop_on_random_batches():
    # Runs cut by sample boundaries, empty samples, masks all trainable or all masked.
    rng = np.random.default_rng(7)
    for _ in range(500):
        total = int(rng.integers(0, 30))
        mask = rng.random(total) < rng.choice([0.0, 0.3, 0.8, 1.0])
        cuts = np.sort(rng.integers(0, total + 1, int(rng.integers(0, 6))))
        offsets = np.concatenate(([0], cuts, [total])).astype(np.int64)
        starts, ends, turn_offsets = turn_table(mask, offsets)
        assert (starts.tolist(), ends.tolist(), turn_offsets.tolist()) == _turns_by_loop(mask, offsets)
        assert starts.dtype == ends.dtype == turn_offsets.dtype == np.int64


@needs_native
def test_the_dispatch_takes_numpy_row_inputs():
    values = np.array([1.0, 2.0, 3.0, 4.0])
    rewards = np.array([0.5, 1.0, 0.25, 2.0])
    trainable = np.array([True, False, True, False])
    offsets = np.array([0, 4])
    spec = AdvantageSpec(0.5, 1.0, timestep="turn", turn_rewards="tr")
    row_inputs = {"tr": (np.array([1.0, 2.0]), np.array([0, 2]))}
    advantages, returns = compute(spec, values, rewards, trainable, offsets, np.array([8.0]), row_inputs=row_inputs)
    assert advantages.tolist() == [5.5, 0, 7.25, 0] and returns.tolist() == [6, 0, 10, 0]
    with pytest.raises(GAEInputError, match="spec reads per-row input 'tr'"):
        compute(spec, values, rewards, trainable, offsets, np.array([8.0]))
