"""``gae diff --baseline LIST`` and ``gae recompute --baseline``: the old sides chosen (an
``--old-estimator`` alone), the ``comparisons`` of the JSON in the order given with the top
level mirroring the first, every profile's figures, terminal credit and lost terminal
rewards against the trainers' own float64 loops (``helpers.ORACLES``), a list bitwise equal
to separate runs on every engine, the per-sample rows per comparison, the side-by-side
reports, and recompute's baseline columns (a stored column beside the profiles:
test_diff_against_baselines.py)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.advantages.contract import PROFILES
from gaecli.advantages.spec import AdvantageSpec

from helpers import ORACLES, spec_document
from rollout_files import Rollouts, gae, rollout_table, rollouts_from_table, write_table
from test_diff import (
    assert_figures,
    assert_markdown_tables,
    diff_json,
    expected_figures,
    masked_tail_rollouts,
    outputs,
    perturbed_credit,
    rollouts,
    write_data,
)

# γλ = 0.72: a tail of 30 masked tokens still passes 5e-5 of z, so "z reaches no trainable
# token" is told by an exact comparison of the loops' outputs.
GAMMA, LAMBD = 0.9, 0.8
COMPARISON_KEYS = {"name", "summary", "top_samples", "groups"}


def lost_by_perturbation(semantics: str, data: Rollouts, gamma: float, lambd: float) -> list[bool]:
    """Whether z reaches no trainable token, measured on the trainer's loop: no trainable
    advantage moves when z moves (an empty sample: lost when z ≠ 0)."""
    lost = []
    for values, rewards, mask, terminal in zip(data.values, data.rewards, data.masks, data.terminal):
        if not mask:
            lost.append(terminal != 0.0)
            continue
        plain = ORACLES[semantics](values, rewards, mask, terminal, gamma, lambd)[0]
        bumped = ORACLES[semantics](values, rewards, mask, terminal + 1.0, gamma, lambd)[0]
        lost.append(all(plain[t] == bumped[t] for t, m in enumerate(mask) if m))
    return lost


# ----------------------------------------------------------------------------- choosing the sides


def test_the_old_sides_chosen(tmp_path):
    data = rollouts(rows=8, seed=1)
    path = write_data(tmp_path, data, extra={"trained": pa.array([[0.0] * len(m) for m in data.masks])})

    def run(*args):
        return gae("diff", path, "--gamma", 1, "--lambd", 1, "--quiet", *args)

    result = run("--old-estimator", "gae", "--against", "trained")
    assert result.exit_code == 2 and "each choose the old advantages" in result.stderr, result.output
    profiles = run("--baseline", "verl", "--old-estimator", "gae", "--json", "-")  # GAE's profiles, as --baseline alone
    assert profiles.exit_code == 0 and json.loads(profiles.stdout) == json.loads(
        run("--baseline", "verl", "--json", "-").stdout
    )
    for text, message in (
        ("unmasked,slime", "which name the same profile"),
        ("verl,verl", "'verl' twice"),
        ("all,skip-masked", "which name the same profile"),
        ("verl,,slime", "empty name"),
        ("verl,hf", "unknown baseline 'hf'"),
    ):
        result = run("--baseline", text)
        assert result.exit_code == 2 and message in result.stderr, (text, result.output)
    assert run("--baseline", "verl,openrlhf", "--against-returns", "trained").exit_code == 2


def test_comparisons_in_the_order_given_and_the_top_level_mirrors_the_first(tmp_path):
    data = rollouts(rows=30, seed=12)
    path = write_data(tmp_path, data)
    report = diff_json(
        path, "--baseline", "roll,skip-masked,nemo-rl", "--group-by", "step", "--top", "4", gamma=GAMMA, lambd=LAMBD
    )
    assert [comparison["name"] for comparison in report["comparisons"]] == ["roll", "skip-masked", "nemo-rl"]
    assert all(set(comparison) == COMPARISON_KEYS for comparison in report["comparisons"])
    assert [comparison["summary"]["baseline"] for comparison in report["comparisons"]] == [
        "roll",
        "skip-masked",
        "nemo-rl",
    ]
    first = report["comparisons"][0]
    assert report["summary"] == first["summary"]
    assert report["top_samples"] == first["top_samples"] and report["groups"] == first["groups"]
    assert report["old"] == {
        "source": "baseline",
        "baseline": "roll",
        "advantages_column": None,
        "returns_column": None,
    }
    assert report["new"] == "masked"
    assert report["new_spec"] == spec_document(GAMMA, LAMBD)
    assert set(report["new_spec"]) == set(AdvantageSpec(GAMMA, LAMBD).to_dict())

    everything = diff_json(path, "--baseline", "all", "--normalize-by", "step", gamma=GAMMA, lambd=LAMBD)
    assert [comparison["name"] for comparison in everything["comparisons"]] == list(PROFILES)
    assert everything["new_spec"]["normalize"] == "by" and everything["new_spec"]["normalize_by"] == "step"

    default = diff_json(path, gamma=GAMMA, lambd=LAMBD)
    assert [comparison["name"] for comparison in default["comparisons"]] == ["unmasked"]


def test_a_stored_column_is_one_comparison(tmp_path):
    data = rollouts(rows=12, seed=3)
    stored, _ = outputs("verl", data, GAMMA, LAMBD)
    path = write_data(tmp_path, data, extra={"trained": pa.array([a.tolist() for a in stored], pa.list_(pa.float64()))})
    report = diff_json(path, "--against", "trained", gamma=GAMMA, lambd=LAMBD)
    (comparison,) = report["comparisons"]
    assert comparison["name"] == "trained" and comparison["summary"] == report["summary"]
    summary = report["summary"]
    assert summary["max_abs_delta_advantage"] == pytest.approx(
        diff_json(path, "--baseline", "verl", gamma=GAMMA, lambd=LAMBD)["summary"]["max_abs_delta_advantage"]
    )
    assert summary["lost_terminal_samples"] is None and summary["lost_terminal_abs_sum"] is None
    assert summary["mean_terminal_credit"] is None
    masked_lost = lost_by_perturbation("masked", data, GAMMA, LAMBD)
    assert summary["new_lost_terminal_samples"] == sum(masked_lost)


# ----------------------------------------------------------------------------- every profile's figures


def test_every_profile_against_its_trainers_loop(tmp_path):
    """One run of ``--baseline all``: each comparison's figures, terminal credit and lost
    terminal rewards against that trainer's own loop."""
    data = rollouts(rows=60, seed=8)
    path = write_data(tmp_path, data)
    rows_path = tmp_path / "rows.parquet"
    report = diff_json(path, "--baseline", "all", "--per-sample", rows_path, gamma=GAMMA, lambd=LAMBD)
    new, new_returns = outputs("masked", data, GAMMA, LAMBD)
    rows = pq.read_table(rows_path).to_pylist()
    masked_lost = lost_by_perturbation("masked", data, GAMMA, LAMBD)
    for index, comparison in enumerate(report["comparisons"]):
        profile = comparison["name"]
        old, old_returns = outputs(profile, data, GAMMA, LAMBD)
        credits = perturbed_credit(profile, data, GAMMA, LAMBD)
        summary = comparison["summary"]
        assert_figures(summary, expected_figures(data, new, old, new_returns, old_returns, credits))
        lost = lost_by_perturbation(profile, data, GAMMA, LAMBD)
        assert summary["lost_terminal_samples"] == sum(lost), profile
        assert summary["lost_terminal_abs_sum"] == math.fsum(abs(z) for z, gone in zip(data.terminal, lost) if gone)
        assert summary["new_lost_terminal_samples"] == sum(masked_lost)
        assert summary["new_lost_terminal_abs_sum"] == math.fsum(
            abs(z) for z, gone in zip(data.terminal, masked_lost) if gone
        )
        mine = rows[index :: len(PROFILES)]
        assert [record["comparison"] for record in mine] == [profile] * len(data)
        assert [record["row"] for record in mine] == list(range(len(data)))
        assert [record["lost_terminal"] for record in mine] == lost
        for record, credit in zip(mine, credits):
            if credit is None:
                assert record["terminal_credit"] is None
            else:
                assert record["terminal_credit"] == pytest.approx(credit, abs=1e-12)
    # what the table of docs/semantics.md says they lose: some profile loses z where another keeps it
    by_profile = {c["name"]: c["summary"]["lost_terminal_samples"] for c in report["comparisons"]}
    assert by_profile["verl"] == by_profile["areal"] == by_profile["roll"] > by_profile["openrlhf"]
    assert by_profile["openrlhf"] == by_profile["nemo-rl"] == by_profile["slime"] == sum(masked_lost)


@pytest.mark.parametrize("gamma, lambd", [(0.0, 0.9), (0.9, 0.8), (1.0, 1.0)])
def test_terminal_credit_of_every_profile(tmp_path, gamma, lambd):
    """The credit each profile gives the last trainable token of a sample whose response
    ends in 3 masked tokens: slime and skyrl (γλ)³, verl / areal / roll 0, openrlhf / nemo-rl 1 — as
    measured by perturbing z in the trainers' loops (the aliases as their profiles)."""
    data = masked_tail_rollouts()
    path = write_data(tmp_path, data)
    formulas = {
        "slime": (gamma * lambd) ** 3,
        "skyrl": (gamma * lambd) ** 3,
        "verl": 0.0,
        "areal": 0.0,
        "roll": 0.0,
        "openrlhf": 1.0,
        "nemo-rl": 1.0,
        "unmasked": (gamma * lambd) ** 3,
        "skip-masked": 0.0,
        "zero-masked": 1.0,
    }
    listed = [
        comparison
        for names in ("all", "unmasked,skip-masked,zero-masked")
        for comparison in diff_json(path, "--baseline", names, gamma=gamma, lambd=lambd)["comparisons"]
    ]
    assert sorted(comparison["name"] for comparison in listed) == sorted(formulas)
    for comparison in listed:
        name, summary = comparison["name"], comparison["summary"]
        measured = perturbed_credit(name, data, gamma, lambd)
        assert measured[0] == pytest.approx(formulas[name], abs=1e-12)
        assert summary["mean_terminal_credit"] == pytest.approx(measured[0], abs=1e-12), name
        assert summary["min_terminal_credit"] == pytest.approx(measured[0], abs=1e-12), name
        assert summary["zero_credit_samples"] == (1 if formulas[name] == 0.0 else 0), name


# ----------------------------------------------------------------------------- a list is separate runs


def test_one_pass_reads_each_batch_once_and_computes_the_new_side_once(tmp_path, monkeypatch):
    import gaecli.pipeline.batches as pipeline  # where computed_batches calls compute_packed
    from gaecli.diff import DiffOptions, diff_files
    from gaecli.io.reader import RolloutFile

    path = write_data(tmp_path, rollouts(rows=25, seed=4))
    reads, computed = [], []
    iter_batches, compute_packed = RolloutFile.iter_batches, pipeline.compute_packed
    compute_screened = pipeline.compute_screened_packed  # the new side, on the kernel's screen

    def counted_batches(self, *args, **kwargs):
        for batch in iter_batches(self, *args, **kwargs):
            reads.append(batch.num_rows)
            yield batch

    def counted_compute(packed, spec, kernel, device):
        computed.append(spec.semantics)
        return compute_packed(packed, spec, kernel, device)

    def counted_screened(packed, spec, *args):
        computed.append(spec.semantics)
        return compute_screened(packed, spec, *args)

    monkeypatch.setattr(RolloutFile, "iter_batches", counted_batches)
    monkeypatch.setattr(pipeline, "compute_packed", counted_compute)
    monkeypatch.setattr(pipeline, "compute_screened_packed", counted_screened)
    report = diff_files([path], DiffOptions(gamma=GAMMA, lambd=LAMBD, baseline="all", batch_rows=10))
    assert reads == [10, 10, 5]  # every row read once
    assert computed == ["masked", *PROFILES] * 3  # per batch: the new side once, each profile once
    assert [comparison.name for comparison in report.comparisons] == list(PROFILES)


def diff_report(paths, *args, workers: int, engine: str = "local") -> tuple[dict, list[dict]]:
    """The JSON document and the per-sample rows of one run."""
    rows_path = paths[0].parent / f"rows-{engine}-{workers}.parquet"
    result = gae(
        "diff",
        *paths,
        "--gamma",
        0.99,
        "--lambd",
        0.9,
        "--engine",
        engine,
        "--workers",
        workers,
        "--per-sample",
        rows_path,
        "--overwrite",  # a later run of the same engine and workers replaces the rows
        "--json",
        "-",
        "--quiet",
        *args,
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), pq.read_table(rows_path).to_pylist()


ENGINES = [("local", 1), ("local", 2), ("ray", 2)]


def test_a_list_gives_the_figures_of_separate_runs_bitwise(tmp_path, local_ray):
    paths = [
        write_data(tmp_path / "in", rollouts(rows=37, seed=31), "a.parquet"),
        write_data(tmp_path / "in", rollouts(rows=23, seed=32), "b.parquet"),
    ]
    options = ["--normalize-by", "step", "--group-by", "step", "--id-col", "sample_id", "--top", "5"]
    names = ["openrlhf", "verl", "unmasked", "roll"]
    separate = {}
    for name in names:
        document, rows = diff_report(paths, *options, "--baseline", name, workers=1)
        separate[name] = document, rows
    for engine, workers in ENGINES:
        if engine == "ray" and local_ray is None:
            continue
        document, rows = diff_report(paths, *options, "--baseline", ",".join(names), workers=workers, engine=engine)
        assert [comparison["name"] for comparison in document["comparisons"]] == names
        for index, name in enumerate(names):
            alone, alone_rows = separate[name]
            # dicts of floats compare by value: equal means the same bits (no NaN in the JSON)
            assert document["comparisons"][index] == alone["comparisons"][0], (engine, workers, name)
            assert alone["summary"] == alone["comparisons"][0]["summary"]
            mine = [record for record in rows if record["comparison"] == name]
            assert mine == alone_rows, (engine, workers, name)
        assert [record["comparison"] for record in rows[: len(names)]] == names  # sample-major


# ----------------------------------------------------------------------------- reports side by side


def test_reports_put_the_comparisons_side_by_side(tmp_path):
    data = rollouts(rows=20, seed=6)
    path = write_data(tmp_path, data)
    markdown, page = tmp_path / "r.md", tmp_path / "r.html"
    result = gae(
        "diff",
        path,
        "--gamma",
        GAMMA,
        "--lambd",
        LAMBD,
        "--baseline",
        "verl,openrlhf,slime",
        "--group-by",
        "step",
        "--markdown",
        markdown,
        "--html",
        page,
    )
    assert result.exit_code == 0, result.output
    text = markdown.read_text()
    assert "| figure | verl | openrlhf | slime |" in text
    assert assert_markdown_tables(text) == 1 + 3 * 2  # the summary, then top samples and groups per comparison
    for name in ("verl", "openrlhf", "slime"):
        assert f"## Top samples by max |Δ advantage| — against {name}" in text
        assert f"## By `step` — against {name}" in text
    summary_lines = [
        line
        for line in text.splitlines()
        if line.startswith("| terminal reward dropped (reaches no trainable token), old side |")
    ]
    assert len(summary_lines) == 1 and len(re.findall(r"(?<!\\)\|", summary_lines[0])) == 5
    assert summary_lines[0].count("Σ\\|z\\|") == 3  # one cell per comparison
    assert "the baselines verl, openrlhf, slime" in result.stderr and "against slime" in result.stderr
    html_text = page.read_text()
    assert len(re.findall(r'src="data:image/png;base64,', html_text)) == 3 * 4  # per comparison: 4 plots
    assert "<th>verl</th><th>openrlhf</th><th>slime</th>" in html_text


# ----------------------------------------------------------------------------- recompute --baseline


@pytest.mark.parametrize("baseline", ["nemo-rl", "verl", "zero-masked"])
def test_recompute_baseline_columns_and_summary(tmp_path, baseline):
    data = rollouts(rows=25, seed=14)
    source = write_table(rollout_table(data, float_type=pa.float64()), tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    result = gae(
        "recompute",
        source,
        "-o",
        target,
        "--gamma",
        GAMMA,
        "--lambd",
        LAMBD,
        "--baseline",
        baseline,
        "--keep-baseline",
        "--json",
        "-",
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    suffix = baseline.replace("-", "_")
    table = pq.read_table(target)
    assert table.column_names[-2:] == [f"advantages_{suffix}", f"returns_{suffix}"]
    data = rollouts_from_table(pq.read_table(source))
    tails, credits = 0, []
    measured = perturbed_credit(baseline, data, GAMMA, LAMBD)
    for row in range(len(data)):
        advantages, returns = ORACLES[baseline](
            data.values[row], data.rewards[row], data.masks[row], data.terminal[row], GAMMA, LAMBD
        )
        for column, want in ((f"advantages_{suffix}", advantages), (f"returns_{suffix}", returns)):
            got = table.column(column)[row].as_py()
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{column} row {row}")
        mask = data.masks[row]
        if any(mask) and not mask[-1]:
            tails += 1
            credits.append(measured[row])
    assert summary["baseline"] == baseline and summary["masked_tail_samples"] == tails > 0
    assert summary["mean_terminal_credit"] == pytest.approx(sum(credits) / tails, abs=1e-12)
    assert summary["min_terminal_credit"] == pytest.approx(min(credits), abs=1e-12)


def test_recompute_baseline_default_and_refusals(tmp_path):
    data = rollouts(rows=6, seed=2)
    source = write_table(rollout_table(data, float_type=pa.float64()), tmp_path / "in.parquet")

    def run(*args):
        return gae("recompute", source, "--gamma", 1, "--lambd", 1, "--quiet", *args)

    result = run("-o", tmp_path / "plain.parquet", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["baseline"] == "unmasked"
    names = pq.read_schema(tmp_path / "plain.parquet").names
    assert not any(name.startswith(("advantages_", "returns_")) for name in names)
    result = run("-o", tmp_path / "kept.parquet", "--keep-baseline")
    assert result.exit_code == 0, result.output
    assert pq.read_schema(tmp_path / "kept.parquet").names[-2:] == ["advantages_unmasked", "returns_unmasked"]
    for baseline, message in (("verl,slime", "names several baselines"), ("all", "names several baselines")):
        result = run("-o", tmp_path / "refused.parquet", "--baseline", baseline)
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert not (tmp_path / "refused.parquet").exists()
