"""Where a local write lands: into the node itself when it is a stream (a character device,
a FIFO, an open descriptor such as ``/dev/stdout`` or a link to ``/proc/self/fd/N``), or a
finished temp file put in place by a rename that never replaces a file which appeared
meanwhile unless told to (:func:`place`)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from pathlib import Path
from typing import Optional, Union

_DESCRIPTOR = re.compile(r"^/(?:dev/fd|proc/(self|thread-self|\d+)(?:/task/\d+)?/fd)/(\d+)$")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_LINKS = 40  # as the kernel's limit of symlinks followed in one lookup


def _descriptor_named(name: str) -> Optional[tuple[int, bool]]:
    """(descriptor, whether it is this process's) that ``name`` (absolute, its directory
    resolved) is, or None."""
    if name in _STANDARD:
        return _STANDARD[name], True
    match = _DESCRIPTOR.match(name)
    if match is None:
        return None
    owner = match[1]
    return int(match[2]), owner in (None, "self", "thread-self") or int(owner) == os.getpid()


def descriptor_behind(path: Union[str, Path]) -> Optional[tuple[int, bool]]:
    """The open descriptor ``path`` names, following its symlinks one by one (a user's link
    to ``/proc/self/fd/1``, ``/dev/stdout`` → ``/proc/self/fd/1``): (descriptor, whether it
    is this process's), or None when no name on the way is a descriptor. A descriptor's own
    link (to the file the shell redirected to, or ``pipe:[123]``) is not followed: writing
    through the descriptor is what reaches that file."""
    current = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        directory, name = os.path.split(current)
        current = os.path.join(os.path.realpath(directory), name)
        found = _descriptor_named(current)
        if found is not None:
            return found
        try:
            link = os.readlink(current)
        except OSError:
            return None
        current = os.path.join(os.path.dirname(current), link)
    return None


def writes_through(path: Union[str, Path]) -> bool:
    """True when a write to ``path`` must go into the node it leads to, never by a temp file
    renamed over it: an open descriptor (:func:`descriptor_behind`), or a character device
    or FIFO (links followed). The one decision of every writer (Parquet outputs, rejects,
    per-sample and groups files, importers, reports)."""
    if descriptor_behind(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def open_through(path: Union[str, Path]) -> int:
    """A new descriptor writing into the node of a :func:`writes_through` path: this
    process's own descriptor duplicated (sharing its offset and mode: what ``> file`` or
    ``>> file`` opened), else the node opened for writing (never created, never truncated).
    Raises :class:`OSError`."""
    found = descriptor_behind(path)
    if found is not None and found[1]:
        return os.dup(found[0])
    return os.open(path, os.O_WRONLY | os.O_NOCTTY)


# ----------------------------------------------------------------------------- the final rename

# link(2) refused by the file system (FAT, some FUSE and network file systems), not by a name there
_NO_HARD_LINKS = {errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS, errno.EACCES}
_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def place(temp: Path, target: Path, *, overwrite: bool) -> None:
    """Put the finished ``temp`` at ``target`` (same directory) atomically. ``overwrite``: a
    rename over whatever is there. Otherwise nothing there is ever replaced: a hard link
    (which fails with EEXIST when a file appeared since the run checked), then the temp
    name removed; where the file system refuses hard links, ``renameat2(RENAME_NOREPLACE)``;
    where that is unsupported too, a rename after a check (a window remains; see
    docs/reliability.md). Raises :class:`FileExistsError` when ``target`` exists (``temp``
    is left for the caller to remove), :class:`OSError` for other failures."""
    if overwrite:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
        rename_noreplace(temp, target)
        return
    os.unlink(temp)


def _renameat2():
    """libc's ``renameat2`` (glibc 2.28+), or None."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


def rename_noreplace(temp: Path, target: Path) -> None:
    """Rename ``temp`` to ``target`` unless something is there: ``renameat2`` with
    ``RENAME_NOREPLACE`` where the system and file system offer it, else a check then a
    rename. Raises :class:`FileExistsError` or :class:`OSError`."""
    function = _renameat2()
    if function is not None:
        if function(_AT_FDCWD, os.fsencode(temp), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        number = ctypes.get_errno()
        if number not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            error_class = FileExistsError if number == errno.EEXIST else OSError
            raise error_class(number, os.strerror(number), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.rename(temp, target)
