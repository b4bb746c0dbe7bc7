"""Streaming Parquet reads: a file's schema and row count up front, then record batches of
bounded size, with every read fault turned into :class:`UnreadableFileError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.errors import GAEUsageError, UnreadableFileError
from gaecli.io.filesystem import AnyPath, RemotePath, store_call, to_path

MIN_BATCH_ROWS = 256  # an automatic batch holds at least this many rows
BATCH_TOKENS = 1 << 20  # an automatic batch holds about this many tokens
MAX_BATCH_ROWS = 1 << 16  # and at most this many rows


def rows_for_tokens(rows: int, tokens: int) -> int:
    """The rows of an automatic batch (``--batch-rows`` not given) of an input of ``rows``
    rows and ``tokens`` tokens: about BATCH_TOKENS tokens at its mean row length, at least
    MIN_BATCH_ROWS and at most MAX_BATCH_ROWS rows. Short rows so come in large batches
    (the per-batch work is paid per million tokens, not per few thousand), long rows in
    batches of MIN_BATCH_ROWS rows, as before."""
    mean_tokens = tokens / rows if rows else 1.0
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, BATCH_TOKENS // max(mean_tokens, 1.0))))


@contextmanager
def read_errors(path: Path | str):
    """Turn Arrow and OS read faults into :class:`UnreadableFileError` naming the file."""
    try:
        yield
    except (pa.ArrowException, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UnreadableFileError(f"{path}: cannot read as Parquet ({reason})") from error


def read_footer(source) -> pq.FileMetaData:
    """A Parquet footer (one read; one GET on an object store) from an open file or a local
    path: the one place gaecli reads footers, so that a run can count them."""
    return pq.read_metadata(source)


class RolloutFile:
    """An open rollout Parquet file: schema, row count, codec, and batch iteration.

    ``footer``: the file's footer when the caller has read it already
    (:func:`read_footer`, :func:`read_metadata`); it is then not read again."""

    def __init__(self, path: AnyPath | str, footer: Optional[pq.FileMetaData] = None) -> None:
        try:
            self.path = to_path(path)
        except GAEUsageError as error:
            raise UnreadableFileError(str(error)) from error
        self._source = None
        with read_errors(self.path):
            if not self.path.is_file():
                raise UnreadableFileError(f"{self.path}: no such file")
            # pre_buffer would cache every row group's bytes until the file is closed:
            # streaming reads keep memory bounded only without it.
            if isinstance(self.path, RemotePath):
                filesystem = self.path.filesystem
                self._source = store_call(filesystem, filesystem.open_input_file, self.path.fs_path)
                where = self._source
            else:
                where = self.path
            try:
                if footer is None:
                    footer = read_footer(where) if self._source is None else store_call(filesystem, read_footer, where)
                self.parquet = pq.ParquetFile(
                    where, metadata=footer, memory_map=False, pre_buffer=False, buffer_size=1 << 20
                )
                self.schema: pa.Schema = self.parquet.schema_arrow
                self.num_rows: int = self.parquet.metadata.num_rows
            except BaseException:
                self._close_source()
                raise

    @property
    def compression(self) -> str:
        """The codec of the first column chunk (what the output is written with)."""
        metadata = self.parquet.metadata
        if metadata.num_row_groups == 0 or metadata.num_columns == 0:
            return "zstd"
        codec = metadata.row_group(0).column(0).compression
        return "none" if codec == "UNCOMPRESSED" else codec.lower()

    def list_values(self, column: str) -> int:
        """The values the footer counts in list column ``column`` (its tokens, plus one per
        null or empty list; 0 for a column the file lacks)."""
        metadata = self.parquet.metadata
        schema = metadata.schema
        leaf = next((i for i in range(len(schema)) if schema.column(i).path.split(".")[0] == column), None)
        if leaf is None:
            return 0
        return sum(metadata.row_group(group).column(leaf).num_values for group in range(metadata.num_row_groups))

    def iter_batches(
        self,
        batch_rows: Optional[int] = None,
        columns: Optional[list[str]] = None,
        token_column: Optional[str] = None,
    ) -> Iterator[pa.RecordBatch]:
        """Record batches of at most ``batch_rows`` rows, in file order; ``batch_rows`` None:
        :func:`rows_for_tokens` of the file, counting the tokens of list column
        ``token_column`` from the footer."""
        if batch_rows is None:
            tokens = self.list_values(token_column) if token_column is not None else 0
            batch_rows = rows_for_tokens(self.num_rows, tokens)
        with read_errors(self.path):
            for batch in self.parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True):
                yield batch

    def close(self) -> None:
        self.parquet.close()
        self._close_source()

    def _close_source(self) -> None:
        if self._source is not None:
            try:
                self._source.close()
            finally:
                self._source = None


def read_schema(path: AnyPath | str) -> pa.Schema:
    """The Arrow schema (with metadata) in a Parquet file's footer, for a path or a URI."""
    located = to_path(path)
    if isinstance(located, RemotePath):
        filesystem = located.filesystem
        return store_call(filesystem, lambda: pq.read_schema(located.fs_path, filesystem=filesystem))
    return pq.read_schema(located)


def read_metadata(path: AnyPath | str) -> pq.FileMetaData:
    """A Parquet file's footer, for a path or a URI (:func:`read_footer`)."""
    located = to_path(path)
    if isinstance(located, RemotePath):
        filesystem = located.filesystem
        with store_call(filesystem, filesystem.open_input_file, located.fs_path) as source:
            return store_call(filesystem, read_footer, source)
    return read_footer(str(located))
