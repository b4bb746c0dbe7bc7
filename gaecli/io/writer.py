"""Atomic Parquet writes: rows go to a hidden temp file beside the target, renamed over
the target once the file is whole; anything else removes the temp file. On an object
store (a :class:`gaecli.io.filesystem.RemotePath` target) the rows are streamed to the
target key itself: the object appears only when the stream is closed whole, which stands
in for the rename."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import (
    AnyPath,
    RemotePath,
    is_stream,
    pyarrow_can_name,
    remove_dead_temps,
    temp_beside,
    to_path,
)
from gaecli.io.targets import open_through, place


def failure_reason(error: BaseException) -> str:
    """Why a write failed, in a few words: the system's text for its errno ("No space left
    on device", "Read-only file system") where it has one, else the first line of the error."""
    number = getattr(error, "errno", None)
    if number:
        return os.strerror(number)
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


def _holds_floats(arrow_type: pa.DataType) -> bool:
    while pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_floating(arrow_type)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary encoding: all but floats and lists of floats. Per-token
    floats (values, rewards, advantages) almost never repeat, and trying a dictionary on
    every column chunk before falling back to plain encoding doubles the write time."""
    return [field.name for field in schema if not _holds_floats(field.type)]


class _CountingSink:
    """A file that cannot seek (a FIFO, a device) with the position Parquet asks for: the
    bytes written so far."""

    def __init__(self, file) -> None:
        self.file, self.position = file, 0

    def write(self, data) -> int:
        self.file.write(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    @property
    def closed(self) -> bool:
        return self.file.closed

    def writable(self) -> bool:
        return True


def _parquet_writer(sink, schema: pa.Schema, compression: str) -> pq.ParquetWriter:
    """The Parquet writer of every output (a temp file, a device or FIFO, an object-store
    stream): no column statistics, dictionaries only where the input had them, a checksum
    in every page header (verified by every read: :func:`gaecli.io.reader.open_parquet`)."""
    return pq.ParquetWriter(
        sink,
        schema,
        compression=compression,
        write_statistics=False,
        use_dictionary=dictionary_columns(schema),
        write_page_checksum=True,
    )


class AtomicParquetWriter:
    """Write record batches to ``target`` atomically.

    The temp file is :func:`gaecli.io.filesystem.temp_beside`'s, in the target's directory
    (created if needed), so the final rename never crosses file systems; dead runs' temp
    files of the target are removed first. :meth:`commit` puts it in place
    (:func:`gaecli.io.targets.place`): without ``overwrite`` a file that appeared at the
    target while this writer wrote (a concurrent run) is never replaced — the commit fails
    with :class:`GAEUsageError` and the temp file goes. :meth:`abort` (also on any
    exception in a ``with`` block) deletes it. A stream target (a character device, FIFO
    or open descriptor, links followed: :func:`gaecli.io.filesystem.is_stream`) is written
    into directly (it is no file to rename over).

    Encoding and compressing a batch runs on a background thread (Arrow releases the GIL)
    while the caller reads and computes the next one; at most one batch is in flight, and a
    write's error is raised by the next :meth:`write` or by :meth:`close`.
    """

    def __init__(
        self, target: AnyPath | str, schema: pa.Schema, *, compression: str = "zstd", overwrite: bool = False
    ) -> None:
        self.target = to_path(target)
        self.overwrite = overwrite
        self.schema = schema
        self.compression = compression
        self.rows = 0
        self._writer: Optional[pq.ParquetWriter] = None
        self._pending: Optional[Future] = None
        self._stream = None  # the output stream on a non-local file system
        self._created_dirs: list[Path] = []
        self.temp: Optional[Path] = None
        if isinstance(self.target, RemotePath):
            self._open_remote(schema, compression)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaecli-writer")
            return
        if is_stream(self.target):  # a device, FIFO or descriptor: written into, never replaced
            self._open_direct(schema, compression)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaecli-writer")
            return
        # the directories this writer creates, deepest first: abort removes them when empty
        self._created_dirs = [d for d in (self.target.parent, *self.target.parent.parents) if not d.exists()]
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise GAEUsageError(
                f"{self.target.parent}: cannot create the output directory ({error.strerror})"
            ) from error
        remove_dead_temps(self.target)  # a killed run's leftovers (only those whose owner is gone)
        self.temp = temp_beside(self.target)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaecli-writer")
        self._temp_file = None  # the temp file open, where pyarrow cannot open it by name
        try:
            if not pyarrow_can_name(self.temp):
                self._temp_file = open(self.temp, "xb")
            sink = self.temp if self._temp_file is None else self._temp_file
            self._writer = _parquet_writer(sink, schema, compression)
        except (pa.ArrowException, OSError) as error:
            self._remove_temp()
            self._remove_created_dirs()
            raise GAEUsageError(f"{self.target}: cannot write ({failure_reason(error)})") from error
        except BaseException:  # a signal while the temp file was being opened: no caller can abort it yet
            self._remove_temp()
            self._remove_created_dirs()
            raise

    def _open_direct(self, schema: pa.Schema, compression: str) -> None:
        """Stream into a device, FIFO or descriptor (``-o /dev/null``, a pipe, ``-o
        /dev/stdout``, a link to ``/proc/self/fd/1``): it is no file to rename over;
        :meth:`commit` closes it, :meth:`abort` closes it without a footer."""
        try:
            sink = os.fdopen(open_through(self.target), "wb", buffering=1 << 20)
            self._stream = pa.PythonFile(_CountingSink(sink), mode="w")
            self._writer = _parquet_writer(self._stream, schema, compression)
        except (pa.ArrowException, OSError) as error:
            self._drop_remote()
            raise GAEUsageError(f"{self.target}: cannot write ({failure_reason(error)})") from error

    def _open_remote(self, schema: pa.Schema, compression: str) -> None:
        """Stream straight to the target key (no rename on object stores)."""
        filesystem, path = self.target.filesystem, self.target.fs_path
        try:
            filesystem.create_dir(self.target.parent.fs_path, recursive=True)
        except (pa.ArrowException, OSError):
            pass  # object stores need no directories; opening the stream says what is wrong
        try:
            self._stream = filesystem.open_output_stream(path)
            self._writer = _parquet_writer(self._stream, schema, compression)
        except (pa.ArrowException, OSError) as error:
            self._drop_remote()
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
        except (pa.ArrowException, OSError) as error:
            raise GAEUsageError(f"{self.target}: cannot write ({failure_reason(error)})") from error

    def close(self) -> None:
        """Finish the file (footer written). Locally it is still a temp file, not in place;
        on an object store the footer is in the stream, which :meth:`commit` closes. A fault
        (a full disk while the footer is written) raises :class:`GAEUsageError`; the temp
        file stays until :meth:`abort`."""
        try:
            self._wait()
        finally:
            self._thread.shutdown(wait=True)
            writer, self._writer = self._writer, None
            if writer is not None:
                try:
                    writer.close()
                    self._close_temp_file()
                except (pa.ArrowException, OSError) as error:
                    writer.is_open = False  # its __del__ must not try the footer again
                    raise GAEUsageError(f"{self.target}: cannot write ({failure_reason(error)})") from error

    def commit(self) -> None:
        """Close and put the temp file in place, over an existing target only with
        ``overwrite`` (on an object store: close the stream, which puts the object in place
        whole; no conditional write there: see docs/reliability.md)."""
        self.close()
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.close()
            except (pa.ArrowException, OSError) as error:
                self._delete_remote()
                raise GAEUsageError(f"{self.target}: cannot put the finished output in place ({error})") from error
            return
        try:
            place(self.temp, self.target, overwrite=self.overwrite)
        except FileExistsError as error:
            self._remove_temp()
            raise GAEUsageError(
                f"{self.target} appeared while this run was writing; give --overwrite to replace it"
            ) from error
        except OSError as error:
            self._remove_temp()
            raise GAEUsageError(
                f"{self.target}: cannot move the finished output into place ({error.strerror})"
            ) from error

    def abort(self) -> None:
        """Drop everything written so far, and the directories this writer created if they
        are empty (abort writers in reverse order of creation so that nested ones go too)."""
        if isinstance(self.target, RemotePath) or self._stream is not None:
            self._abort_remote()
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the temp file goes anyway
            pass
        self._remove_temp()
        self._remove_created_dirs()

    def _remove_created_dirs(self) -> None:
        for directory in self._created_dirs:
            try:
                directory.rmdir()
            except OSError:
                break

    def _abort_remote(self) -> None:
        """No footer is written (the stream never holds a whole Parquet file); the upload
        is aborted where the stream can, else the stream is closed and the key deleted."""
        try:
            self._wait()
        except Exception:  # noqa: BLE001
            pass
        self._thread.shutdown(wait=True)
        if self._stream is None:  # committed already, or never opened
            return
        self._drop_remote()

    def _drop_remote(self) -> None:
        stream, self._stream = self._stream, None
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.is_open = False  # its __del__ must not write a footer
        if stream is not None:
            abort = getattr(stream, "abort", None)
            try:
                if callable(abort):
                    abort()
                    return
                stream.close()
            except (pa.ArrowException, OSError):
                pass
        self._delete_remote()

    def _delete_remote(self) -> None:
        if not isinstance(self.target, RemotePath):
            return  # a device or FIFO written directly: nothing to delete
        try:
            filesystem = self.target.filesystem
            if filesystem.get_file_info(self.target.fs_path).type != pafs.FileType.NotFound:
                filesystem.delete_file(self.target.fs_path)
        except (pa.ArrowException, OSError):
            pass

    def _close_temp_file(self) -> None:
        temp_file, self._temp_file = getattr(self, "_temp_file", None), None
        if temp_file is not None:
            temp_file.close()

    def _remove_temp(self) -> None:
        try:
            self._close_temp_file()
        except OSError:
            pass  # the file goes anyway
        if self.temp is None:
            return
        try:
            self.temp.unlink()
        except OSError:
            pass  # never created (a read-only file system refuses even the unlink), or gone already

    def __enter__(self) -> "AtomicParquetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
