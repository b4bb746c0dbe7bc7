"""The statistics pass over one file before the computing pass (the unit the engines run per
file: :func:`file_statistics`), the statistics a run declares (the scores of the critic-free
estimators, :func:`score_statistics`; the whitening moments of every side,
:func:`side_moments`), and which sides are whitened with them (:func:`whitened_sides`). The
engine-level passes over every file, merged in input order, are :mod:`gaecli.run.passes`."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.distillation import with_distillation
from gaecli.advantages.estimators import declared_statistics, whitens_returns
from gaecli.advantages.normalization import clipped
from gaecli.advantages.statistics import KeyedStatistics, Moments, Statistic, side_operands, whitening_statistics
from gaecli.advantages.whiten import whiten_rows
from gaecli.errors import GAEInputError
from gaecli.io.reader import RolloutFile
from gaecli.pipeline.batches import Computation, ComputedBatch, check_file, computed_batches


def statistics_columns(schema: pa.Schema, computation: Computation, keys: Iterable[Optional[str]] = ()) -> list[str]:
    """The columns a statistics pass reads (the data, the stored comparison, the key
    columns ``keys``), in file order."""
    columns = computation.columns
    needed = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    named = (computation.normalize_by, *computation.stored_columns, *keys)
    needed |= {name for name in named if name is not None} | set(computation.variants.columns())
    needed |= {name for _, name in (*computation.id_columns(), *computation.estimator_input_columns())}
    needed |= {name for _, name in computation.estimator_token_columns()}
    return [name for name in schema.names if name in needed]


def score_statistics(computation: Computation) -> tuple[Statistic, ...]:
    """The statistics of the rows' scores that the sides computed here declare
    (:data:`gaecli.advantages.estimators.ESTIMATOR_STATISTICS`): gathered first, from the
    inputs alone."""
    declared = (statistic for spec in computation.specs for statistic in declared_statistics(spec))
    return tuple(dict.fromkeys(statistic for statistic in declared if not statistic.reads_sides))


def side_moments(computation: Computation) -> tuple[Optional[Statistic], ...]:
    """The whitening moments of each side (the new one, then each old side:
    :attr:`Computation.n_sides`; None where a side needs none): under ``--normalize`` every
    side's, keyed by :attr:`Computation.whiten_key`, and then, where the rule reads the batch
    beside ``--normalize-by``'s groups, every side's over the whole input; otherwise those a
    side's estimator declares (the ``reinforce++`` estimators', per step). With no old side,
    the new side's spec stands in for it."""
    operands = side_operands(computation.n_sides)
    if not computation.critic_free:
        rule = computation.new_spec.whitening_rule
        tokens = "trainable" if rule is None else rule.tokens
        by_key = whitening_statistics(computation.whiten_key, computation.n_sides, tokens)
        if computation.whiten_key is not None and rule is not None and "batch" in rule.levels_used():
            return by_key + whitening_statistics(None, computation.n_sides, tokens)  # the batch level's, after
        return by_key
    specs = (computation.new_spec, *computation.old_specs)
    moments = []
    for index, operand in enumerate(operands):
        spec = specs[index] if index < len(specs) else specs[0]
        declared = () if spec is None else declared_statistics(spec, operand)
        moments.append(next((statistic for statistic in declared if statistic.reads_sides), None))
    return tuple(moments)


def rollout_statistics(
    rollout, computation: Computation, statistics: tuple[Statistic, ...], progress=None, scores=None
) -> KeyedStatistics:
    """The keyed ``statistics`` of the computed batches of an open reader (a file's
    :class:`RolloutFile`, or a table's), added in row order. Statistics of the inputs alone
    (the scores) need only the checks and the packing; those of a side compute the sides,
    with ``scores``, the file's score statistics, when a side needs them
    (:func:`computed_batches`). ``progress`` (optional) is advanced per batch."""
    check_file(rollout.schema, str(rollout.path), computation)
    result = KeyedStatistics(statistics)
    read = statistics_columns(rollout.schema, computation, result.keys)
    sides = any(statistic.reads_sides for statistic in result.statistics)
    for computed in computed_batches(rollout, computation, read, scores, compute_sides=sides):
        packed = computed.packed
        operands = {operand: computed.operand(operand) for operand in result.operands}
        keys = {key: computed.keys(key) for key in result.keys}
        result.add(operands, packed.trainable, packed.offsets, keys, response=packed.response)
        result.rows += computed.batch.num_rows
        result.tokens += packed.tokens
        if progress is not None:
            progress.advance(computed.batch.num_rows, packed.tokens)
    return result


def file_statistics(
    path: str, computation: Computation, statistics: tuple[Statistic, ...], footer=None, scores=None, progress=None
) -> KeyedStatistics:
    """:func:`rollout_statistics` over one file (the unit of every statistics pass).
    ``footer``: the file's footer if read already; ``scores``: its score statistics if a side
    needs them."""
    rollout = RolloutFile(path, footer)
    try:
        return rollout_statistics(rollout, computation, statistics, progress, scores)
    finally:
        rollout.close()


def checked_moments(
    moments: tuple[Moments, ...], normalize_by: Optional[str], whole: str = "the input"
) -> tuple[Moments, Moments]:
    """The moments (new, old) of the merged ``--normalize`` statistics (one per side);
    refuses (:class:`GAEInputError`) a group, or the ``whole`` input, with no trainable token."""
    new, old = moments[0], moments[1]
    empty = new.empty_groups()
    if empty.size:
        key = new.key(int(empty[0]))
        where = whole if normalize_by is None else f"group {normalize_by}={key!r}"
        raise GAEInputError(f"cannot normalize: {where} has no trainable token")
    return new, old


def whitened_sides(
    computed: ComputedBatch,
    computation: Computation,
    moments: Optional[tuple[Optional[Moments], ...]],
    cast: bool = True,
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, Optional[np.ndarray]]]]:
    """The advantages and returns of every side of a computed batch after whitening with the
    merged ``moments`` (the new side's, then each old side's: :attr:`Computation.n_sides`):
    under ``--normalize`` every side's advantages (the new ones 0 at masked positions; in
    their computed dtype unless ``cast`` is False), otherwise the side of each ``reinforce++``
    estimator (0 at masked positions; ``reinforce++-baseline``'s returns are its advantages);
    then the distillation term of each side where it joins after the whitening
    (:meth:`Computation.side_distillation`), then the new side's ``--advantage-clip``.
    Returns ``(new, new_returns, olds)``, ``olds`` one ``(advantages, returns)`` per old side
    (:attr:`ComputedBatch.olds`)."""
    new, new_returns, olds = _whitened(computed, computation, moments, cast)
    packed = computed.packed
    stage, coef = computation.side_distillation(0)
    if stage == "after-whiten":
        new = with_distillation(new, packed.teacher_kl, packed.trainable, coef)
    for index, (old, old_returns) in enumerate(olds[: len(computation.old_sides)]):
        stage, coef = computation.side_distillation(index + 1)
        if stage == "after-whiten":
            olds[index] = (with_distillation(old, packed.teacher_kl, packed.trainable, coef), old_returns)
    return clipped(new, computation.new_spec.advantage_clip), new_returns, olds


def _whitened(computed: ComputedBatch, computation: Computation, moments, cast: bool):
    new, new_returns, olds = computed.new, computed.new_returns, list(computed.olds)
    if moments is None:
        return new, new_returns, olds
    packed = computed.packed
    keys = computed.keys(computation.whiten_key)
    if not computation.critic_free:
        rule = computation.new_spec.whitening_rule
        sides = 1 + computation.n_sides
        batches = moments[sides:] or (None,) * sides  # the whole input's, where the rule reads them
        new_dtype = new.dtype if cast else np.float64
        new = whiten_rows(
            new, packed.offsets, moments[0], keys, trainable=packed.trainable, dtype=new_dtype, rule=rule,
            batch=batches[0],
        )  # fmt: skip
        for index, ((old, old_returns), side_moments) in enumerate(zip(olds, moments[1:sides])):
            old_dtype = old.dtype if cast else np.float64
            whitened = whiten_rows(
                old, packed.offsets, side_moments, keys, dtype=old_dtype, rule=rule, batch=batches[index + 1]
            )
            olds[index] = (whitened, old_returns)
        return new, new_returns, olds
    from gaecli.advantages.estimators import whiten_trainable

    specs = (computation.new_spec, *computation.old_specs)
    sides = [(new, new_returns), *olds]
    for index, (spec, whitens) in enumerate(zip(specs, computation.estimator_whitened)):
        if whitens:
            advantages = whiten_trainable(
                sides[index][0], packed.trainable, packed.offsets, moments[index], keys, spec, packed.response
            )
            sides[index] = (advantages, advantages if whitens_returns(spec) else sides[index][1])
    if not computation.old_sides:  # the new side stands in for the old one
        sides[1:] = [sides[0]]
    return sides[0][0], sides[0][1], sides[1:]
