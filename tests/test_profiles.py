"""The trainer profiles (``verl``, ``openrlhf``, ``slime``, ``roll``, ``areal``, ``nemo-rl``, ``skyrl``):
the worked example of docs/semantics.md under every profile, the trainers' own loops
(tests/helpers.py) at every position on random agentic batches for every kernel on the
torch and the numpy path, the aliases, the names of a baseline list, recompute's
``--baseline``, and what each profile loses of the terminal reward."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gaecli
from gaecli.advantages import AdvantageSpec
from gaecli.advantages.baselines import lost_terminal_abs_sum, lost_terminal_samples
from gaecli.advantages.contract import ALIASES, BASELINES, PROFILES, expand_baselines, profile_of
from gaecli.advantages.dispatch import compute, gae_flat
from gaecli.errors import InvalidOptionError
from gaecli.recompute import RecomputeOptions, recompute_files

from helpers import (
    FAST_KERNEL_NAMES,
    KERNEL_NAMES,
    ORACLES,
    Batch,
    assert_bitwise,
    assert_close,
    make_batch,
    oracle_batch,
    ragged_batches,
)
from rollout_files import random_rollouts, rollout_table, rollouts_from_table, worked_example_in_a_process, write_table

# The worked example of docs/semantics.md: R = 4, mask [1, 0, 1, 0], V = [1, 2, 3, 4],
# r = [0.5, 1, 0.25, 2], z = 8, γ = 0.5, λ = 1 (γλ = 0.5); and a fully masked sample R = 2,
# V = [1, 2], r = [0.5, 0.25], z = 4. Every number is dyadic, so every kernel gets them exactly.
WORKED_EXPECTED = {
    # verl: z on token 3, masked, so lost. Trainable tokens: the contract without z:
    #   A2 = 0.25 + 0.5·0 − 3 = −2.75;  A0 = (0.5 + 0.5·3 − 1) + 0.5·(−2.75) = −0.375.
    # Masked tokens hold the carry: token 3 (after the last trainable) 0, token 1 A2 = −2.75.
    # returns = A + V everywhere. Fully masked: A = 0, returns = V.
    "verl": (([-0.375, -2.75, -2.75, 0.0], [0.625, -0.75, 0.25, 4.0]), ([0.0, 0.0], [1.0, 2.0])),
    # areal: verl's loop (no row truncated: no bootstrap value): the same numbers.
    "areal": (([-0.375, -2.75, -2.75, 0.0], [0.625, -0.75, 0.25, 4.0]), ([0.0, 0.0], [1.0, 2.0])),
    # openrlhf: Ṽ = [1, 0, 3, 0], r̃ = [0.5, 0, 8.25, 0] (z on token 2), plain GAE:
    #   A3 = 0;  A2 = 8.25 − 3 = 5.25;  A1 = 0.5·3 + 0.5·5.25 = 4.125;
    #   A0 = (0.5 − 1) + 0.5·4.125 = 1.5625;  returns = A + Ṽ. Fully masked: zeros.
    "openrlhf": (([1.5625, 4.125, 5.25, 0.0], [2.5625, 4.125, 8.25, 0.0]), ([0.0, 0.0], [0.0, 0.0])),
    # slime: r = [0.5, 1, 0.25, 10] (z on token 3), plain GAE, returns = A + V:
    #   A3 = 10 − 4 = 6;  A2 = (0.25 + 2 − 3) + 3 = 2.25;  A1 = (1 + 1.5 − 2) + 1.125 = 1.625;
    #   A0 = (0.5 + 1 − 1) + 0.8125 = 1.3125.
    # Fully masked: r = [0.5, 4.25]: A1 = 2.25, A0 = (0.5 + 1 − 1) + 1.125 = 1.625.
    "slime": (([1.3125, 1.625, 2.25, 6.0], [2.3125, 3.625, 5.25, 10.0]), ([1.625, 2.25], [2.625, 4.25])),
    # skyrl: the same loop over every column of the response (its left padding comes before the
    # response, so it changes nothing here): slime's numbers.
    "skyrl": (([1.3125, 1.625, 2.25, 6.0], [2.3125, 3.625, 5.25, 10.0]), ([1.625, 2.25], [2.625, 4.25])),
    # roll: r̃ = m·(r + z on token 3) = [0.5, 0, 0.25, 0], V unmasked, plain GAE:
    #   A3 = 0 − 4 = −4;  A2 = (0.25 + 2 − 3) + 0.5·(−4) = −2.75;
    #   A1 = (0 + 1.5 − 2) + 0.5·(−2.75) = −1.875;  A0 = (0.5 + 1 − 1) + 0.5·(−1.875) = −0.4375;
    #   returns = A + V = [0.5625, 0.125, 0.25, 0];  advantages = A·m.
    # Fully masked: r̃ = 0: A1 = −2, A0 = (1 − 1) + 0.5·(−2) = −1; returns = A + V = [0, 0].
    "roll": (([-0.4375, 0.0, -2.75, 0.0], [0.5625, 0.125, 0.25, 0.0]), ([0.0, 0.0], [0.0, 0.0])),
    # nemo-rl: z on token 2 (the last trainable), skip recursion = the contract at trainable
    #   tokens: A2 = 5.25, A0 = 3.625; advantages 0 at masked tokens; returns = carry + V there:
    #   token 1: 5.25 + 2 = 7.25, token 3: 0 + 4 = 4. Fully masked: A = 0, returns = V.
    "nemo-rl": (([3.625, 0.0, 5.25, 0.0], [4.625, 7.25, 8.25, 4.0]), ([0.0, 0.0], [1.0, 2.0])),
    # masked, the contract: equal to nemo-rl at trainable tokens, 0 at masked ones.
    "masked": (([3.625, 0.0, 5.25, 0.0], [4.625, 0.0, 8.25, 0.0]), ([0.0, 0.0], [0.0, 0.0])),
}
NAMES = ["masked", *BASELINES]  # every semantics; an alias takes its profile's numbers


def worked_batch(dtype: torch.dtype) -> Batch:
    as_tensor = lambda xs: torch.tensor(xs, dtype=dtype)  # noqa: E731
    return Batch(
        [as_tensor([1.0, 2.0, 3.0, 4.0]), as_tensor([1.0, 2.0])],
        [as_tensor([0.5, 1.0, 0.25, 2.0]), as_tensor([0.5, 0.25])],
        [torch.tensor([True, False, True, False]), torch.tensor([False, False])],
        [8.0, 4.0],
        0.5,
        1.0,
        dtype,
    )


def listed(semantics: str, batch: Batch, kernel: str):
    return gaecli.baseline_gae(*batch.args(), gamma=batch.gamma, lambd=batch.lambd, semantics=semantics, kernel=kernel)


def on_numpy(semantics: str, batch: Batch, kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The commands' route: the dispatch on numpy buffers (terminal rewards in the values'
    dtype), back as tensors."""
    values, rewards, mask, offsets, terminals = (t.numpy() for t in batch.packed())
    spec = AdvantageSpec(batch.gamma, batch.lambd, semantics)
    advantages, returns = compute(spec, values, rewards, mask, offsets, terminals.astype(values.dtype), kernel=kernel)
    assert isinstance(advantages, np.ndarray) and isinstance(returns, np.ndarray)
    return torch.from_numpy(advantages), torch.from_numpy(returns)


def split(flat: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    return list(torch.split(flat, [v.numel() for v in batch.values]))


# ----------------------------------------------------------------------------- names


def test_the_seven_profiles_and_their_aliases():
    assert PROFILES == ("verl", "openrlhf", "slime", "roll", "areal", "nemo-rl", "skyrl")
    assert ALIASES == {"unmasked": "slime", "zero-masked": "openrlhf", "skip-masked": "verl"}
    assert set(BASELINES) == set(PROFILES) | set(ALIASES)
    assert [profile_of(name) for name in ("unmasked", "zero-masked", "skip-masked", "roll", "masked")] == [
        "slime",
        "openrlhf",
        "verl",
        "roll",
        "masked",
    ]
    for name in NAMES:
        assert AdvantageSpec(0.9, 0.95, name).semantics == name
    assert set(gaecli.BASELINES) == set(BASELINES)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("all", PROFILES),
        ("verl", ("verl",)),
        ("openrlhf,verl", ("openrlhf", "verl")),
        (" slime , nemo-rl ", ("slime", "nemo-rl")),
        ("unmasked,skip-masked,zero-masked", ("unmasked", "skip-masked", "zero-masked")),
        ("skip-masked,openrlhf", ("skip-masked", "openrlhf")),
    ],
)
def test_a_baseline_list_expands(text, expected):
    assert expand_baselines(text) == expected


def test_masked_is_an_old_side_of_its_own_and_not_in_all():
    # the plain contract, the old side of a diff of the GAE variants (docs/variants.md)
    assert expand_baselines("masked,verl") == ("masked", "verl")
    assert "masked" not in expand_baselines("all")


@pytest.mark.parametrize(
    "text, message",
    [
        ("unmasked,slime", "'unmasked' and 'slime', which name the same profile"),
        ("verl,skip-masked", "'verl' and 'skip-masked'"),
        ("all,zero-masked", "'openrlhf' and 'zero-masked'"),
        ("roll,roll", "'roll' twice"),
        ("all,all", "twice"),
        ("verl,half-masked", "unknown baseline 'half-masked'"),
        ("masked,masked", "'masked' twice"),
        ("verl,,slime", "empty name"),
        ("", "empty name"),
    ],
)
def test_a_bad_baseline_list_is_refused(text, message):
    with pytest.raises(InvalidOptionError, match=message) as raised:
        expand_baselines(text)
    assert str(raised.value).startswith("--baseline: ")


def test_an_unknown_semantics_is_refused_everywhere():
    batch = make_batch(3, [4])
    with pytest.raises(InvalidOptionError, match="unknown semantics 'trl'"):
        AdvantageSpec(0.9, 0.95, "trl")
    with pytest.raises(gaecli.GAEInputError, match="unknown semantics 'all'"):
        listed("all", batch, "auto")
    with pytest.raises(InvalidOptionError, match="unknown semantics 'trl'"):
        lost_terminal_samples("trl", np.ones(2, bool), np.array([0, 2]), np.zeros(1), gamma=1.0, lambd=1.0)


# ----------------------------------------------------------------------------- the worked example


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("semantics", NAMES)
def test_worked_example_on_the_torch_path(semantics, kernel, dtype):
    advantages, returns = listed(semantics, worked_batch(dtype), kernel)
    for sample, (expected_advantages, expected_returns) in enumerate(WORKED_EXPECTED[profile_of(semantics)]):
        label = f"{semantics} {kernel} sample {sample}"
        assert_bitwise(f"{label} advantages", torch.tensor(expected_advantages, dtype=dtype), advantages[sample])
        assert_bitwise(f"{label} returns", torch.tensor(expected_returns, dtype=dtype), returns[sample])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", FAST_KERNEL_NAMES)
@pytest.mark.parametrize("semantics", NAMES)
def test_worked_example_on_the_numpy_path(semantics, kernel, dtype):
    batch = worked_batch(dtype)
    advantages, returns = on_numpy(semantics, batch, kernel)
    expected = WORKED_EXPECTED[profile_of(semantics)]
    expected_advantages = torch.tensor([*expected[0][0], *expected[1][0]], dtype=dtype)
    expected_returns = torch.tensor([*expected[0][1], *expected[1][1]], dtype=dtype)
    assert_bitwise(f"{semantics} {kernel} advantages", expected_advantages, advantages)
    assert_bitwise(f"{semantics} {kernel} returns", expected_returns, returns)


@pytest.mark.parametrize("semantics", NAMES)
def test_worked_example_through_the_trainers_loops(semantics):
    # The oracles themselves give the hand-worked numbers (they are what the tests trust).
    advantages, returns = oracle_batch(semantics, worked_batch(torch.float64))
    for sample, (expected_advantages, expected_returns) in enumerate(WORKED_EXPECTED[profile_of(semantics)]):
        assert advantages[sample].tolist() == expected_advantages
        assert returns[sample].tolist() == expected_returns


# ----------------------------------------------------------------------------- the trainers' loops


@pytest.mark.parametrize("kernel", FAST_KERNEL_NAMES)
@pytest.mark.parametrize("profile", PROFILES)
@given(batch=ragged_batches())
def test_every_kernel_reproduces_the_trainers_loop(profile, kernel, batch):
    # Every position, masked ones included, on both paths: the torch API and the numpy dispatch.
    expected_advantages, expected_returns = oracle_batch(profile, batch)
    advantages, returns = listed(profile, batch, kernel)
    assert_close(f"{profile} {kernel} advantages", expected_advantages, advantages)
    assert_close(f"{profile} {kernel} returns", expected_returns, returns)
    numpy_advantages, numpy_returns = on_numpy(profile, batch, kernel)
    # numpy and torch: the same bits for the same kernel.
    for index, (a, r) in enumerate(zip(split(numpy_advantages, batch), split(numpy_returns, batch))):
        assert_bitwise(f"{profile} {kernel} numpy advantages sample {index}", advantages[index], a)
        assert_bitwise(f"{profile} {kernel} numpy returns sample {index}", returns[index], r)


@pytest.mark.parametrize("profile", PROFILES)
@given(batch=ragged_batches(dtype=torch.float64))
def test_the_reference_kernel_reproduces_the_trainers_loop(profile, batch):
    advantages, returns = listed(profile, batch, "reference")
    expected_advantages, expected_returns = oracle_batch(profile, batch)
    assert_close(f"{profile} advantages", expected_advantages, advantages)
    assert_close(f"{profile} returns", expected_returns, returns)


@pytest.mark.parametrize("profile", PROFILES)
def test_long_agentic_samples(profile):
    # Many turns (masked observation blocks), masked tails and heads, fully masked rows.
    batch = make_batch(
        7,
        [300, 517, 1, 0, 64, 1000],
        ["blocks", "blocks", "zeros", "zeros", "masked-tail", "random"],
        gamma=0.999,
        lambd=0.97,
        dtype=torch.float64,
    )
    expected_advantages, expected_returns = oracle_batch(profile, batch)
    for kernel in FAST_KERNEL_NAMES:
        advantages, returns = listed(profile, batch, kernel)
        assert_close(f"{profile} {kernel} advantages", expected_advantages, advantages)
        assert_close(f"{profile} {kernel} returns", expected_returns, returns)


def test_the_profiles_differ_where_the_table_says():
    # One agentic batch: where two profiles must agree they agree bitwise, and each pair the
    # table tells apart is told apart somewhere.
    batch = make_batch(11, [40, 33, 25, 9], ["blocks", "masked-tail", "random", "zeros"], dtype=torch.float64)
    out = {name: listed(name, batch, "reference") for name in ("masked", *PROFILES)}
    cat = lambda name, which: torch.cat(out[name][which])  # noqa: E731
    mask = torch.cat(batch.masks)
    assert_bitwise("areal = verl", cat("verl", 0), cat("areal", 0))
    assert_bitwise("areal = verl returns", cat("verl", 1), cat("areal", 1))
    assert_bitwise("nemo-rl = masked at trainable tokens", cat("masked", 0), cat("nemo-rl", 0))
    assert torch.equal(cat("masked", 1)[mask], cat("nemo-rl", 1)[mask])
    for name in ("roll", "nemo-rl", "masked"):
        assert (cat(name, 0)[~mask] == 0).all(), name
    for first, second in (("verl", "nemo-rl"), ("verl", "slime"), ("openrlhf", "roll"), ("slime", "roll")):
        assert not torch.equal(cat(first, 0), cat(second, 0)), (first, second)


@pytest.mark.parametrize("alias, profile", sorted(ALIASES.items()))
@pytest.mark.parametrize("kernel", FAST_KERNEL_NAMES)
def test_an_alias_is_its_profile_bitwise(alias, profile, kernel):
    batch = make_batch(13, [0, 17, 50, 3, 29], dtype=torch.float32)
    for function in (listed, on_numpy):
        got, expected = function(alias, batch, kernel), function(profile, batch, kernel)
        for which in range(2):
            got_flat = torch.cat(got[which]) if isinstance(got[which], list) else got[which]
            expected_flat = torch.cat(expected[which]) if isinstance(expected[which], list) else expected[which]
            assert_bitwise(f"{alias} = {profile} ({function.__name__}, output {which})", expected_flat, got_flat)


@pytest.mark.parametrize("profile", PROFILES)
def test_gae_flat_takes_the_profiles(profile):
    batch = worked_batch(torch.float64)
    values, rewards, mask, offsets, terminals = (t.numpy() for t in batch.packed())
    advantages, returns = gae_flat(values, rewards, mask, offsets, terminals, gamma=0.5, lambd=1.0, semantics=profile)
    expected = WORKED_EXPECTED[profile]
    assert advantages.tolist() == [*expected[0][0], *expected[1][0]]
    assert returns.tolist() == [*expected[0][1], *expected[1][1]]


# ----------------------------------------------------------------------------- what each profile loses


def lost_by_rules(semantics: str, batch: Batch) -> list[bool]:
    """Whether each sample's z reaches no trainable token, by the rules of
    docs/semantics.md#what-each-profile-loses, one sample at a time."""
    profile = profile_of(semantics)
    lost = []
    for mask, terminal in zip(batch.masks, batch.terminals):
        flags = [bool(m) for m in mask.tolist()]
        if not flags:
            lost.append(terminal != 0.0)
        elif profile in ("verl", "areal", "roll"):
            lost.append(not flags[-1])
        elif profile in ("masked", "openrlhf", "nemo-rl"):
            lost.append(not any(flags))
        else:  # slime, skyrl
            lost.append(not any(flags) or (not flags[-1] and batch.gamma * batch.lambd == 0.0))
    return lost


@pytest.mark.parametrize("semantics", NAMES)
@given(batch=ragged_batches(), on_torch=st.booleans())
def test_lost_terminal_samples_match_the_rules(semantics, batch, on_torch):
    _, _, mask, offsets, terminals = batch.packed()
    arrays = (mask, offsets, terminals) if on_torch else (mask.numpy(), offsets.numpy(), terminals.numpy())
    lost = lost_terminal_samples(semantics, *arrays, gamma=batch.gamma, lambd=batch.lambd)
    assert isinstance(lost, torch.Tensor if on_torch else np.ndarray)
    expected = lost_by_rules(semantics, batch)
    assert [bool(x) for x in lost.tolist()] == expected
    total = lost_terminal_abs_sum(semantics, *arrays, gamma=batch.gamma, lambd=batch.lambd)
    assert total == math.fsum(abs(z) for z, gone in zip(batch.terminals, expected) if gone)


@pytest.mark.parametrize("semantics", NAMES)
@pytest.mark.parametrize("gamma, lambd", [(0.5, 1.0), (1.0, 0.0), (0.0, 1.0), (0.9, 0.95)])
def test_lost_terminal_samples_are_where_z_moves_no_trainable_advantage(semantics, gamma, lambd):
    # Independent of the rules: with V = r = 0 and z = 1 a trainable advantage is non-zero
    # exactly when z reaches it (the trainers' loops of tests/helpers.py).
    lengths = [0, 1, 1, 2, 5, 9, 12, 30, 7, 3]
    batch = make_batch(
        17,
        lengths,
        ["ones", "ones", "zeros", "masked-head", "masked-tail", "blocks", "random", "blocks", "zeros", "masked-tail"],
        gamma=gamma,
        lambd=lambd,
        dtype=torch.float64,
    )
    batch.values = [torch.zeros_like(v) for v in batch.values]
    batch.rewards = [torch.zeros_like(r) for r in batch.rewards]
    batch.terminals = [1.0] * len(lengths)
    advantages, _ = oracle_batch(semantics, batch)
    _, _, mask, offsets, terminals = batch.packed()
    lost = lost_terminal_samples(semantics, mask.numpy(), offsets.numpy(), terminals.numpy(), gamma=gamma, lambd=lambd)
    for index, (sample_advantages, sample_mask) in enumerate(zip(advantages, batch.masks)):
        if sample_mask.numel() == 0:
            assert lost[index]  # z = 1 on an empty sample
            continue
        reached = bool((sample_advantages[sample_mask] != 0).any())
        assert bool(lost[index]) == (not reached), (semantics, index, batch.kinds[index], sample_mask.tolist())
    assert lost_terminal_abs_sum(
        semantics, mask.numpy(), offsets.numpy(), terminals.numpy(), gamma=gamma, lambd=lambd
    ) == float(lost.sum())


def test_lost_terminal_on_the_worked_example():
    batch = worked_batch(torch.float64)
    _, _, mask, offsets, terminals = (t.numpy() for t in batch.packed())
    got = {
        name: lost_terminal_samples(name, mask, offsets, terminals, gamma=0.5, lambd=1.0).tolist()
        for name in ("masked", *PROFILES)
    }
    # Token 3 is masked: verl, areal and roll lose z = 8 (slime carries it back with γλ = 0.5);
    # the fully masked sample's z = 4 has no trainable token to reach under any profile.
    assert got == {
        "masked": [False, True],
        "verl": [True, True],
        "openrlhf": [False, True],
        "slime": [False, True],
        "roll": [True, True],
        "areal": [True, True],
        "nemo-rl": [False, True],
        "skyrl": [False, True],
    }
    assert lost_terminal_abs_sum("verl", mask, offsets, terminals, gamma=0.5, lambd=1.0) == 12.0
    assert lost_terminal_abs_sum("nemo-rl", mask, offsets, terminals, gamma=0.5, lambd=1.0) == 4.0
    assert lost_terminal_abs_sum("slime", mask, offsets, terminals, gamma=0.5, lambd=0.0) == 12.0


# ----------------------------------------------------------------------------- recompute's baseline


@pytest.mark.parametrize("baseline", ["nemo-rl", "roll", "skip-masked"])
def test_recompute_keeps_a_profile_as_columns(tmp_path, baseline):
    rollouts = random_rollouts(23, seed=5)
    source = write_table(rollout_table(rollouts), tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    recompute_files([source], target, RecomputeOptions(gamma=0.9, lambd=0.8, keep_baseline=True, baseline=baseline))
    suffix = baseline.replace("-", "_")
    output = pq.read_table(target)
    assert output.column_names[-2:] == [f"advantages_{suffix}", f"returns_{suffix}"]
    assert pq.read_schema(target).metadata[b"gaecli.baseline"] == baseline.encode()
    data = rollouts_from_table(pq.read_table(source))
    for row in range(len(data)):
        expected = ORACLES[baseline](data.values[row], data.rewards[row], data.masks[row], data.terminal[row], 0.9, 0.8)
        for column, values in zip((f"advantages_{suffix}", f"returns_{suffix}"), expected):
            got = output.column(column)[row].as_py()
            assert np.allclose(got, values, rtol=0, atol=2e-5 * (1 + max(map(abs, values), default=0.0))), (column, row)


@pytest.mark.parametrize(
    "baseline, message",
    [
        ("all", "names several baselines"),
        ("verl,slime", "names several baselines"),
        ("unmasked,slime", "which name the same profile"),
        ("hf", "unknown baseline 'hf'"),
    ],
)
def test_recompute_refuses_a_list_or_an_unknown_baseline(baseline, message):
    with pytest.raises(InvalidOptionError, match=message):
        RecomputeOptions(gamma=0.9, lambd=0.8, keep_baseline=True, baseline=baseline)


@pytest.mark.skipif("native" not in gaecli.available_kernels(), reason="needs numba")
def test_the_numpy_path_of_every_profile_never_imports_torch():
    results, torch_loaded = worked_example_in_a_process(PROFILES)
    assert not torch_loaded and list(results) == list(PROFILES)
    for profile in PROFILES:
        (expected_advantages, expected_returns), _ = WORKED_EXPECTED[profile]
        lost = 8.0 if profile in ("verl", "roll", "areal") else 0.0
        assert str(results[profile]) == str([expected_advantages, expected_returns, lost]), profile
