"""The old sides of a comparison: what the new advantages are compared with, each a small
named :class:`ComparisonSide` (a trainer profile recomputed, stored columns, or another
estimator recomputed), so that a diff compares the one new side with several old sides in one
pass over the data (docs/diff.md#what-is-compared)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaecli.advantages.spec import AdvantageSpec, estimator_spec

BASELINE = "baseline"
"""A side recomputed from the same values, rewards and mask under a trainer profile."""

STORED = "stored"
"""A side read from columns stored in the file (``--against``)."""

ESTIMATOR = "estimator"
"""A side recomputed from the same data by another estimator (``--old-estimator``,
docs/estimators.md) under the masked contract."""


@dataclass(frozen=True)
class ComparisonSide:
    """One old side (hashable, picklable): its ``kind`` (:data:`BASELINE`, :data:`STORED` or
    :data:`ESTIMATOR`), its ``name`` in the reports (the profile or alias as given, the stored
    advantages column, or the estimator), the ``semantics`` recomputed (baselines only), the
    stored columns (stored sides only; ``returns_column`` may be None) and the ``estimator``
    (estimator sides only)."""

    kind: str
    name: str
    semantics: Optional[str] = None
    advantages_column: Optional[str] = None
    returns_column: Optional[str] = None
    estimator: Optional[str] = None

    @classmethod
    def baseline(cls, semantics: str) -> "ComparisonSide":
        """A trainer profile (or an alias of one) recomputed, named as given."""
        return cls(BASELINE, semantics, semantics=semantics)

    @classmethod
    def stored(cls, advantages_column: str, returns_column: Optional[str] = None) -> "ComparisonSide":
        """Advantages (and returns, optional) stored in the file, named by the advantages column."""
        return cls(STORED, advantages_column, advantages_column=advantages_column, returns_column=returns_column)

    @classmethod
    def from_estimator(cls, estimator: str) -> "ComparisonSide":
        """Another estimator recomputed on the same rows, named by the estimator."""
        return cls(ESTIMATOR, estimator, estimator=estimator)

    @property
    def recomputed(self) -> bool:
        return self.kind != STORED

    def spec(
        self,
        gamma: Optional[float],
        lambd: Optional[float],
        group_by: Optional[str] = None,
        step_by: Optional[str] = None,
    ) -> Optional[AdvantageSpec]:
        """What recomputes this side (None for a stored side): GAE with γ, λ under its
        semantics, or its estimator with the parameters and per-row ids that estimator reads
        (:func:`gaecli.advantages.spec.estimator_spec`)."""
        if self.kind == ESTIMATOR:
            return estimator_spec(self.estimator, gamma, lambd, group_by, step_by)
        return AdvantageSpec(gamma, lambd, self.semantics) if self.recomputed else None

    @property
    def output_columns(self) -> tuple[str, str]:
        """``advantages_<name>``, ``returns_<name>`` (``-`` turned into ``_``, ``+`` into ``p``): the columns a
        recomputed side is written to (``gae recompute --keep-baseline``) and named by in
        messages."""
        suffix = self.name.replace("-", "_").replace("+", "p")
        return f"advantages_{suffix}", f"returns_{suffix}"

    def to_dict(self) -> dict:
        """The ``old`` object of the JSON reports: ``source``, ``baseline``,
        ``advantages_column``, ``returns_column``, and for an estimator side ``estimator``."""
        record = {
            "source": self.kind,
            "baseline": self.semantics,
            "advantages_column": self.advantages_column,
            "returns_column": self.returns_column,
        }
        if self.kind == ESTIMATOR:
            record["estimator"] = self.estimator
        return record
