"""Atomic Parquet writes: rows go to a hidden temp file beside the target, renamed over
the target once the file is whole; anything else removes the temp file."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.errors import GAEUsageError


def _holds_floats(arrow_type: pa.DataType) -> bool:
    while pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_floating(arrow_type)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary encoding: all but floats and lists of floats. Per-token
    floats (values, rewards, advantages) almost never repeat, and trying a dictionary on
    every column chunk before falling back to plain encoding doubles the write time."""
    return [field.name for field in schema if not _holds_floats(field.type)]


class AtomicParquetWriter:
    """Write record batches to ``target`` atomically.

    The temp file is ``.<name>.gaecli-<random>.tmp`` in the target's directory (created if
    needed), so the final rename never crosses file systems. :meth:`commit` renames it into
    place; :meth:`abort` (also on any exception in a ``with`` block) deletes it.

    Encoding and compressing a batch runs on a background thread (Arrow releases the GIL)
    while the caller reads and computes the next one; at most one batch is in flight, and a
    write's error is raised by the next :meth:`write` or by :meth:`close`.
    """

    def __init__(self, target: Path, schema: pa.Schema, *, compression: str = "zstd") -> None:
        self.target = Path(target)
        self.schema = schema
        self.compression = compression
        self.rows = 0
        # the directories this writer creates, deepest first: abort removes them when empty
        self._created_dirs = [d for d in (self.target.parent, *self.target.parent.parents) if not d.exists()]
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise GAEUsageError(f"{self.target.parent}: cannot create the output directory ({error.strerror})") from error
        self.temp = self.target.parent / f".{self.target.name}.gaecli-{uuid.uuid4().hex[:8]}.tmp"
        self._writer: Optional[pq.ParquetWriter] = None
        self._pending: Optional[Future] = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaecli-writer")
        try:
            self._writer = pq.ParquetWriter(
                self.temp, schema, compression=compression, write_statistics=False,
                use_dictionary=dictionary_columns(schema),
            )
        except (pa.ArrowException, OSError) as error:
            self._remove_temp()
            raise GAEUsageError(f"{self.target}: cannot write ({error})") from error

    def write(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` as its own row group (flushed as soon as it is encoded, so memory
        stays bounded), in the background."""
        self._wait()
        self._pending = self._thread.submit(self._write_now, batch)
        self.rows += batch.num_rows

    def _write_now(self, batch: pa.RecordBatch) -> None:
        self._writer.write_table(pa.Table.from_batches([batch]), row_group_size=max(batch.num_rows, 1))

    def _wait(self) -> None:
        """Wait for the batch in flight; raise its error."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except OSError as error:
            raise GAEUsageError(f"{self.target}: cannot write ({error})") from error

    def close(self) -> None:
        """Finish the temp file (footer written); it is still not in place."""
        try:
            self._wait()
        finally:
            self._thread.shutdown(wait=True)
            if self._writer is not None:
                try:
                    self._writer.close()
                finally:
                    self._writer = None

    def commit(self) -> None:
        """Close and rename the temp file over the target."""
        self.close()
        try:
            os.replace(self.temp, self.target)
        except OSError as error:
            self._remove_temp()
            raise GAEUsageError(f"{self.target}: cannot move the finished output into place ({error.strerror})") from error

    def abort(self) -> None:
        """Drop everything written so far, and the directories this writer created if they
        are empty (abort writers in reverse order of creation so that nested ones go too)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the temp file goes anyway
            pass
        self._remove_temp()
        for directory in self._created_dirs:
            try:
                directory.rmdir()
            except OSError:
                break

    def _remove_temp(self) -> None:
        try:
            self.temp.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "AtomicParquetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
