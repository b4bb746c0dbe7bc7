"""``gae recompute`` and ``gae diff`` on a table in memory: a pyarrow Table or RecordBatch, a
pandas or polars DataFrame, or any object exporting ``__arrow_c_stream__``, computed by the
commands' own code (the recompute's per-batch pipeline, :func:`gaecli.pipeline.computed_batches`
and :func:`gaecli.recompute.output_batch`; the diff's :func:`gaecli.diff_files`), so the
numbers are the commands' bits. Docs: docs/python-api.md#tables."""

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


def recompute_table(
    table: Any,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
    device: str = "cpu",
    batch_rows: Optional[int] = None,
    columns=None,
    normalize: bool = False,
    normalize_by: Optional[str] = None,
    replace: bool = False,
    keep_baseline: bool = False,
    baseline: str = "unmasked",
) -> Any:
    """``gae recompute`` on a table: the same rows, in the same order, every column kept, with
    the advantages and returns columns added (and the baseline's with ``keep_baseline``),
    returned in the kind given (a pyarrow Table for an ``__arrow_c_stream__`` exporter).

    Options as :class:`gaecli.RecomputeOptions` (``columns``: a :class:`gaecli.Columns`
    naming the input and output columns, KL rewards included; ``normalize``/``normalize_by``:
    whitening over the whole table). The numbers are those the command writes for a file of
    these rows, bit for bit. Raises :class:`gaecli.GAEInputError` for an invalid row, naming
    the table row and column (``table, row 3, column 'values': ...``), and for a table it
    cannot read.
    """
    from gaecli.advantages.kernels import resolve_kernel
    from gaecli.io.format import Columns
    from gaecli.pipeline import computed_batches
    from gaecli.recompute import RecomputeOptions
    from gaecli.recompute.output import check_job, computation_of, output_batch, output_schema

    arrow, kind = to_arrow(table)
    settings = {} if batch_rows is None else {"batch_rows": batch_rows}
    options = RecomputeOptions(
        gamma=gamma,
        lambd=lambd,
        kernel=kernel,
        device=device,
        columns=columns or Columns(),
        normalize=normalize or normalize_by is not None,
        normalize_by=normalize_by,
        replace=replace,
        keep_baseline=keep_baseline,
        baseline=baseline,
        **settings,
    )
    kernel = resolve_kernel(options.kernel, options.device)
    computation = computation_of(options, kernel)
    rollout = TableRollout(arrow)
    job = _Job()
    check_job(rollout.schema, job, options, computation)
    schema, list_type = output_schema(rollout, job, options, kernel)
    schema = schema.with_metadata(arrow.schema.metadata)  # the table's own metadata (pandas' index), nothing added
    moments = _moments(rollout, computation) if options.whitening else None
    batches = [
        output_batch(computed, options, schema, list_type, moments)[0]
        for computed in computed_batches(rollout, computation)
    ]
    return from_arrow(pa.Table.from_batches(batches, schema=schema), kind)


def _moments(rollout: TableRollout, computation):
    """The ``--normalize`` statistics of the whole table (new, old), gathered and merged as
    the command does for one file (:func:`gaecli.run.passes.engine_moments`)."""
    from gaecli.advantages.statistics import merged_in_order, whitening_statistics
    from gaecli.pipeline import checked_moments, rollout_statistics

    statistics = whitening_statistics(computation.normalize_by)
    merged, _ = merged_in_order(statistics, [rollout_statistics(rollout, computation, statistics)])
    return checked_moments(tuple(merged[statistic] for statistic in statistics), computation.normalize_by, "the table")


def diff_table(table: Any, **options: Any):
    """``gae diff`` on a table (the kinds :func:`recompute_table` takes): the same
    :class:`gaecli.diff.DiffReport` that :func:`gaecli.diff_files` returns for a file of these
    rows, with ``file`` None in ``files`` and in the top samples, whose ``row`` is the table
    row. ``options``: the fields of :class:`gaecli.DiffOptions` but ``per_sample``,
    ``groups_out`` and ``report_paths`` (nothing is written). Raises as :func:`recompute_table`.

    The table is written to a temporary Parquet file read by :func:`gaecli.diff_files`
    itself, so every figure is the command's, bit for bit; error messages name the table
    where they would name that file."""
    import dataclasses
    import tempfile
    from pathlib import Path

    import pyarrow.parquet as pq

    from gaecli.diff import DiffOptions, diff_files
    from gaecli.errors import GAEError, InvalidDataError

    for refused in ("per_sample", "groups_out", "report_paths"):
        if refused in options:
            raise GAEInputError(f"diff_table writes nothing: {refused} is not an option here")
    diff_options = DiffOptions(**options)
    arrow, _ = to_arrow(table)
    with tempfile.TemporaryDirectory(prefix="gaecli-table-") as directory:
        path = Path(directory) / f"{TABLE}.parquet"
        pq.write_table(arrow, path, write_page_checksum=True)
        try:
            report = diff_files([path], diff_options)
        except InvalidDataError as error:
            raise InvalidDataError(dataclasses.replace(error.finding, file=TABLE)) from None
        except GAEError as error:
            if str(path) not in str(error) or type(error).__init__ is not Exception.__init__:
                raise
            raise type(error)(str(error).replace(str(path), TABLE)) from None
    report.files = [{**entry, "file": None} for entry in report.files]
    for comparison in report.comparisons:
        comparison.top = [dataclasses.replace(entry, file=None) for entry in comparison.top]
    return report
