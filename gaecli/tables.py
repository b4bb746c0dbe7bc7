"""``gae recompute`` and ``gae diff`` on a table in memory: a pyarrow Table or RecordBatch, a
pandas or polars DataFrame, or any object exporting ``__arrow_c_stream__``, computed in memory by the
commands' own units (the recompute's :func:`gaecli.recompute.run.output_batches`, the diff's
:func:`gaecli.diff.run.diff_rollout`) after the pre-passes of the run driver
(:func:`gaecli.run.reader_statistics`), so the numbers are the commands' bits. Docs: docs/python-api.md#tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterator, Optional

import pyarrow as pa

from gaecli.errors import GAEInputError

TABLE = "table"
"""What error messages call the input where the commands name a file: ``table, row 3, column 'values': ...``."""


@dataclass(frozen=True)
class _Job:
    """The one unit of a table: its name where a file's path would be."""

    source: PurePath = PurePath(TABLE)


class TableRollout:
    """A table with the reading interface of :class:`gaecli.io.reader.RolloutFile` that the
    per-batch pipeline uses (``path``, ``schema``, ``iter_batches``, ``close``)."""

    compression = None

    def __init__(self, table: pa.Table):
        self.table = table
        self.path = TABLE
        self.schema = table.schema

    def iter_batches(
        self, batch_rows: Optional[int], columns: Optional[list[str]] = None, token_column: Optional[str] = None
    ) -> Iterator[pa.RecordBatch]:
        if batch_rows is None:
            from gaecli.io.format import is_list_type
            from gaecli.io.reader import rows_for_tokens

            tokens = 0
            if token_column in self.table.column_names and is_list_type(self.table.schema.field(token_column).type):
                chunks = [chunk for chunk in self.table.column(token_column).chunks if len(chunk)]
                tokens = sum(chunk.offsets[-1].as_py() - chunk.offsets[0].as_py() for chunk in chunks)
            batch_rows = rows_for_tokens(self.table.num_rows, tokens)
        table = self.table if columns is None else self.table.select(columns)
        yield from table.to_batches(max_chunksize=batch_rows)

    def close(self) -> None:
        pass


def to_arrow(table: Any) -> tuple[pa.Table, str]:
    """``table`` as a pyarrow Table, and its kind (``arrow-table``, ``arrow-batch``,
    ``pandas``, ``polars``, ``arrow-stream``) to give results back in."""
    if isinstance(table, pa.Table):
        return table, "arrow-table"
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table]), "arrow-batch"
    module = type(table).__module__.split(".", 1)[0]
    if module == "pandas":
        return pa.Table.from_pandas(table), "pandas"
    if module == "polars":
        return table.to_arrow(), "polars"
    if hasattr(table, "__arrow_c_stream__"):
        return pa.table(table), "arrow-stream"
    raise GAEInputError(
        f"table must be a pyarrow Table or RecordBatch, a pandas or polars DataFrame, or export __arrow_c_stream__; "
        f"got {type(table).__name__}"
    )


def from_arrow(table: pa.Table, kind: str) -> Any:
    """``table`` back in the kind :func:`to_arrow` read (a pyarrow Table for ``arrow-stream``)."""
    if kind == "arrow-batch":
        return (
            table.combine_chunks().to_batches()[0]
            if table.num_rows
            else pa.RecordBatch.from_pylist([], schema=table.schema)
        )
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        import polars

        return polars.from_arrow(table)
    return table


_WRITES = ("overwrite", "skip_existing", "report_paths", "per_sample", "groups_out")
"""The options of the commands that name files to write: refused here (nothing is written)."""


def _refuse_writes(function: str, options: dict) -> None:
    for refused in _WRITES:
        if refused in options:
            raise GAEInputError(f"{function} writes nothing: {refused} is not an option here")


def recompute_table(table: Any, **options: Any) -> Any:
    """``gae recompute`` on a table: the same rows, in the same order, every column kept, with
    the advantages and returns columns added (and the baseline's with ``keep_baseline``),
    returned in the kind given (a pyarrow Table for an ``__arrow_c_stream__`` exporter).

    ``options``: the fields of :class:`gaecli.RecomputeOptions` but ``overwrite``,
    ``skip_existing`` and ``report_paths`` (nothing is written): γ and λ where the estimator
    reads them, ``estimator`` with ``group_by`` / ``step_by``, the GAE ``variants``,
    ``columns`` (a :class:`gaecli.Columns` naming the input and output columns, KL rewards
    included), ``normalize``/``normalize_by`` (whitening over the whole table), ``on_invalid``
    (``"skip"``: the invalid rows are left out of the result). Computed in memory by the
    command's own unit (:func:`gaecli.recompute.run.output_batches`), so the numbers are those
    the command writes for a file of these rows, bit for bit. Raises
    :class:`gaecli.GAEInputError` for an invalid row, naming the table row and column
    (``table, row 3, column 'values': ...``), for a bad option value and for a table it
    cannot read.
    """
    from gaecli.recompute import RecomputeOptions
    from gaecli.recompute.output import check_job, output_schema
    from gaecli.recompute.run import output_batches
    from gaecli.run import reader_statistics

    _refuse_writes("recompute_table", options)
    arrow, kind = to_arrow(table)
    recompute = RecomputeOptions(**options)
    rollout = TableRollout(arrow)
    job = _Job()
    check_job(rollout.schema, job, recompute)
    schema, list_type = output_schema(rollout, job, recompute)
    schema = schema.with_metadata(arrow.schema.metadata)  # the table's own metadata (pandas' index), nothing added
    moments, scores = reader_statistics(rollout, recompute.computation, whole="the table")
    batches = [output for _, output, _, _ in output_batches(rollout, recompute, schema, list_type, moments, scores)]
    return from_arrow(pa.Table.from_batches(batches, schema=schema), kind)


def diff_table(table: Any, **options: Any):
    """``gae diff`` on a table (the kinds :func:`recompute_table` takes): the same
    :class:`gaecli.diff.DiffReport` that :func:`gaecli.diff_files` returns for a file of these
    rows, with ``file`` None in ``files`` and in the top samples, whose ``row`` is the table
    row. ``options``: the fields of :class:`gaecli.DiffOptions` but ``per_sample``,
    ``groups_out`` and ``report_paths`` (nothing is written). Raises as :func:`recompute_table`.

    Computed in memory by the command's own unit (:func:`gaecli.diff.run.diff_rollout`) and
    merge, so every figure is the command's, bit for bit; error messages name the table
    where they would name a file."""

    from gaecli.diff import DiffOptions
    from gaecli.diff.run import diff_report, diff_rollout, merge_parts
    from gaecli.run import reader_statistics

    _refuse_writes("diff_table", options)
    diff = DiffOptions(**options)
    arrow, _ = to_arrow(table)
    rollout = TableRollout(arrow)
    moments, scores = reader_statistics(rollout, diff.computation, whole="the input")
    part = diff_rollout(0, rollout, None, diff, moments, None, scores)
    return diff_report(diff, [part], merge_parts([part], diff))
