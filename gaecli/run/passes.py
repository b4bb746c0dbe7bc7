"""The statistics passes over every file before the computing pass, on an engine: one
:func:`gaecli.pipeline.file_statistics` unit per file, the parts merged in input order (so
the same bits for any engine and worker count) and handed out per file, each unit getting
the statistics of its own keys only: the critic-free estimators' scores
(:func:`engine_file_scores`), then the whitening moments (:func:`engine_file_moments`);
both as a run needs them: :func:`engine_pre_passes`."""

from __future__ import annotations

from typing import Optional

from gaecli.advantages.statistics import KeyedStatistics, Moments, Statistic, merged_in_order
from gaecli.engines import TaskFailure, map_units
from gaecli.pipeline import Computation, checked_moments, file_statistics, score_statistics, side_moments


def _per_file_pass(phase: str, unit, tasks: list, paths: list, engine, progress, total_rows: int, session) -> list:
    """One ``unit`` per file on ``engine`` (the progress shown as ``phase``), stopped at the
    first failure (raised as for one file); the results in input order."""
    progress.start(phase, total_rows)
    try:
        parts = map_units(
            unit, tasks, [str(path) for path in paths], engine, stop_on_failure=True, progress=progress, session=session
        )
    finally:
        progress.finish()
    for part in parts:
        if isinstance(part, TaskFailure):
            part.raise_error()
    return parts


def engine_statistics(
    paths: list[str],
    computation: Computation,
    statistics: tuple[Statistic, ...],
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
    scores: Optional[list] = None,
    phase: str = "statistics",
) -> tuple[KeyedStatistics, list[KeyedStatistics]]:
    """The keyed ``statistics`` over ``paths`` on ``engine`` (an
    :class:`gaecli.engines.EngineOptions`, with the command's
    :class:`gaecli.engines.EngineSession` if any; progress shown as ``phase``): one
    :func:`gaecli.pipeline.file_statistics` unit per file, stopped at the first failure
    (raised as for one file), merged in input order. Returns the merged statistics and, per
    file, those of its own keys alone. ``footers``: the files' footers where read already;
    ``scores``: the files' score statistics where a side needs them."""
    footers = footers or [None] * len(paths)
    scores = scores or [None] * len(paths)
    tasks = [(str(path), computation, statistics, footer, part) for path, footer, part in zip(paths, footers, scores)]
    parts = _per_file_pass(phase, file_statistics, tasks, paths, engine, progress, total_rows, session)
    return merged_in_order(statistics, parts)


def engine_file_scores(
    paths: list[str],
    computation: Computation,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
) -> list[KeyedStatistics]:
    """The score statistics the critic-free estimators declare
    (:func:`gaecli.pipeline.score_statistics`) over ``paths``, handed out per file: for each
    file the merged statistics of the groups and steps its rows belong to, and only those."""
    statistics = score_statistics(computation)
    return engine_statistics(
        paths, computation, statistics, engine, progress, total_rows, session, footers, phase="scores"
    )[1]


def _side_moments(
    paths, computation: Computation, engine, progress, total_rows: int, session, footers, scores
) -> tuple[tuple[Optional[Statistic], ...], KeyedStatistics, list[KeyedStatistics]]:
    sides = side_moments(computation)
    statistics = tuple(statistic for statistic in sides if statistic is not None)
    merged, per_file = engine_statistics(
        paths, computation, statistics, engine, progress, total_rows, session, footers, scores
    )
    if not computation.critic_free:  # under --normalize; a step of an estimator may have nothing to whiten
        checked_moments(tuple(merged[statistic] for statistic in sides), computation.normalize_by)
    return sides, merged, per_file


def engine_moments(
    paths: list[str], computation: Computation, engine, progress, total_rows: int, session=None
) -> tuple[Moments, Moments]:
    """The merged ``--normalize`` statistics over ``paths``: the moments of the new and the
    (first) old advantages; refuses (:class:`GAEInputError`) a group without any trainable
    token."""
    sides, merged, _ = _side_moments(paths, computation, engine, progress, total_rows, session, None, None)
    return merged[sides[0]], merged[sides[1]]


def engine_file_moments(
    paths: list[str],
    computation: Computation,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
    statistics: Optional[list] = None,
) -> list[tuple[Optional[Moments], ...]]:
    """The whitening moments of every side (:func:`gaecli.pipeline.side_moments`: the new
    one, then each old side, :attr:`Computation.n_sides`; None for a side not whitened),
    handed out per file: for each of ``paths`` the merged moments of the groups its rows
    belong to, and only those, so that each file's unit is sent what it needs (a few dozen
    bytes per group of the file) and not every group. ``footers``: the files' footers where
    read already; ``statistics``: the files' score statistics where a side needs them
    (:func:`engine_file_scores`)."""
    sides, _, per_file = _side_moments(paths, computation, engine, progress, total_rows, session, footers, statistics)
    return [tuple(None if side is None else part[side] for side in sides) for part in per_file]


def engine_pre_passes(
    paths: list[str],
    computation: Computation,
    whitening: bool,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
) -> tuple[list, list]:
    """Every statistics pass a run needs before its computing pass, per file (None where a
    pass is not needed): the score statistics when a side is a grouped estimator, then the
    whitening moments under ``whitening`` (``--normalize``) or when a ``reinforce++`` side
    whitens. Returns ``(scores, moments)``, one entry per file of ``paths``."""
    scores, moments = [None] * len(paths), [None] * len(paths)
    if computation.needs_scores:
        scores = engine_file_scores(paths, computation, engine, progress, total_rows, session, footers)
    if whitening or any(computation.estimator_whitened):
        moments = engine_file_moments(paths, computation, engine, progress, total_rows, session, footers, scores)
    return scores, moments
