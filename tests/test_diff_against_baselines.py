"""``gae diff --against COLUMN --baseline LIST`` and ``gae diff --list-baselines``: a stored
column written by verl's own loop (``helpers.ORACLES``, no gaecli code) compared in one pass
beside every trainer profile, the stored comparison first; each comparison the same bits as
a run with that side alone, its figures against numpy over the oracles' arrays (whitened
too, each side with its own statistics), the JSON, Markdown, HTML, per-sample and groups
outputs with several kinds of side, ``diff_table``; the names ``--baseline`` takes listed
with their descriptions (the block of docs/diff.md), and the refusals that remain."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.advantages.contract import ALIASES, MASKED, PROFILE_SUMMARIES, PROFILES

from rollout_files import Rollouts, gae
from test_diff import (
    assert_figures,
    assert_markdown_tables,
    expected_figures,
    outputs,
    perturbed_credit,
    rollouts,
    whiten_lists,
    write_data,
)

GAMMA, LAMBD = 0.9, 0.8
STORED, STORED_RETURNS = "trained", "trained_returns"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "diff.md"


def stored_columns(data) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """verl's advantages and returns from its own float64 loop, as the columns a trainer
    logged, and the arrays themselves."""
    advantages, returns = outputs("verl", data, GAMMA, LAMBD)
    columns = {
        STORED: pa.array([a.tolist() for a in advantages], pa.list_(pa.float64())),
        STORED_RETURNS: pa.array([r.tolist() for r in returns], pa.list_(pa.float64())),
    }
    return columns, advantages, returns


def run_diff(paths, *args, rows: Path | None = None) -> tuple[dict, list[dict]]:
    """The JSON document of one ``gae diff`` run and, with ``rows``, its per-sample rows."""
    written = ["--per-sample", rows, "--overwrite"] if rows is not None else []
    result = gae("diff", *paths, "--gamma", GAMMA, "--lambd", LAMBD, *written, "--json", "-", "--quiet", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), (pq.read_table(rows).to_pylist() if rows is not None else [])


@pytest.fixture
def dump(tmp_path):
    """Two files of rollouts with verl's advantages and returns stored beside them, the
    rollouts and stored arrays of both in input order."""
    parts = [rollouts(rows=23, seed=41), rollouts(rows=17, seed=42)]
    paths, stored, stored_returns = [], [], []
    for index, data in enumerate(parts):
        columns, advantages, returns = stored_columns(data)
        paths.append(write_data(tmp_path / "in", data, f"part-{index}.parquet", extra=columns))
        stored += advantages
        stored_returns += returns
    both = Rollouts(
        values=parts[0].values + parts[1].values,
        rewards=parts[0].rewards + parts[1].rewards,
        masks=parts[0].masks + parts[1].masks,
        terminal=parts[0].terminal + parts[1].terminal,
    )
    return paths, both, stored, stored_returns


STORED_OPTIONS = ("--against", STORED, "--against-returns", STORED_RETURNS)
COMMON = ("--group-by", "step", "--id-col", "sample_id", "--top", "4")


# ----------------------------------------------------------------------------- the sides, in order


def test_the_stored_column_first_then_every_profile(tmp_path, dump):
    paths, data, stored, stored_returns = dump
    document, rows = run_diff(
        paths, *STORED_OPTIONS, "--baseline", "all", *COMMON, "--workers", "2", rows=tmp_path / "rows.parquet"
    )
    names = [comparison["name"] for comparison in document["comparisons"]]
    assert names == [STORED, *PROFILES] and len(names) == 1 + 7
    assert [comparison["summary"]["baseline"] for comparison in document["comparisons"]] == [None, *PROFILES]
    assert document["old"] == {
        "source": "stored",
        "baseline": None,
        "advantages_column": STORED,
        "returns_column": STORED_RETURNS,
    }
    first = document["comparisons"][0]
    assert document["summary"] == first["summary"] and document["top_samples"] == first["top_samples"]

    # the stored comparison against numpy over the oracles' arrays (masked GAE and verl's loop)
    new, new_returns = outputs("masked", data, GAMMA, LAMBD)
    stored_summary = first["summary"]
    assert_figures(stored_summary, expected_figures(data, new, stored, new_returns, stored_returns, credits=None))
    largest = max(
        float(np.max(np.abs(a - b)[np.asarray(mask, dtype=bool)])) for a, b, mask in zip(new, stored, data.masks)
        if any(mask)
    )  # fmt: skip
    assert stored_summary["max_abs_delta_advantage"] == pytest.approx(largest, rel=1e-12)
    assert stored_summary["mean_terminal_credit"] is None and stored_summary["lost_terminal_samples"] is None
    # the same old advantages give the same figures: the verl column matches the stored one
    verl = document["comparisons"][1 + PROFILES.index("verl")]["summary"]
    for key in ("max_abs_delta_advantage", "mean_abs_delta_advantage", "changed_samples", "sign_flip_tokens"):
        assert verl[key] == pytest.approx(stored_summary[key], rel=1e-9), key
    assert stored_summary["max_abs_delta_advantage"] > 0.0  # verl is not the contract on these rows

    # every comparison: the bits of a run with that side alone (one file at a time, one worker)
    one = (*COMMON, "--workers", "1")
    alone = {STORED: run_diff(paths, *STORED_OPTIONS, *one, rows=tmp_path / "alone.parquet")}
    for profile in PROFILES:
        alone[profile] = run_diff(paths, "--baseline", profile, *one, rows=tmp_path / "alone.parquet")
    for index, name in enumerate(names):
        separate, separate_rows = alone[name]
        assert document["comparisons"][index] == separate["comparisons"][0], name
        assert [record for record in rows if record["comparison"] == name] == separate_rows, name

    # per sample: every comparison of a sample in the order given, the stored one's max |Δ| by numpy
    assert len(rows) == len(data) * len(names)
    assert [record["comparison"] for record in rows[: len(names)]] == names
    mine = rows[:: len(names)]
    for record, a, b, mask in zip(mine, new, stored, data.masks):
        trainable = np.asarray(mask, dtype=bool)
        want = float(np.max(np.abs(a - b)[trainable])) if trainable.any() else 0.0
        assert record["max_abs_delta_advantage"] == pytest.approx(want, rel=1e-12, abs=1e-15)
        assert record["terminal_credit"] is None and record["lost_terminal"] is None


def test_against_alone_and_a_list_beside_it(tmp_path, dump):
    paths, data, stored, _ = dump
    document, _ = run_diff(paths, "--against", STORED, "--baseline", "openrlhf,skip-masked")
    assert [comparison["name"] for comparison in document["comparisons"]] == [STORED, "openrlhf", "skip-masked"]
    assert document["comparisons"][0]["summary"]["max_abs_delta_return"] is None  # no --against-returns
    assert document["comparisons"][1]["summary"]["max_abs_delta_return"] is not None
    alone, _ = run_diff(paths, "--against", STORED)
    assert [comparison["name"] for comparison in alone["comparisons"]] == [STORED]  # no default baseline added
    assert alone["comparisons"][0] == document["comparisons"][0]


def test_normalize_whitens_each_side_with_its_own_statistics(tmp_path, dump):
    paths, data, stored, stored_returns = dump
    steps = [row % 4 for row in range(23)] + [row % 4 for row in range(17)]
    new, new_returns = outputs("masked", data, GAMMA, LAMBD)
    for option, groups in ((("--normalize",), None), (("--normalize-by", "step"), steps)):
        document, _ = run_diff(paths, *STORED_OPTIONS, "--baseline", "openrlhf,slime", *option)
        names = [comparison["name"] for comparison in document["comparisons"]]
        assert names == [STORED, "openrlhf", "slime"]
        white_new = whiten_lists(new, data.masks, groups)
        for comparison, name in zip(document["comparisons"], names):
            if name == STORED:
                old, old_returns, credits = stored, stored_returns, None
            else:
                (old, old_returns), credits = (
                    outputs(name, data, GAMMA, LAMBD),
                    perturbed_credit(name, data, GAMMA, LAMBD),
                )
            white_old = whiten_lists(old, data.masks, groups)
            expected = expected_figures(data, white_new, white_old, new_returns, old_returns, credits)
            assert_figures(comparison["summary"], expected, exact_tol=1e-7)
            if groups is None:
                assert comparison["summary"]["old_advantage_std"] == pytest.approx(1.0, abs=1e-6), name
            separate_args = STORED_OPTIONS if name == STORED else ("--baseline", name)
            separate, _ = run_diff(paths, *separate_args, *option)
            assert comparison == separate["comparisons"][0], (option, name)


# ----------------------------------------------------------------------------- the reports


def test_reports_show_the_stored_column_beside_the_profiles(tmp_path, dump):
    paths, *_ = dump
    markdown, page, groups = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "groups.parquet"
    result = gae(
        "diff", *paths, "--gamma", GAMMA, "--lambd", LAMBD, *STORED_OPTIONS, "--baseline", "verl,openrlhf",
        "--group-by", "step", "--groups-out", groups, "--markdown", markdown, "--html", page,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    names = [STORED, "verl", "openrlhf"]
    text = markdown.read_text()
    assert "| figure | trained | verl | openrlhf |" in text
    assert assert_markdown_tables(text) == 1 + 3 * 2  # the summary, then top samples and groups per comparison
    for name in names:
        assert f"## Top samples by max |Δ advantage| — against {name}" in text
        assert f"## By `step` — against {name}" in text
    headline = "stored column 'trained', returns 'trained_returns' and the baselines verl, openrlhf"
    assert headline in text and headline in " ".join(result.stderr.split())
    verdict = re.compile(
        r"Of 40 samples, \d+ changed against trained, \d+ against verl, \d+ against openrlhf; the most "
    )
    assert verdict.search(text), text.splitlines()[2]  # the verdict names each comparison
    credit = next(line for line in text.splitlines() if line.startswith("| ↳ old terminal credit"))
    assert credit.split("|")[2].strip().startswith("—")  # not defined for the stored column, defined for the rest
    assert all(cell.strip()[0].isdigit() for cell in credit.split("|")[3:5])
    html_text = page.read_text()
    assert "<th>trained</th><th>verl</th><th>openrlhf</th>" in html_text
    assert len(re.findall(r'src="data:image/png;base64,', html_text)) == 3 * 4  # per comparison: 4 plots
    table = pq.read_table(groups)
    assert list(dict.fromkeys(table.column("comparison").to_pylist())) == names
    assert table.num_rows == 3 * 4  # 4 steps per comparison


def test_the_summary_rows_a_stored_column_lacks_stay_in_place(dump):
    from gaecli.report import summary_table

    paths, *_ = dump
    document, _ = run_diff(paths, "--against", STORED, "--baseline", "verl")  # no stored returns
    headers, rows = summary_table(document)
    assert headers == ["figure", STORED, "verl"]
    labels = [row[0] for row in rows]
    spread = labels.index("|Δ return| mean / median / p99 / max")
    assert rows[spread][1:] == ["—", rows[spread][2]] and rows[spread][2][0].isdigit()  # no old returns
    assert labels[spread + 1].startswith("  ÷ σ") and rows[spread + 1][1] == "—"  # under its own row, not last
    credit = labels.index("  old terminal credit (mean / min)")
    assert labels[credit + 1] == "  tails that kept none of the terminal reward" and rows[credit + 1][1] == "—"
    assert labels[-2:] == ["fully masked samples", "empty samples"]


def test_diff_table_takes_both(tmp_path, dump):
    import gaecli
    from gaecli.diff import DiffOptions, diff_files

    paths, *_ = dump
    options = dict(gamma=GAMMA, lambd=LAMBD, against=STORED, against_returns=STORED_RETURNS, baseline="verl,roll")
    assert [side.name for side in DiffOptions(**options).sides] == [STORED, "verl", "roll"]
    assert [side.kind for side in DiffOptions(**options).sides] == ["stored", "baseline", "baseline"]
    from_file = diff_files([paths[0]], DiffOptions(**options)).to_dict()
    from_table = gaecli.diff_table(pq.read_table(paths[0]), **options).to_dict()
    assert [c["summary"] for c in from_table["comparisons"]] == [c["summary"] for c in from_file["comparisons"]]


# ----------------------------------------------------------------------------- --list-baselines


def listed_names(text: str) -> list[tuple[str, str]]:
    """The GAE baselines listed: the lines before the estimators' profiles (after a blank line)."""
    return [tuple(line.split(None, 1)) for line in text.split("\n\n", 1)[0].splitlines()]


def test_list_baselines_names_every_profile_and_alias():
    result = gae("diff", "--list-baselines")  # no INPUT, no --gamma
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = listed_names(result.stdout)
    names = [name for name, _ in lines]
    assert names == [*PROFILES, *ALIASES, MASKED, "all"] and len(PROFILES) == 7 and len(ALIASES) == 3
    descriptions = dict(lines)
    assert all(descriptions[profile] == PROFILE_SUMMARIES[profile] for profile in PROFILES)
    assert all(descriptions[alias].startswith(f"= {profile},") for alias, profile in ALIASES.items())
    assert all(profile in descriptions["all"] for profile in PROFILES)
    assert tuple(PROFILE_SUMMARIES) == PROFILES
    # the block of docs/diff.md is the command's output
    page = DOCS.read_text()
    block = page.split("### Listing the baselines", 1)[1].split("```\n", 2)[1]
    assert block == result.stdout


def test_list_baselines_is_eager_and_diff_still_needs_an_input(tmp_path):
    assert gae("diff", "--gamma", "2", "--list-baselines").exit_code == 0  # before any other option is checked
    missing = gae("diff")
    assert missing.exit_code == 2 and "Missing argument" in missing.output


# ----------------------------------------------------------------------------- what stays refused


def test_refusals(tmp_path):
    data = rollouts(rows=8, seed=1)
    columns, _, _ = stored_columns(data)
    path = write_data(tmp_path, data, extra={**columns, "verl": columns[STORED]})

    def run(*args):
        return gae("diff", path, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", *args)

    for args in (
        ("--old-estimator", "gae", "--against", STORED),
        ("--against", STORED, "--old-estimator", "gae", "--baseline", "verl"),
    ):
        result = run(*args)
        assert result.exit_code == 2 and "each choose the old advantages" in result.stderr, result.output
        assert "--old-estimator" in result.stderr and "give one of them" in result.stderr
    result = run("--against", "verl", "--baseline", "all")
    assert result.exit_code == 2 and "--against column 'verl' has the name of a baseline" in result.stderr
    assert run("--against", "verl", "--baseline", "skip-masked").exit_code == 0  # told apart by name
    result = run("--baseline", "verl", "--against-returns", STORED_RETURNS)
    assert result.exit_code == 2 and "needs --against" in result.stderr
    grpo = ("--estimator", "grpo", "--group-col", "step", "--against", STORED)
    assert gae("diff", path, "--quiet", *grpo).exit_code == 0  # a critic-free new side against the stored column
    assert gae("diff", path, "--quiet", *grpo, "--baseline", "verl").exit_code == 0  # grpo has verl's profile
    opo = ("--estimator", "opo", "--group-col", "step", "--against", STORED, "--baseline", "verl")
    result = gae("diff", path, "--quiet", *opo)
    assert result.exit_code == 2 and "opo has no trainer profiles" in result.stderr, result.output
