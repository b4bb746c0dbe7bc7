"""What the native kernel's two compiled passes (:mod:`.native`, plain GAE, and
:mod:`.native_variants`, the GAE variants) share: numba, when it is installed, its threads
(started as a good neighbour to the caller's torch), and the split of a batch's samples into
token-balanced groups, one per thread."""

from __future__ import annotations

import os
import threading

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - exercised only without the dependency
    numba = None

AVAILABLE = numba is not None

WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""The OpenMP runtimes' settings of how long an idle worker spins before it sleeps; one set by
the user is left as it is."""

_launch = threading.Lock()
_launched = False


def thread_count() -> int:
    """numba's number of threads, its thread pool started first if it is not yet.

    numba's OpenMP pool links the system's ``libgomp``, torch ships its own: two runtimes, two
    pools of one thread per core in one process. By default an OpenMP worker spins for a while
    after each parallel region, so right after a gaecli kernel the trainer's next torch op
    found its cores taken by gaecli's idle workers (20 % slower on two cores, many times on
    16). The pool is therefore started with ``OMP_WAIT_POLICY=PASSIVE`` (workers sleep at once;
    the runtime reads it when it loads), and the variable removed again, so that torch's
    runtime and child processes see the environment as it was. A policy the user set wins."""
    global _launched
    if not _launched:
        with _launch:
            if not _launched:
                _start_threads()
                _launched = True
    return numba.get_num_threads()


def _start_threads() -> None:
    chosen = any(name in os.environ for name in WAIT_POLICY_VARIABLES)
    if not chosen:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        from numba.np.ufunc import parallel

        parallel._launch_threads()
    finally:
        if not chosen:
            os.environ.pop("OMP_WAIT_POLICY", None)


def plan_groups(offsets: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Split the samples into ``groups`` groups of about equal token counts: group ``g``
    holds the samples whose first position lies in ``[g, g + 1) * N / groups``, longest
    first (equal lengths in sample order). Returns ``(order, group_bounds)``: int64 ``[B]``
    sample indices and ``[groups + 1]`` bounds into it. Compiled: a trainer pays it on
    every call."""
    return _plan_groups_compiled(np.asarray(offsets, dtype=np.int64), groups)


def _plan_groups_loop(offsets, groups):
    """:func:`plan_groups` as the loop that is compiled."""
    batch = offsets.shape[0] - 1
    total = offsets[batch]
    group_bounds = np.empty(groups + 1, dtype=np.int64)
    for group in range(groups):
        group_bounds[group] = np.searchsorted(offsets[:batch], (total * group) // groups)
    group_bounds[groups] = batch
    order = np.empty(batch, dtype=np.int64)
    for group in range(groups):
        first, stop = group_bounds[group], group_bounds[group + 1]
        longest_first = np.argsort(offsets[first:stop] - offsets[first + 1 : stop + 1], kind="mergesort")
        order[first:stop] = longest_first + first
    return order, group_bounds


_plan_groups_compiled = numba.njit(cache=True, nogil=True)(_plan_groups_loop) if AVAILABLE else None
