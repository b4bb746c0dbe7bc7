"""Grouped reductions over many files: per-row quantities of each computed batch, added
per group key in row order and merged in input order, so any batch size, engine or worker
count gives the same bits. The ``--normalize`` statistics are one
(:func:`normalize_reduction`); estimators that need group statistics (a group's mean score,
its count) declare their own :class:`Reduction` and reuse the same pass
(:func:`gaecli.pipeline.engine_reduction`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from gaecli.grouping import GroupedMoments
from gaecli.stats import row_moments

ROW_QUANTITIES: dict[str, tuple[Callable, type]] = {
    # name: (per-row function (per-token array [N], trainable [N], offsets [B + 1]) -> per-row arrays [B],
    #        accumulator of those per group in row order: add(keys, *rows), merge(other) -> codes)
    "trainable-moments": (row_moments, GroupedMoments),
}
"""What a reduction can gather per row. ``trainable-moments``: count, sum and sum of squares
over the row's trainable tokens (:func:`gaecli.stats.row_moments`), kept as compensated
sums in row order (:class:`gaecli.grouping.GroupedMoments`)."""


@dataclass(frozen=True)
class Reduction:
    """What one grouped-reduction pass gathers: for each of ``operands`` (per-token arrays of
    a computed batch, by attribute name: ``new``, ``old``), the per-row ``quantity`` (a key of
    :data:`ROW_QUANTITIES`), added per value of the ``key`` column (None: one group for the
    whole input). Picklable, so that engines ship it to workers."""

    operands: tuple[str, ...]
    key: Optional[str] = None
    quantity: str = "trainable-moments"

    def __post_init__(self) -> None:
        if self.quantity not in ROW_QUANTITIES:
            raise ValueError(f"unknown row quantity {self.quantity!r}; known: {', '.join(ROW_QUANTITIES)}")


def normalize_reduction(key: Optional[str]) -> Reduction:
    """The ``--normalize`` statistics: moments of the new and the old advantages over
    trainable tokens, per value of ``key`` (``--normalize-by``) or over the whole input."""
    return Reduction(("new", "old"), key)


@dataclass
class ReductionResult:
    """A reduction over some rows: one accumulator per operand, and the rows and tokens read
    for it (the pass counts them; engines report progress with them). :meth:`merge` adds
    another part's (parts merged in the same order give the same bits)."""

    reduction: Reduction
    groups: dict[str, GroupedMoments] = field(default_factory=dict)
    rows: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        accumulator = ROW_QUANTITIES[self.reduction.quantity][1]
        for operand in self.reduction.operands:
            self.groups.setdefault(operand, accumulator())

    def add(self, operands: dict[str, np.ndarray], trainable: np.ndarray, offsets: np.ndarray, keys) -> None:
        """Add one batch: ``operands`` maps each operand to its flat ``[N]`` array,
        ``trainable`` bool ``[N]``, ``offsets`` ``[B + 1]``, ``keys`` the batch's ``[B]``
        key column (an Arrow array; None for one group)."""
        per_row = ROW_QUANTITIES[self.reduction.quantity][0]
        for operand in self.reduction.operands:
            self.groups[operand].add(keys, *per_row(operands[operand], trainable, offsets))

    def merge(self, other: "ReductionResult") -> dict[str, np.ndarray]:
        """Add ``other``'s groups after ours; returns, per operand, the code here of each of
        its groups."""
        codes = {operand: self.groups[operand].merge(other.groups[operand]) for operand in self.reduction.operands}
        self.rows += other.rows
        self.tokens += other.tokens
        return codes


def merge_results(reduction: Reduction, parts: list[ReductionResult]) -> ReductionResult:
    """The parts merged in the order given (input order)."""
    merged = ReductionResult(reduction)
    for part in parts:
        merged.merge(part)
    return merged
