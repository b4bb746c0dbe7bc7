"""``gaecli.recompute_table``: a pyarrow Table or RecordBatch, a pandas or polars DataFrame, or
an ``__arrow_c_stream__`` exporter in, the same kind out with every column kept; the numbers
bitwise those ``gae recompute`` writes for the same rows (and close to the float64 oracle);
invalid rows named by table row and column."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gaecli
from gaecli import Columns, GAEInputError, RecomputeOptions
from gaecli.pipeline import VariantOptions

from rollout_files import TOLERANCE, assert_rows_close, random_rollouts, reference_outputs, rollout_table, write_table

GAMMA, LAMBD = 0.99, 0.95


def table(rows=23, seed=5, **kwargs):
    rollouts = random_rollouts(rows, seed)
    ids = pa.array([f"id-{row}" for row in range(rows)])
    groups = pa.array([row % 3 for row in range(rows)], pa.int64())
    return rollouts, rollout_table(rollouts, extra_first={"id": ids}, extra={"group": groups}, **kwargs)


def command_output(tmp_path, arrow: pa.Table, **options) -> pa.Table:
    """What ``gae recompute`` writes for these rows (through its library function)."""
    source = write_table(arrow, tmp_path / "in.parquet")
    target = tmp_path / "out.parquet"
    gaecli.recompute_file(source, target, RecomputeOptions(gamma=GAMMA, lambd=LAMBD, **options))
    return pq.read_table(target)


def assert_same_numbers(got: pa.Table, want: pa.Table, names=("advantages", "returns")) -> None:
    for name in names:
        got_flat = got.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        want_flat = want.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        assert got_flat.dtype == want_flat.dtype
        assert got_flat.tobytes() == want_flat.tobytes(), name  # bitwise
        assert got.column(name).combine_chunks().offsets.equals(want.column(name).combine_chunks().offsets)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"normalize": True},
        {"normalize_by": "group"},
        {"keep_baseline": True, "baseline": "skip-masked"},
        {"batch_rows": 4},
    ],
    ids=["plain", "normalize", "normalize-by", "baseline", "batch-rows"],
)
def test_arrow_table_agrees_bitwise_with_the_command(tmp_path, options):
    rollouts, arrow = table()
    got = gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD, **options)
    assert isinstance(got, pa.Table)
    assert got.column_names[: len(arrow.column_names)] == arrow.column_names
    for name in arrow.column_names:
        assert got.column(name).equals(arrow.column(name)), name  # every other column kept as it was
    want = command_output(tmp_path, arrow, **options)
    names = ["advantages", "returns"] + (
        ["advantages_skip_masked", "returns_skip_masked"] if options.get("keep_baseline") else []
    )
    assert got.column_names == want.column_names
    assert_same_numbers(got, want, names)
    if not options:  # and the numbers are GAE: against the independent float64 oracle
        advantages, returns = reference_outputs(rollouts, GAMMA, LAMBD)
        assert_rows_close("advantages", advantages, got.column("advantages").to_pylist(), TOLERANCE["float"])
        assert_rows_close("returns", returns, got.column("returns").to_pylist(), TOLERANCE["float"])


def test_kl_rewards_and_column_names_agree_with_the_command(tmp_path):
    rollouts, arrow = table(names={"values": "v", "rewards": "r"})
    rng = np.random.default_rng(0)
    lengths = [len(mask) for mask in rollouts.masks]
    for name in ("log_probs", "ref_log_probs"):
        arrow = arrow.append_column(
            name, pa.array([list(rng.normal(-1.0, 0.3, n)) for n in lengths], pa.list_(pa.float32()))
        )
    columns = Columns(values="v", rewards="r", advantages="adv", returns="ret", kl_coef=0.1, kl_estimator="k3")
    got = gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD, columns=columns)
    want = command_output(tmp_path, arrow, columns=columns)
    assert_same_numbers(got, want, ["adv", "ret"])


def test_record_batch_in_record_batch_out(tmp_path):
    _, arrow = table()
    batch = arrow.combine_chunks().to_batches()[0]
    got = gaecli.recompute_table(batch, gamma=GAMMA, lambd=LAMBD)
    assert isinstance(got, pa.RecordBatch) and got.num_rows == arrow.num_rows
    assert_same_numbers(pa.Table.from_batches([got]), command_output(tmp_path, arrow))


def test_arrow_c_stream_exporter_gives_a_table(tmp_path):
    _, arrow = table()

    class Exporter:  # a foreign table: only the Arrow PyCapsule stream interface
        def __arrow_c_stream__(self, requested_schema=None):
            return arrow.__arrow_c_stream__(requested_schema)

    got = gaecli.recompute_table(Exporter(), gamma=GAMMA, lambd=LAMBD)
    assert isinstance(got, pa.Table)
    assert_same_numbers(got, command_output(tmp_path, arrow))


def test_pandas_dataframe_in_pandas_out(tmp_path):
    pandas = pytest.importorskip("pandas", reason="pandas is not installed (pip install gaecli[dev])")
    _, arrow = table()
    frame = arrow.to_pandas()
    frame.index = pandas.RangeIndex(100, 100 + len(frame))  # an index of its own, kept
    got = gaecli.recompute_table(frame, gamma=GAMMA, lambd=LAMBD)
    assert isinstance(got, pandas.DataFrame)
    assert list(got.index) == list(frame.index)
    assert list(got.columns) == [*frame.columns, "advantages", "returns"]
    assert list(got["id"]) == list(frame["id"])
    want = command_output(tmp_path, arrow)
    for name in ("advantages", "returns"):
        got_flat = np.concatenate([np.asarray(row, dtype=np.float32) for row in got[name]])
        want_flat = want.column(name).combine_chunks().flatten().to_numpy()
        assert got_flat.tobytes() == want_flat.tobytes()


def test_polars_dataframe_in_polars_out(tmp_path):
    polars = pytest.importorskip("polars", reason="polars is not installed (pip install gaecli[dev])")
    _, arrow = table()
    frame = polars.from_arrow(arrow)
    got = gaecli.recompute_table(frame, gamma=GAMMA, lambd=LAMBD)
    assert isinstance(got, polars.DataFrame)
    assert got.columns == [*frame.columns, "advantages", "returns"]
    # polars holds lists as large lists: the command's output for a file of the frame's rows
    assert_same_numbers(got.to_arrow(), command_output(tmp_path, frame.to_arrow()))


def test_invalid_row_named_by_table_row_and_column():
    rollouts, _ = table()
    rollouts.values[7][1] = float("nan")
    arrow = rollout_table(rollouts)
    with pytest.raises(GAEInputError) as raised:
        gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD)
    assert str(raised.value) == "table, row 7, column 'values': 'values' is nan at token 1 [non-finite]"


def test_not_a_table_refused():
    with pytest.raises(GAEInputError, match="table must be a pyarrow Table"):
        gaecli.recompute_table([1, 2, 3], gamma=GAMMA, lambd=LAMBD)


def report_without_files(report) -> dict:
    document = report.to_dict()
    document["files"] = [{**entry, "file": None} for entry in document["files"]]
    for entry in document["top_samples"]:
        entry["file"] = None
    return document


@pytest.mark.parametrize("kind", ["arrow", "pandas", "polars"])
@pytest.mark.parametrize(
    "options", [{}, {"group_by": "group", "id_col": "id", "normalize": True}], ids=["plain", "grouped"]
)
def test_diff_table_is_the_diff_of_a_file_of_the_same_rows(tmp_path, kind, options):
    _, arrow = table()
    source = write_table(arrow, tmp_path / "in.parquet")
    want = gaecli.diff_file(source, gaecli.DiffOptions(gamma=GAMMA, lambd=LAMBD, **options))
    if kind == "arrow":
        given = arrow
    elif kind == "pandas":
        given = pytest.importorskip("pandas").DataFrame(arrow.to_pandas())
    else:
        given = pytest.importorskip("polars").from_arrow(arrow)
    got = gaecli.diff_table(given, gamma=GAMMA, lambd=LAMBD, **options)
    assert got.files == [{"file": None, "rows": arrow.num_rows, "tokens": want.files[0]["tokens"]}]
    assert all(entry.file is None for entry in got.top)
    assert [entry.row for entry in got.top] == [entry.row for entry in want.top]
    assert report_without_files(got) == report_without_files(want)


def test_diff_table_invalid_row_named_by_table_row_and_column():
    rollouts, _ = table()
    rollouts.rewards[4][0] = float("inf")
    with pytest.raises(GAEInputError) as raised:
        gaecli.diff_table(rollout_table(rollouts), gamma=GAMMA, lambd=LAMBD)
    assert str(raised.value) == "table, row 4, column 'rewards': 'rewards' is inf at token 0 [non-finite]"


@pytest.mark.parametrize(
    "options",
    [
        {"estimator": "grpo", "group_by": "group"},
        {"estimator": "reinforce++", "gamma": GAMMA},
        {"gamma": GAMMA, "lambd": LAMBD, "variants": VariantOptions(lambd_critic=0.5, lambd_alpha=0.1)},
    ],
    ids=["grpo", "reinforce++", "variants"],
)
def test_estimators_and_variants_agree_bitwise_with_the_command(tmp_path, options):
    _, arrow = table()
    got = gaecli.recompute_table(arrow, **options)
    source = write_table(arrow, tmp_path / "in.parquet")
    gaecli.recompute_file(source, tmp_path / "out.parquet", RecomputeOptions(**options))
    want = pq.read_table(tmp_path / "out.parquet")
    assert got.column_names == want.column_names
    assert_same_numbers(got, want)


def test_on_invalid_skip_leaves_the_invalid_rows_out(tmp_path):
    rollouts, _ = table()
    rollouts.values[7][1] = float("nan")
    arrow = rollout_table(rollouts)
    got = gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD, on_invalid="skip")
    assert got.num_rows == arrow.num_rows - 1
    want = command_output(tmp_path, arrow, on_invalid="skip")
    assert want.num_rows == got.num_rows
    assert_same_numbers(got, want)


def test_table_functions_refuse_what_writes_files():
    _, arrow = table()
    with pytest.raises(GAEInputError, match="recompute_table writes nothing: skip_existing is not an option here"):
        gaecli.recompute_table(arrow, gamma=GAMMA, lambd=LAMBD, skip_existing=True)
    with pytest.raises(GAEInputError, match="diff_table writes nothing: per_sample is not an option here"):
        gaecli.diff_table(arrow, gamma=GAMMA, lambd=LAMBD, per_sample="x.parquet")


def test_diff_table_with_estimators_is_the_diff_of_a_file_of_the_same_rows(tmp_path):
    _, arrow = table()
    options = {"estimator": "rloo", "old_estimator": "grpo", "group_by_id": "group"}
    source = write_table(arrow, tmp_path / "in.parquet")
    want = gaecli.diff_file(source, gaecli.DiffOptions(**options))
    got = gaecli.diff_table(arrow, **options)
    assert report_without_files(got) == report_without_files(want)
