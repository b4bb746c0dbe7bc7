"""The statistics passes over every file before the computing pass, on an engine: one
:func:`gaecli.pipeline.file_statistics` unit per file, the parts merged in input order (so
the same bits for any engine and worker count) and handed out per file, each unit getting
the statistics of its own keys only: the critic-free estimators' scores
(:func:`engine_file_scores`), then the whitening moments (:func:`engine_file_moments`);
both as a run needs them: :func:`engine_pre_passes`. Each pass is over the files of a
:class:`gaecli.run.Run` (their footers, the computation, the engine, the progress), on the
command's engine session if any."""

from __future__ import annotations

from typing import Optional

from gaecli.advantages.statistics import KeyedStatistics, Moments, Statistic, merged_in_order
from gaecli.engines import EngineSession, TaskFailure, map_units
from gaecli.pipeline import checked_moments, file_statistics, score_statistics, side_moments
from gaecli.pipeline.turn_rows import settle_turn_rows
from gaecli.run.driver import Run, total_rows


def _per_file_pass(phase: str, unit, tasks: list, run: Run, session) -> list:
    """One ``unit`` per file of ``run`` on its engine (the progress shown as ``phase``),
    stopped at the first failure (raised as for one file); the results in input order."""
    labels = [str(path) for path in run.files]
    run.progress.start(phase, total_rows(run.footers))
    try:
        parts = map_units(unit, tasks, labels, run.engine, stop_on_failure=True, progress=run.progress, session=session)
    finally:
        run.progress.finish()
    for part in parts:
        if isinstance(part, TaskFailure):
            part.raise_error()
    return parts


def engine_statistics(
    run: Run,
    statistics: tuple[Statistic, ...],
    session: Optional[EngineSession] = None,
    scores: Optional[list] = None,
    phase: str = "statistics",
) -> tuple[KeyedStatistics, list[KeyedStatistics]]:
    """The keyed ``statistics`` over the files of ``run`` (:class:`gaecli.run.Run`: its
    computation, footers, engine and progress), with the command's
    :class:`gaecli.engines.EngineSession` if any, progress shown as ``phase``: one
    :func:`gaecli.pipeline.file_statistics` unit per file, stopped at the first failure
    (raised as for one file), merged in input order. Returns the merged statistics and, per
    file, those of its own keys alone. ``scores``: the files' score statistics where a side
    needs them."""
    scores = scores or [None] * len(run.files)
    tasks = [
        (str(path), run.computation, statistics, footer, part)
        for path, footer, part in zip(run.files, run.footers, scores)
    ]
    parts = _per_file_pass(phase, file_statistics, tasks, run, session)
    return merged_in_order(statistics, parts)


def engine_file_scores(run: Run, session: Optional[EngineSession] = None) -> list[KeyedStatistics]:
    """The score statistics the critic-free estimators declare
    (:func:`gaecli.pipeline.score_statistics`) over the files of ``run``, handed out per
    file: for each file the merged statistics of the groups and steps its rows belong to, and
    only those; the turn rows' episodes checked and settled over every file
    (:func:`gaecli.pipeline.turn_rows.settle_turn_rows`)."""
    statistics = score_statistics(run.computation)
    merged, per_file = engine_statistics(run, statistics, session, phase="scores")
    settle_turn_rows(merged, per_file, run.computation, [str(path) for path in run.files])
    return per_file


def _side_moments(
    run: Run, session, scores
) -> tuple[tuple[Optional[Statistic], ...], KeyedStatistics, list[KeyedStatistics]]:
    computation = run.computation
    sides = side_moments(computation)
    statistics = tuple(statistic for statistic in sides if statistic is not None)
    merged, per_file = engine_statistics(run, statistics, session, scores)
    if not computation.critic_free:  # under --normalize; a step of an estimator may have nothing to whiten
        checked_moments(tuple(merged[statistic] for statistic in sides), computation.normalize_by)
    return sides, merged, per_file


def engine_moments(run: Run, session: Optional[EngineSession] = None) -> tuple[Moments, Moments]:
    """The merged ``--normalize`` statistics over the files of ``run``: the moments of the
    new and the (first) old advantages; refuses (:class:`GAEInputError`) a group without any
    trainable token."""
    sides, merged, _ = _side_moments(run, session, None)
    return merged[sides[0]], merged[sides[1]]


def engine_file_moments(
    run: Run, session: Optional[EngineSession] = None, statistics: Optional[list] = None
) -> list[tuple[Optional[Moments], ...]]:
    """The whitening moments of every side (:func:`gaecli.pipeline.side_moments`: the new
    one, then each old side, :attr:`Computation.n_sides`; None for a side not whitened),
    handed out per file: for each file of ``run`` the merged moments of the groups its rows
    belong to, and only those, so that each file's unit is sent what it needs (a few dozen
    bytes per group of the file) and not every group. ``statistics``: the files' score
    statistics where a side needs them (:func:`engine_file_scores`)."""
    sides, _, per_file = _side_moments(run, session, statistics)
    return [tuple(None if side is None else part[side] for side in sides) for part in per_file]


def engine_pre_passes(run: Run, session: Optional[EngineSession] = None) -> tuple[list, list]:
    """Every statistics pass a run needs before its computing pass, per file (None where a
    pass is not needed): the score statistics when a side is a grouped estimator, then the
    whitening moments under ``--normalize`` (:attr:`Computation.whitening`) or when a
    ``reinforce++`` side whitens. Returns ``(scores, moments)``, one entry per file of
    ``run``."""
    computation = run.computation
    scores, moments = [None] * len(run.files), [None] * len(run.files)
    if computation.needs_scores:
        scores = engine_file_scores(run, session)
    if computation.whitening or any(computation.estimator_whitened):
        moments = engine_file_moments(run, session, scores)
    return scores, moments
