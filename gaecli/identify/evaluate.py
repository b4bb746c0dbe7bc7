"""One candidate judged on every row read: its normalisation fitted there, its residuals at
trainable tokens, the samples it reproduces and where it first breaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from gaecli.identify.candidates import Family
from gaecli.identify.fit import NORMALIZATIONS, Affine, Target
from gaecli.identify.sample import Sample

MATCH_TOLERANCE = 1e-3
"""A fitted whitening is the rows' own when its mean and std are theirs within this relative
tolerance (the trainers add ε ≤ 1e-5 to the std or 1e-8 to the variance)."""


@dataclass
class Judged:
    """A candidate on the sample: the computation (``family``), its fitted γ and λ (None where
    it reads neither) and normalisation with its ``affine`` map, the residual figures at
    trainable tokens, the samples (rows with a trainable token) and those reproduced, the
    first samples it breaks on (``breaks``, each at its first token; empty when it reproduces
    all) and the normalised outputs at every position (kept for the report on masked
    positions, then dropped)."""

    family: Family
    gamma: Optional[float]
    lambd: Optional[float]
    normalization: str
    affine: Affine
    max_abs: float
    rms: float
    samples: int
    reproduced: int
    breaks: list
    returns_max_abs: Optional[float] = None
    whitening: Optional[dict] = None
    predicted: Optional[np.ndarray] = field(default=None, repr=False)
    identifiable: dict = field(default_factory=dict)

    @property
    def first_break(self) -> Optional[dict]:
        return self.breaks[0] if self.breaks else None

    @property
    def explains(self) -> bool:
        return self.reproduced == self.samples

    @property
    def share(self) -> float:
        return self.reproduced / self.samples if self.samples else 1.0

    @property
    def parameters(self) -> int:
        """The rank of the normalisation (none 0, batch 1, group 2): an explanation with fewer ranks higher."""
        return NORMALIZATIONS.index(self.normalization)


def sample_target(sample: Sample) -> Target:
    """The sample's stored values at trainable tokens and their groups."""
    groups = None
    count = 0
    if sample.group_codes is not None:
        groups = sample.group_codes[sample.row_of_token[sample.trainable]]
        count = int(sample.group_codes.max()) + 1 if sample.group_codes.size else 0
    rows = sample.row_of_token[sample.trainable]
    return Target(sample.stored[sample.trainable], rows, sample.rows, groups, count)


def judge(family: Family, sample: Sample, target: Target, gamma, lambd, normalization: str, tolerance: float) -> Judged:
    """``family`` with γ, λ and ``normalization`` on every row of ``sample``."""
    raw, returns = family.compute(sample, gamma, lambd)
    trainable = sample.trainable
    predicted_trainable, affine = target.predicted(raw[trainable], normalization)
    stored = target.stored
    residual = np.abs(stored - predicted_trainable)
    bad = residual > tolerance * (1.0 + np.abs(stored))
    returns_max_abs = None
    if returns is not None and sample.stored_returns is not None:
        returns_residual = np.abs(sample.stored_returns[trainable] - returns[trainable])
        returns_max_abs = float(returns_residual.max()) if returns_residual.size else 0.0
        bad |= returns_residual > tolerance * (1.0 + np.abs(sample.stored_returns[trainable]))
    rows_of = sample.row_of_token[trainable]
    counts = sample.trainable_counts
    broken = np.bincount(rows_of[bad], minlength=sample.rows) > 0
    samples = int((counts > 0).sum())
    judged = Judged(
        family=family,
        gamma=gamma,
        lambd=lambd,
        normalization=normalization,
        affine=affine,
        max_abs=float(residual.max()) if residual.size else 0.0,
        rms=float(np.sqrt(np.mean(residual * residual))) if residual.size else 0.0,
        samples=samples,
        reproduced=samples - int(broken.sum()),
        breaks=_breaks(sample, bad, stored, predicted_trainable),
        returns_max_abs=returns_max_abs,
    )
    groups = None
    if normalization == "group":
        groups = sample.group_codes[sample.row_of_token]
    predicted = affine.apply(raw, groups) if normalization != "none" else raw
    written = family.written(sample)
    judged.predicted = predicted if written is None else np.where(written, predicted, 0.0)
    if normalization == "batch":
        judged.whitening = batch_whitening(affine, raw, trainable, sample.response)
    return judged


BREAKS_LISTED = 5
"""The samples a candidate breaks on that the report names (the first, in row order)."""


def _breaks(sample: Sample, bad: np.ndarray, stored: np.ndarray, predicted: np.ndarray) -> list[dict]:
    """The first :data:`BREAKS_LISTED` samples the candidate does not reproduce, each at its
    first token beyond the tolerance: ``sample``, ``where``, ``token``, ``stored``, ``computed``."""
    indices = np.flatnonzero(bad)
    if indices.size == 0:
        return []
    positions = np.flatnonzero(sample.trainable)[indices]
    rows = sample.row_of_token[positions]
    _, first = np.unique(rows, return_index=True)  # each broken row's first bad token (rows ascend)
    listed = []
    for index in first[:BREAKS_LISTED].tolist():
        row, position = int(rows[index]), int(positions[index])
        listed.append(
            {
                "sample": row,
                "where": sample.where(row),
                "token": position - int(sample.offsets[row]),
                "stored": float(stored[indices[index]]),
                "computed": float(predicted[indices[index]]),
            }
        )
    return listed


def batch_whitening(
    affine: Affine, raw: np.ndarray, trainable: np.ndarray, response: Optional[np.ndarray] = None
) -> dict:
    """The whitening a batch affine map stands for: ``stored = (raw − mean) / std``, and
    whose statistics those are: the trainable tokens' of the rows read (``over``
    ``trainable``), the response's (``response``, SkyRL's: the tokens of the ``response``
    mask, bool ``[N]``, every token without one), or neither (``null``: a batch other than
    the rows read, e.g. a larger one of which they are a part)."""
    if affine.scale == 0:
        return {"mean": None, "std": None, "over": None}
    std = 1.0 / affine.scale
    mean = -affine.shift * std
    over = None
    for name, tokens in (("trainable", raw[trainable]), ("response", raw if response is None else raw[response])):
        if tokens.size > 1:
            own_mean, own_std = float(tokens.mean()), float(tokens.std(ddof=1))
            spread = max(abs(own_std), 1e-12)
            if abs(mean - own_mean) <= MATCH_TOLERANCE * spread and abs(std - own_std) <= MATCH_TOLERANCE * spread:
                over = name
                break
    return {"mean": mean, "std": std, "over": over}
