"""AReaL's no-EOS bootstrap in gaecli's ``areal`` profile (the truncation bootstrap,
docs/semantics.md#the-trainer-profiles): ``baseline_gae(_packed)`` with ``truncated`` and
``bootstrap_values`` on every kernel that computes it, on the torch and the numpy path, and the
commands (``gae recompute --keep-baseline``, ``gae diff --baseline areal``), held at every
position against AReaL's own loop written out in tests/trainer_loops_more.py (a dump's row laid
out as AReaL's padded row); every other profile refuses the bootstrap."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from trainer_loops_more import areal_dump_row

import gaecli
from gaecli.advantages import AdvantageSpec
from gaecli.advantages.contract import PROFILES
from gaecli.advantages.dispatch import compute
from gaecli.advantages.kernels import KERNELS
from gaecli.errors import InvalidOptionError

from helpers import KERNEL_NAMES, Batch, assert_bitwise, assert_close, make_batch, variant_oracle
from rollout_files import TOLERANCE, assert_rows_close, gae, random_rollouts, rollout_table, write_table

TRUNCATION = {"truncated": "truncated", "bootstrap_values": "bootstrap_values"}
SPEC = AdvantageSpec(0.5, 1.0, "areal", **TRUNCATION)
BOOTSTRAP_KERNELS = [name for name in KERNEL_NAMES if not KERNELS[name].missing(SPEC)]

# The worked example of docs/semantics.md (R = 4, mask [1, 0, 1, 0], V = [1, 2, 3, 4],
# r = [0.5, 1, 0.25, 2], z = 8, γ = 0.5, λ = 1), truncated with bootstrap 2: z sits on the
# masked token 3 and is lost, as without the bootstrap; the value after token 2 is 2:
#   A2 = 0.25 + 0.5·2 − 3 = −1.75;  A0 = (0.5 + 0.5·3 − 1) + 0.5·(−1.75) = 0.125;
#   token 1 holds the carry A2, token 3 (after the last step) 0; returns = A + V.
# The same row ending trainable (mask [1, 0, 1, 1]): z on token 3 and the bootstrap after it:
#   A3 = 2 + 8 + 0.5·2 − 4 = 7;  A2 = (0.25 + 0.5·4 − 3) + 0.5·7 = 2.75;  A0 = 1 + 0.5·2.75 = 2.375.
# A fully masked truncated row: A = 0, returns = V (the bootstrap is read by no step). The
# example not truncated (its bootstrap value NaN, not read): the profile's numbers without it.
# An empty truncated row owns nothing. Every number is dyadic: every kernel gets them exactly.
WORKED = [
    ([1.0, 2.0, 3.0, 4.0], [0.5, 1.0, 0.25, 2.0], [1, 0, 1, 0], 8.0, True, 2.0),
    ([1.0, 2.0, 3.0, 4.0], [0.5, 1.0, 0.25, 2.0], [1, 0, 1, 1], 8.0, True, 2.0),
    ([1.0, 2.0], [0.5, 0.25], [0, 0], 4.0, True, 5.0),
    ([1.0, 2.0, 3.0, 4.0], [0.5, 1.0, 0.25, 2.0], [1, 0, 1, 0], 8.0, False, float("nan")),
    ([], [], [], 1.0, True, 3.0),
]
WORKED_EXPECTED = [
    ([0.125, -1.75, -1.75, 0.0], [1.125, 0.25, 1.25, 4.0]),
    ([2.375, 2.75, 2.75, 7.0], [3.375, 4.75, 5.75, 11.0]),
    ([0.0, 0.0], [1.0, 2.0]),
    ([-0.375, -2.75, -2.75, 0.0], [0.625, -0.75, 0.25, 4.0]),
    ([], []),
]


def worked_batch(dtype: torch.dtype) -> tuple[Batch, list[bool], list[float]]:
    tensor = lambda xs: torch.tensor(xs, dtype=dtype)  # noqa: E731
    batch = Batch(
        [tensor(v) for v, *_ in WORKED],
        [tensor(r) for _, r, *_ in WORKED],
        [torch.tensor(m, dtype=torch.bool) for _, _, m, *_ in WORKED],
        [row[3] for row in WORKED],
        0.5,
        1.0,
        dtype,
    )
    return batch, [row[4] for row in WORKED], [row[5] for row in WORKED]


def loop_batch(batch: Batch, flags, boots) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """AReaL's loop on every row, as float64 tensors."""
    advantages, returns = [], []
    for values, rewards, mask, terminal, flag, boot in zip(*batch.args(), flags, boots):
        row = areal_dump_row(values.double().tolist(), rewards.double().tolist(), mask.tolist(), terminal, flag, boot,
                             batch.gamma, batch.lambd)  # fmt: skip
        advantages.append(torch.tensor(row[0], dtype=torch.float64))
        returns.append(torch.tensor(row[1], dtype=torch.float64))
    return advantages, returns


def on_numpy(batch: Batch, flags, boots, kernel: str, semantics: str = "areal"):
    """The commands' route: the dispatch on numpy buffers, the flags and bootstrap values as
    the per-row inputs the spec names."""
    values, rewards, mask, offsets, terminals = (t.numpy() for t in batch.packed())
    spec = AdvantageSpec(batch.gamma, batch.lambd, semantics, **TRUNCATION)
    inputs = {"truncated": np.array(flags, dtype=bool), "bootstrap_values": np.array(boots, dtype=np.float64)}
    return compute(spec, values, rewards, mask, offsets, terminals.astype(values.dtype), kernel=kernel,
                   row_inputs=inputs)  # fmt: skip


def random_truncation(seed: int, rows: int) -> tuple[list[bool], list[float]]:
    """Flags (about half the rows truncated) and bootstrap values (NaN, unread, where not)."""
    rng = np.random.default_rng(seed)
    flags = [bool(x) for x in rng.random(rows) < 0.5]
    return flags, [float(rng.normal(0.0, 2.0)) if flag else float("nan") for flag in flags]


def test_only_the_areal_profile_takes_the_bootstrap():
    assert BOOTSTRAP_KERNELS[:2] == ["reference", "scan"] and "native" in BOOTSTRAP_KERNELS
    for profile in PROFILES:
        if profile == "areal":
            assert AdvantageSpec(0.9, 0.95, profile, **TRUNCATION).features >= {"truncated", "bootstrap_values"}
            continue
        with pytest.raises(InvalidOptionError, match=f"not to the '{profile}' baseline$"):
            AdvantageSpec(0.9, 0.95, profile, **TRUNCATION)
    with pytest.raises(InvalidOptionError, match=r"\(lambd_critic\) .* 'areal' baseline \(which takes truncated"):
        AdvantageSpec(0.9, 0.95, "areal", lambd_critic=1.0, **TRUNCATION)
    with pytest.raises(InvalidOptionError, match="go together"):
        AdvantageSpec(0.9, 0.95, "areal", truncated="truncated")
    batch, flags, boots = worked_batch(torch.float64)
    with pytest.raises(InvalidOptionError, match="not to the 'skip-masked' baseline"):
        gaecli.baseline_gae(*batch.args(), gamma=0.5, lambd=1.0, semantics="skip-masked", truncated=flags,
                            bootstrap_values=boots)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", BOOTSTRAP_KERNELS)
def test_worked_example_on_both_paths(kernel, dtype):
    batch, flags, boots = worked_batch(dtype)
    advantages, returns = gaecli.baseline_gae(*batch.args(), gamma=0.5, lambd=1.0, semantics="areal",
                                              kernel=kernel, truncated=flags, bootstrap_values=boots)  # fmt: skip
    flat_advantages, flat_returns = on_numpy(batch, flags, boots, kernel)
    for sample, (expected_advantages, expected_returns) in enumerate(WORKED_EXPECTED):
        label = f"{kernel} sample {sample}"
        assert_bitwise(f"{label} advantages", torch.tensor(expected_advantages, dtype=dtype), advantages[sample])
        assert_bitwise(f"{label} returns", torch.tensor(expected_returns, dtype=dtype), returns[sample])
    assert_bitwise(f"{kernel} numpy advantages", torch.cat(advantages), torch.from_numpy(flat_advantages))
    assert_bitwise(f"{kernel} numpy returns", torch.cat(returns), torch.from_numpy(flat_returns))


def test_worked_example_through_areal_s_loop():
    # The loop itself gives the hand-worked numbers (it is what the tests trust).
    batch, flags, boots = worked_batch(torch.float64)
    advantages, returns = loop_batch(batch, flags, boots)
    assert [a.tolist() for a in advantages] == [a for a, _ in WORKED_EXPECTED]
    assert [r.tolist() for r in returns] == [r for _, r in WORKED_EXPECTED]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel", BOOTSTRAP_KERNELS)
@pytest.mark.parametrize("seed", range(4))
def test_every_position_is_areal_s_loop_on_agentic_batches(seed, kernel, dtype):
    # Tool blocks, responses ending masked, masked heads, fully masked, one-token and empty rows.
    kinds = ["blocks", "masked-tail", "zeros", "ones", "random", "masked-head", "blocks", "zeros", "random"]
    lengths = [40, 17, 5, 9, 1, 12, 63, 0, 0]
    batch = make_batch(seed, lengths, kinds, gamma=[0.99, 0.9, 1.0, 0.0][seed], lambd=[0.95, 0.7, 1.0, 0.5][seed],
                       dtype=dtype)  # fmt: skip
    flags, boots = random_truncation(seed, len(lengths))
    flags[:3] = [True, True, True]  # a truncated row of blocks, one ending masked, one fully masked
    boots[:3] = [1.5, -2.0, 4.0]
    expected_advantages, expected_returns = loop_batch(batch, flags, boots)
    values, rewards, mask, offsets, terminals = batch.packed()
    advantages, returns = gaecli.baseline_gae_packed(values, rewards, mask, offsets, terminals, gamma=batch.gamma,
                                                     lambd=batch.lambd, semantics="areal", kernel=kernel,
                                                     truncated=flags, bootstrap_values=boots)  # fmt: skip
    pieces = [v.numel() for v in batch.values]
    assert_close(f"{kernel} advantages", expected_advantages, list(torch.split(advantages, pieces)))
    assert_close(f"{kernel} returns", expected_returns, list(torch.split(returns, pieces)))
    flat_advantages, flat_returns = on_numpy(batch, flags, boots, kernel)
    assert_bitwise(f"{kernel} numpy advantages", advantages, torch.from_numpy(flat_advantages))
    assert_bitwise(f"{kernel} numpy returns", returns, torch.from_numpy(flat_returns))


def test_rows_not_truncated_give_the_profile_s_bits():
    batch = make_batch(5, [30, 8, 0, 14], ["blocks", "masked-tail", "zeros", "random"], dtype=torch.float64)
    plain = gaecli.baseline_gae(*batch.args(), gamma=0.99, lambd=0.95, semantics="areal", kernel="native")
    flags, boots = [False] * 4, [float("nan"), 1.0, 2.0, float("inf")]  # not read
    bootstrapped = gaecli.baseline_gae(*batch.args(), gamma=0.99, lambd=0.95, semantics="areal", kernel="native",
                                       truncated=flags, bootstrap_values=boots)  # fmt: skip
    for index, (expected, got) in enumerate(zip(plain[0] + plain[1], bootstrapped[0] + bootstrapped[1])):
        assert_bitwise(f"output {index}", expected, got)


def test_a_truncated_row_without_a_bootstrap_value_is_refused():
    batch, flags, boots = worked_batch(torch.float64)
    boots[1] = float("nan")
    with pytest.raises(gaecli.GAEInputError, match="sample 1: truncated, but bootstrap_values is nan"):
        gaecli.baseline_gae(*batch.args(), gamma=0.5, lambd=1.0, semantics="areal", truncated=flags,
                            bootstrap_values=boots)  # fmt: skip


# ----------------------------------------------------------------------------- the commands

GAMMA, LAMBD = 0.9, 0.8


@pytest.fixture
def dump(tmp_path):
    """A float64 dump (tool blocks, masked tails, fully masked, one-token and empty rows) with
    a truncated flag and a bootstrap value per row (null where not truncated)."""
    rollouts = random_rollouts(30, 8)
    flags = [row % 3 != 1 for row in range(30)]
    boots = [round(float(row) / 7.0 - 1.5, 3) if flag else None for row, flag in enumerate(flags)]
    extra = {"cut": pa.array(flags), "boot": pa.array(boots, pa.float64())}
    path = write_table(rollout_table(rollouts, float_type=pa.float64(), extra=extra), tmp_path / "in.parquet")
    cut_shapes = {("empty" if not m else "fully masked" if not any(m) else "masked tail" if not m[-1] else
                   "trainable end") for m, flag in zip(rollouts.masks, flags) if flag}  # fmt: skip
    assert cut_shapes == {"empty", "fully masked", "masked tail", "trainable end"}
    loops = [
        areal_dump_row(v, r, m, z, flag, boot, GAMMA, LAMBD)
        for v, r, m, z, flag, boot in zip(rollouts.values, rollouts.rewards, rollouts.masks, rollouts.terminal, flags,
                                          boots)  # fmt: skip
    ]
    return path, rollouts, flags, boots, loops


def columns(rollouts) -> tuple:
    return rollouts.values, rollouts.rewards, rollouts.masks, rollouts.terminal


def test_recompute_keeps_areal_s_bootstrapped_baseline(dump, tmp_path):
    path, rollouts, flags, boots, loops = dump
    out = tmp_path / "out.parquet"
    options = ("--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--baseline", "areal", "--keep-baseline")
    result = gae("recompute", path, "-o", out, *options, "--truncated-col", "cut", "--bootstrap-col", "boot")
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert_rows_close("advantages_areal", [a for a, _ in loops], table.column("advantages_areal").to_pylist(),
                      TOLERANCE["double"])  # fmt: skip
    assert_rows_close("returns_areal", [r for _, r in loops], table.column("returns_areal").to_pylist(),
                      TOLERANCE["double"])  # fmt: skip
    # the new side takes the same columns: the masked contract with the truncation bootstrap
    new = [variant_oracle(v, r, m, z, GAMMA, LAMBD, truncated=flag, bootstrap=boot or 0.0)[0]
           for v, r, m, z, flag, boot in zip(*columns(rollouts), flags, boots)]  # fmt: skip
    assert_rows_close("advantages", new, table.column("advantages").to_pylist(), TOLERANCE["double"])
    # without the columns, the profile's zero bootstrap: the truncated rows change
    plain = tmp_path / "plain.parquet"
    assert gae("recompute", path, "-o", plain, *options).exit_code == 0
    before, after = (t.column("advantages_areal").to_pylist() for t in (pq.read_table(plain), table))
    changed = [row for row, (a, b) in enumerate(zip(before, after)) if a != b]
    assert changed and all(flags[row] for row in changed)


def test_a_kept_areal_baseline_written_without_the_bootstrap_is_not_taken_as_current(dump, tmp_path):
    """The baseline's spec is recorded where it takes the truncation bootstrap: under
    --skip-existing an output written with it is kept, and one whose metadata lacks it (written
    before the areal profile took one: another computation) is refused (exit 2) until
    --overwrite replaces it."""
    path, *_ = dump
    out = tmp_path / "out.parquet"
    options = ("--gamma", GAMMA, "--lambd", LAMBD, "--baseline", "areal", "--keep-baseline", "--truncated-col", "cut",
               "--bootstrap-col", "boot", "--kernel", "native")  # fmt: skip
    assert gae("recompute", path, "-o", out, *options, "--quiet").exit_code == 0
    recorded = json.loads(pq.read_schema(out).metadata[b"gaecli.baseline_specs"])
    assert [(spec["semantics"], spec["truncated"], spec["bootstrap_values"]) for spec in recorded] == [
        ("areal", "cut", "boot")
    ]
    kept = gae("recompute", path, "-o", out, *options, "--skip-existing", "--json", "-")
    assert [entry["skipped"] for entry in json.loads(kept.stdout)["files"]] == [True]
    table = pq.read_table(out)
    older = {k: v for k, v in table.schema.metadata.items() if k != b"gaecli.baseline_specs"}
    pq.write_table(table.replace_schema_metadata(older), out)
    refused = gae("recompute", path, "-o", out, *options, "--skip-existing", "--quiet")
    assert refused.exit_code == 2 and "baseline_specs (not recorded)" in refused.output
    assert "--overwrite" in refused.output
    assert gae("recompute", path, "-o", out, *options, "--overwrite", "--quiet").exit_code == 0
    assert b"gaecli.baseline_specs" in pq.read_schema(out).metadata


def test_diff_against_areal_reads_the_bootstrap(dump):
    path, rollouts, flags, boots, loops = dump
    result = gae("diff", path, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--json", "-", "--baseline",
                 "areal,masked", "--truncated-col", "cut", "--bootstrap-col", "boot")  # fmt: skip
    assert result.exit_code == 0, result.output
    comparisons = json.loads(result.stdout)["comparisons"]
    new = [np.array(variant_oracle(v, r, m, z, GAMMA, LAMBD, truncated=flag, bootstrap=boot or 0.0)[0])
           for v, r, m, z, flag, boot in zip(*columns(rollouts), flags, boots)]  # fmt: skip
    masks = [np.array(m, dtype=bool) for m in rollouts.masks]
    largest = max(float(np.abs(a - np.array(old))[m].max()) for a, (old, _), m in zip(new, loops, masks) if m.any())
    areal = next(c for c in comparisons if c["name"] == "areal")["summary"]
    assert areal["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-9)
    # masked stays the plain contract (no bootstrap): a diff of the variant alone
    plain = [np.array(variant_oracle(v, r, m, z, GAMMA, LAMBD)[0]) for v, r, m, z in zip(*columns(rollouts))]
    largest = max(float(np.abs(a - b)[m].max()) for a, b, m in zip(new, plain, masks) if m.any())
    masked = next(c for c in comparisons if c["name"] == "masked")["summary"]
    assert masked["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_scan_computes_the_contract_s_truncation_bootstrap_too(dtype):
    """``scan`` (the kernel ``auto`` takes on CUDA) reads the truncation bootstrap, the one variant
    it supports, for the masked contract as for the profile: the definition's float64 sums."""
    batch = make_batch(2, [40, 17, 5, 1, 0, 30], ["blocks", "masked-tail", "zeros", "ones", "zeros", "random"],
                       gamma=0.9, lambd=0.8, dtype=dtype)  # fmt: skip
    flags, boots = [True, True, True, True, True, False], [1.5, -2.0, 4.0, 0.5, 3.0, float("nan")]
    spec = AdvantageSpec(0.9, 0.8, **TRUNCATION)
    advantages, returns = gaecli.compute_advantages(*batch.args(), spec=spec, kernel="scan", truncated=flags,
                                                    bootstrap_values=boots)  # fmt: skip
    expected = [variant_oracle(v, r, m, z, 0.9, 0.8, truncated=flag, bootstrap=0.0 if not flag else boot)
                for v, r, m, z, flag, boot in zip(*batch.args(), flags, boots)]  # fmt: skip
    assert_close("scan advantages", [torch.tensor(a, dtype=torch.float64) for a, _ in expected], advantages)
    assert_close("scan returns", [torch.tensor(r, dtype=torch.float64) for _, r in expected], returns)
    with pytest.raises(gaecli.KernelUnavailableError, match="kernel 'scan' does not support lambd_critic"):
        gaecli.compute_advantages(*batch.args(), spec=AdvantageSpec(0.9, 0.8, lambd_critic=1.0), kernel="scan")
