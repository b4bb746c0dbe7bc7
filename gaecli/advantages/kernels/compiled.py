"""What the native kernel's two compiled passes (:mod:`.native`, plain GAE, and
:mod:`.native_variants`, the GAE variants) share: numba, when it is installed, and the split
of a batch's samples into token-balanced groups, one per thread."""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - exercised only without the dependency
    numba = None

AVAILABLE = numba is not None


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
