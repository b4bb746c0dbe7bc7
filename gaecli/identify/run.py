"""The run of ``gae identify``: the sample read, every candidate's parameters fitted on its
first rows, every candidate judged on all of it, ranked and grouped into a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from gaecli.identify.candidates import Family, families
from gaecli.identify.defaults import FIT_ROWS, FIT_TOKENS, MIN_FIT_TOKENS
from gaecli.identify.evaluate import Judged, judge, sample_target
from gaecli.identify.fit import GRID, grid_search, refine
from gaecli.identify.options import IdentifyOptions
from gaecli.identify.report import IdentifyReport, build_report
from gaecli.identify.sample import Sample, read_sample
from gaecli.progress import NoProgress, Progress

PERTURBATION = 0.01
"""γ or λ is identifiable when moving it by this much changes some trainable token's value
beyond the tolerance."""


def fit_rows(sample: Sample) -> tuple[Sample, bool]:
    """The rows γ and λ are fitted on: the first :data:`FIT_ROWS` with at least
    :data:`MIN_FIT_TOKENS` trainable tokens, within :data:`FIT_TOKENS` tokens (the first such
    row always); when no row has that many, every row with a trainable token (the flag False:
    λ is then barely identifiable)."""
    counts = sample.trainable_counts
    eligible = counts >= MIN_FIT_TOKENS
    enough = bool(eligible.any())
    if not enough:
        eligible = counts > 0
    lengths = np.where(eligible, np.diff(sample.offsets), 0)
    keep = eligible & (np.cumsum(eligible) <= FIT_ROWS) & (np.cumsum(lengths) <= FIT_TOKENS)
    if eligible.any() and not keep.any():
        keep[int(np.flatnonzero(eligible)[0])] = True
    return sample.subset(keep), enough


def _fitted(family: Family, fit: Sample, normalizations: tuple[str, ...]) -> dict[str, tuple]:
    """Each normalisation's fitted (γ, λ) of ``family`` on the fit rows ((None, None) for a
    family that reads neither; λ None for ``reinforce++``)."""
    if not family.fits_gamma:
        return {name: (None, None) for name in normalizations}
    target = sample_target(fit)
    trainable = fit.trainable

    def raw_of(gamma: float, lambd: float) -> np.ndarray:
        return family.compute(fit, gamma, lambd)[0][trainable]

    best = grid_search(raw_of, target, normalizations, GRID if family.fits_lambda else (1.0,))
    fitted = {}
    for name in normalizations:
        _, gamma, lambd = best[name]
        _, gamma, lambd = refine(
            lambda g, lam, name=name: target.objective(raw_of(g, lam), name), (gamma, lambd), family.fits_lambda
        )
        fitted[name] = (gamma, lambd if family.fits_lambda else None)
    return fitted


def rank_key(judged: Judged, order: int) -> tuple:
    """Explanations first, the simplest first among them (the normalisation with fewer free
    numbers, then fewer fitted parameters: an outcome estimator none, ``reinforce++`` γ, GAE
    γ and λ); then the share of samples reproduced, then the RMS residual; ties in
    documentation order."""
    if judged.explains:
        family = judged.family
        return (0, judged.parameters, int(family.fits_gamma) + int(family.fits_lambda), 0.0, 0.0, order)
    return (1, 0, 0, -judged.share, judged.rms, order)


def identify_sample(sample: Sample, options: IdentifyOptions, column: Optional[str] = None) -> IdentifyReport:
    """Every candidate fitted and judged on ``sample`` (the rows read), ranked and grouped."""
    fit, enough = fit_rows(sample)
    target = sample_target(sample)
    with_groups = sample.group_codes is not None
    judged: list[tuple[tuple, Judged]] = []
    best_predicted = None
    for order, family in enumerate(families(with_groups, tuple(sample.variants))):
        normalizations = tuple(name for name in family.normalizations if name != "group" or with_groups)
        fitted = _fitted(family, fit, normalizations)
        for name in normalizations:
            gamma, lambd = fitted[name]
            entry = judge(family, sample, target, gamma, lambd, name, options.tolerance)
            key = rank_key(entry, order)
            if best_predicted is None or key < best_predicted[0]:
                best_predicted = (key, entry.predicted)
            if not entry.explains:  # an explanation keeps its outputs: the masked positions may order the ties
                entry.predicted = None
            judged.append((key, entry))
            if entry.explains:
                break  # a simpler normalisation explains it: the others add nothing
    judged.sort(key=lambda pair: pair[0])
    ranked = _masked_positions_first([entry for _, entry in judged], sample, options.tolerance)
    best = ranked[0]
    if best.predicted is None:
        best.predicted = best_predicted[1]
    for entry in ranked[1:]:
        entry.predicted = None
    best.identifiable = _identifiable(best, sample, target, options.tolerance)
    return build_report(ranked, sample, options, column or options.against, fit.rows, enough)


def _masked_positions_first(ranked: list[Judged], sample: Sample, tolerance: float) -> list[Judged]:
    """The ranking with the explanations tied for first (the same normalisation and number of
    fitted parameters) ordered by the share of masked positions they reproduce too, most
    first (stable): of computations equal at trainable tokens, the one that also wrote what the
    column holds at masked ones leads."""
    first = ranked[0]
    if not first.explains:
        return ranked
    tied = [entry for entry in ranked if entry.explains and rank_key(entry, 0)[:3] == rank_key(first, 0)[:3]]
    masked = ~sample.trainable
    stored = sample.stored[masked]

    def share(entry: Judged) -> float:
        if stored.size == 0:
            return 1.0
        return float(np.mean(np.abs(stored - entry.predicted[masked]) <= tolerance * (1.0 + np.abs(stored))))

    ordered = sorted(tied, key=lambda entry: -share(entry))
    return ordered + ranked[len(tied) :]


def _identifiable(best: Judged, sample: Sample, target, tolerance: float) -> dict:
    """Whether moving γ, or λ, by :data:`PERTURBATION` changes the best candidate's values at
    some trainable token beyond the tolerance (read where the family fits it)."""
    family = best.family
    found = {}
    for name, fitted in (("gamma", family.fits_gamma), ("lambd", family.fits_lambda)):
        if not fitted:
            continue
        values = {"gamma": best.gamma, "lambd": best.lambd}
        moved = values[name] + PERTURBATION if values[name] + PERTURBATION <= 1.0 else values[name] - PERTURBATION
        values[name] = moved
        raw, _ = family.compute(sample, values["gamma"], values["lambd"] if family.fits_lambda else 1.0)
        groups = sample.group_codes[sample.row_of_token] if best.normalization == "group" else None
        moved_predicted = best.affine.apply(raw, groups)[sample.trainable]
        change = np.abs(moved_predicted - best.predicted[sample.trainable])
        found[name] = bool((change > tolerance * (1.0 + np.abs(target.stored))).any())
    return found


def identify_files(
    inputs: list[str | Path], options: Optional[IdentifyOptions] = None, progress: Optional[Progress] = None
) -> IdentifyReport:
    """Which computation produced the stored advantages ``options.against`` of the rollout
    files ``inputs`` (paths, directories, globs, as :func:`gaecli.diff_files` takes them)?
    Reads the first ``options.sample_rows`` rows (docs/identify.md), checked as ``gae diff``
    checks them; fits and judges every candidate there. Raises as :func:`gaecli.diff_files`."""
    from gaecli.io.paths import check_writes, input_files, report_writes
    from gaecli.io.reader import RolloutFile
    from gaecli.run import read_footers
    from gaecli.run.driver import total_rows

    options = options or IdentifyOptions()
    paths = input_files(list(inputs))
    check_writes(paths, report_writes(options.report_paths))
    footers = read_footers(paths, strict=True)
    progress = progress or NoProgress()
    rows = total_rows(footers)
    progress.start("reading the sample", min(rows, options.sample_rows or rows))
    opened = []

    def rollouts():
        for path, footer in zip(paths, footers):
            rollout = RolloutFile(path, footer)
            opened.append(rollout)
            yield str(path), rollout

    try:
        sample = read_sample(rollouts(), options, rows, progress)
    finally:
        for rollout in opened:
            rollout.close()
    progress.finish()
    return identify_sample(sample, options)


def identify_table(table: Any, **options: Any) -> IdentifyReport:
    """:func:`identify_files` on a table in memory (the kinds :func:`gaecli.recompute_table`
    takes); ``options``: the fields of :class:`IdentifyOptions` but ``report_paths``. Error
    messages name the table where they would name a file; a sample's ``where`` is its row."""
    from gaecli.io.memory import TableRollout, refuse_writes, to_arrow

    refuse_writes("identify_table", options)
    identify = IdentifyOptions(**options)
    arrow, _ = to_arrow(table)
    sample = read_sample([(None, TableRollout(arrow))], identify, arrow.num_rows)
    return identify_sample(sample, identify)
