"""A table in memory read as a rollout file is: a pyarrow Table or RecordBatch, a pandas or
polars DataFrame, or any object exporting ``__arrow_c_stream__``, with the reading interface
of :class:`gaecli.io.reader.RolloutFile` (:class:`TableRollout`), and back in the kind given;
what :func:`gaecli.recompute_table` and :func:`gaecli.diff_table` read. Docs: docs/python-api.md#tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterator, Optional

import pyarrow as pa

from gaecli.errors import GAEInputError

TABLE = "table"
"""What error messages call the input where the commands name a file: ``table, row 3, column 'values': ...``."""


@dataclass(frozen=True)
class TableJob:
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


def refuse_writes(function: str, options: dict) -> None:
    for refused in _WRITES:
        if refused in options:
            raise GAEInputError(f"{function} writes nothing: {refused} is not an option here")
