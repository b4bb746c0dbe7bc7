"""Streaming Parquet reads: a file's schema and row count up front, then record batches of
bounded size, with every read fault turned into :class:`UnreadableFileError`: a page whose
checksum does not match (verified wherever the file carries checksums) and a file that
yields fewer or more rows than its footer says (it changed while it was read) included."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.errors import GAEUsageError, UnreadableFileError
from gaecli.io.filesystem import AnyPath, RemotePath, pyarrow_can_name, store_call, to_path

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


CHECKSUM_FAILED = "CRC checksum verification failed"  # what Arrow says of a page that does not match


def open_parquet(where, footer: Optional[pq.FileMetaData]) -> pq.ParquetFile:
    """The one place gaecli opens a Parquet file to read its pages: page checksums verified
    wherever the file carries them (files written without them read as before). No
    pre-buffering: it would cache every row group's bytes until the file is closed, and
    streaming reads keep memory bounded only without it."""
    return pq.ParquetFile(
        where,
        metadata=footer,
        memory_map=False,
        pre_buffer=False,
        buffer_size=1 << 20,
        page_checksum_verification=True,
    )


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
            is_file = self.path.is_file()
        except GAEUsageError as error:  # no file system for the URI, or its store failed
            raise UnreadableFileError(str(error)) from error
        self._source = None
        with read_errors(self.path):
            if not is_file:
                raise UnreadableFileError(f"{self.path}: no such file")
            self._source = open_source(self.path)
            where = self.path if self._source is None else self._source
            try:
                if footer is None:
                    footer = _stored(self.path, read_footer, where)
                self.parquet = open_parquet(where, footer)
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
        ``token_column`` from the footer. A page whose checksum does not match raises
        :class:`UnreadableFileError` naming its row group; so does a file that, read to its
        end, gave another number of rows than its footer says (it was shortened or replaced
        while it was read: Arrow reads a column chunk cut off at the end of the file as
        having no more pages)."""
        if batch_rows is None:
            tokens = self.list_values(token_column) if token_column is not None else 0
            batch_rows = rows_for_tokens(self.num_rows, tokens)
        rows = 0
        with read_errors(self.path):
            try:
                for batch in self.parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True):
                    rows += batch.num_rows
                    yield batch
            except (pa.ArrowException, OSError) as error:
                if CHECKSUM_FAILED in str(error):
                    raise self._corrupt_page(rows, columns) from error
                raise
        if rows != self.num_rows:
            raise UnreadableFileError(
                f"{self.path} changed while it was read: the footer says {self.num_rows} rows, {rows} were read"
            )

    def _corrupt_page(self, first_row: int, columns: Optional[list[str]]) -> UnreadableFileError:
        """The error of a page checksum that failed in a batch starting at ``first_row``:
        the row groups from the one holding that row on are read again, one by one, to name
        the first that fails (a batch may span row groups)."""
        metadata = self.parquet.metadata
        ends = list(accumulate(metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)))
        failing = min(bisect_right(ends, first_row), max(metadata.num_row_groups - 1, 0))
        for group in range(failing, metadata.num_row_groups):
            try:
                self.parquet.read_row_group(group, columns=columns, use_threads=False)
            except (pa.ArrowException, OSError) as error:
                if CHECKSUM_FAILED in str(error):
                    failing = group
                    break
        return UnreadableFileError(
            f"{self.path}: cannot read as Parquet (row group {failing}: a page's checksum does not match its "
            f"data; the file is corrupt)"
        )

    def close(self) -> None:
        self.parquet.close()
        self._close_source()

    def _close_source(self) -> None:
        if self._source is not None:
            try:
                self._source.close()
            finally:
                self._source = None


def open_source(path: AnyPath):
    """The open file pyarrow reads ``path`` through, or None where pyarrow opens the local
    path itself: an object store's input file, or a local file whose name is no UTF-8
    (pyarrow takes a name as UTF-8 text; Python opens it by its bytes as they are)."""
    if isinstance(path, RemotePath):
        return _stored(path, path.filesystem.open_input_file, path.fs_path)
    return None if pyarrow_can_name(path) else open(path, "rb")


def _stored(path: AnyPath, read, *args):
    """``read(*args)``; for an object store's file through :func:`store_call` (bounded, and
    a signal obeyed while it is pending)."""
    if isinstance(path, RemotePath):
        return store_call(path.filesystem, read, *args)
    return read(*args)


def _read_with(path: AnyPath | str, read):
    """``read(source)`` of the file at ``path`` (a path or a URI), through :func:`open_source`."""
    located = to_path(path)
    source = open_source(located)
    if source is None:
        return read(str(located))
    with source:
        return _stored(located, read, source)


def read_schema(path: AnyPath | str) -> pa.Schema:
    """The Arrow schema (with metadata) in a Parquet file's footer, for a path or a URI."""
    return _read_with(path, pq.read_schema)


def read_metadata(path: AnyPath | str) -> pq.FileMetaData:
    """A Parquet file's footer, for a path or a URI (:func:`read_footer`)."""
    return _read_with(path, read_footer)
