"""``gae diff --group-by`` at many groups: every group's figures in the ``--groups-out``
Parquet file (held against plain loops over each group's samples), the reports' groups
the hardest hit (largest max |Δ advantage|, against a sort of the loops' maxima), the same
bits for any batch size and worker count, the state's size per group, one footer read
per file, and the usage errors."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.comparison.figures import RowFigures
from gaecli.comparison.groups import GROUP_FIGURES, HARDEST_GROUPS, GroupedFigures
from gaecli.diff import DiffOptions, diff_files
from gaecli.engines import EngineOptions

from rollout_files import gae
from test_diff import expected_figures, outputs, perturbed_credit, rollouts, write_data

GAMMA, LAMBD = 0.9, 0.8


def prompt_keys(rows: int, groups: int, offset: int = 0) -> pa.Array:
    """Two-to-three rows per group, out of key order, and a null group."""
    keys = [None if (row + offset) % 17 == 5 else f"p{((row + offset) * 7) % groups:03d}" for row in range(rows)]
    return pa.array(keys, pa.string())


def group_expectations(data, keys: list, baseline: str) -> dict:
    """Each group's figures by plain loops over its samples (test_diff's oracle)."""
    new, new_returns = outputs("masked", data, GAMMA, LAMBD)
    old, old_returns = outputs(baseline, data, GAMMA, LAMBD)
    credits = perturbed_credit(baseline, data, GAMMA, LAMBD)
    expected = {}
    for key in dict.fromkeys(keys):  # first-seen order
        rows = [row for row, other in enumerate(keys) if other == key]

        def pick(xs, rows=rows):
            return [xs[row] for row in rows]

        part = data.take(rows)
        figures = expected_figures(part, pick(new), pick(old), pick(new_returns), pick(old_returns), pick(credits))
        deltas = [abs(new[row][t] - old[row][t]) for row in rows for t, m in enumerate(data.masks[row]) if m]
        figures["max_abs_delta_advantage"] = max(deltas, default=0.0)
        figures["first_row"] = rows[0]
        expected[key] = figures
    return expected


def assert_group(got: dict, want: dict) -> None:
    for key in ("samples", "tokens", "trainable_tokens", "changed_samples", "fully_masked_samples"):
        assert got[key] == want[key], key
    assert got["masked_tail_samples"] == want["masked_tail_samples"]
    assert got["changed_share"] == pytest.approx(want["changed_samples"] / want["samples"])
    if want["mean_terminal_credit"] is None:
        assert got["mean_terminal_credit"] is None
    else:
        assert got["mean_terminal_credit"] == pytest.approx(want["mean_terminal_credit"], abs=1e-12)
    trainable = want["trainable_tokens"]
    for key in ("mean_abs_delta_advantage", "max_abs_delta_advantage", "mean_abs_delta_return"):
        expected = want[key] if trainable else 0.0
        assert got[key] == pytest.approx(expected, rel=1e-9, abs=1e-12), key
    if trainable:
        assert got["sign_flip_share"] == pytest.approx(want["sign_flip_share"], rel=1e-9)
    else:
        assert got["sign_flip_share"] is None
    if trainable >= 2 and math.isfinite(want["correlation"]):
        assert got["correlation"] == pytest.approx(want["correlation"], rel=1e-9, abs=1e-12)


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
    assert table.schema.names == ["key", *(name for name, _ in GROUP_FIGURES)]
    assert table.schema.field("key").type == pa.string()
    listed = table.to_pylist()
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
    return RowFigures(**{name: value[start:stop] for name, value in vars(rows).items()})


def test_a_multi_file_diff_reads_each_footer_once(tmp_path, monkeypatch):
    """Three inputs, --normalize-by and --group-by (two passes), in this process: three
    footer reads, and the report equals that of a run that reads footers as it likes."""
    import gaecli.io.reader as reader

    paths = [write_data(tmp_path / "in", rollouts(rows=11, seed=60 + index), f"f{index}.parquet") for index in range(3)]
    reads = []
    read_footer = reader.read_footer

    def counted(source):
        reads.append(source)
        return read_footer(source)

    monkeypatch.setattr(reader, "read_footer", counted)
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
