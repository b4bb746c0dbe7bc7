"""Input discovery and output planning: which files to read and where each output goes."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import AnyPath, RemotePath, is_uri, list_parquet, to_path

GLOB_CHARACTERS = set("*?[")


@dataclass(frozen=True)
class FileJob:
    """One input file and the output it becomes; ``relative`` is the mirrored path.
    ``source`` and ``target`` are :class:`Path` or, for object-store URIs,
    :class:`gaecli.io.filesystem.RemotePath`."""

    source: AnyPath
    target: AnyPath
    relative: Path


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
        raise GAEUsageError(f"{item}: glob patterns work for local paths only; for a URI give the directory "
                            f"(read recursively for {' or '.join(patterns)}) or the files themselves")
    raise GAEUsageError(f"{item}: no such file or directory")


def discover_inputs(inputs: list[str], patterns: tuple[str, ...] = ("*.parquet",)) -> tuple[list[tuple[AnyPath, AnyPath]], bool]:
    """Expand paths, directories (recursively, files matching ``patterns``) and globs into
    (file, root) pairs in a stable order. The flag says whether the inputs name one plain
    file. URIs (``s3://…``) go through pyarrow's file systems: an object or a prefix
    listed recursively; globs are for local paths only."""
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
        if GLOB_CHARACTERS & set(item) and not path.exists():
            matches = sorted(Path(m) for m in glob.glob(item, recursive=True) if Path(m).is_file())
            if not matches:
                raise GAEUsageError(f"{item}: no file matches this pattern")
            root = _glob_root(item)
            found.extend((match, root) for match in matches)
        elif path.is_dir():
            matches = sorted({p for pattern in patterns for p in path.rglob(pattern) if p.is_file()})
            if not matches:
                raise GAEUsageError(f"{item}: directory holds no {' or '.join(patterns)} file")
            found.extend((match, path) for match in matches)
        elif path.is_file():
            found.append((path, path.parent))
        else:
            raise GAEUsageError(f"{item}: no such file or directory")
    single = len(inputs) == 1 and len(found) == 1 and to_path(inputs[0]).is_file()
    return found, single


def plan_outputs(inputs: list[str], output: str, *, overwrite: bool = False, suffixes: tuple[str, ...] = ()) -> list[FileJob]:
    """Map every input file to its output path.

    One plain file in → ``output`` is a file (or, when ``output`` is an existing directory,
    the file of the same name inside it). Otherwise ``output`` is a directory and each
    input's path relative to its root (the directory given, the fixed part of a glob, or
    the file's own directory) is mirrored under it. Refuses (:class:`GAEUsageError`) an
    output equal to an input, two inputs landing on one output, and an existing output
    (also ``output`` with each of ``suffixes``, e.g. a rejects file) unless ``overwrite``.
    """
    found, single = discover_inputs(inputs)
    out = to_path(output)
    jobs: list[FileJob] = []
    if single:
        source = found[0][0]
        target = out / source.name if out.is_dir() else out
        jobs.append(FileJob(source, target, Path(target.name)))
    else:
        if out.exists() and not out.is_dir():
            raise GAEUsageError(f"{output}: several inputs need a directory as output, and this is a file")
        for source, root in found:
            relative = Path(source.relative_to(root) if isinstance(source, RemotePath) else os.path.relpath(source, root))
            jobs.append(FileJob(source, out / relative, relative))
    sources = {job.source.resolve() for job in jobs}
    seen: dict[AnyPath, AnyPath] = {}
    for job in jobs:
        resolved = job.target.resolve()
        if resolved in sources:
            raise GAEUsageError(f"{job.target}: the output would replace an input; choose another output path")
        if resolved in seen:
            raise GAEUsageError(f"{seen[resolved]} and {job.source} would both be written to {job.target}")
        seen[resolved] = job.source
        if not overwrite:
            for candidate in (job.target, *(with_suffix(job.target, s) for s in suffixes)):
                if candidate.exists():
                    raise GAEUsageError(f"{candidate} exists; give --overwrite to replace it")
    return jobs


def with_suffix(target: AnyPath, suffix: str) -> AnyPath:
    """``out.parquet`` + ``.rejected`` → ``out.rejected.parquet``."""
    if target.suffix == ".parquet":
        return target.with_name(target.stem + suffix + ".parquet")
    return target.with_name(target.name + suffix + ".parquet")
