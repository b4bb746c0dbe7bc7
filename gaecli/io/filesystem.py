"""Paths and URIs: where gaecli's inputs and outputs live.

A plain path (or a ``file://`` URI, which names a local path) stays a :class:`pathlib.Path`
and takes gaecli's local code paths (globs, temp file + rename). Any other URI that
:meth:`pyarrow.fs.FileSystem.from_uri` understands (``s3://``, ``gs://``, ``hdfs://``,
``mock://`` …) becomes a :class:`RemotePath`: it is read and written through that
:class:`pyarrow.fs.FileSystem`.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from gaecli.errors import GAEUsageError
from gaecli.io.targets import open_through, place, writes_through

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")

# one FileSystem per scheme://authority?query in each process (object-store clients are
# costly to build; a mock:// file system lives as long as its instance)
_FILESYSTEMS: dict[str, pafs.FileSystem] = {}
_CALL_LIMITS: dict[int, Optional[float]] = {}  # id of a cached file system → :func:`store_call`'s limit
_LOCK = threading.Lock()


def is_uri(text: str) -> bool:
    """True for ``scheme://…`` (a Windows drive letter ``C:\\`` is no URI)."""
    return bool(_URI.match(str(text)))


# Object-store timeouts, in seconds: to open a connection, and without a byte read or sent
# on one (pyarrow's S3 client: ``connect_timeout``, ``request_timeout``; each request is
# tried up to three times). A stalled store thus fails the file in well under a minute, and
# a signal is obeyed once the call in flight gives up. ``s3://…?connect_timeout=2&
# request_timeout=5`` sets them per URI.
OBJECT_STORE_TIMEOUTS = {"connect_timeout": 5.0, "request_timeout": 10.0}


def _without_timeouts(uri: str) -> tuple[str, dict[str, float]]:
    """``uri`` without gaecli's timeout query parameters, and their values."""
    parts = urlsplit(uri)
    kept, timeouts = [], {}
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        if name in OBJECT_STORE_TIMEOUTS:
            try:
                timeouts[name] = float(value)
            except ValueError:
                raise GAEUsageError(f"{uri}: {name} must be a number of seconds, got {value!r}") from None
            if not timeouts[name] > 0:
                raise GAEUsageError(f"{uri}: {name} must be more than 0 seconds, got {value!r}")
        else:
            kept.append(item)
    return parts._replace(query="&".join(kept)).geturl(), timeouts


def _with_timeouts(filesystem: pafs.FileSystem, timeouts: dict[str, float]) -> pafs.FileSystem:
    """A file system with :data:`OBJECT_STORE_TIMEOUTS` (or ``timeouts``) set where pyarrow
    takes them: S3 both; GCS its retry time limit (``request_timeout``, unless the URI set
    ``retry_limit_seconds``). Every store's calls are bounded besides (:func:`store_call`)."""
    if isinstance(filesystem, pafs.S3FileSystem):
        rebuild, (options,) = filesystem.__reduce__()  # every option from_uri set, by name
        return rebuild({**options, **OBJECT_STORE_TIMEOUTS, **timeouts})
    if type(filesystem).__name__ == "GcsFileSystem":
        import datetime

        rebuild, (options,) = filesystem.__reduce__()
        if options.get("retry_time_limit") is None:
            seconds = {**OBJECT_STORE_TIMEOUTS, **timeouts}["request_timeout"]
            options = {**options, "retry_time_limit": datetime.timedelta(seconds=seconds)}
        return rebuild(options)
    return filesystem


# A call to a store that offers no request timeout (GCS: its retries are bounded, not one
# stalled request; HDFS, …) fails after this many request timeouts (60 s by default).
STORE_CALL_LIMIT_TIMEOUTS = 6
_PENDING_CALLS: list[threading.Thread] = []  # store calls under way or given up on, in their thread


def _call_limit(filesystem: pafs.FileSystem, timeouts: dict[str, float]) -> Optional[float]:
    """Seconds a call to ``filesystem`` may take (None: its own timeouts bound it)."""
    if isinstance(filesystem, (pafs.S3FileSystem, pafs.LocalFileSystem)):
        return None
    return STORE_CALL_LIMIT_TIMEOUTS * {**OBJECT_STORE_TIMEOUTS, **timeouts}["request_timeout"]


def store_call(filesystem: pafs.FileSystem, function, *args):
    """``function(*args)``, a blocking call to ``filesystem``, made so that a signal is
    obeyed while it is pending: in the main thread, the call runs in a daemon thread waited
    on in short slices (the signal handlers run between them; the KeyboardInterrupt leaves
    the call behind, and :func:`store_calls_pending` then tells the command to end without
    waiting for it). A call that outlasts the store's limit (stores without a request
    timeout) raises :class:`TimeoutError`. Elsewhere (a worker's thread), a plain call."""
    if threading.current_thread() is not threading.main_thread():
        return function(*args)
    limit = _CALL_LIMITS.get(id(filesystem), None)
    outcome: dict = {}
    done = threading.Event()

    def call() -> None:
        try:
            outcome["result"] = function(*args)
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            outcome["error"] = error
        finally:
            done.set()

    thread = threading.Thread(target=call, name="gaecli-store-call", daemon=True)
    # counted as pending before it starts: a signal that arrives as it starts (before this
    # thread waits on it) leaves it behind too
    _PENDING_CALLS.append(thread)
    deadline = None if limit is None else time.monotonic() + limit
    thread.start()
    while not done.wait(0.05):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the store did not answer within {limit:g} s")
    _PENDING_CALLS.remove(thread)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def store_calls_pending() -> bool:
    """Whether a store call that :func:`store_call` gave up on is still running (the
    process must then end without waiting for it: ``os._exit``)."""
    return any(thread.is_alive() for thread in _PENDING_CALLS)


def _filesystem(base: str, uri: str) -> tuple[pafs.FileSystem, str]:
    """The cached file system of ``base`` and ``uri``'s path in it."""
    with _LOCK:
        plain_uri, timeouts = _without_timeouts(uri)
        try:
            fs_from_uri, path = pafs.FileSystem.from_uri(plain_uri)
        except (pa.ArrowException, OSError, ValueError) as error:
            unreachable = unreachable_host(uri, error)
            if unreachable is not None:
                raise GAEUsageError(unreachable) from error
            raise GAEUsageError(f"{uri}: not a path or URI pyarrow's file systems understand ({error})") from error
        if base not in _FILESYSTEMS:
            _FILESYSTEMS[base] = _with_timeouts(fs_from_uri, timeouts)
            _CALL_LIMITS[id(_FILESYSTEMS[base])] = _call_limit(fs_from_uri, timeouts)
        filesystem = _FILESYSTEMS[base]
    return filesystem, path


UNREACHABLE = (
    ("curlcode: 6", "its name does not resolve"),
    ("couldn't resolve host", "its name does not resolve"),
    ("could not resolve host", "its name does not resolve"),
    ("name or service not known", "its name does not resolve"),
    ("temporary failure in name resolution", "its name does not resolve"),
    ("curlcode: 7", "the connection was refused or timed out"),
    ("couldn't connect to server", "the connection was refused or timed out"),
    ("curlcode: 28", "the connection timed out"),
)
"""What the AWS SDK and the resolver say when a store's host cannot be reached (lowercase),
and what that means for a person."""


def unreachable_host(uri: str, error: BaseException) -> Optional[str]:
    """The one-line message of an object store whose host cannot be reached (a name that
    does not resolve, a connection refused or timed out), told from the error's text; None
    for any other error. The host is the URI's ``endpoint_override`` where given, else the
    store's own endpoint; the store's own words follow (its first line)."""
    text = str(error).lower()
    why = next((meaning for pattern, meaning in UNREACHABLE if pattern in text), None)
    if why is None:
        return None
    parts = urlsplit(uri)
    endpoint = dict(parse_qsl(parts.query)).get("endpoint_override")
    host = f"the host {endpoint}" if endpoint else f"the {parts.scheme} endpoint"
    said = str(error).splitlines()[0]
    return (
        f"{uri}: {host} could not be reached ({why}: {said}); check the network, or give the store's address "
        f"as ?endpoint_override=HOST:PORT"
    )


@contextmanager
def store_errors(where: object):
    """Turn a failed call to an object store about ``where`` (a URI) — a refused
    connection, a timeout, a key pyarrow refuses (``s3://b//k``) — into
    :class:`GAEUsageError` naming it: the one place store faults of discovery and planning
    (``exists``, ``is_file``, ``is_dir``, listings) become an unusable path (exit 2)."""
    try:
        yield
    except (pa.ArrowException, OSError) as error:
        unreachable = unreachable_host(str(where), error)
        if unreachable is not None:
            raise GAEUsageError(unreachable) from error
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        what = "refuses this path" if isinstance(error, pa.ArrowInvalid) else "failed"
        raise GAEUsageError(f"{where}: the object store {what} ({reason})") from error


class RemotePath:
    """A file or directory on a non-local pyarrow file system, named by its URI.

    Offers the small part of :class:`pathlib.Path` gaecli uses (``name``, ``stem``,
    ``suffix``, ``parent``, ``/``, ``with_name``, ``exists``, ``is_file``, ``is_dir``,
    ``resolve``); ``str()`` is the URI. Picklable: a worker process rebuilds its file
    system from the URI.
    """

    __slots__ = ("_base", "_uri_path", "_fs_path", "_query")

    def __init__(self, uri: str) -> None:
        parts = urlsplit(uri)
        self._base = f"{parts.scheme}://{parts.netloc}"
        self._query = parts.query
        self._uri_path = parts.path.rstrip("/") or "/"
        _, fs_path = _filesystem(self._key, uri)
        self._fs_path = fs_path.rstrip("/") if fs_path not in ("", "/") else fs_path

    @classmethod
    def _make(cls, base: str, query: str, uri_path: str, fs_path: str) -> "RemotePath":
        new = object.__new__(cls)
        new._base, new._query, new._uri_path, new._fs_path = base, query, uri_path, fs_path
        return new

    @property
    def _key(self) -> str:
        return self._base + (f"?{self._query}" if self._query else "")

    # ------------------------------------------------------------------ file system

    @property
    def filesystem(self) -> pafs.FileSystem:
        cached = _FILESYSTEMS.get(self._key)
        return cached if cached is not None else _filesystem(self._key, str(self))[0]

    @property
    def fs_path(self) -> str:
        """The path within :attr:`filesystem`."""
        return self._fs_path

    def info(self) -> pafs.FileInfo:
        """The store's information on this path (:class:`GAEUsageError` naming the URI when
        the store cannot be asked, or does not answer in time: :func:`store_errors`,
        :func:`store_call`)."""
        filesystem = self.filesystem
        with store_errors(self):
            return store_call(filesystem, filesystem.get_file_info, self._fs_path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def resolve(self) -> "RemotePath":
        return self

    # ------------------------------------------------------------------ pure path parts

    @property
    def name(self) -> str:
        return self._uri_path.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        name = self.name
        dot = name.rfind(".")
        return name[dot:] if 0 < dot < len(name) - 1 else ""

    @property
    def stem(self) -> str:
        suffix = self.suffix
        return self.name[: len(self.name) - len(suffix)] if suffix else self.name

    @property
    def parent(self) -> "RemotePath":
        name = self.name
        if not name:
            return self
        uri_path = self._uri_path[: -len(name)].rstrip("/") or "/"
        fs_path = self._fs_path[: -len(name)] if self._fs_path.endswith(name) else self._fs_path
        fs_path = fs_path.rstrip("/") or ("/" if self._fs_path.startswith("/") else "")
        return self._make(self._base, self._query, uri_path, fs_path)

    def __truediv__(self, other: Union[str, Path]) -> "RemotePath":
        result = self
        for part in Path(other).as_posix().split("/"):
            if part in ("", "."):
                continue
            uri_path = result._uri_path.rstrip("/") + "/" + part
            fs_path = (result._fs_path.rstrip("/") + "/" + part) if result._fs_path not in ("",) else part
            result = self._make(self._base, self._query, uri_path, fs_path)
        return result

    def with_name(self, name: str) -> "RemotePath":
        return self.parent / name

    def relative_to(self, root: "RemotePath") -> str:
        """This path below ``root``, as a posix path."""
        prefix = root._uri_path.rstrip("/") + "/"
        if not self._uri_path.startswith(prefix):
            raise ValueError(f"{self} is not below {root}")
        return self._uri_path[len(prefix) :]

    # ------------------------------------------------------------------ identity

    def __str__(self) -> str:
        return self._base + self._uri_path + (f"?{self._query}" if self._query else "")

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(("RemotePath", str(self)))

    def __lt__(self, other: "RemotePath") -> bool:
        return str(self) < str(other)

    def __reduce__(self):
        return (self._make, (self._base, self._query, self._uri_path, self._fs_path))


AnyPath = Union[Path, RemotePath]


def to_path(item: Union[str, Path, RemotePath]) -> AnyPath:
    """A plain path or ``file://`` URI → :class:`Path`; any other URI → :class:`RemotePath`
    (:class:`GAEUsageError` when pyarrow knows no file system for it)."""
    if isinstance(item, (Path, RemotePath)):
        return item
    text = str(item)
    if not is_uri(text):
        return Path(text)
    filesystem, path = _filesystem(_base_of(text), text)
    if isinstance(filesystem, pafs.LocalFileSystem):
        return Path(path)
    return RemotePath(text)


def _base_of(uri: str) -> str:
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}" + (f"?{parts.query}" if parts.query else "")


def pyarrow_can_name(path: Union[str, Path]) -> bool:
    """True when pyarrow can open the local ``path`` by name: pyarrow takes names as UTF-8
    text, and a name whose bytes are no UTF-8 (held by Python with surrogate escapes) is
    none; such a file is opened by Python (which passes the bytes) and handed over open."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve(item: Union[str, Path, RemotePath]) -> tuple[pafs.FileSystem, str]:
    """(file system, path in it) for a plain path or a URI."""
    path = to_path(item)
    if isinstance(path, RemotePath):
        return path.filesystem, path.fs_path
    return pafs.LocalFileSystem(), str(path)


# ----------------------------------------------------------------------------- temp files

TEMP_MARK = ".gaecli-"
NAME_MAX = 255  # bytes in one file name on the file systems gaecli writes to
# .<name>.gaecli-<host>-<pid>-<start>-<random>.tmp: the owner (host, process id and the
# process's start time, which survives pid reuse) is in the name
_TEMP_OWNER = re.compile(r"^([0-9a-f]{6})-(\d+)-(\d+)-[0-9a-f]{8}\.tmp$")
_TEMP_OWNER_ROOM = 64  # bytes kept for TEMP_MARK + owner + random + ".tmp" (at most ~50)


def _start_time(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux /proc), None
    where there is no /proc or no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields here start at field 3
    except (OSError, IndexError, ValueError):
        return None


def _host_id() -> str:
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def _owner() -> str:
    """This process as a temp file's owner: host, pid, start time (0 without /proc)."""
    pid = os.getpid()
    return f"{_host_id()}-{pid}-{_start_time(pid) or 0}"


def _temp_stem(target: Path) -> str:
    """``.<name>`` of ``target``'s temp files; a name too long to leave room for the owner
    is cut and given a hash of the whole name (so the temp name stays within NAME_MAX), and
    so is a name that is no UTF-8 (pyarrow, which writes the temp file, takes names as UTF-8
    text; the rename gives the output its name's bytes)."""
    import hashlib

    name = target.name.encode("utf-8", "surrogateescape")
    room = NAME_MAX - 1 - _TEMP_OWNER_ROOM
    if len(name) <= room and pyarrow_can_name(target.name):
        return "." + target.name
    digest = hashlib.sha1(name).hexdigest()[:16]
    cut = name[: room - len(digest) - 1].decode("utf-8", "ignore")
    return f".{cut}~{digest}"


def temp_beside(target: Path) -> Path:
    """The hidden temp file an output is written to before it is renamed over ``target``:
    ``.<name>.gaecli-<host>-<pid>-<start>-<random>.tmp`` in the same directory (so the rename
    is atomic, a leftover is recognisably ours and its owner process is named); a long
    ``<name>`` is shortened with a hash, so the temp name never exceeds NAME_MAX bytes."""
    import uuid

    return target.parent / f"{_temp_stem(target)}{TEMP_MARK}{_owner()}-{uuid.uuid4().hex[:8]}.tmp"


def _owner_gone(host: str, pid: int, start: int) -> bool:
    """True when the process that made a temp file has ended (on this host; a pid reused
    by a process that started later counts as ended). Another host's files stay."""
    if host != _host_id():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    now = _start_time(pid)
    return bool(start) and now is not None and now != start


def remove_dead_temps(target: AnyPath) -> list[Path]:
    """Remove the temp files of ``target`` whose owner process is gone (a kill -9's
    leftovers); temp files of live runs, of other hosts and of unknown owners stay.
    Returns the files removed. Object stores have none (nothing is renamed there)."""
    if not isinstance(target, Path):
        return []
    prefix = _temp_stem(target) + TEMP_MARK
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        owner = _TEMP_OWNER.match(entry.name[len(prefix) :])
        if owner is None or not _owner_gone(owner[1], int(owner[2]), int(owner[3])):
            continue
        try:
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


# ----------------------------------------------------------------------------- special files


def file_kind(path: Path) -> Optional[str]:
    """What ``path`` is (links followed): "file", "directory", "character device", "FIFO",
    "socket", "block device", or None when nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return "file"  # unreadable: the write will say why
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "file"


def is_stream(path: AnyPath) -> bool:
    """True for a local path written into its node, never replaced by a rename: a character
    device, a FIFO, an open descriptor, or a link to one (``--json /dev/null``, ``--json
    >(jq .)``, ``-o /dev/stdout``, a link to ``/proc/self/fd/1``):
    :func:`gaecli.io.targets.writes_through`."""
    return isinstance(path, Path) and writes_through(path)


def _write_descriptor(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def write_whole(target: Union[str, Path, RemotePath], data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` as the file ``target`` (a path or a URI), whole or not at all: locally a
    hidden temp file beside it (:func:`temp_beside`) put in place by
    :func:`gaecli.io.targets.place` (without ``overwrite``, a file that is there is never
    replaced: :class:`FileExistsError`); on an object store one upload, which appears when
    it completes. A stream (:func:`is_stream`: ``/dev/null``, ``/dev/stdout``, a shell's
    ``>(…)``, a link to ``/proc/self/fd/N``) is written into, never replaced. Raises
    :class:`OSError` (or an Arrow error) when it cannot."""
    path = to_path(target)
    if isinstance(path, RemotePath):
        with path.filesystem.open_output_stream(path.fs_path) as stream:
            stream.write(data)
        return
    if is_stream(path):
        descriptor = open_through(path)
        try:
            _write_descriptor(descriptor, data)
        finally:
            os.close(descriptor)
        return
    remove_dead_temps(path)
    temp = temp_beside(path)
    try:
        with open(temp, "xb") as file:
            file.write(data)
        place(temp, path, overwrite=overwrite)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def total_size(paths) -> int:
    """Bytes in the files ``paths`` (paths or URIs); a file that cannot be read counts 0."""
    total = 0
    for item in paths:
        try:
            path = to_path(item)
            size = path.info().size if isinstance(path, RemotePath) else path.stat().st_size
        except (OSError, pa.ArrowException, GAEUsageError):
            continue
        total += size or 0
    return total


def list_parquet(directory: RemotePath, patterns: tuple[str, ...]) -> list[RemotePath]:
    """Files below ``directory`` (recursively) whose names match ``patterns``, sorted."""
    import fnmatch

    selector = pafs.FileSelector(directory.fs_path, recursive=True)
    found = []
    filesystem = directory.filesystem
    with store_errors(directory):
        infos = store_call(filesystem, filesystem.get_file_info, selector)
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        if not any(fnmatch.fnmatchcase(info.base_name, pattern) for pattern in patterns):
            continue
        prefix = directory.fs_path.rstrip("/") + "/"
        relative = info.path[len(prefix) :] if info.path.startswith(prefix) else info.path.lstrip("/")
        found.append(directory / relative)
    return sorted(found)
