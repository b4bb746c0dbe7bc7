"""The result of ``gae diff``: the JSON document's parts and what the plots need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from gaecli._version import __version__
from gaecli.comparison.figures import QUANTILE_METHOD
from gaecli.comparison.top_samples import TopSample
from gaecli.diff.options import DiffOptions
from gaecli.pipeline import normalize_label
from gaecli.stats import SignedLogHistogram


@dataclass
class DiffReport:
    """The result of a diff: the JSON document's parts, plus what the plots need (the Δ
    advantage histogram, the token sample, the top samples' per-token arrays)."""

    options: DiffOptions
    kernel: str
    files: list[dict]
    summary: dict
    groups: Optional[list[dict]]
    top: list[TopSample]
    histogram: SignedLogHistogram
    scatter: tuple[np.ndarray, np.ndarray]

    def old_side(self) -> dict:
        """What the old advantages are: a GAE baseline, a stored column, or (``--old-estimator``)
        another estimator, then with its name under ``estimator``."""
        options = self.options
        if options.old_estimator is not None:
            return {
                "source": "estimator",
                "estimator": options.old_estimator,
                "baseline": None,
                "advantages_column": None,
                "returns_column": None,
            }
        return {
            "source": "stored" if options.against is not None else "baseline",
            "baseline": options.old_semantics,
            "advantages_column": options.against,
            "returns_column": options.against_returns,
        }

    def to_dict(self) -> dict:
        """The JSON document of ``gae diff --json`` (every key in docs/diff.md)."""
        options = self.options
        return {
            "version": __version__,
            "gamma": options.gamma,
            "lambd": options.lambd,
            "kernel": self.kernel,
            "new": "masked",
            "estimator": options.estimator,
            "group_col": options.group_by_id,
            "step_col": options.step_by,
            "old": self.old_side(),
            "normalize": normalize_label(options),
            "tolerance": options.tolerance,
            "group_by": options.group_by,
            "id_col": options.id_col,
            "top": options.top,
            "files": self.files,
            "quantiles": dict(QUANTILE_METHOD),
            "summary": self.summary,
            "top_samples": [entry.to_dict() for entry in self.top],
            "groups": self.groups,
            "per_sample": options.per_sample,
        }
