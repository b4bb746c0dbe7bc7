"""The GAE variants on the command line: ``gae recompute`` and ``gae diff`` (new side only)
with ``--timestep``, ``--lambd-critic``, ``--lambd-alpha``, ``--turn-rewards-col``,
``--truncated-col`` / ``--bootstrap-col``, held against the independent float64 loop
(:func:`helpers.variant_oracle`); the metadata and ``--skip-existing``; invalid per-row
columns (exit 1, the rejects file with ``--on-invalid skip``, ``gae validate``'s rules);
refused options (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.advantages.layout import turn_table

from helpers import spec_document, variant_oracle
from rollout_files import TOLERANCE, assert_rows_close, files_under, gae, random_rollouts, rollout_table, write_table

GAMMA, LAMBD = 0.9, 0.8
ROWS = 30
ROW_INPUT_FLAGS = ["--turn-rewards-col", "turns", "--truncated-col", "cut", "--bootstrap-col", "boot"]
ROW_INPUT_FIELDS = {"turn_rewards": "turns", "truncated": "cut", "bootstrap_values": "boot"}  # the spec of those flags
VARIANT_FLAGS = ["--timestep", "turn", "--lambd-alpha", "0.05", "--lambd-critic", "1", *ROW_INPUT_FLAGS]


def turn_counts(masks) -> list[int]:
    return [int(np.diff(turn_table(np.array(m, dtype=bool), np.array([0, len(m)]))[2])[0]) for m in masks]


@pytest.fixture
def dump(tmp_path):
    """A float64 dump with a turn-rewards list (one per turn), a truncated flag and a
    bootstrap value per row (null where not truncated)."""
    rollouts = random_rollouts(ROWS, 4)
    rng = np.random.default_rng(1)
    turns = [[round(float(x), 2) for x in rng.normal(0.0, 1.0, count)] for count in turn_counts(rollouts.masks)]
    cut = [row % 3 == 0 for row in range(ROWS)]
    boot = [round(float(row) / 7.0, 3) if flag else None for row, flag in enumerate(cut)]
    extra = {
        "turns": pa.array(turns, pa.list_(pa.float64())),
        "cut": pa.array(cut, pa.bool_()),
        "boot": pa.array(boot, pa.float64()),
    }
    path = write_table(rollout_table(rollouts, float_type=pa.float64(), extra=extra), tmp_path / "in.parquet")
    return path, rollouts, turns, cut, boot


def expected_rows(rollouts, turns, cut, boot, **fields):
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
            turn_rewards=turns[row] if turns is not None else None,
            truncated=cut[row] if cut is not None else False,
            bootstrap=boot[row] if cut is not None and cut[row] else 0.0,
        )
        advantages.append(np.array(a))
        returns.append(np.array(r))
    return advantages, returns


def recompute(inputs, output, *options):
    return gae("recompute", *inputs, "-o", output, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *options)


def test_recompute_with_every_variant_matches_the_float64_loop(dump, tmp_path):
    path, rollouts, turns, cut, boot = dump
    out = tmp_path / "out.parquet"
    result = recompute([path], out, *VARIANT_FLAGS)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    fields = {"timestep": "turn", "lambd_alpha": 0.05, "lambd_critic": 1.0}
    advantages, returns = expected_rows(rollouts, turns, cut, boot, **fields)
    assert_rows_close("advantages", advantages, table.column("advantages").to_pylist(), TOLERANCE["double"])
    assert_rows_close("returns", returns, table.column("returns").to_pylist(), TOLERANCE["double"])
    spec = json.loads(table.schema.metadata[b"gaecli.spec"])
    assert spec == spec_document(GAMMA, LAMBD, timestep="turn", lambd_critic=1.0, lambd_alpha=0.05, **ROW_INPUT_FIELDS)


@pytest.mark.parametrize(
    "flags, fields, inputs",
    [
        (["--lambd-critic", "0.3"], {"lambd_critic": 0.3}, ()),
        (["--lambd-alpha", "0.1"], {"lambd_alpha": 0.1}, ()),
        (["--turn-rewards-col", "turns"], {}, ("turns",)),
        (["--truncated-col", "cut", "--bootstrap-col", "boot"], {}, ("cut",)),
        (["--timestep", "turn"], {"timestep": "turn"}, ()),
    ],
)
def test_each_flag_alone(dump, tmp_path, flags, fields, inputs):
    path, rollouts, turns, cut, boot = dump
    out = tmp_path / "out.parquet"
    result = recompute([path], out, *flags)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    advantages, returns = expected_rows(
        rollouts, turns if "turns" in inputs else None, cut if "cut" in inputs else None, boot, **fields
    )
    assert_rows_close("advantages", advantages, table.column("advantages").to_pylist(), TOLERANCE["double"])
    assert_rows_close("returns", returns, table.column("returns").to_pylist(), TOLERANCE["double"])


def test_skip_existing_takes_an_output_of_another_spec_as_not_done(dump, tmp_path):
    path = dump[0]
    out = tmp_path / "out.parquet"
    assert recompute([path], out, "--lambd-alpha", "0.05").exit_code == 0
    same = recompute([path], out, "--lambd-alpha", "0.05", "--skip-existing", "--json", "-")
    assert same.exit_code == 0 and json.loads(same.stdout)["files"][0]["skipped"] is True
    other = recompute([path], out, "--lambd-alpha", "0.5", "--skip-existing")
    assert other.exit_code == 2
    assert "written with spec.lambd_alpha 0.05, not 0.5" in other.stderr
    plain = recompute([path], out, "--skip-existing")
    assert plain.exit_code == 2 and "spec.lambd_alpha 0.05, not null" in plain.stderr


def test_diff_shapes_the_new_side_only(dump):
    path, rollouts, turns, cut, boot = dump

    def diff(*flags):
        result = gae("diff", path, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--json", "-", *flags)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["summary"]

    # decoupled λ changes the returns only: the advantages equal the plain contract's
    assert diff("--baseline", "masked", "--lambd-critic", "0.3")["max_abs_delta_advantage"] == 0.0
    summary = diff("--baseline", "masked", "--timestep", "turn", "--turn-rewards-col", "turns")
    new, _ = expected_rows(rollouts, turns, None, boot, timestep="turn")
    old, _ = expected_rows(rollouts, None, None, boot)
    largest = max((float(np.abs(a - b).max()) for a, b in zip(new, old) if a.size), default=0.0)
    assert summary["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-9)


def test_invalid_turn_lists_and_bootstraps_stop_the_run_or_go_to_the_rejects_file(tmp_path):
    rollouts = random_rollouts(6, 2)
    counts = turn_counts(rollouts.masks)
    turns = [[0.5] * count for count in counts]
    bad_row = next(row for row, count in enumerate(counts) if count > 0)
    turns[bad_row] = turns[bad_row] + [1.0]  # one reward too many
    cut = [False] * 6
    cut[5] = True
    boot = [0.0] * 5 + [float("nan")]
    extra = {
        "turns": pa.array(turns, pa.list_(pa.float64())),
        "cut": pa.array(cut),
        "boot": pa.array(boot, pa.float64()),
    }
    path = write_table(rollout_table(rollouts, extra=extra), tmp_path / "in.parquet")
    out_dir = tmp_path / "out"
    flags = ["--turn-rewards-col", "turns", "--truncated-col", "cut", "--bootstrap-col", "boot"]
    stopped = recompute([path], out_dir / "out.parquet", *flags)
    assert stopped.exit_code == 1
    assert f"row {bad_row}, column 'turns'" in stopped.stderr and "[turn-rewards-length]" in stopped.stderr
    assert files_under(out_dir) == []
    skipped = recompute([path], out_dir / "out.parquet", *flags, "--on-invalid", "skip")
    assert skipped.exit_code == 0, skipped.output
    rejects = pq.read_table(out_dir / "out.rejected.parquet")
    reasons = rejects.column("reason").to_pylist()
    assert len(reasons) == 2 and "[turn-rewards-length]" in reasons[0] and "[bootstrap-invalid]" in reasons[1]
    assert pq.read_table(out_dir / "out.parquet").num_rows == 4


def test_validate_reports_the_variant_rules(tmp_path):
    rollouts = random_rollouts(4, 3)
    counts = turn_counts(rollouts.masks)
    turns = [[0.0] * count for count in counts]
    rows = [row for row, count in enumerate(counts) if count > 0]
    turns[rows[0]] = None
    turns[rows[1]] = [float("inf")] + [0.0] * (counts[rows[1]] - 1)
    extra = {
        "turns": pa.array(turns, pa.list_(pa.float64())),
        "cut": pa.array([None, False, True, False], pa.bool_()),
        "boot": pa.array([0.0, 0.0, None, 0.0], pa.float64()),
    }
    path = write_table(rollout_table(rollouts, extra=extra), tmp_path / "in.parquet")
    result = gae("validate", path, "--json", "-", "--quiet", *ROW_INPUT_FLAGS)
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    found = {(f["row"], f["column"], f["code"]) for f in document["findings"]}
    assert {
        (rows[0], "turns", "turn-rewards-null"),
        (rows[1], "turns", "turn-rewards-non-finite"),
        (0, "cut", "truncated-null"),
        (2, "boot", "bootstrap-invalid"),
    } <= found
    assert document["counts"]["turn-rewards-length"] == 0
    missing = gae("validate", path, "--json", "-", "--quiet", "--turn-rewards-col", "nope")
    codes = [(f["column"], f["code"]) for f in json.loads(missing.stdout)["findings"]]
    assert missing.exit_code == 1 and ("nope", "missing-column") in codes


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kernel", "scan", "--lambd-critic", "1"], "kernel 'scan' does not support lambd_critic"),
        (["--kernel", "chunked", "--timestep", "turn"], "kernel 'chunked' does not support timestep:turn"),
        (["--lambd-alpha", "0"], "--lambd-alpha must be > 0"),
        (["--lambd-alpha", "nan"], "--lambd-alpha must be a finite number"),
        (["--lambd-critic", "1.5"], "--lambd-critic must be in [0, 1]"),
        (["--timestep", "step"], "--timestep: unknown timestep 'step'"),
        (["--truncated-col", "cut"], "--truncated-col and --bootstrap-col go together"),
        (["--turn-rewards-col", "nope"], "--turn-rewards-col column 'nope' is missing"),
        (["--turn-rewards-col", "cut"], "--turn-rewards-col column 'cut' is bool, expected a list of float or int"),
    ],
)
def test_refused_options_exit_2(dump, tmp_path, flags, message):
    out_dir = tmp_path / "out"
    result = recompute([dump[0]], out_dir / "out.parquet", *flags)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert files_under(out_dir) == []
    diffed = gae("diff", dump[0], "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *flags)
    assert diffed.exit_code == 2 and message in diffed.stderr, diffed.output


def test_help_lists_the_variant_flags_once_for_both_commands():
    for command in ("recompute", "diff"):
        text = gae(command, "--help").output
        for flag in ("--lambd-critic", "--lambd-alpha", "--turn-rewards-col", "--timestep", "--truncated-col"):
            assert flag in text
    sources = Path(__file__).parent.joinpath("..", "gaecli", "cli").glob("*.py")
    assert sum(source.read_text().count('"--lambd-critic"') for source in sources) == 1  # the flag is declared once


def test_reference_and_native_write_the_same_bits_whatever_the_batch_size(dump, tmp_path):
    path = dump[0]
    tables = []
    for kernel, rows in (("reference", "7"), ("native", "256"), ("native", "3")):
        out = tmp_path / f"{kernel}-{rows}.parquet"
        result = recompute([path], out, *VARIANT_FLAGS, "--kernel", kernel, "--batch-rows", rows)
        assert result.exit_code == 0, result.output
        tables.append(pq.read_table(out))
    for column in ("advantages", "returns"):
        assert tables[0].column(column).equals(tables[1].column(column)), column
        assert tables[1].column(column).equals(tables[2].column(column)), column


def test_normalize_whitens_the_variant_advantages(dump, tmp_path):
    """The statistics pass reads the variants' columns too; the whitened advantages are the
    oracle's, whitened over every trainable token (mean, Bessel variance, ε = 1e-8)."""
    path, rollouts, turns, cut, boot = dump
    out = tmp_path / "out.parquet"
    flags = ["--timestep", "turn", "--turn-rewards-col", "turns", "--truncated-col", "cut", "--bootstrap-col", "boot"]
    result = recompute([path], out, "--normalize", *flags)
    assert result.exit_code == 0, result.output
    advantages, _ = expected_rows(rollouts, turns, cut, boot, timestep="turn")
    trainable = np.concatenate([np.array(m, dtype=bool) for m in rollouts.masks])
    flat = np.concatenate(advantages)
    picked = flat[trainable]
    whitened = np.where(trainable, (flat - picked.mean()) / np.sqrt(picked.var(ddof=1) + 1e-8), 0.0)
    got = np.concatenate([np.array(row) for row in pq.read_table(out).column("advantages").to_pylist()])
    assert np.allclose(got, whitened, atol=1e-9)
