"""The old sides of a comparison: what the new advantages are compared with, each a small
named :class:`ComparisonSide` (a trainer profile recomputed, stored columns, or another
estimator recomputed), so that a diff compares the one new side with several old sides in one
pass over the data (docs/diff.md#what-is-compared). They are part of what a run computes, so
they live with its description (:mod:`gaecli.pipeline.description`); named here too."""

from gaecli.pipeline.description import BASELINE, ESTIMATOR, STORED, ComparisonSide, old_side_spec

__all__ = ["BASELINE", "ESTIMATOR", "STORED", "ComparisonSide", "old_side_spec"]
