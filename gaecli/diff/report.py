"""The result of ``gae diff``: the JSON document's parts and what the plots need, one
:class:`ComparisonResult` per old side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from gaecli._version import __version__
from gaecli.comparison.figures import QUANTILE_METHOD
from gaecli.comparison.top_samples import TopSample
from gaecli.diff.options import DiffOptions
from gaecli.pipeline.description import ComparisonSide
from gaecli.stats import SignedLogHistogram


@dataclass
class ComparisonResult:
    """The comparison of the new side with one old side: the ``comparisons[]`` entry of the
    JSON document, plus what the plots need (the Δ advantage histogram, the token sample,
    the top samples' per-token arrays)."""

    side: ComparisonSide
    summary: dict
    groups: Optional[list[dict]]  # the groups hit hardest (GroupedFigures.hardest), largest first
    group_count: Optional[int]  # groups in all (None without --group-by)
    top: list[TopSample]
    histogram: SignedLogHistogram
    scatter: tuple[np.ndarray, np.ndarray]

    @property
    def name(self) -> str:
        return self.side.name

    def to_dict(self) -> dict:
        """``{name, summary, top_samples, groups}`` (docs/diff.md#the-json-document)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "top_samples": [entry.to_dict() for entry in self.top],
            "groups": self.groups,
        }


@dataclass
class DiffReport:
    """The result of a diff: one :class:`ComparisonResult` per old side, in the order given.
    ``summary``, ``groups``, ``top``, ``histogram`` and ``scatter`` are the first
    comparison's (as the JSON document's top level). ``skipped``: the rows left out under
    ``--on-invalid skip`` (:meth:`gaecli.pipeline.rejects.SkippedRows.to_dict`)."""

    options: DiffOptions
    kernel: str
    files: list[dict]
    comparisons: list[ComparisonResult]
    skipped: dict = field(default_factory=lambda: {"count": 0, "rows": []})

    @property
    def first(self) -> ComparisonResult:
        return self.comparisons[0]

    @property
    def summary(self) -> dict:
        return self.first.summary

    @property
    def groups(self) -> Optional[list[dict]]:
        return self.first.groups

    @property
    def group_count(self) -> Optional[int]:
        return self.first.group_count

    @property
    def top(self) -> list[TopSample]:
        return self.first.top

    @property
    def histogram(self) -> SignedLogHistogram:
        return self.first.histogram

    @property
    def scatter(self) -> tuple[np.ndarray, np.ndarray]:
        return self.first.scatter

    def to_dict(self) -> dict:
        """The JSON document of ``gae diff --json`` (every key in docs/diff.md): the new side
        (``new_spec``), every comparison (``comparisons``), and at the top level the first
        comparison's figures as before (``old``, ``summary``, ``top_samples``, ``groups``)."""
        options = self.options
        comparisons = [comparison.to_dict() for comparison in self.comparisons]
        first = comparisons[0]
        return {
            "version": __version__,
            "gamma": options.gamma,
            "lambd": options.lambd,
            "kernel": self.kernel,
            "new": options.new_spec.semantics,
            "new_spec": options.new_spec.to_dict(),
            "estimator": options.estimator,
            "group_col": options.group_by_id,
            "step_col": options.step_by,
            "old": self.first.side.to_dict(),
            "normalize": options.new_spec.normalize_label,
            "tolerance": options.tolerance,
            "group_by": options.group_by,
            "id_col": options.id_col,
            "top": options.top,
            "files": self.files,
            "on_invalid": options.on_invalid,
            "skipped": self.skipped,
            "rejects": options.rejects,
            "quantiles": dict(QUANTILE_METHOD),
            "summary": first["summary"],
            "top_samples": first["top_samples"],
            "groups": first["groups"],
            "group_count": self.first.group_count,
            "groups_out": options.groups_out,
            "comparisons": comparisons,
            "per_sample": options.per_sample,
        }
