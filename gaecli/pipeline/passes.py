"""The passes over every file before the computing pass: the grouped reductions
(``--normalize`` statistics, the ``reinforce++`` whitening) and the critic-free estimators'
score statistics, one file per unit, merged in input order; and which sides are whitened."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.reduction import Reduction, ReductionResult, merge_results, normalize_reduction
from gaecli.advantages.whiten import whiten_rows
from gaecli.errors import GAEInputError
from gaecli.grouping import GroupedMoments
from gaecli.io.reader import RolloutFile
from gaecli.pipeline.batches import Computation, ComputedBatch, check_file, check_scalar_column, computed_batches


def statistics_columns(schema: pa.Schema, computation: Computation, key: Optional[str] = None) -> list[str]:
    """The columns a reduction pass reads (the data, the stored comparison, ``key``), in
    file order."""
    columns = computation.columns
    needed = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    named = (computation.normalize_by, *computation.stored_columns, key)
    needed |= {name for name in named if name is not None} | set(computation.variants.columns())
    needed |= {name for _, name in computation.id_columns()}
    return [name for name in schema.names if name in needed]


def rollout_reduction(
    rollout, computation: Computation, reduction: Reduction, progress=None, statistics=None
) -> ReductionResult:
    """A grouped-reduction pass (:class:`gaecli.advantages.reduction.Reduction`) over the
    computed batches of an open reader (a file's :class:`RolloutFile`, or a table's);
    ``progress`` (optional) is advanced per batch; ``statistics``: the file's score
    statistics when a side needs them (:func:`computed_batches`)."""
    where = str(rollout.path)
    check_file(rollout.schema, where, computation)
    check_scalar_column(rollout.schema, where, "the reduction key", reduction.key)
    result = ReductionResult(reduction)
    read = statistics_columns(rollout.schema, computation, reduction.key)
    for computed in computed_batches(rollout, computation, read, statistics):
        packed = computed.packed
        operands = {operand: computed.operand(operand) for operand in reduction.operands}
        result.add(operands, packed.trainable, packed.offsets, computed.keys(reduction.key))
        result.rows += computed.batch.num_rows
        result.tokens += packed.tokens
        if progress is not None:
            progress.advance(computed.batch.num_rows, packed.tokens)
    return result


def file_reduction(
    path: str, computation: Computation, reduction: Reduction, footer=None, statistics=None, progress=None
) -> ReductionResult:
    """:func:`rollout_reduction` over one file (the unit of the statistics pass). ``footer``:
    the file's footer if read already; ``statistics``: its score statistics if needed."""
    rollout = RolloutFile(path, footer)
    try:
        return rollout_reduction(rollout, computation, reduction, progress, statistics)
    finally:
        rollout.close()


def checked_moments(
    merged: ReductionResult, normalize_by: Optional[str], whole: str = "the input"
) -> tuple[GroupedMoments, GroupedMoments]:
    """The moments (new, old) of a merged ``--normalize`` reduction; refuses
    (:class:`GAEInputError`) a group, or the ``whole`` input, with no trainable token."""
    new, old = merged.groups["new"], merged.groups["old"]
    empty = new.empty_groups()
    if empty.size:
        key = new.key(int(empty[0]))
        where = whole if normalize_by is None else f"group {normalize_by}={key!r}"
        raise GAEInputError(f"cannot normalize: {where} has no trainable token")
    return new, old


def engine_reduction_parts(
    paths: list[str],
    computation: Computation,
    reduction: Reduction,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
    statistics: Optional[list] = None,
) -> list[ReductionResult]:
    """The per-file parts of a grouped-reduction pass over ``paths`` on ``engine`` (an
    :class:`gaecli.engines.EngineOptions`, with the command's
    :class:`gaecli.engines.EngineSession` if any): one :func:`file_reduction` unit per file,
    stopped at the first failure (raised as for one file), in input order. ``footers``: the
    files' footers where read already (None where not)."""
    footers = footers or [None] * len(paths)
    statistics = statistics or [None] * len(paths)
    tasks = [
        (str(path), computation, reduction, footer, scores) for path, footer, scores in zip(paths, footers, statistics)
    ]
    return _per_file_pass("statistics", file_reduction, tasks, paths, engine, progress, total_rows, session)


def _per_file_pass(phase: str, unit, tasks: list, paths: list, engine, progress, total_rows: int, session) -> list:
    """One ``unit`` per file on ``engine`` (the progress shown as ``phase``), stopped at the
    first failure (raised as for one file); the results in input order."""
    from gaecli.engines import TaskFailure, map_units

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


def engine_reduction(
    paths: list[str], computation: Computation, reduction: Reduction, engine, progress, total_rows: int, session=None
) -> ReductionResult:
    """A grouped-reduction pass over ``paths`` (:func:`engine_reduction_parts`), merged in
    input order: every part is computed per file whatever the engine, so the result is the
    same for any engine and worker count."""
    return merge_results(
        reduction, engine_reduction_parts(paths, computation, reduction, engine, progress, total_rows, session)
    )


def _moments_parts(
    paths: list[str],
    computation: Computation,
    engine,
    progress,
    total_rows: int,
    session,
    footers=None,
    statistics=None,
) -> tuple[tuple[GroupedMoments, ...], list[dict[str, np.ndarray]], list]:
    reduction = normalize_reduction(computation.whiten_key, computation.n_sides)
    parts = engine_reduction_parts(
        paths, computation, reduction, engine, progress, total_rows, session, footers, statistics
    )
    merged = ReductionResult(reduction)
    codes = [merged.merge(part) for part in parts]
    moments = tuple(merged.groups[operand] for operand in reduction.operands)
    if not computation.critic_free:  # under --normalize; a step of an estimator may have nothing to whiten
        checked_moments(merged, computation.normalize_by)
    return moments, codes, parts


def engine_moments(
    paths: list[str], computation: Computation, engine, progress, total_rows: int, session=None
) -> tuple[GroupedMoments, GroupedMoments]:
    """The ``--normalize`` statistics (:func:`gaecli.advantages.reduction.normalize_reduction`)
    by :func:`engine_reduction`: the moments of the new and the (first) old advantages;
    refuses (:class:`GAEInputError`) a group without any trainable token."""
    return _moments_parts(paths, computation, engine, progress, total_rows, session)[0][:2]


def engine_file_moments(
    paths: list[str],
    computation: Computation,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
    statistics: Optional[list] = None,
) -> list[tuple[GroupedMoments, ...]]:
    """:func:`engine_moments`, handed out per file: for each of ``paths`` the merged moments
    of every side (the new one, then each old side: :attr:`Computation.n_sides`) of the groups
    its rows belong to, and only those, so that each file's unit is sent what it needs (a few
    dozen bytes per group of the file) and not every group. ``footers``: the files' footers
    where read already; ``statistics``: the files' score statistics where a side needs them
    (:func:`engine_file_scores`)."""
    moments, codes, parts = _moments_parts(
        paths, computation, engine, progress, total_rows, session, footers, statistics
    )
    operands = normalize_reduction(computation.whiten_key, computation.n_sides).operands
    return [
        tuple(side.subset(code[operand], part.groups[operand].table) for side, operand in zip(moments, operands))
        for code, part in zip(codes, parts)
    ]


def rollout_scores(rollout, computation: Computation, progress=None):
    """The score statistics (:class:`gaecli.advantages.estimators.ScoreStatistics`) of the
    rows of an open reader: each valid row's score added per group id (when a side is
    grouped) and per step id (or the whole input), in row order."""
    from gaecli.advantages.estimators import ScoreStatistics, row_scores

    where = str(rollout.path)
    check_file(rollout.schema, where, computation)
    grouped = computation.group_by is not None and computation.needs_scores
    statistics = ScoreStatistics(grouped)
    read = statistics_columns(rollout.schema, computation)
    for computed in computed_batches(rollout, computation, read, compute_sides=False):
        packed = computed.packed
        _, counts = row_scores(packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards)
        statistics.add(
            computed.keys(computation.group_by) if grouped else None,
            computed.keys(computation.step_by),
            computed.scores,
            counts,
        )
        statistics.rows += computed.batch.num_rows
        statistics.tokens += packed.tokens
        if progress is not None:
            progress.advance(computed.batch.num_rows, packed.tokens)
    return statistics


def file_scores(path: str, computation: Computation, footer=None, progress=None):
    """:func:`rollout_scores` over one file (the unit of the score pass)."""
    rollout = RolloutFile(path, footer)
    try:
        return rollout_scores(rollout, computation, progress)
    finally:
        rollout.close()


def engine_file_scores(
    paths: list[str],
    computation: Computation,
    engine,
    progress,
    total_rows: int,
    session=None,
    footers: Optional[list] = None,
) -> list:
    """The score statistics of the critic-free estimators over ``paths`` (one
    :func:`file_scores` unit per file on ``engine``, merged in input order, so the same for
    any engine and worker count), handed out per file: for each file the merged statistics of
    the groups and steps its rows belong to, and only those."""
    from gaecli.advantages.estimators import ScoreStatistics

    footers = footers or [None] * len(paths)
    tasks = [(str(path), computation, footer) for path, footer in zip(paths, footers)]
    parts = _per_file_pass("scores", file_scores, tasks, paths, engine, progress, total_rows, session)
    merged = ScoreStatistics(parts[0].groups is not None if parts else True)
    codes = [merged.merge(part) for part in parts]
    return [merged.subset(code) for code in codes]


def whitened_sides(
    computed: ComputedBatch,
    computation: Computation,
    moments: Optional[tuple[GroupedMoments, ...]],
    cast: bool = True,
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, Optional[np.ndarray]]]]:
    """The advantages and returns of every side of a computed batch after whitening with the
    merged ``moments`` (the new side's, then each old side's: :attr:`Computation.n_sides`):
    under ``--normalize`` every side's advantages (the new ones 0 at masked positions; in
    their computed dtype unless ``cast`` is False), otherwise the side of each ``reinforce++``
    estimator (0 at masked positions; ``reinforce++-baseline``'s returns are its advantages).
    Returns ``(new, new_returns, olds)``, ``olds`` one ``(advantages, returns)`` per old side
    (:attr:`ComputedBatch.olds`)."""
    new, new_returns, olds = computed.new, computed.new_returns, list(computed.olds)
    if moments is None:
        return new, new_returns, olds
    packed = computed.packed
    keys = computed.keys(computation.whiten_key)
    if not computation.critic_free:
        new = whiten_rows(
            new, packed.offsets, moments[0], keys, trainable=packed.trainable, dtype=new.dtype if cast else np.float64
        )
        for index, ((old, old_returns), side_moments) in enumerate(zip(olds, moments[1:])):
            whitened = whiten_rows(old, packed.offsets, side_moments, keys, dtype=old.dtype if cast else np.float64)
            olds[index] = (whitened, old_returns)
        return new, new_returns, olds
    from gaecli.advantages.estimators import whiten_trainable

    specs = (computation.new_spec, *computation.old_specs)
    sides = [(new, new_returns), *olds]
    for index, (spec, whitens) in enumerate(zip(specs, computation.estimator_whitened)):
        if whitens:
            advantages = whiten_trainable(sides[index][0], packed.trainable, packed.offsets, moments[index], keys)
            sides[index] = (advantages, advantages if spec.estimator == "reinforce++-baseline" else sides[index][1])
    if not computation.old_sides:  # the new side stands in for the old one
        sides[1:] = [sides[0]]
    return sides[0][0], sides[0][1], sides[1:]
