"""Where numba keeps gaecli's compiled kernels, and whether it holds them yet: a directory the
user can write (``$XDG_CACHE_HOME/gaecli/numba``, else ``~/.cache/gaecli/numba``; a
``NUMBA_CACHE_DIR`` the user set wins), chosen when ``gaecli`` is imported, before any of its
modules imports numba. Imports neither numba nor numpy (``gae --help`` loads this)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Optional

CACHE_VARIABLE = "NUMBA_CACHE_DIR"
"""numba's setting of its cache directory (read when numba is imported, and again before each
compilation when a ``NUMBA_`` variable changed)."""

PACKAGE = Path(os.path.abspath(__file__)).parents[2]
"""The ``gaecli`` package directory, as numba names its source files (absolute, links kept)."""


def user_cache_directory() -> Optional[Path]:
    """``$XDG_CACHE_HOME/gaecli/numba`` (an absolute ``XDG_CACHE_HOME``), else
    ``~/.cache/gaecli/numba``; None when there is no home directory to put it in."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no HOME and no passwd entry
            return None
    return Path(base) / "gaecli" / "numba"


def use_user_cache() -> Optional[Path]:
    """Point numba's cache at :func:`user_cache_directory` unless ``NUMBA_CACHE_DIR`` is set
    (then it stays as the user set it), so that compiled kernels persist where the package's
    own directory is not writable (numba's default is the package's ``__pycache__``). Sets the
    variable in this process's environment (gaecli's worker processes inherit it), and numba's
    configuration too where numba is imported already. Returns the cache directory in force
    (None: numba's default). Where the directory cannot be made, numba falls back to its
    default by itself."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    directory = user_cache_directory()
    if directory is None:
        return None
    os.environ[CACHE_VARIABLE] = str(directory)
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = str(directory)
    return directory


def _index_directory(source_directory: Path, cache_directory: Optional[str]) -> Path:
    """Where numba writes the index files of the functions defined in ``source_directory``'s
    modules (numba's ``_CacheLocator.get_suitable_cache_subpath``)."""
    if not cache_directory:
        return source_directory / "__pycache__"
    hashed = hashlib.sha1(str(source_directory).encode()).hexdigest()
    return Path(cache_directory) / f"{source_directory.name}_{hashed}"


def kernels_cached() -> bool:
    """Whether numba's cache (``NUMBA_CACHE_DIR``, else the package's ``__pycache__``) holds
    compiled code of this gaecli for this Python: an index file of one of its modules, written
    no earlier than that module's source. False: the next run compiles its kernels (the first
    run, or the first after gaecli changed), which takes seconds to a minute. Reads file names
    and times only; where the package's directories cannot be listed (no permission), True:
    nothing is known, and nothing is said."""
    cache_directory = os.environ.get(CACHE_VARIABLE)
    suffix = f".py{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}.nbi"
    try:
        directories = [PACKAGE, *(path for path in PACKAGE.rglob("*") if path.is_dir() and path.name != "__pycache__")]
    except OSError:
        return True
    for source_directory in directories:
        try:
            indexes = list(os.scandir(_index_directory(source_directory, cache_directory)))
        except OSError:
            continue
        for index in indexes:
            if not index.name.endswith(suffix):
                continue
            source = source_directory / f"{index.name.split('.', 1)[0]}.py"
            try:
                if index.stat().st_mtime >= source.stat().st_mtime:
                    return True
            except OSError:
                continue
    return False
