"""``gae diff --per-sample``: one Parquet row of figures per sample and comparison."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.comparison.figures import RowFigures
from gaecli.diff.options import DiffOptions
from gaecli.display import display
from gaecli.errors import GAEUsageError

PER_SAMPLE_FIGURES = [
    ("length", pa.int64()),
    ("trainable_tokens", pa.int64()),
    ("masked_share", pa.float64()),
    ("masked_tail", pa.int64()),
    ("fully_masked", pa.bool_()),
    ("changed", pa.bool_()),
    ("max_abs_delta_advantage", pa.float64()),
    ("mean_abs_delta_advantage", pa.float64()),
    ("max_relative_delta_advantage", pa.float64()),
    ("max_abs_delta_return", pa.float64()),
    ("mean_abs_delta_return", pa.float64()),
    ("sign_flips", pa.int64()),
    ("terminal_credit", pa.float64()),
    ("lost_terminal", pa.bool_()),
]


def _nullable(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, arrow_type, mask=np.isnan(values))


PER_SAMPLE_COLUMNS = ("file", "row", "id", "comparison", *(name for name, _ in PER_SAMPLE_FIGURES))
"""Every column of the ``--per-sample`` file but its group column."""


def group_column(options: DiffOptions) -> Optional[str]:
    """The name of the ``--per-sample`` file's group column: ``--group-by``'s own, ``group_``
    before it where it collides with another column (:func:`gaecli.comparison.groups.group_column_name`);
    None without ``--group-by``."""
    from gaecli.comparison.groups import group_column_name

    return None if options.group_by is None else group_column_name(options.group_by, PER_SAMPLE_COLUMNS)


def group_column_in(names: list[str]) -> Optional[str]:
    """The group column of a ``--per-sample`` file's columns ``names`` (None without one):
    the column after ``file``, ``row`` and ``id`` before ``comparison``."""
    return next((name for name in names[2:4] if name not in ("id", "comparison")), None)


def per_sample_schema(first: pa.Schema, options: DiffOptions) -> pa.Schema:
    """``--per-sample``'s schema: file, row, id and the group column (:func:`group_column`;
    typed as in the first file, dictionaries decoded), the comparison's name, then the figures."""
    fields = [pa.field("file", pa.string()), pa.field("row", pa.int64())]
    for name, column in (("id", options.id_col), (group_column(options), options.group_by)):
        if column is not None:
            arrow_type = first.field(column).type
            fields.append(pa.field(name, arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type))
    fields.append(pa.field("comparison", pa.string()))
    fields.extend(pa.field(name, arrow_type) for name, arrow_type in PER_SAMPLE_FIGURES)
    return pa.schema(fields)


def per_sample_batch(
    schema: pa.Schema,
    file: str,
    file_rows: np.ndarray,
    comparisons: list[tuple[str, RowFigures]],
    ids: Optional[pa.Array],
    groups: Optional[pa.Array],
) -> pa.RecordBatch:
    """One batch's rows of the ``--per-sample`` file: for each sample (``file_rows``: its row
    in the file; the rows compared, without those skipped), one row per comparison
    (``comparisons``: (name, the rows' figures) in the order given), so the file's order is the
    samples' whatever the batch size."""
    parts = [_comparison_batch(schema, file, file_rows, label, rows, ids, groups) for label, rows in comparisons]
    if len(parts) == 1:
        return parts[0]
    count = parts[0].num_rows
    sample_major = np.arange(count * len(parts)).reshape(len(parts), count).T.ravel()
    table = pa.Table.from_batches(parts, schema=schema).take(pa.array(sample_major)).combine_chunks()
    return table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=schema)


def _comparison_batch(
    schema: pa.Schema,
    file: str,
    file_rows: np.ndarray,
    comparison: str,
    rows: RowFigures,
    ids: Optional[pa.Array],
    groups: Optional[pa.Array],
) -> pa.RecordBatch:
    """One comparison's rows of a batch (one row per sample)."""
    count = rows.lengths.size
    arrays = [
        pa.repeat(pa.scalar(display(file), pa.string()), count),  # the path as printed: no raw bytes, no secrets
        pa.array(file_rows, pa.int64()),
    ]
    for name, column in (("id", ids), (group_column_in(schema.names), groups)):
        if name is not None and name in schema.names and column is not None:
            arrow_type = schema.field(name).type
            try:
                arrays.append(column if column.type == arrow_type else column.cast(arrow_type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise GAEUsageError(
                    f"{file}: {name} column has type {column.type}, the first file's is {arrow_type}"
                ) from error
    arrays.append(pa.array([comparison] * count, pa.string()))
    lost = rows.lost_terminal
    figures = {
        "length": pa.array(rows.lengths, pa.int64()),
        "trainable_tokens": pa.array(rows.trainable, pa.int64()),
        "masked_share": _nullable(rows.masked_share, pa.float64()),
        "masked_tail": pa.array(rows.masked_tail, pa.int64()),
        "fully_masked": pa.array(rows.fully_masked, pa.bool_()),
        "changed": pa.array(rows.changed, pa.bool_()),
        "max_abs_delta_advantage": pa.array(rows.max_abs, pa.float64()),
        "mean_abs_delta_advantage": _nullable(rows.mean_abs, pa.float64()),
        "max_relative_delta_advantage": pa.array(rows.max_relative, pa.float64()),
        "max_abs_delta_return": _nullable(rows.max_abs_return, pa.float64()),
        "mean_abs_delta_return": _nullable(rows.mean_abs_return, pa.float64()),
        "sign_flips": pa.array(rows.sign_flips, pa.int64()),
        "terminal_credit": _nullable(rows.credit, pa.float64()),
        "lost_terminal": pa.array(lost if lost is not None else [None] * count, pa.bool_()),
    }
    arrays.extend(figures[name] for name, _ in PER_SAMPLE_FIGURES)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
