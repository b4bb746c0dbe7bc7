"""``gae diff --group-by`` at many groups: every group's figures in the ``--groups-out``
Parquet file (held against plain loops over each group's samples), the reports' groups
the hardest hit (largest max |Δ advantage|, against a sort of the loops' maxima), the same
bits for any batch size and worker count, the state's size per group, one footer read
per file, and the usage errors."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gaecli.comparison.figures import RowFigures
from gaecli.comparison.groups import GROUP_FIGURES, HARDEST_GROUPS, GroupedFigures
from gaecli.diff import DiffOptions, diff_files
from gaecli.engines import EngineOptions

from rollout_files import count_footer_reads, gae
from test_diff import outputs, perturbed_credit, rollouts, trainable_tokens, write_data

GAMMA, LAMBD = 0.9, 0.8


def prompt_keys(rows: int, groups: int, offset: int = 0) -> pa.Array:
    """Two-to-three rows per group, out of key order, and a null group."""
    keys = [None if (row + offset) % 17 == 5 else f"p{((row + offset) * 7) % groups:03d}" for row in range(rows)]
    return pa.array(keys, pa.string())


def group_expectations(data, keys: list, baseline: str, tol: float = 1e-6) -> dict:
    """Each group's figures by plain loops over its samples and tokens (the trainers' GAE
    loops of test_diff's oracle), in first-seen order."""
    new, new_returns = outputs("masked", data, GAMMA, LAMBD)
    old, old_returns = outputs(baseline, data, GAMMA, LAMBD)
    credits = perturbed_credit(baseline, data, GAMMA, LAMBD)
    expected = {}
    for key in dict.fromkeys(keys):
        rows = [row for row, other in enumerate(keys) if other == key]
        deltas, return_deltas, news, olds, tail_credits = [], [], [], [], []
        changed = flips = tails = 0
        for row in rows:
            mask = data.masks[row]
            sample_changed = False
            for t, a, b in trainable_tokens(mask, new[row], old[row]):
                deltas.append(abs(a - b))
                return_deltas.append(abs(float(new_returns[row][t]) - float(old_returns[row][t])))
                news.append(a)
                olds.append(b)
                sample_changed |= abs(a - b) / (1 + abs(a)) > tol
                flips += a * b < 0
            changed += sample_changed
            if any(mask) and not mask[-1]:
                tails += 1
                tail_credits.append(credits[row])
        n = len(news)
        correlation = None
        if n >= 2 and np.var(news) > 0 and np.var(olds) > 0:
            correlation = float(np.corrcoef(news, olds)[0, 1])
        expected[key] = {
            "samples": len(rows),
            "tokens": sum(len(data.masks[row]) for row in rows),
            "trainable_tokens": n,
            "changed_samples": changed,
            "changed_share": changed / len(rows),
            "fully_masked_samples": sum(1 for row in rows if data.masks[row] and not any(data.masks[row])),
            "masked_tail_samples": tails,
            "mean_terminal_credit": sum(tail_credits) / tails if tails else None,
            "mean_abs_delta_advantage": sum(deltas) / n if n else 0.0,
            "max_abs_delta_advantage": max(deltas, default=0.0),
            "mean_abs_delta_return": sum(return_deltas) / n if n else 0.0,
            "max_abs_delta_return": max(return_deltas, default=0.0),
            "sign_flip_share": flips / n if n else None,
            "correlation": correlation,
            "first_row": rows[0],
        }
    return expected


def assert_group(got: dict, want: dict) -> None:
    for key, value in want.items():
        if key == "first_row":
            continue
        if value is None or isinstance(value, int):
            assert got[key] == value, (key, got[key], value)
        else:
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_groups_out_holds_every_group_and_the_reports_the_hardest(tmp_path):
    data = rollouts(rows=120, seed=31)
    keys = prompt_keys(len(data), groups=50)
    path = write_data(tmp_path, data, extra={"prompt": keys})
    groups_path = tmp_path / "groups.parquet"
    markdown_path = tmp_path / "report.md"
    result = gae(
        "diff",
        path,
        "--gamma",
        GAMMA,
        "--lambd",
        LAMBD,
        "--group-by",
        "prompt",
        "--baseline",
        "unmasked",
        "--groups-out",
        groups_path,
        "--json",
        "-",
        "--markdown",
        markdown_path,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    expected = group_expectations(data, keys.to_pylist(), "unmasked")
    assert len(expected) == 51  # 50 keys and the null group

    table = pq.read_table(groups_path)
    assert table.schema.names == ["prompt", "comparison", *(name for name, _ in GROUP_FIGURES)]  # --group-by's name
    assert table.schema.field("prompt").type == pa.string()
    listed = [{"key": row.pop("prompt"), **row} for row in table.to_pylist()]  # the JSON's groups[] say "key"
    assert {row.pop("comparison") for row in listed} == {"unmasked"}
    # key order, the null key last
    assert [row["key"] for row in listed] == sorted(key for key in expected if key is not None) + [None]
    for row in listed:
        assert_group(row, expected[row["key"]])
        assert row["max_abs_delta_return"] is not None  # baselines compare returns

    # the reports: the 20 groups with the largest max |Δ advantage|, ties in first-seen order
    ranked = sorted(expected, key=lambda key: (-expected[key]["max_abs_delta_advantage"], expected[key]["first_row"]))
    assert [group["key"] for group in report["groups"]] == ranked[:HARDEST_GROUPS]
    by_key = {row["key"]: row for row in listed}
    for group in report["groups"]:
        assert group == by_key[group["key"]]  # the side file's figures, bit for bit
    assert report["group_count"] == 51 and report["groups_out"] == str(groups_path)
    markdown = markdown_path.read_text()
    assert f"The 20 of 51 groups, largest max |Δ advantage| first; every group's figures are in {groups_path}" in (
        markdown
    )
    assert sum(1 for line in markdown.splitlines() if line.startswith("| p")) <= HARDEST_GROUPS
    assert "The 20 of 51 groups" in result.stderr  # the terminal's note


def test_group_figures_are_the_same_bits_for_any_batch_size_and_worker_count(tmp_path):
    first, second = rollouts(rows=70, seed=41), rollouts(rows=50, seed=42)
    paths = [
        write_data(tmp_path / "in", first, "a.parquet", extra={"prompt": prompt_keys(70, groups=30)}),
        write_data(tmp_path / "in", second, "b.parquet", extra={"prompt": prompt_keys(50, groups=30, offset=3)}),
    ]
    runs = []
    for index, (batch_rows, workers) in enumerate(((1, 1), (7, 1), (1000, 1), (5, 2))):
        out = tmp_path / f"groups{index}.parquet"
        options = DiffOptions(
            gamma=0.99, lambd=0.9, group_by="prompt", normalize_by="prompt", batch_rows=batch_rows, groups_out=str(out)
        )
        report = diff_files(paths, options, engine=EngineOptions(workers=workers))
        runs.append((report.groups, report.group_count, pq.read_table(out)))
    for groups, count, table in runs[1:]:
        assert groups == runs[0][0] and count == runs[0][1] == table.num_rows
        assert table.equals(runs[0][2])


def test_groups_out_of_a_baseline_list_is_each_comparison_alone(tmp_path):
    data = rollouts(rows=60, seed=43)
    path = write_data(tmp_path, data, extra={"prompt": prompt_keys(60, groups=20)})

    def groups_out(baseline: str, name: str):
        out = tmp_path / name
        options = DiffOptions(gamma=0.99, lambd=0.9, baseline=baseline, group_by="prompt", groups_out=str(out))
        report = diff_files([path], options)
        return report, pq.read_table(out)

    both, table = groups_out("unmasked,verl", "both.parquet")
    assert table.num_rows == 2 * both.group_count
    for name in ("unmasked", "verl"):
        alone, alone_table = groups_out(name, f"{name}.parquet")
        rows = table.filter(pc.equal(table["comparison"], name))
        assert rows.equals(alone_table)
        listed = [comparison for comparison in both.comparisons if comparison.name == name][0]
        assert listed.groups == alone.groups


def test_hardest_groups_against_a_sort():
    rng = np.random.default_rng(5)
    figures = GroupedFigures("unmasked")
    figures.table.encode(pa.array([f"k{code}" for code in range(500)]))
    figures._grow()
    maxima = rng.integers(0, 40, 500).astype(np.float64)  # many ties
    maxima[123] = np.nan  # counts as the largest
    figures.maxima[: figures.size, 0] = maxima
    ranks = np.where(np.isnan(maxima), np.inf, maxima)
    reference = sorted(range(500), key=lambda code: (-ranks[code], code))
    for count in (0, 1, 20, 37, 499, 500, 800):
        assert figures.hardest(count).tolist() == reference[:count], count


def test_group_state_is_a_few_arrays_not_per_group_objects():
    groups = 20_000
    rows = RowFigures(
        lengths=np.full(groups, 3),
        trainable=np.full(groups, 2),
        masked_tail=np.zeros(groups, dtype=np.int64),
        max_abs=np.linspace(0.0, 1.0, groups),
        max_relative=np.zeros(groups),
        sum_abs=np.ones(groups),
        sign_flips=np.zeros(groups, dtype=np.int64),
        max_abs_return=np.full(groups, np.nan),
        sum_abs_return=np.full(groups, np.nan),
        credit=np.full(groups, np.nan),
        changed=np.ones(groups, dtype=bool),
        sums=np.ones((groups, 5)),
    )
    figures = GroupedFigures("unmasked")
    keys = pa.array([f"uid-{code:06d}" for code in range(groups)])
    half = groups // 2
    figures.update(keys.slice(0, half), _rows_slice(rows, 0, half))
    figures.update(keys.slice(half), _rows_slice(rows, half, groups))
    assert figures.size == groups
    assert figures.sums.nbytes + figures.maxima.nbytes <= 2 * groups * 17 * 8  # doubling: at most twice 136 B
    assert len(pickle.dumps(figures)) < groups * (17 * 8 + 10 + 8 + 40)  # 136 B, the key, its offset, slack
    assert figures.entries(figures.hardest(3))[0]["key"] == f"uid-{groups - 1:06d}"


def _rows_slice(rows: RowFigures, start: int, stop: int) -> RowFigures:
    return RowFigures(**{name: None if value is None else value[start:stop] for name, value in vars(rows).items()})


def test_a_multi_file_diff_reads_each_footer_once(tmp_path, monkeypatch):
    """Three inputs, --normalize-by and --group-by (two passes), in this process: three
    footer reads, and the report equals that of a run that reads footers as it likes."""
    paths = [write_data(tmp_path / "in", rollouts(rows=11, seed=60 + index), f"f{index}.parquet") for index in range(3)]
    reads = count_footer_reads(monkeypatch)
    options = DiffOptions(gamma=GAMMA, lambd=LAMBD, normalize_by="step", group_by="step", batch_rows=4)
    counted_report = diff_files(paths, options)
    assert len(reads) == 3, reads
    monkeypatch.undo()
    again = diff_files(paths, options)
    assert counted_report.to_dict() == again.to_dict()


def test_groups_out_usage_errors(tmp_path):
    path = write_data(tmp_path, rollouts(rows=8, seed=1))

    def run(*args):
        return gae("diff", path, "--gamma", 1, "--lambd", 1, "--quiet", *args)

    result = run("--groups-out", tmp_path / "g.parquet")
    assert result.exit_code == 2 and "--groups-out needs --group-by" in result.stderr
    result = run("--group-by", "step", "--groups-out", path)
    assert result.exit_code == 2 and "input" in result.stderr
    result = run("--group-by", "step", "--groups-out", tmp_path / "same.json", "--json", tmp_path / "same.json")
    assert result.exit_code == 2
    assert sorted(item.name for item in tmp_path.iterdir()) == [path.name]
