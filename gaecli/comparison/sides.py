"""The old sides of a comparison: what the new advantages are compared with, each a small
named :class:`ComparisonSide` (a trainer profile recomputed, or stored columns), so that a
diff compares the one new side with several old sides in one pass over the data
(docs/diff.md#what-is-compared). A later kind (another estimator) is one more constructor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaecli.advantages.spec import AdvantageSpec

BASELINE = "baseline"
"""A side recomputed from the same values, rewards and mask under a trainer profile."""

STORED = "stored"
"""A side read from columns stored in the file (``--against``)."""


@dataclass(frozen=True)
class ComparisonSide:
    """One old side (hashable, picklable): its ``kind`` (:data:`BASELINE` or :data:`STORED`),
    its ``name`` in the reports (the profile or alias as given, or the stored advantages
    column), the ``semantics`` recomputed (baselines only) and the stored columns (stored
    sides only; ``returns_column`` may be None)."""

    kind: str
    name: str
    semantics: Optional[str] = None
    advantages_column: Optional[str] = None
    returns_column: Optional[str] = None

    @classmethod
    def baseline(cls, semantics: str) -> "ComparisonSide":
        """A trainer profile (or an alias of one) recomputed, named as given."""
        return cls(BASELINE, semantics, semantics=semantics)

    @classmethod
    def stored(cls, advantages_column: str, returns_column: Optional[str] = None) -> "ComparisonSide":
        """Advantages (and returns, optional) stored in the file, named by the advantages column."""
        return cls(STORED, advantages_column, advantages_column=advantages_column, returns_column=returns_column)

    @property
    def recomputed(self) -> bool:
        return self.kind == BASELINE

    def spec(self, gamma: float, lambd: float) -> Optional[AdvantageSpec]:
        """What recomputes this side: GAE with γ, λ under its semantics (None for a stored side)."""
        return AdvantageSpec(gamma, lambd, self.semantics) if self.recomputed else None

    @property
    def output_columns(self) -> tuple[str, str]:
        """``advantages_<name>``, ``returns_<name>`` (``-`` turned into ``_``): the columns a
        recomputed side is written to (``gae recompute --keep-baseline``) and named by in
        messages."""
        suffix = self.name.replace("-", "_")
        return f"advantages_{suffix}", f"returns_{suffix}"

    def to_dict(self) -> dict:
        """The ``old`` object of the JSON reports: ``source``, ``baseline``,
        ``advantages_column``, ``returns_column``."""
        return {
            "source": self.kind,
            "baseline": self.semantics,
            "advantages_column": self.advantages_column,
            "returns_column": self.returns_column,
        }
