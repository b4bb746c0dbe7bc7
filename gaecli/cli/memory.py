"""The ``gae`` process's allocator settings: buffers freed after one batch are reused by the
next instead of being returned to the system and faulted in again, numpy's and Arrow's
alike (one allocator, glibc's, for both)."""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# A batch of about a million tokens allocates buffers of a few MB each. By default glibc
# maps such a buffer on its own and unmaps it when freed, so each batch's buffers are new
# pages: thousands of page faults a batch (on many-short-rows files, a fifth of the run).
# Below this size a buffer comes from the heap, and the heap keeps up to TRIM_THRESHOLD
# of freed memory for reuse. Larger buffers (batches of very long rows) are mapped as before.
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 512 << 20


# (environment variable, mallopt parameter, gaecli's value)
SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
)

# Arrow's buffers (the decoded pages, the written columns) from the same glibc heap: Arrow's
# own default on Linux (mimalloc) gives freed pages back to the system after each batch, and
# a streaming read of a 500 MB rollout file then spent 1.6 to 7 s in page faults against
# 0.4 s with this pool. Read by pyarrow when it is first imported, after this is set.
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
ARROW_POOL = "system"


def reuse_freed_memory() -> None:
    """Set the allocator of this process (glibc on Linux, which Arrow's pool then uses too;
    elsewhere nothing) and of the worker processes it starts (through the environment they
    inherit) to keep freed batch buffers for reuse. A setting the user made in the environment is kept and left to
    glibc, which read it as the process started (and ignores one it cannot use): only
    gaecli's own values are passed to ``mallopt``, so a malformed setting cannot crash the
    tool."""
    if not sys.platform.startswith("linux"):
        return
    os.environ.setdefault(ARROW_POOL_VARIABLE, ARROW_POOL)
    ours = []
    for variable, parameter, value in SETTINGS:
        if variable not in os.environ:
            os.environ[variable] = str(value)
            ours.append((parameter, value))
    try:
        libc = ctypes.CDLL("libc.so.6")
        for parameter, value in ours:
            libc.mallopt(parameter, value)
    except (OSError, AttributeError):  # not glibc
        pass
