"""Input discovery and output planning: which files to read and where each output goes."""

from __future__ import annotations

import errno
import fnmatch
import glob
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import NAME_MAX, AnyPath, RemotePath, file_kind, is_uri, list_parquet, to_path

GLOB_CHARACTERS = set("*?[")


@dataclass(frozen=True)
class FileJob:
    """One input file and the output it becomes. ``source`` and ``target`` are
    :class:`Path` or, for object-store URIs, :class:`gaecli.io.filesystem.RemotePath`."""

    source: AnyPath
    target: AnyPath


def _glob_root(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if GLOB_CHARACTERS & set(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _discover_remote(item: str, path: RemotePath, patterns: tuple[str, ...]) -> list[tuple[RemotePath, RemotePath]]:
    """A URI: one object, or a "directory" listed recursively. No globs."""
    if path.is_file():
        return [(path, path.parent)]
    if path.is_dir():
        matches = list_parquet(path, patterns)
        if not matches:
            raise GAEUsageError(f"{item}: directory holds no {' or '.join(patterns)} file")
        return [(match, path) for match in matches]
    if GLOB_CHARACTERS & set(path.fs_path):
        raise GAEUsageError(
            f"{item}: glob patterns work for local paths only; for a URI give the directory "
            f"(read recursively for {' or '.join(patterns)}) or the files themselves"
        )
    raise GAEUsageError(f"{item}: no such file or directory")


def discover_inputs(
    inputs: list[str],
    patterns: tuple[str, ...] = ("*.parquet",),
    unreadable: Optional[list[tuple[Path, str]]] = None,
) -> tuple[list[tuple[AnyPath, AnyPath]], bool]:
    """Expand paths, directories (recursively, files matching ``patterns``) and globs into
    (file, root) pairs in a stable order. The flag says whether the inputs name one plain
    file. URIs (``s3://…``) go through pyarrow's file systems: an object or a prefix
    listed recursively; globs are for local paths only.

    Nothing named is skipped: a match that is no regular file — a dangling symlink, a
    symlink loop, a FIFO, a socket, a device (:func:`not_a_regular_file`; stat only, a FIFO
    is never opened) — is an unreadable input: :class:`GAEUsageError` naming it, or, when
    the caller gives an ``unreadable`` list, a (path, message) entry appended to it (the
    path left out of the files found)."""
    found: list[tuple[AnyPath, AnyPath]] = []
    for item in inputs:
        located = to_path(item)
        if isinstance(located, RemotePath):
            remote = _discover_remote(item, located, patterns)
            found.extend(remote)
            continue
        if is_uri(item):  # file://: a local path
            item = str(located)
        path = Path(item)
        if GLOB_CHARACTERS & set(item) and not os.path.lexists(path):
            matches = sorted(Path(m) for m in glob.glob(item, recursive=True) if not Path(m).is_dir())
            if not matches:
                raise GAEUsageError(f"{item}: no file matches this pattern")
            root = _glob_root(item)
            found.extend((match, root) for match in matches)
        elif path.is_dir():
            matches = _list_directory(path, patterns)
            if not matches:
                raise GAEUsageError(f"{item}: directory holds no {' or '.join(patterns)} file")
            found.extend((match, path) for match in matches)
        elif os.path.lexists(path):
            found.append((path, path.parent))
        else:
            raise GAEUsageError(f"{item}: no such file or directory")
    found = _first_of_each(_regular_files(found, unreadable))
    single = len(inputs) == 1 and len(found) == 1 and to_path(inputs[0]).is_file()
    return found, single


def not_a_regular_file(path: Path) -> Optional[str]:
    """Why ``path``, found as an input, cannot be read as a file — a dangling symlink, a
    symlink loop, a FIFO, socket or device, a file ``stat`` refuses — as a message naming
    it; None for a regular file (links followed). Only ``stat``: nothing is opened, so a
    FIFO cannot block the run."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path}: a symbolic link to nothing ({os.readlink(path)} does not exist); not a file to read"
        return f"{path}: no such file"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return f"{path}: a symbolic link loop; not a file to read"
        return f"{path}: cannot read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    return f"{path}: a {file_kind(path)}, not a regular file; an input must be a file to read"


def _regular_files(
    found: list[tuple[AnyPath, AnyPath]], unreadable: Optional[list[tuple[Path, str]]]
) -> list[tuple[AnyPath, AnyPath]]:
    """The (file, root) pairs of ``found`` whose file is a regular file (object-store files
    are); the others raise, or go to ``unreadable`` (see :func:`discover_inputs`)."""
    kept = []
    for source, root in found:
        problem = None if isinstance(source, RemotePath) else not_a_regular_file(source)
        if problem is None:
            kept.append((source, root))
        elif unreadable is None:
            raise GAEUsageError(problem)
        elif all(os.path.abspath(path) != os.path.abspath(source) for path, _ in unreadable):
            unreadable.append((source, problem))
    return kept


def _list_directory(directory: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Entries below ``directory`` (recursively, symlinked directories not followed) whose
    names match ``patterns``, sorted: every one that is not a directory, so that a
    dangling link or a FIFO named like an input is found (and refused by
    :func:`discover_inputs`), never skipped. A directory that cannot be listed is an error
    (:class:`GAEUsageError` naming it), never skipped."""

    def unreadable(error: OSError) -> None:
        raise GAEUsageError(
            f"{error.filename}: cannot read this directory below the input {directory} ({error.strerror or error})"
        )

    matches = set()
    for root, _dirs, names in os.walk(directory, onerror=unreadable):
        for name in names:  # os.walk lists a symlink to a directory among the directories
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
                matches.add(Path(root) / name)
    return sorted(matches)


def _first_of_each(found: list[tuple[AnyPath, AnyPath]]) -> list[tuple[AnyPath, AnyPath]]:
    """Each file once, by its resolved path (a directory and its subdirectory given
    together, a file named twice, through a symlink or ``..``); the first root is kept."""
    seen: set = set()
    unique = []
    for source, root in found:
        key = source.resolve()
        if key not in seen:
            seen.add(key)
            unique.append((source, root))
    return unique


def plan_outputs(
    inputs: list[str],
    output: str,
    *,
    overwrite: bool = False,
    suffixes: tuple[str, ...] = (),
    reports: Sequence[tuple[str, Optional[str]]] = (),
) -> list[FileJob]:
    """Map every input file to its output path.

    One plain file in → ``output`` is a file (or, when ``output`` is an existing directory,
    the file of the same name inside it). Otherwise ``output`` is a directory and each
    input's path relative to its root (the directory given, the fixed part of a glob, or
    the file's own directory) is mirrored under it. Every output, each output with each of
    ``suffixes`` (e.g. a rejects file) and the ``reports`` ((role, path) pairs, e.g. the
    JSON report) go through :func:`check_writes` against the inputs and each other, and an
    existing output (or suffixed file) is refused (:class:`GAEUsageError`) unless
    ``overwrite``.
    """
    found, single = discover_inputs(inputs)
    out = to_path(output)
    jobs: list[FileJob] = []
    if single:
        source = found[0][0]
        target = out / source.name if out.is_dir() else out
        jobs.append(FileJob(source, target))
    else:
        if out.exists() and not out.is_dir():
            raise GAEUsageError(f"{output}: several inputs need a directory as output, and this is a file")
        _refuse_output_inside_inputs(inputs, out, output)
        for source, root in found:
            relative = Path(
                source.relative_to(root) if isinstance(source, RemotePath) else os.path.relpath(source, root)
            )
            jobs.append(FileJob(source, out / relative))
    writes: list[tuple[str, AnyPath]] = [(f"output of {job.source}", job.target) for job in jobs]
    for suffix in suffixes:
        writes += [(f"{suffix.lstrip('.')} rows file of {job.source}", with_suffix(job.target, suffix)) for job in jobs]
    check_writes([job.source for job in jobs], [*writes, *reports], overwrite=overwrite)
    return jobs


def _refuse_output_inside_inputs(inputs: list[str], out: AnyPath, output: str) -> None:
    """An output directory inside an input directory (read recursively) is refused
    before anything is written: its outputs would be inputs of the next run over that
    directory (``-o d2/fixed`` for ``d2``), which a second run would then refuse."""
    if isinstance(out, RemotePath):
        return
    target = Path(os.path.abspath(out)).resolve()
    for item in inputs:
        located = to_path(item)
        if isinstance(located, RemotePath) or not located.is_dir():
            continue
        directory = located.resolve()
        if directory in target.parents:  # the directory itself: its outputs would replace inputs (check_writes)
            raise GAEUsageError(
                f"{output}: the output directory is inside the input directory {item}, so its outputs would be "
                f"read as inputs by the next run; choose an output outside {item}"
            )


def with_suffix(target: AnyPath, suffix: str) -> AnyPath:
    """``out.parquet`` + ``.rejected`` → ``out.rejected.parquet``."""
    if target.suffix == ".parquet":
        return target.with_name(target.stem + suffix + ".parquet")
    return target.with_name(target.name + suffix + ".parquet")


# ----------------------------------------------------------------------------- the one rule

REPORT_ROLES = ("report", "JSON report", "Markdown report", "HTML report")
"""The roles of reports: documents, replaced when they exist. Every other role is a data
file, refused when it exists unless the run was given ``--overwrite``."""

INPUT_PATTERNS = {
    "rollout": ("*.parquet",),  # recompute, diff, validate
    "torch.save dump": ("*.pt", "*.pth"),  # import miles, import slime
    "NeMo-RL dump": ("train_data_step*.jsonl",),  # import nemo-rl
    "SkyRL dump": ("global_step_*_training_input.pkl",),  # import skyrl
}
"""The file names each reader lists in an input directory (the importers' patterns are these)."""

DATA_SUFFIXES = tuple(dict.fromkeys([*(os.path.splitext(p)[1] for ps in INPUT_PATTERNS.values() for p in ps), ".pkl"]))
"""What an input of gaecli is named like — the suffixes of :data:`INPUT_PATTERNS` (SkyRL's
dumps among them: ``.pkl``), and ``.pkl`` in any case (a torch.save dump named by path is
read whatever its name; ``.pkl`` is its usual other one): never the name of a report
(``--json d/*.jsonl`` expanded by the shell)."""


ReportPath = Union[str, tuple[str, str]]  # a path, or (role, path): ("JSON report", "r.json")


def report_writes(report_paths: Sequence[ReportPath]) -> list[tuple[str, str]]:
    """(role, path) pairs of the report paths a library call is given (a bare path is a
    "report")."""
    return [item if isinstance(item, tuple) else ("report", item) for item in report_paths]


_ENDPOINT_FILESYSTEMS = tuple(getattr(pafs, name) for name in ("S3FileSystem", "GcsFileSystem") if hasattr(pafs, name))


def _endpoint(text: str) -> str:
    """``http://Host:9000/`` → ``host:9000``."""
    return text.split("://", 1)[-1].rstrip("/").lower()


def _remote_identity(path: RemotePath) -> tuple:
    """What an object-store URI names, never how it is spelled: the file system's type, the
    endpoint it talks to (S3's and GCS's ``endpoint_override``, else the URI's host and port,
    credentials left out) and the bucket and key. The query's order and the options that
    do not change the place (timeouts, region, scheme) are not part of it."""
    filesystem = path.filesystem
    endpoint = None
    if isinstance(filesystem, _ENDPOINT_FILESYSTEMS):
        try:
            endpoint = _endpoint(filesystem.__reduce__()[1][0].get("endpoint_override") or "")
        except (AttributeError, IndexError, TypeError):
            endpoint = None
    if endpoint is None:
        parts = urlsplit(str(path))
        endpoint = _endpoint(f"{parts.hostname or ''}:{parts.port or ''}")
    return ("object", filesystem.type_name, endpoint, path.fs_path.strip("/"))


def _identity(path: AnyPath) -> set:
    """What makes two names one file: the resolved path (symlinks, ``..``, ``file://``) and,
    for a file that exists, its device and inode (hard links); for an object-store URI what
    it names (:func:`_remote_identity`)."""
    if isinstance(path, RemotePath):
        return {_remote_identity(path)}
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: no file, named as given
        resolved = Path(os.path.abspath(path))
    keys: set = {("path", str(resolved))}
    try:
        status = os.stat(path)
    except OSError:
        return keys
    return keys | {("inode", status.st_dev, status.st_ino)}


def check_writes(
    inputs: Iterable[Union[str, AnyPath]],
    writes: Iterable[tuple[str, Union[str, AnyPath, None]]],
    *,
    overwrite: bool = False,
) -> None:
    """The one rule every command applies before any work: each path the run will write
    (``writes``: (role, path) pairs — outputs, rejects files, JSON, Markdown, HTML,
    per-sample and groups files; None and '-' (stdout) are skipped) must be none of the
    ``inputs`` and none of the other writes — compared as resolved paths and, for files that
    exist, by device and inode, so a symlink, ``..``, a hard link or a ``file://`` URI is
    caught; object-store URIs by what they name (:func:`_remote_identity`). A directory,
    socket or block device is no file to write; a report named like an input
    (:data:`DATA_SUFFIXES`: ``--json d/*.jsonl`` expanded by the shell) and a name longer
    than NAME_MAX bytes are refused. Then a data file (any role but :data:`REPORT_ROLES`)
    that exists is refused unless ``overwrite``. Raises :class:`GAEUsageError` naming both
    paths of a collision. Character devices, FIFOs and descriptors pass: they are written
    into (:func:`gaecli.io.targets.writes_through`)."""
    writes = list(writes)
    owners: dict = {}  # identity key → (role, path as given) of the first path with it
    for item in inputs:
        for key in _identity(to_path(item)):
            owners.setdefault(key, ("input", str(item)))
    for role, item in writes:
        if item is None or str(item) == "-":
            continue
        path = to_path(item)
        identity = _identity(path)
        clashes = sorted((owners[key] for key in identity if key in owners), key=lambda owner: owner[0] != "input")
        if clashes:  # an input first
            other_role, other_item = clashes[0]
            if other_role == "input":
                raise GAEUsageError(
                    f"{item}: this is an input file ({other_item}); the {role} would replace "
                    f"an input: choose another path"
                )
            raise GAEUsageError(
                f"{item}: the {role} and the {other_role} ({other_item}) are the same file; give each its own path"
            )
        _check_writable(role, item, path)
        for key in identity:
            owners[key] = (role, str(item))
    if not overwrite:
        _refuse_existing(writes)


def _refuse_existing(writes: list[tuple[str, Union[str, AnyPath, None]]]) -> None:
    """A data file (a role not in :data:`REPORT_ROLES`) that exists: refused."""
    for role, item in writes:
        if item is None or str(item) == "-" or role in REPORT_ROLES:
            continue
        path = to_path(item)
        if path.exists() if isinstance(path, RemotePath) else os.path.lexists(path):
            raise GAEUsageError(f"{item} exists; give --overwrite to replace it")


def _check_writable(role: str, item, path: AnyPath) -> None:
    """Refuse what no write can go to (see :func:`check_writes`)."""
    if isinstance(path, RemotePath):
        if path.is_dir():
            raise GAEUsageError(f"{item}: the {role} is a directory; give a file path")
        return
    kind = file_kind(path)
    if kind in ("directory", "socket", "block device"):
        raise GAEUsageError(f"{item}: the {role} is a {kind}; give a file path")
    if role in REPORT_ROLES:
        if path.suffix.lower() in DATA_SUFFIXES:
            raise GAEUsageError(
                f"{item}: the {role} would be named like a data file ({path.suffix}); "
                f"did a shell glob expand into the option? give a report path"
            )
        if kind is None and not path.parent.is_dir():
            raise GAEUsageError(f"{item}: the directory {path.parent} does not exist")
    if len(path.name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise GAEUsageError(
            f"{item}: the {role}'s file name is longer than {NAME_MAX} bytes; choose a shorter output name"
        )


def input_files(inputs: list) -> list:
    """Every input file of ``inputs`` (paths, directories, globs; :func:`discover_inputs`)
    once, in a stable order: a file named twice is read once."""
    paths: list = []
    seen: set = set()
    for item in inputs:
        found, _ = discover_inputs([str(item)])
        for path, _root in found:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                paths.append(path)
    return paths
