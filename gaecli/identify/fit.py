"""How well a computation explains a stored column: its normalisation fitted (none, one
affine map over the batch, one per group), the residuals at trainable tokens, and the fit
of γ and λ (a coarse grid, then a bounded Nelder–Mead search from its best point)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

NORMALIZATIONS = ("none", "batch", "group")
"""How a candidate's raw output may have been normalised before it was stored, simplest
first: not at all, by one affine map over every row read (a whitening over the batch: its
mean and std fitted), or by one affine map per ``--group-col`` group."""

GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.97, 0.99, 0.995, 1.0)
"""The coarse grid of γ and of λ, denser near 1 where trainers set them."""

SEARCH_STEPS = 400
"""At most this many objective evaluations per refined fit."""


@dataclass(frozen=True)
class Affine:
    """``stored ≈ scale · raw + shift`` at trainable tokens: floats for the batch, float64
    ``[G]`` arrays per group (a group whose raw values are all equal: scale 0)."""

    scale: object
    shift: object

    def apply(self, raw: np.ndarray, group_of_token: Optional[np.ndarray]) -> np.ndarray:
        if group_of_token is None:
            return self.scale * raw + self.shift
        return self.scale[group_of_token] * raw + self.shift[group_of_token]


IDENTITY = Affine(1.0, 0.0)


def fit_affine(raw: np.ndarray, stored: np.ndarray, groups: Optional[np.ndarray], count: int = 0) -> Affine:
    """The least-squares affine map of ``raw`` onto ``stored`` (both the trainable tokens'
    float64 values), one for all or, with ``groups`` (each token's group, int64), one per
    group of ``count``: the centred form, so large means lose no digits."""
    if groups is None:
        n = raw.size
        if n == 0:
            return IDENTITY
        raw_mean, stored_mean = raw.mean(), stored.mean()
        centred = raw - raw_mean
        spread = float(centred @ centred)
        scale = float(centred @ (stored - stored_mean)) / spread if spread > 1e-24 * n * (1 + raw_mean**2) else 0.0
        return Affine(scale, float(stored_mean - scale * raw_mean))
    n = np.bincount(groups, minlength=count).astype(np.float64)
    safe = np.maximum(n, 1.0)
    raw_mean = np.bincount(groups, raw, count) / safe
    stored_mean = np.bincount(groups, stored, count) / safe
    centred = raw - raw_mean[groups]
    spread = np.bincount(groups, centred * centred, count)
    cross = np.bincount(groups, centred * (stored - stored_mean[groups]), count)
    flat = spread <= 1e-24 * safe * (1 + raw_mean**2)
    scale = np.where(flat, 0.0, cross / np.where(flat, 1.0, spread))
    return Affine(scale, stored_mean - scale * raw_mean)


TRIM = 0.75
"""The fits judge a candidate by the rows it reproduces best, this share of them: a few rows
the trainer computed otherwise (or corrupted) do not pull γ, λ or a whitening off the rest."""


@dataclass(frozen=True)
class Target:
    """The stored values a fit is judged on: float64 at the trainable tokens of the rows
    taken (``stored``), each such token's row (int64 ``rows``, of ``row_count``), its group
    (int64, None without groups) and the count of groups."""

    stored: np.ndarray
    rows: np.ndarray
    row_count: int
    groups: Optional[np.ndarray]
    count: int

    def _row_errors(self, predicted: np.ndarray) -> np.ndarray:
        """Each row's mean squared relative residual (rows without a trainable token: none)."""
        residual = (self.stored - predicted) / (1.0 + np.abs(self.stored))
        sums = np.bincount(self.rows, residual * residual, self.row_count)
        counts = np.bincount(self.rows, minlength=self.row_count)
        return sums[counts > 0] / counts[counts > 0]

    def objective(self, raw: np.ndarray, normalization: str) -> float:
        """The root of the mean of the :data:`TRIM` smallest rows' mean squared relative
        residual, ``(stored − predicted) / (1 + |stored|)``, with ``raw`` (the trainable
        tokens' raw output) under ``normalization`` fitted: the objective every fit minimises."""
        errors = self._row_errors(self.predicted(raw, normalization)[0])
        if errors.size == 0:
            return 0.0
        kept = max(int(np.ceil(TRIM * errors.size)), 1)
        return float(np.sqrt(np.mean(np.partition(errors, kept - 1)[:kept])))

    def predicted(self, raw: np.ndarray, normalization: str) -> tuple[np.ndarray, Affine]:
        """The stored values ``raw`` predicts under ``normalization`` and the map fitted: a
        batch map fitted again on the :data:`TRIM` rows it fits best (a per-group map is not)."""
        if normalization == "none":
            return raw, IDENTITY
        if normalization == "group":
            affine = fit_affine(raw, self.stored, self.groups, self.count)
            return affine.apply(raw, self.groups), affine
        affine = fit_affine(raw, self.stored, None)
        errors = np.full(self.row_count, np.inf)
        present = np.bincount(self.rows, minlength=self.row_count) > 0
        errors[present] = self._row_errors(affine.apply(raw, None))
        if present.sum() > 1:
            kept = max(int(np.ceil(TRIM * present.sum())), 1)
            threshold = np.partition(errors[present], kept - 1)[kept - 1]
            tokens = errors[self.rows] <= threshold
            affine = fit_affine(raw[tokens], self.stored[tokens], None)
        return affine.apply(raw, None), affine


def grid_search(
    raw_of: Callable[[float, float], np.ndarray], target: Target, normalizations: tuple[str, ...], lambdas
) -> dict[str, tuple[float, float, float]]:
    """Every (γ, λ) of :data:`GRID` (λ over ``lambdas``): for each normalisation the best
    ``(objective, γ, λ)``. ``raw_of(γ, λ)``: the raw output at the target's tokens."""
    best = {name: (np.inf, 1.0, 1.0) for name in normalizations}
    for gamma in GRID:
        for lambd in lambdas:
            raw = raw_of(gamma, lambd)
            for name in normalizations:
                value = target.objective(raw, name)
                if value < best[name][0]:
                    best[name] = (value, gamma, lambd)
    return best


RESTARTS = (0.05, 0.01, 0.002)
"""The simplex steps of the Nelder–Mead searches, each started again from the last one's best
point: a simplex that collapsed onto an edge of the square (λ near 1) opens again."""


def refine(objective: Callable[[float, float], float], start: tuple[float, float], fit_lambda: bool) -> tuple:
    """The (γ, λ) in [0, 1]² that minimise ``objective`` near ``start``: Nelder–Mead searches
    from simplices of :data:`RESTARTS`' steps around the best point so far, each point
    clipped into the square; λ held where ``fit_lambda`` is False (a golden-section search of
    γ). Returns ``(objective, γ, λ)``."""
    if not fit_lambda:
        value, gamma = _golden(lambda g: objective(g, start[1]), start[0])
        return value, gamma, start[1]
    best = (objective(*start), np.array(start, dtype=np.float64))
    for step in RESTARTS:
        best = _nelder_mead(objective, best[1], step)
        if best[0] < 1e-15:
            break
    return best[0], float(best[1][0]), float(best[1][1])


def _nelder_mead(objective: Callable[[float, float], float], origin: np.ndarray, step: float) -> tuple:
    """One Nelder–Mead search in [0, 1]² from ``origin`` and a step along each axis (inward
    where the square ends): ``(objective, point)`` of its best point."""
    points = [origin]
    for axis in range(2):
        offset = np.zeros(2)
        offset[axis] = step if origin[axis] + step <= 1.0 else -step
        points.append(origin + offset)
    scores = [objective(*point) for point in points]
    for _ in range(SEARCH_STEPS):
        order = np.argsort(scores)
        points, scores = [points[i] for i in order], [scores[i] for i in order]
        if scores[0] < 1e-15 or np.max(np.abs(np.array(points[1:]) - points[0])) < 1e-8:
            break
        centre = (points[0] + points[1]) / 2
        reflected = np.clip(centre + (centre - points[2]), 0.0, 1.0)
        value = objective(*reflected)
        if value < scores[0]:
            expanded = np.clip(centre + 2 * (centre - points[2]), 0.0, 1.0)
            expanded_value = objective(*expanded)
            points[2], scores[2] = (expanded, expanded_value) if expanded_value < value else (reflected, value)
        elif value < scores[1]:
            points[2], scores[2] = reflected, value
        else:
            contracted = (centre + points[2]) / 2
            contracted_value = objective(*contracted)
            if contracted_value < scores[2]:
                points[2], scores[2] = contracted, contracted_value
            else:
                points = [points[0]] + [(points[0] + point) / 2 for point in points[1:]]
                scores = [scores[0]] + [objective(*point) for point in points[1:]]
    best = int(np.argmin(scores))
    return scores[best], points[best]


def _golden(objective: Callable[[float], float], start: float) -> tuple[float, float]:
    """The minimum of a one-dimensional ``objective`` on [0, 1] near ``start``: a golden-section
    search on the bracket of the grid's neighbours of ``start``."""
    index = int(np.argmin(np.abs(np.array(GRID) - start)))
    low, high = GRID[max(index - 1, 0)], GRID[min(index + 1, len(GRID) - 1)]
    ratio = (np.sqrt(5.0) - 1) / 2
    a, b = low + (1 - ratio) * (high - low), low + ratio * (high - low)
    fa, fb = objective(a), objective(b)
    while high - low > 1e-9:
        if fa <= fb:
            high, b, fb = b, a, fa
            a = low + (1 - ratio) * (high - low)
            fa = objective(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = objective(b)
    candidates = [(objective(low), low), (objective(high), high), (fa, a), (fb, b), (objective(start), start)]
    value, point = min(candidates)
    return value, float(point)
