"""gae identify with ``--truncated-col`` / ``--bootstrap-col``: a dump whose stored advantages
are AReaL's own loop with its no-EOS bootstrap (tests/trainer_loops_more.py's
``areal_dump_row``, whitened or not as verl whitens) is named the ``areal`` profile exactly, γ
and λ recovered, with the two columns, and explained by nothing without them; the columns are
checked as ``gae diff`` checks them (exit 1 naming file, row and column; exit 2 for the
options)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_identify import _names, _whitened
from trainer_loops_more import areal_dump_row

from gaecli.identify import IdentifyOptions, identify_files, identify_table

from rollout_files import gae

ROWS = 96
TRUNCATION = ("--truncated-col", "cut", "--bootstrap-col", "boot")


def _rows(seed: int) -> list[dict]:
    """Rows of 4–30 tokens: a tool block inside most (a masked run between trainable tokens),
    every third row ending in one, row 9 fully masked; values, small rewards, a 0/1 outcome.
    Every eighth row (1, 9, 17...) is truncated with a bootstrap value 0.5–3 away from 0 (it
    moves its row's last trainable step beyond any tolerance); the others are not, their
    bootstrap value null (not read)."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(ROWS):
        n = int(rng.integers(5, 30))
        mask = np.ones(n, dtype=np.int64)
        if rng.random() < 0.7:
            start = int(rng.integers(1, n - 2))
            mask[start : int(rng.integers(start + 1, n - 1))] = 0
        if index % 3 == 0:
            mask[int(rng.integers(2, n)) :] = 0
        if index == 9:
            mask[:] = 0
        cut = index % 8 == 1
        boot = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 3.0)) if cut else None
        rows.append(
            {
                "values": [float(x) for x in rng.normal(size=n)],
                "rewards": [float(x) for x in rng.normal(size=n) * 0.1],
                "loss_mask": mask.tolist(),
                "terminal_reward": float(rng.choice([0.0, 1.0])),
                "cut": cut,
                "boot": boot,
            }
        )
    shapes = {("fully masked" if not any(r["loss_mask"]) else "masked tail" if not r["loss_mask"][-1] else
               "trainable end") for r in rows if r["cut"]}  # fmt: skip
    assert shapes == {"fully masked", "masked tail", "trainable end"}
    assert any(0 in r["loss_mask"][:-1] and r["loss_mask"][-1] for r in rows if r["cut"])  # a tool block inside
    return rows


def _areal(rows, gamma: float, lambd: float, whitened: bool) -> list[list[float]]:
    """AReaL's loop with its bootstrap on every row, whitened over the batch's trainable tokens
    as verl's masked_whiten does (what AReaL's advantage normalisation computes) where asked."""
    advantages = [
        areal_dump_row(r["values"], r["rewards"], r["loss_mask"], r["terminal_reward"], r["cut"], r["boot"] or 0.0,
                       gamma, lambd)[0]
        for r in rows
    ]  # fmt: skip
    return _whitened(advantages, [r["loss_mask"] for r in rows]) if whitened else advantages


def _table(rows, advantages, flag_type=None) -> pa.Table:
    """The rows with the stored ``advantages``, the flag ``cut`` (bool, or of ``flag_type``) and ``boot``."""
    columns = {name: [r[name] for r in rows] for name in ("values", "rewards", "loss_mask", "terminal_reward")}
    columns["advantages"] = [[float(a) for a in row] for row in advantages]
    flags = [r["cut"] if flag_type is None else int(r["cut"]) for r in rows]
    columns["cut"] = pa.array(flags, flag_type or pa.bool_())
    columns["boot"] = pa.array([r["boot"] for r in rows], pa.float64())
    return pa.table(columns)


def _identify(path, *options) -> dict:
    result = gae("identify", path, "--json", "-", "--quiet", *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("whitened", [False, True], ids=["raw", "whitened"])
def test_areal_s_bootstrap_is_named_with_the_two_columns(tmp_path, whitened):
    gamma, lambd = (0.93, 0.81) if whitened else (0.97, 0.88)
    rows = _rows(11 if whitened else 12)
    path = tmp_path / "areal.parquet"
    pq.write_table(_table(rows, _areal(rows, gamma, lambd, whitened), pa.int8()), path)  # a 0/1 integer flag
    document = _identify(path, *TRUNCATION, "--batch-rows", 7)  # the rows read across batches
    best = document["candidates"][0]
    assert document["explained"] is True, document["verdict"]
    assert _names(best) == {"areal"}  # verl's loop is AReaL's without the bootstrap: it no longer ties
    assert best["members"][0]["variants"] == ["truncated", "bootstrap_values"]
    assert abs(best["gamma"] - gamma) <= 1e-3 and abs(best["lambd"] - lambd) <= 1e-3
    assert best["normalization"] == ("batch" if whitened else "none")
    assert best["share_reproduced"] == 1.0 and best["max_abs_residual"] <= 1e-6
    if whitened:
        assert best["whitening"]["over"] == "trainable"
    assert document["masked_positions"]["share_like_best"] == 1.0  # every position is AReaL's
    assert document["verdict"].startswith("computed like areal (")
    # no other candidate reads the columns: verl's is the zero bootstrap and explains nothing
    verl = next(c for c in document["candidates"] if "verl" in _names(c))
    assert verl["explains"] is False and "variants" not in verl["members"][0]

    # without the columns the areal profile is the zero bootstrap: every truncated row with a
    # trainable token breaks, the others are reproduced (γ and λ still fitted on them)
    document = _identify(path)
    best = document["candidates"][0]
    assert document["explained"] is False, document["verdict"]
    assert {"verl", "areal"} <= _names(best) and "variants" not in best["members"][0]
    samples = [r for r in rows if any(r["loss_mask"])]
    cut = sum(r["cut"] for r in samples)
    assert cut == 11 and best["samples"] == len(samples)
    assert best["samples_reproduced"] == len(samples) - cut
    assert abs(best["gamma"] - gamma) <= 1e-3 and abs(best["lambd"] - lambd) <= 1e-3
    broken = best["first_break"]["where"]
    assert broken == f"{path} row 1" and rows[1]["cut"], broken
    assert document["verdict"].startswith("nothing gaecli knows explains 'advantages': the closest is verl or areal")


def test_rows_not_truncated_read_no_bootstrap():
    # the same columns on a dump truncated nowhere: areal is verl's loop again, the two tie
    rows = _rows(13)
    for r in rows:
        r["cut"], r["boot"] = False, None
    table = _table(rows, _areal(rows, 0.99, 0.9, whitened=False))
    document = identify_table(table, truncated_col="cut", bootstrap_col="boot").to_dict()
    best = document["candidates"][0]
    assert document["explained"] and _names(best) == {"verl", "areal"}, document["verdict"]


def test_the_python_side_takes_the_two_columns(tmp_path):
    rows = _rows(14)
    table = _table(rows, _areal(rows, 1.0, 0.95, whitened=True))
    pq.write_table(table, tmp_path / "areal.parquet")
    options = {"truncated_col": "cut", "bootstrap_col": "boot"}
    reports = (identify_table(table, **options), identify_files([tmp_path], IdentifyOptions(**options)))
    for report in reports:
        document = report.to_dict()
        best = document["candidates"][0]
        assert document["explained"] and _names(best) == {"areal"}, document["verdict"]
        assert best["normalization"] == "batch" and best["whitening"]["over"] == "trainable"
    assert identify_table(table).to_dict()["explained"] is False


def _bad_flag(rows, row):
    rows[row]["cut"] = 2


def _nan_bootstrap(rows, row):
    rows[row]["cut"], rows[row]["boot"] = 1, float("nan")


@pytest.mark.parametrize(
    "change, column, words",
    [
        (_bad_flag, "cut", "the truncated flag is 2, not 0 or 1 [truncated-value]"),
        (_nan_bootstrap, "boot", "the row is truncated but 'boot' is nan [bootstrap-invalid]"),
    ],
    ids=["a flag of 2", "a NaN bootstrap"],
)
def test_an_invalid_truncation_column_stops_with_file_row_and_column(tmp_path, change, column, words):
    rows = _rows(15)
    for r in rows:
        r["cut"] = int(r["cut"])
    change(rows, 12)  # in the fifth batch of three rows
    path = tmp_path / "areal.parquet"
    pq.write_table(_table(rows, [[0.0] * len(r["loss_mask"]) for r in rows], pa.int64()), path)
    out = tmp_path / "report.json"
    result = gae("identify", path, *TRUNCATION, "--batch-rows", 3, "--json", out)
    assert result.exit_code == 1, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"{path}, row 12, column '{column}': {words}" in message, message
    assert not out.exists()


@pytest.mark.parametrize(
    "options, words",
    [
        (("--truncated-col", "cut"), "--truncated-col and --bootstrap-col go together"),
        (("--truncated-col", "nope", "--bootstrap-col", "boot"), "--truncated-col column 'nope' is missing"),
        (("--truncated-col", "boot", "--bootstrap-col", "cut"), "--truncated-col column 'boot' is double"),
    ],
    ids=["alone", "missing", "a float flag"],
)
def test_refused_truncation_options_exit_2(tmp_path, options, words):
    rows = _rows(16)
    path = tmp_path / "areal.parquet"
    pq.write_table(_table(rows, [[0.0] * len(r["loss_mask"]) for r in rows]), path)
    result = gae("identify", path, *options)
    assert result.exit_code == 2 and words in result.stderr, result.output
