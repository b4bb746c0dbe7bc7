"""The GAE variants added after the first five (docs/variants.md): the relative-position λ
(``lambd_schedule="relative-position"`` with ``lambd_q``, ``--lambd-schedule`` /
``--lambd-q``) and explicit turn ids (``turn_ids``, ``--turn-ids-col``) against hand-worked
numbers and the independent float64 loop :func:`tests.helpers.variant_oracle`, on every
kernel that supports them, in the Python, table and command forms; the same bits whatever
the batch size and the number of workers; refused options (exit 2) and invalid data (exit 1,
one line, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import gaecli
from gaecli import AdvantageSpec
from gaecli.advantages import compute_advantages
from gaecli.advantages.kernels import KERNELS
from gaecli.advantages.variants import relative_position_lambd
from gaecli.errors import InvalidOptionError, KernelUnavailableError
from gaecli.pipeline import VariantOptions

from helpers import assert_close, make_batch, spec_document, variant_oracle
from rollout_files import (
    TOLERANCE,
    assert_rows_close,
    files_under,
    gae,
    random_rollouts,
    rollout_table,
    write_table,
)

VARIANT_KERNELS = [
    name for name in gaecli.available_kernels() if not KERNELS[name].missing(AdvantageSpec(0.9, 0.9, lambd_alpha=1.0))
]
"""Every kernel here that supports the length-adaptive λ: each must support the new ones too."""

# The contract's worked example (docs/semantics.md): trainable tokens 0 and 2, two turns.
EXAMPLE = dict(values=[1.0, 2.0, 3.0, 4.0], rewards=[0.5, 1.0, 0.25, 2.0], mask=[1, 0, 1, 0], terminal=8.0)
# Three trainable tokens, rewards 0, z = 4 (γ = 1 below): every δ is 1.
THREE = dict(values=[1.0, 2.0, 3.0], rewards=[0.0, 0.0, 0.0], mask=[1, 1, 1], terminal=4.0)
# Two turns of two tokens: turns [0, 1] and [3, 4] by the mask.
TURNS = dict(values=[1.0, 2.0, 3.0, 4.0, 5.0], rewards=[0.1, 0.2, 0.3, 0.4, 0.5], mask=[1, 1, 0, 1, 1], terminal=2.0)

GAMMA, LAMBD = 0.9, 0.8
RELATIVE = {"lambd_schedule": "relative-position", "lambd_q": 0.3}


def run_one(example, spec, kernel="auto", **data):
    """Advantages and returns (lists of floats) of one sample under ``spec``."""
    tensors = [torch.tensor(example[name], dtype=torch.float64) for name in ("values", "rewards")]
    mask = torch.tensor(example["mask"], dtype=torch.bool)
    advantages, returns = compute_advantages(
        [tensors[0]], [tensors[1]], [mask], [example["terminal"]], spec=spec, kernel=kernel, **data
    )
    return advantages[0].tolist(), returns[0].tolist()


def oracle_one(example, gamma, lambd, fields, data):
    return variant_oracle(
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
        turn_ids=data.get("turn_ids", [None])[0],
    )


# ----------------------------------------------------------------------------- relative-position λ

RELATIVE_HAND_WORKED = [
    # (name, example, γ, λ, spec fields, data, advantages, returns)
    # L = 2 trainable tokens, q = 0.25: λ = 0.25^(1/1) = 0.25, γλ = 0.125; δ_2 = 8.25 − 3 = 5.25,
    # δ_0 = 0.5 + 0.5·3 − 1 = 1, A_0 = 1 + 0.125·5.25 = 1.65625. The returns keep λ = 1.
    (
        "token L=2",
        EXAMPLE,
        0.5,
        1.0,
        {"lambd_schedule": "relative-position", "lambd_q": 0.25},
        {},
        [1.65625, 0, 5.25, 0],
        [4.625, 0, 8.25, 0],
    ),
    # q = 1: λ = 1 whatever L: the plain advantages (λ = 1), returns as plain.
    (
        "q=1",
        EXAMPLE,
        0.5,
        1.0,
        {"lambd_schedule": "relative-position", "lambd_q": 1.0},
        {},
        [3.625, 0, 5.25, 0],
        [4.625, 0, 8.25, 0],
    ),
    # L = 3, q = 0.25: λ = 0.25^(1/2) = 0.5; γ = 1, δ = [1, 1, 1]: A = [1 + 0.5·1.5, 1 + 0.5·1, 1].
    # Returns keep --lambd 0.9: G_2 = 1, G_1 = 1 + 0.9 = 1.9, G_0 = 1 + 0.9·1.9 = 2.71; + V.
    (
        "token L=3",
        THREE,
        1.0,
        0.9,
        {"lambd_schedule": "relative-position", "lambd_q": 0.25},
        {},
        [1.75, 1.5, 1.0],
        [3.71, 3.9, 4.0],
    ),
    # With --lambd-critic 1 the returns are the λ = 1 sums: G = [3, 2, 1] + V = [4, 4, 4].
    (
        "token L=3 + critic",
        THREE,
        1.0,
        0.9,
        {"lambd_schedule": "relative-position", "lambd_q": 0.25, "lambd_critic": 1.0},
        {},
        [1.75, 1.5, 1.0],
        [4.0, 4.0, 4.0],
    ),
    # Turn mode, L = 2 turns (not 4 tokens), q = 0.2: λ = 0.2, γλ = 0.1; turn values [1, 4],
    # turn rewards [2, 3 + z = 5]: δ_1 = 5 − 4 = 1, δ_0 = 2 + 0.5·4 − 1 = 3, A_0 = 3 + 0.1·1 = 3.1;
    # advantages A_u + r[t]; returns keep λ = 0.5: G_0 = 3 + 0.25·1 = 3.25, + V_0 = 4.25; G_1 + V_1 = 5.
    (
        "turn L=2",
        TURNS,
        0.5,
        0.5,
        {"timestep": "turn", "lambd_schedule": "relative-position", "lambd_q": 0.2},
        {"turn_rewards": [[2.0, 3.0]]},
        [3.2, 3.3, 0, 1.4, 1.5],
        [4.25, 4.25, 0, 5, 5],
    ),
]


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize(
    "name, example, gamma, lambd, fields, data, advantages, returns",
    RELATIVE_HAND_WORKED,
    ids=[case[0] for case in RELATIVE_HAND_WORKED],
)
def test_relative_position_hand_worked(kernel, name, example, gamma, lambd, fields, data, advantages, returns):
    spec = AdvantageSpec(gamma, lambd, **fields)
    got_advantages, got_returns = run_one(example, spec, kernel, **data)
    assert got_advantages == pytest.approx(advantages, abs=1e-12)
    assert got_returns == pytest.approx(returns, abs=1e-12)
    oracle = oracle_one(example, gamma, lambd, fields, data)
    assert oracle[0] == pytest.approx(advantages, abs=1e-12) and oracle[1] == pytest.approx(returns, abs=1e-12)


def test_relative_position_lambd_by_length():
    """λ = q^(1/(L − 1)) for L ≥ 2 (L = 5: the 4th root), 1 for L = 1, 0 for L = 0."""
    got = relative_position_lambd(0.25, np.array([0, 1, 2, 3, 5, 10**9]))
    assert got.tolist() == pytest.approx([0.0, 1.0, 0.25, 0.5, 0.5**0.5, 0.25 ** (1 / (10**9 - 1))], abs=1e-15)
    assert relative_position_lambd(1.0, np.array([0, 1, 7])).tolist() == [0.0, 1.0, 1.0]


RELATIVE_COMBINATIONS = [
    {"lambd_schedule": "relative-position", "lambd_q": 0.3},
    {"lambd_schedule": "relative-position", "lambd_q": 1.0},
    {"lambd_schedule": "relative-position", "lambd_q": 0.05, "lambd_critic": 1.0},
    {"lambd_schedule": "relative-position", "lambd_q": 0.5, "timestep": "turn"},
    {"lambd_schedule": "relative-position", "lambd_q": 0.7, "timestep": "turn", "lambd_critic": 0.6},
]


def random_bootstrap(count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    flags = rng.random(count) < 0.5
    return {"truncated": flags.tolist(), "bootstrap_values": np.where(flags, rng.normal(0, 2, count), np.nan).tolist()}


def batch_oracle(batch, fields: dict, data: dict):
    advantages, returns = [], []
    for index, (values, rewards, mask, terminal) in enumerate(zip(*batch.args())):
        one = {key: [column[index]] for key, column in data.items()}
        a, r = oracle_one(
            {"values": values, "rewards": rewards, "mask": mask, "terminal": terminal},
            batch.gamma,
            batch.lambd,
            fields,
            one,
        )
        advantages.append(torch.tensor(a, dtype=torch.float64))
        returns.append(torch.tensor(r, dtype=torch.float64))
    return advantages, returns


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize("fields", RELATIVE_COMBINATIONS, ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_relative_position_against_the_float64_loop(kernel, fields, dtype):
    batch = make_batch(13, [0, 1, 2, 3, 9, 30, 64, 17, 5], dtype=dtype, gamma=0.97, lambd=0.9)
    data = random_bootstrap(len(batch), 3)
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    advantages, returns = compute_advantages(*batch.args(), spec=spec, kernel=kernel, **data)
    expected_advantages, expected_returns = batch_oracle(batch, fields, data)
    assert_close(f"{kernel} advantages", expected_advantages, advantages)
    assert_close(f"{kernel} returns", expected_returns, returns)


def test_relative_position_is_declared_and_refused_by_kernels_without_it():
    spec = AdvantageSpec(0.9, 0.9, **RELATIVE)
    assert spec.features >= {"lambd_schedule", "lambd_q"} and spec.variants == ("lambd_schedule", "lambd_q")
    for name, kernel in KERNELS.items():
        assert ("lambd_schedule" in kernel.supports) == ("lambd_alpha" in kernel.supports), name
    batch = make_batch(1, [5, 3])
    with pytest.raises(KernelUnavailableError, match="does not support lambd_q, lambd_schedule"):
        compute_advantages(*batch.args(), spec=spec, kernel="scan")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"lambd_q": 0.5}, "lambd_schedule relative-position and lambd_q go together"),
        ({"lambd_schedule": "relative-position"}, "lambd_schedule relative-position and lambd_q go together"),
        ({"lambd_schedule": "linear", "lambd_q": 0.5}, "unknown lambd_schedule 'linear'"),
        ({"lambd_schedule": "relative-position", "lambd_q": 0.0}, r"lambd_q must be a finite number in \(0, 1\]"),
        ({"lambd_schedule": "relative-position", "lambd_q": 1.5}, r"lambd_q must be a finite number in \(0, 1\]"),
        ({"lambd_schedule": "relative-position", "lambd_q": float("nan")}, "lambd_q must be a finite number"),
        ({"lambd_schedule": "relative-position", "lambd_q": True}, "lambd_q must be a finite number"),
        ({**RELATIVE, "lambd_alpha": 0.1}, "each set the λ of the advantages"),
        ({**RELATIVE, "semantics": "verl"}, "apply to the masked contract only"),
    ],
)
def test_spec_refuses_bad_relative_position_fields(fields, message):
    with pytest.raises(InvalidOptionError, match=message):
        AdvantageSpec(0.9, 0.9, **fields)


# ----------------------------------------------------------------------------- the commands


@pytest.fixture
def dump(tmp_path):
    """Two float64 files of random rollouts (turns by the mask), one truncated flag and
    bootstrap value per row."""
    paths, rows = [], []
    for seed in (4, 5):
        rollouts = random_rollouts(25, seed)
        cut = [row % 3 == 0 for row in range(len(rollouts))]
        boot = [round(row / 7.0, 3) if flag else None for row, flag in enumerate(cut)]
        extra = {"cut": pa.array(cut, pa.bool_()), "boot": pa.array(boot, pa.float64())}
        table = rollout_table(rollouts, float_type=pa.float64(), extra=extra)
        paths.append(write_table(table, tmp_path / "in" / f"part{seed}.parquet"))
        rows.append((rollouts, cut, boot))
    return paths, rows


def expected_rows(rollouts, cut, boot, fields, turn_ids=None):
    advantages, returns = [], []
    for row in range(len(rollouts)):
        a, r = variant_oracle(
            rollouts.values[row],
            rollouts.rewards[row],
            rollouts.masks[row],
            rollouts.terminal[row],
            GAMMA,
            LAMBD,
            **fields,
            truncated=cut[row] if cut is not None else False,
            bootstrap=boot[row] if cut is not None and cut[row] else 0.0,
            turn_ids=None if turn_ids is None else turn_ids[row],
        )
        advantages.append(np.array(a))
        returns.append(np.array(r))
    return advantages, returns


def recompute(inputs, output, *options):
    return gae("recompute", *inputs, "-o", output, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *options)


RELATIVE_FLAGS = ["--lambd-schedule", "relative-position", "--lambd-q", "0.3"]


@pytest.mark.parametrize("turn", [False, True], ids=["token", "turn"])
def test_recompute_relative_position_matches_the_float64_loop(dump, tmp_path, turn):
    paths, rows = dump
    flags = [*RELATIVE_FLAGS, "--truncated-col", "cut", "--bootstrap-col", "boot"]
    fields = dict(RELATIVE)
    if turn:
        flags += ["--timestep", "turn", "--lambd-critic", "1"]
        fields.update(timestep="turn", lambd_critic=1.0)
    out = tmp_path / "out.parquet"
    result = recompute([paths[0]], out, *flags)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    rollouts, cut, boot = rows[0]
    advantages, returns = expected_rows(rollouts, cut, boot, fields)
    assert_rows_close("advantages", advantages, table.column("advantages").to_pylist(), TOLERANCE["double"])
    assert_rows_close("returns", returns, table.column("returns").to_pylist(), TOLERANCE["double"])
    spec = json.loads(table.schema.metadata[b"gaecli.spec"])
    document = spec_document(GAMMA, LAMBD, **fields, truncated="cut", bootstrap_values="boot")
    assert {name: spec[name] for name in document} == document


def output_bits(out_dir) -> dict:
    found = {}
    for name in files_under(out_dir):
        table = pq.read_table(out_dir / name)
        found[name] = [table.column(column).combine_chunks().flatten().to_numpy().tobytes() for column in COLUMNS]
    return found


COLUMNS = ("advantages", "returns")


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
def test_recompute_relative_position_is_the_same_bits_whatever_the_batch_and_workers(dump, tmp_path, kernel):
    paths, _ = dump
    flags = [*RELATIVE_FLAGS, "--timestep", "turn", "--truncated-col", "cut", "--bootstrap-col", "boot"]
    runs = {}
    for batch_rows, workers in ((1, 1), (1000, 1), (1, 2), (1000, 2)):
        out_dir = tmp_path / f"out-{batch_rows}-{workers}"
        options = ("--kernel", kernel, "--batch-rows", batch_rows, "--workers", workers)
        result = recompute([paths[0].parent], out_dir, *flags, *options)
        assert result.exit_code == 0, result.output
        runs[batch_rows, workers] = output_bits(out_dir)
    first = runs[1, 1]
    assert sorted(first) == ["part4.parquet", "part5.parquet"]
    for key, bits in runs.items():
        assert bits == first, f"batch rows, workers {key}: not the bits of one row at a time on one worker"


def test_diff_and_the_table_api_take_the_relative_position_lambd(dump, tmp_path):
    paths, rows = dump
    rollouts, cut, boot = rows[0]
    diffed = gae(
        "diff", paths[0], "--gamma", GAMMA, "--lambd", LAMBD, "--baseline", "masked", *RELATIVE_FLAGS, "--json", "-"
    )
    assert diffed.exit_code == 0, diffed.output
    new, _ = expected_rows(rollouts, None, None, RELATIVE)
    old, _ = expected_rows(rollouts, None, None, {})
    largest = max((float(np.abs(a - b).max()) for a, b in zip(new, old) if a.size), default=0.0)
    assert largest > 0.01  # the schedule changes the advantages, and diff sees by how much
    assert json.loads(diffed.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-9)
    arrow = pq.read_table(paths[0])
    variants = VariantOptions(lambd_schedule="relative-position", lambd_q=0.3)
    got = gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD, variants=variants)
    advantages, returns = expected_rows(rollouts, None, None, RELATIVE)
    assert_rows_close("advantages", advantages, got.column("advantages").to_pylist(), TOLERANCE["double"])
    assert_rows_close("returns", returns, got.column("returns").to_pylist(), TOLERANCE["double"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lambd-q", "0.5"], "--lambd-schedule relative-position and --lambd-q go together"),
        (["--lambd-schedule", "relative-position"], "--lambd-schedule relative-position and --lambd-q go together"),
        (["--lambd-schedule", "linear", "--lambd-q", "0.5"], "--lambd-schedule: unknown λ schedule 'linear'"),
        ([*RELATIVE_FLAGS[:2], "--lambd-q", "0"], "--lambd-q must be a finite number in (0, 1]"),
        ([*RELATIVE_FLAGS[:2], "--lambd-q", "1.01"], "--lambd-q must be a finite number in (0, 1]"),
        ([*RELATIVE_FLAGS[:2], "--lambd-q", "nan"], "--lambd-q must be a finite number in (0, 1]"),
        ([*RELATIVE_FLAGS, "--lambd-alpha", "0.1"], "--lambd-schedule and --lambd-alpha each set the λ"),
        ([*RELATIVE_FLAGS, "--kernel", "scan"], "kernel 'scan' does not support lambd_q, lambd_schedule"),
    ],
)
def test_refused_relative_position_options_exit_2(dump, tmp_path, flags, message):
    out_dir = tmp_path / "out"
    result = recompute([dump[0][0]], out_dir / "out.parquet", *flags)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert files_under(out_dir) == []
    diffed = gae("diff", dump[0][0], "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *flags)
    assert diffed.exit_code == 2 and message in diffed.stderr, diffed.output


# ----------------------------------------------------------------------------- explicit turn ids

TURN = {"timestep": "turn"}
TURN_IDS_HAND_WORKED = [
    # (name, spec fields, data, advantages, returns); example T, γ = λ = 0.5.
    # Ids that number the mask's runs: the mask's turns. V = [1, 4], R = [0, z = 2]:
    # δ_1 = 2 − 4 = −2, δ_0 = 0 + 0.5·4 − 1 = 1, A_0 = 1 + 0.25·(−2) = 0.5; advantages A_u + r[t].
    ("as the mask", TURN, {"turn_ids": [[0, 0, -1, 1, 1]]}, [0.6, 0.7, 0, -1.6, -1.5], [1.5, 1.5, 0, 2, 2]),
    # One id over both runs: one turn spanning the masked token 2 (which stays 0). V_0 = 1,
    # R_0 = z = 2: A_0 = 2 − 1 = 1.
    ("one turn over a gap", TURN, {"turn_ids": [[0, 0, -1, 0, 0]]}, [1.1, 1.2, 0, 1.4, 1.5], [2, 2, 0, 2, 2]),
    # Ids 0 | 1 1 | 2 (token 1 and token 3 are one turn; the run [3, 4] is split): V = [1, 2, 5],
    # R = [0, 0, 2]: δ_2 = −3, δ_1 = 0.5·5 − 2 = 0.5, δ_0 = 0.5·2 − 1 = 0; A_1 = 0.5 + 0.25·(−3) = −0.25,
    # A_0 = 0.25·(−0.25) = −0.0625.
    (
        "a split run",
        TURN,
        {"turn_ids": [[0, 1, -1, 1, 2]]},
        [0.0375, -0.05, 0, 0.15, -2.5],
        [0.9375, 1.75, 0, 1.75, 2],
    ),
    # The same turns with turn rewards [1, 2, 3] (one per turn of the ids): R = [1, 2, 3 + 2]:
    # δ_2 = 5 − 5 = 0, δ_1 = 2 + 2.5 − 2 = 2.5, δ_0 = 1 + 1 − 1 = 1; A_0 = 1 + 0.25·2.5 = 1.625.
    (
        "a split run + turn rewards",
        TURN,
        {"turn_ids": [[0, 1, -1, 1, 2]], "turn_rewards": [[1.0, 2.0, 3.0]]},
        [1.725, 2.7, 0, 2.9, 0.5],
        [2.625, 4.5, 0, 4.5, 5],
    ),
    # Gaps in the numbering and any id at a masked token: ids 3 | 7 7 (the 9 is masked): the
    # mask's turns again, as in "as the mask".
    ("gaps and masked ids", TURN, {"turn_ids": [[3, 3, 9, 7, 7]]}, [0.6, 0.7, 0, -1.6, -1.5], [1.5, 1.5, 0, 2, 2]),
    # One turn, truncated with bootstrap 6: δ_0 = 2 + 0.5·6 − 1 = 4.
    (
        "one turn + bootstrap",
        TURN,
        {"turn_ids": [[0, 0, -1, 0, 0]], "truncated": [True], "bootstrap_values": [6.0]},
        [4.1, 4.2, 0, 4.4, 4.5],
        [5, 5, 0, 5, 5],
    ),
    # Three turns (the split run), relative-position λ with q = 0.25: λ = 0.25^(1/2) = 0.5 (as
    # --lambd), so the advantages are those of "a split run"; the returns keep λ = 0.5 too.
    (
        "a split run + relative-position",
        {**TURN, "lambd_schedule": "relative-position", "lambd_q": 0.25},
        {"turn_ids": [[0, 1, -1, 1, 2]]},
        [0.0375, -0.05, 0, 0.15, -2.5],
        [0.9375, 1.75, 0, 1.75, 2],
    ),
]


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize(
    "name, fields, data, advantages, returns", TURN_IDS_HAND_WORKED, ids=[case[0] for case in TURN_IDS_HAND_WORKED]
)
def test_turn_ids_hand_worked(kernel, name, fields, data, advantages, returns):
    got_advantages, got_returns = run_one(TURNS, AdvantageSpec(0.5, 0.5, **fields), kernel, **data)
    assert got_advantages == pytest.approx(advantages, abs=1e-12)
    assert got_returns == pytest.approx(returns, abs=1e-12)
    oracle = oracle_one(TURNS, 0.5, 0.5, fields, data)
    assert oracle[0] == pytest.approx(advantages, abs=1e-12) and oracle[1] == pytest.approx(returns, abs=1e-12)


def random_turn_ids(mask, rng) -> list[int]:
    """Turn ids of one sample: non-decreasing at trainable tokens, starting anywhere in 0..2
    and stepping by 0, 1 or 2 (a step inside a run splits it; no step over masked tokens
    joins two runs), −1 or junk at masked tokens."""
    ids, current = [], int(rng.integers(0, 3))
    for keep in mask:
        if keep:
            current += int(rng.choice([0, 0, 1, 2]))
            ids.append(current)
        else:
            ids.append(-1 if rng.random() < 0.8 else 99)
    return ids


def id_turn_count(mask, ids) -> int:
    return len({turn for keep, turn in zip(mask, ids) if keep})


TURN_ID_COMBINATIONS = [
    {},
    {"turn": True},
    {"bootstrap": True},
    {"lambd_critic": 1.0, "turn": True},
    {"lambd_alpha": 0.3, "lambd_critic": 0.7, "bootstrap": True},
    {"lambd_schedule": "relative-position", "lambd_q": 0.4, "turn": True, "bootstrap": True},
]


def turn_id_data(batch, seed: int, turn: bool, bootstrap: bool) -> dict:
    rng = np.random.default_rng(seed)
    masks = [mask.tolist() for mask in batch.masks]
    data = {"turn_ids": [random_turn_ids(mask, rng) for mask in masks]}
    if turn:
        counts = [id_turn_count(mask, ids) for mask, ids in zip(masks, data["turn_ids"])]
        data["turn_rewards"] = [rng.normal(0.0, 1.0, count).tolist() for count in counts]
    if bootstrap:
        data.update(random_bootstrap(len(batch), seed + 1))
    return data


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
@pytest.mark.parametrize("combination", TURN_ID_COMBINATIONS, ids=lambda c: "+".join(c) or "ids")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_turn_ids_against_the_float64_loop(kernel, combination, dtype):
    fields = {key: value for key, value in combination.items() if key not in ("turn", "bootstrap")}
    fields["timestep"] = "turn"
    batch = make_batch(17, [0, 1, 2, 3, 9, 30, 64, 17, 5], dtype=dtype, gamma=0.97, lambd=0.9)
    data = turn_id_data(batch, 7, combination.get("turn", False), combination.get("bootstrap", False))
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    advantages, returns = compute_advantages(*batch.args(), spec=spec, kernel=kernel, **data)
    expected_advantages, expected_returns = batch_oracle(batch, fields, data)
    assert_close(f"{kernel} advantages", expected_advantages, advantages)
    assert_close(f"{kernel} returns", expected_returns, returns)


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
def test_turn_ids_that_number_the_mask_runs_give_the_bits_of_the_mask_turns(kernel):
    batch = make_batch(23, [40, 0, 7, 1, 64, 12], dtype=torch.float32)
    ids = []
    for mask in batch.masks:
        flags = mask.tolist()
        run_starts = np.cumsum([bool(keep) and (t == 0 or not flags[t - 1]) for t, keep in enumerate(flags)])
        ids.append([int(start) - 1 if keep else -1 for start, keep in zip(run_starts, flags)])
    spec = AdvantageSpec(batch.gamma, batch.lambd, timestep="turn", lambd_critic=1.0)
    plain = compute_advantages(*batch.args(), spec=spec, kernel=kernel)
    given = compute_advantages(*batch.args(), spec=spec, kernel=kernel, turn_ids=ids)
    for want, have in zip(plain, given):
        for a, b in zip(want, have):
            assert torch.equal(a, b)


def test_turn_ids_in_the_packed_form_are_flat():
    batch = make_batch(5, [6, 9], dtype=torch.float64)
    data = turn_id_data(batch, 2, False, False)
    spec = AdvantageSpec(batch.gamma, batch.lambd, timestep="turn")
    listed = compute_advantages(*batch.args(), spec=spec, **data)
    flat_ids = torch.tensor([turn for ids in data["turn_ids"] for turn in ids])
    offsets = torch.tensor([0, 6, 15])
    packed = gaecli.compute_advantages_packed(
        torch.cat(batch.values),
        torch.cat(batch.rewards),
        torch.cat(batch.masks),
        offsets,
        torch.tensor(batch.terminals, dtype=torch.float64),
        spec=spec,
        turn_ids=flat_ids,
    )
    assert torch.equal(packed[0], torch.cat(listed[0])) and torch.equal(packed[1], torch.cat(listed[1]))


@pytest.mark.parametrize(
    "ids, extra, message",
    [
        ([[0, 1, -1, 0, 0]], {}, r"sample 0: turn_ids is 0 at trainable token 3 \(turn ids must be >= 0"),
        ([[0, 0, -1, -1, 1]], {}, "sample 0: turn_ids is -1 at trainable token 3"),
        ([[0, 0, 1]], {}, "sample 0: turn_ids has 3 ids, the sample has 5 tokens"),
        ([[0, None, -1, 1, 1]], {}, "sample 0: turn_ids is nan at token 1 \\(must be an integer\\)"),
        ([None], {}, "sample 0: turn_ids is None"),
        ([[0, 0.5, -1, 1, 1]], {}, "must be an integer"),
        ([[0, 1, -1, 1, 2]], {"turn_rewards": [[1.0, 2.0]]}, "sample 0: turn_rewards has 2 values, the sample has 3"),
    ],
)
def test_invalid_turn_ids_name_the_sample(ids, extra, message):
    with pytest.raises(gaecli.GAEInputError, match=message):
        run_one(TURNS, AdvantageSpec(0.5, 0.5, timestep="turn"), turn_ids=ids, **extra)


def test_turn_ids_need_the_turn_timestep_and_a_capable_kernel():
    with pytest.raises(InvalidOptionError, match="turn_ids gives the turns of timestep 'turn'"):
        AdvantageSpec(0.9, 0.9, turn_ids="ids")
    spec = AdvantageSpec(0.9, 0.9, timestep="turn", turn_ids="ids")
    assert "turn_ids" in spec.features and [(i.name, i.role, i.kind) for i in spec.row_inputs] == [
        ("ids", "turn_ids", "list")
    ]
    for name, kernel in KERNELS.items():
        assert ("turn_ids" in kernel.supports) == ("timestep:turn" in kernel.supports), name
    batch = make_batch(1, [5])
    with pytest.raises(KernelUnavailableError, match="does not support timestep:turn, turn_ids"):
        compute_advantages(*batch.args(), spec=spec, kernel="scan", row_inputs={"ids": [[0] * 5]})


@pytest.fixture
def id_dump(tmp_path):
    """A float64 file of random rollouts with a turn-ids column (int64 lists, −1 or junk at
    masked tokens) and a turn-rewards column of one reward per turn of the ids."""
    rollouts = random_rollouts(40, 8)
    rng = np.random.default_rng(3)
    ids = [random_turn_ids(mask, rng) for mask in rollouts.masks]
    turns = [rng.normal(0.0, 1.0, id_turn_count(mask, row)).round(2).tolist() for mask, row in zip(rollouts.masks, ids)]
    cut = [row % 4 == 1 for row in range(len(rollouts))]
    boot = [round(row / 9.0, 3) if flag else None for row, flag in enumerate(cut)]
    extra = {
        "ids": pa.array(ids, pa.list_(pa.int64())),
        "turns": pa.array(turns, pa.list_(pa.float64())),
        "cut": pa.array(cut, pa.bool_()),
        "boot": pa.array(boot, pa.float64()),
    }
    path = write_table(rollout_table(rollouts, float_type=pa.float64(), extra=extra), tmp_path / "in" / "a.parquet")
    half = rollout_table(rollouts, float_type=pa.float64(), extra=extra).slice(0, 17)
    write_table(half, tmp_path / "in" / "b.parquet")
    return path, rollouts, ids, turns, cut, boot


ID_FLAGS = ["--timestep", "turn", "--turn-ids-col", "ids", "--turn-rewards-col", "turns"]
CUT_FLAGS = ["--truncated-col", "cut", "--bootstrap-col", "boot"]


def test_recompute_with_turn_ids_matches_the_float64_loop(id_dump, tmp_path):
    path, rollouts, ids, turns, cut, boot = id_dump
    out = tmp_path / "out.parquet"
    result = recompute([path], out, *ID_FLAGS, *CUT_FLAGS, *RELATIVE_FLAGS)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    fields = {"timestep": "turn", **RELATIVE}
    advantages, returns = [], []
    for row in range(len(rollouts)):
        a, r = variant_oracle(
            rollouts.values[row],
            rollouts.rewards[row],
            rollouts.masks[row],
            rollouts.terminal[row],
            GAMMA,
            LAMBD,
            **fields,
            turn_rewards=turns[row],
            truncated=cut[row],
            bootstrap=boot[row] if cut[row] else 0.0,
            turn_ids=ids[row],
        )
        advantages.append(np.array(a))
        returns.append(np.array(r))
    assert_rows_close("advantages", advantages, table.column("advantages").to_pylist(), TOLERANCE["double"])
    assert_rows_close("returns", returns, table.column("returns").to_pylist(), TOLERANCE["double"])
    assert json.loads(table.schema.metadata[b"gaecli.spec"])["turn_ids"] == "ids"


@pytest.mark.parametrize("kernel", VARIANT_KERNELS)
def test_recompute_with_turn_ids_is_the_same_bits_whatever_the_batch_and_workers(id_dump, tmp_path, kernel):
    runs = {}
    for batch_rows, workers in ((1, 1), (1000, 1), (1, 2), (1000, 2)):
        out_dir = tmp_path / f"out-{batch_rows}-{workers}"
        options = ("--kernel", kernel, "--batch-rows", batch_rows, "--workers", workers)
        result = recompute([id_dump[0].parent], out_dir, *ID_FLAGS, *CUT_FLAGS, *options)
        assert result.exit_code == 0, result.output
        runs[batch_rows, workers] = output_bits(out_dir)
    first = runs[1, 1]
    assert sorted(first) == ["a.parquet", "b.parquet"]
    for key, bits in runs.items():
        assert bits == first, f"batch rows, workers {key}: not the bits of one row at a time on one worker"


def test_diff_and_the_table_api_take_turn_ids(id_dump):
    path, rollouts, ids, turns, cut, boot = id_dump
    variants = VariantOptions(timestep="turn", turn_rewards_col="turns", turn_ids_col="ids")
    got = gaecli.recompute_table(pq.read_table(path), gamma=GAMMA, lambd=LAMBD, variants=variants)
    new = [
        np.array(
            variant_oracle(
                rollouts.values[row],
                rollouts.rewards[row],
                rollouts.masks[row],
                rollouts.terminal[row],
                GAMMA,
                LAMBD,
                timestep="turn",
                turn_rewards=turns[row],
                turn_ids=ids[row],
            )[0]
        )
        for row in range(len(rollouts))
    ]
    assert_rows_close("advantages", new, got.column("advantages").to_pylist(), TOLERANCE["double"])
    diffed = gae("diff", path, "--gamma", GAMMA, "--lambd", LAMBD, "--baseline", "masked", *ID_FLAGS, "--json", "-")
    assert diffed.exit_code == 0, diffed.output
    old, _ = expected_rows(rollouts, None, None, {})
    largest = max((float(np.abs(a - b).max()) for a, b in zip(new, old) if a.size), default=0.0)
    assert json.loads(diffed.stdout)["summary"]["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-9)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--turn-ids-col", "ids"], "--turn-ids-col gives the turns of --timestep turn: set --timestep turn too"),
        (["--timestep", "turn", "--turn-ids-col", "nope"], "--turn-ids-col column 'nope' is missing"),
        (
            ["--timestep", "turn", "--turn-ids-col", "turns"],
            "double>, expected a list of integers",
        ),
        (["--timestep", "turn", "--turn-ids-col", "ids", "--kernel", "scan"], "kernel 'scan' does not support"),
        (["--timestep", "turn", "--turn-ids-col", "ids", "--turn-rewards-col", "ids"], "name one column twice"),
    ],
)
def test_refused_turn_id_options_exit_2(id_dump, tmp_path, flags, message):
    out_dir = tmp_path / "out"
    result = recompute([id_dump[0]], out_dir / "out.parquet", *flags)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert files_under(out_dir) == []
    diffed = gae("diff", id_dump[0], "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *flags)
    assert diffed.exit_code == 2 and message in diffed.stderr, diffed.output


# Each case: the ids of row 1 (mask [1, 1, 0, 1]), with turn rewards for two turns, and the
# rule and message the run stops with.
INVALID_TURN_IDS = [
    ([0, 0, -1], "[turn-ids-length]", "'ids' has 3 ids, the row has 4 tokens"),
    (None, "[turn-ids-null]", "the turn-ids list is null"),
    ([0, None, -1, 1], "[turn-ids-null]", "the turn-ids list holds a null"),
    ([0, -1, -1, 1], "[turn-ids-order]", "'ids' is -1 at trainable token 1"),
    ([1, 0, -1, 1], "[turn-ids-order]", "'ids' is 0 at trainable token 1"),
    ([0, 1, -1, 2], "[turn-rewards-length]", "'turns' has 2 rewards, the row has 3 turns"),
]


def invalid_turn_ids_file(tmp_path, ids):
    """Three rows whose turn ids are valid but row 1's (mask [1, 1, 0, 1], two turn rewards),
    which are ``ids``: column ``ids``, turn rewards ``turns``."""
    rollouts = random_rollouts(3, 1)
    rollouts.masks[1] = [1, 1, 0, 1]
    for column in (rollouts.values, rollouts.rewards):
        column[1] = [0.5, 0.25, 1.0, 2.0]
    all_ids = [[0 if keep else -1 for keep in mask] for mask in rollouts.masks]
    turns = [[0.5] * id_turn_count(mask, row) for mask, row in zip(rollouts.masks, all_ids)]
    all_ids[1] = ids
    turns[1] = [0.5, 1.5]
    extra = {"ids": pa.array(all_ids, pa.list_(pa.int64())), "turns": pa.array(turns, pa.list_(pa.float64()))}
    return write_table(rollout_table(rollouts, extra=extra), tmp_path / "in.parquet")


@pytest.mark.parametrize(
    "ids, rule, message", INVALID_TURN_IDS, ids=[case[1] + str(case[0]) for case in INVALID_TURN_IDS]
)
def test_invalid_turn_ids_stop_the_run_naming_file_row_and_column(tmp_path, ids, rule, message):
    path = invalid_turn_ids_file(tmp_path, ids)
    before = path.read_bytes()
    out_dir = tmp_path / "out"
    stopped = recompute([path], out_dir / "out.parquet", *ID_FLAGS)
    assert stopped.exit_code == 1, stopped.output
    lines = stopped.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], stopped.stderr
    column = "turns" if rule == "[turn-rewards-length]" else "ids"
    assert f"row 1, column '{column}'" in lines[0] and rule in lines[0] and message in lines[0], lines[0]
    assert files_under(out_dir) == [] and path.read_bytes() == before
    skipped = recompute([path], out_dir / "out.parquet", *ID_FLAGS, "--on-invalid", "skip")
    assert skipped.exit_code == 0, skipped.output
    assert pq.read_table(out_dir / "out.parquet").num_rows == 2


@pytest.mark.skipif(not {"reference", "native"} <= set(VARIANT_KERNELS), reason="needs numba")
@pytest.mark.parametrize("combination", TURN_ID_COMBINATIONS + [{"relative": True}], ids=lambda c: "+".join(c) or "ids")
def test_native_is_bitwise_the_reference_with_the_added_variants(combination):
    """float64 inside both, rounded once: the same bits, with turn ids or the relative-position λ (token mode)."""
    batch = make_batch(29, [0, 1, 2, 5, 40, 64, 9, 17], dtype=torch.float32)
    if combination.get("relative"):
        fields, data = dict(RELATIVE), random_bootstrap(len(batch), 4)
    else:
        fields = {key: value for key, value in combination.items() if key not in ("turn", "bootstrap")}
        fields["timestep"] = "turn"
        data = turn_id_data(batch, 9, combination.get("turn", False), combination.get("bootstrap", False))
    spec = AdvantageSpec(batch.gamma, batch.lambd, **fields)
    native = compute_advantages(*batch.args(), spec=spec, kernel="native", **data)
    reference = compute_advantages(*batch.args(), spec=spec, kernel="reference", **data)
    for want, have in zip(reference, native):
        for a, b in zip(want, have):
            assert torch.equal(a, b)


@pytest.mark.parametrize(
    "ids, rule, message", INVALID_TURN_IDS, ids=[case[1] + str(case[0]) for case in INVALID_TURN_IDS]
)
def test_validate_checks_turn_ids_by_the_rules_recompute_stops_on(tmp_path, ids, rule, message):
    """gae validate --turn-ids-col finds, in row 1 and its column, what recompute stops on (and
    may find more there: it does not stop at the first); no --timestep needed; the valid rows
    give nothing."""
    path = invalid_turn_ids_file(tmp_path, ids)
    before = path.read_bytes()
    result = gae("validate", path, "--turn-ids-col", "ids", "--turn-rewards-col", "turns", "--json", "-", "--quiet")
    assert result.exit_code == 1, result.output
    findings = [f for f in json.loads(result.stdout)["findings"] if f["severity"] == "error"]
    column = "turns" if rule == "[turn-rewards-length]" else "ids"
    found = [f for f in findings if f["code"] == rule[1:-1]]
    assert [(f["row"], f["column"]) for f in found] == [(1, column)] and message in found[0]["message"]
    assert {f["row"] for f in findings} == {1} and path.read_bytes() == before


def test_validate_passes_valid_turn_ids_and_refuses_a_missing_column(tmp_path):
    path = invalid_turn_ids_file(tmp_path, [0, 0, -1, 1])
    passed = gae("validate", path, "--turn-ids-col", "ids", "--turn-rewards-col", "turns", "--quiet")
    assert passed.exit_code == 0, passed.output
    missing = gae("validate", path, "--turn-ids-col", "nope", "--json", "-", "--quiet")
    assert missing.exit_code == 1, missing.output
    assert [(f["column"], f["code"]) for f in json.loads(missing.stdout)["findings"]] == [("nope", "missing-column")]
