"""The streamed batches of one file: each checked, packed and computed for the new side and
every old side (:class:`Computation`, :func:`computed_batches`), with the per-file checks
before any row is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import (
    GROUPED_ESTIMATORS,
    WHITENED_ESTIMATORS,
)
from gaecli.advantages.dispatch import ROW_ADVANTAGE
from gaecli.advantages.spec import AdvantageSpec, estimator_spec
from gaecli.checks import (
    ROW_INPUT_TYPES,
    BatchCheck,
    Finding,
    check_batch,
    check_schema,
    first_error,
    row_input_type_ok,
)
from gaecli.errors import GAEUsageError, InvalidDataError
from gaecli.io.format import (
    Columns,
    is_list_type,
    is_real_type,
    output_float_type,
)
from gaecli.io.reader import RolloutFile
from gaecli.pipeline.options import VariantOptions
from gaecli.pipeline.packing import PackedBatch, compute_packed, drop_rows, pack_batch, row_input_arrays, stored_column
from gaecli.stop import check_stop


def check_rollout_schema(schema: pa.Schema, columns: Columns, file: str) -> None:
    """Raise :class:`InvalidDataError` for the first schema error (missing column, type)."""
    error = first_error(check_schema(schema, columns, file))
    if error is not None:
        raise InvalidDataError(error)


def check_scalar_column(schema: pa.Schema, file: str, flag: str, name: Optional[str]) -> None:
    """A column named by an option (``--normalize-by``, ``--group-by``...) must exist and
    hold scalars: else :class:`GAEUsageError`."""
    if name is None:
        return
    if name not in schema.names:
        raise GAEUsageError(f"{file}: {flag} column {name!r} is missing (have: {', '.join(schema.names)})")
    if pa.types.is_nested(schema.field(name).type):
        raise GAEUsageError(
            f"{file}: {flag} column {name!r} is {schema.field(name).type}; "
            f"use a column of scalars (ids, strings, numbers)"
        )


def check_variant_columns(schema: pa.Schema, file: str, variants: "VariantOptions") -> None:
    """The columns named by the variants' options must exist with their types
    (:data:`gaecli.checks.ROW_INPUT_TYPES`), else :class:`GAEUsageError` naming the option."""
    wanted = (
        ("--turn-rewards-col", "turn_rewards", variants.turn_rewards_col),
        ("--truncated-col", "truncated", variants.truncated_col),
        ("--bootstrap-col", "bootstrap_values", variants.bootstrap_col),
    )
    for flag, role, name in wanted:
        if name is None:
            continue
        if name not in schema.names:
            raise GAEUsageError(f"{file}: {flag} column {name!r} is missing (have: {', '.join(schema.names)})")
        if not row_input_type_ok(role, schema.field(name).type):
            arrow_type = schema.field(name).type
            raise GAEUsageError(f"{file}: {flag} column {name!r} is {arrow_type}, expected {ROW_INPUT_TYPES[role]}")


@dataclass(frozen=True)
class Computation:
    """What the batches of a file are computed with (picklable; the kernel resolved).

    New advantages: ``new`` (an :class:`AdvantageSpec`; None: the masked contract with γ,
    λ and ``variants``, the GAE variants of the new side, whose per-row columns are checked
    with every batch), computed once per batch. Old advantages: ``sides``, the old sides of
    the comparison (:class:`gaecli.comparison.sides.ComparisonSide`), each computed or read
    per batch; when empty, the one side of ``baseline`` (a trainer profile recomputed) or,
    with ``against``, the stored column (and ``against_returns``). ``on_invalid``:
    ``"stop"`` raises on the first invalid row, ``"skip"`` computes the valid rows only."""

    gamma: float
    lambd: float
    kernel: str
    device: str
    batch_rows: Optional[int]
    columns: Columns
    baseline: Optional[str] = "unmasked"
    against: Optional[str] = None
    against_returns: Optional[str] = None
    on_invalid: str = "stop"
    normalize_by: Optional[str] = None
    new: Optional[AdvantageSpec] = None
    sides: tuple = ()
    variants: VariantOptions = field(default_factory=VariantOptions)
    estimator: str = "gae"
    old_estimator: Optional[str] = None
    group_by: Optional[str] = None
    step_by: Optional[str] = None

    @cached_property
    def new_spec(self) -> AdvantageSpec:
        """What the new advantages are (not whitened here): ``new``, or ``estimator`` (masked
        GAE with γ, λ and the GAE variants asked for, or a critic-free estimator)."""
        if self.new is not None:
            return self.new
        return self.side_spec(self.estimator, **self.variants.spec_fields())

    @cached_property
    def old_sides(self) -> tuple:
        """The old sides, in order (:class:`gaecli.comparison.sides.ComparisonSide`): ``sides``,
        else the ``old_estimator``, the stored ``against`` column or the ``baseline``
        profile; empty when nothing is compared (a critic-free recompute has no baseline)."""
        from gaecli.comparison.sides import ComparisonSide

        if self.sides:
            return tuple(self.sides)
        if self.old_estimator is not None:
            return (ComparisonSide.from_estimator(self.old_estimator),)
        if self.against is not None:
            return (ComparisonSide.stored(self.against, self.against_returns),)
        if self.baseline is None:
            return ()
        return (ComparisonSide.baseline(self.baseline),)

    @cached_property
    def old_specs(self) -> tuple[Optional[AdvantageSpec], ...]:
        """The spec of each old side, in order (None for a stored side)."""
        return tuple(side.spec(self.gamma, self.lambd, self.group_by, self.step_by) for side in self.old_sides)

    @cached_property
    def old_spec(self) -> Optional[AdvantageSpec]:
        """What the first old side is when recomputed (None when it is stored or absent)."""
        return self.old_specs[0] if self.old_specs else None

    @property
    def stored_columns(self) -> tuple[str, ...]:
        """The stored columns the old sides read (``--against``, ``--against-returns``)."""
        names = [name for side in self.old_sides for name in (side.advantages_column, side.returns_column)]
        return tuple(name for name in names if name is not None)

    def side_spec(self, estimator: str, **fields_) -> AdvantageSpec:
        """The spec of ``estimator`` under the masked contract, with the parameters and per-row
        ids it reads and no others (:func:`gaecli.advantages.spec.estimator_spec`: one set of
        options serves every side of a comparison)."""
        return estimator_spec(estimator, self.gamma, self.lambd, self.group_by, self.step_by, **fields_)

    @property
    def specs(self) -> tuple[AdvantageSpec, ...]:
        """The specs computed here: the new one, then that of every recomputed old side."""
        return (self.new_spec, *(spec for spec in self.old_specs if spec is not None))

    @property
    def critic_free(self) -> bool:
        """Whether a side computed here is a critic-free estimator (docs/estimators.md)."""
        return any(spec.critic_free for spec in self.specs)

    @property
    def needs_scores(self) -> bool:
        """Whether a side needs the score statistics of every file first (a grouped estimator)."""
        return any(spec.estimator in GROUPED_ESTIMATORS for spec in self.specs)

    @property
    def n_sides(self) -> int:
        """The old sides the statistics passes keep moments of (at least one: with no old
        side, the new side stands in for it)."""
        return max(1, len(self.old_sides))

    @property
    def estimator_whitened(self) -> tuple[bool, ...]:
        """Which sides (the new one first, then each old side) a ``reinforce++`` estimator
        whitens over the input (``--normalize`` whitens every side, and is refused with them)."""
        specs = (self.new_spec, *self.old_specs)
        whitened = tuple(spec is not None and spec.estimator in WHITENED_ESTIMATORS for spec in specs)
        return whitened + (whitened[0],) * (1 + self.n_sides - len(whitened))

    @property
    def whiten_key(self) -> Optional[str]:
        """The column whose values split the whitening statistics: ``--normalize-by``, or the
        step id of the ``reinforce++`` estimators (None: the whole input)."""
        return self.normalize_by if self.normalize_by is not None else self.step_by

    def id_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column) of the per-row ids a side reads (group, step): a null id is
        invalid data."""
        named = (("--group-col", self.group_by), ("--step-col", self.step_by))
        return tuple(
            (flag, name)
            for (flag, name), field_name in zip(named, ("group_by", "step_by"))
            if name is not None and any(getattr(spec, field_name) is not None for spec in self.specs)
        )


@dataclass
class ComputedBatch:
    """One streamed batch: as read (``batch``), its valid rows (``valid``, all of them but
    under ``on_invalid="skip"``) and their check, where it starts in the file, the packed
    valid rows, and new and old advantages and returns (not whitened; flat, the values'
    dtype; old returns None when unknown). ``olds``: (advantages, returns) of every old side
    in the order of :attr:`Computation.old_sides`; ``old`` and ``old_returns`` are the
    first's."""

    batch: pa.RecordBatch
    valid: pa.RecordBatch
    check: BatchCheck
    first_row: int
    first_token: int
    packed: PackedBatch
    new: np.ndarray
    new_returns: np.ndarray
    old: np.ndarray
    old_returns: Optional[np.ndarray]
    olds: Optional[tuple] = None
    scores: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if self.olds is None:
            self.olds = ((self.old, self.old_returns),)

    def keys(self, name: Optional[str]) -> Optional[pa.Array]:
        """The valid rows' values of column ``name`` (None when ``name`` is None)."""
        return self.valid.column(name) if name is not None else None

    def operand(self, name: str) -> np.ndarray:
        """A per-token array by the name a reduction gives it: ``new``, ``old`` (the first old
        side) or ``old:K`` (the old side K, counted from 0)."""
        if name.startswith("old:"):
            return self.olds[int(name[4:])][0]
        return getattr(self, name)


def id_findings(batch: pa.RecordBatch, computation: Computation, file: str, first_row: int) -> list[Finding]:
    """``null`` findings (one per row, the lowest row first) for rows whose group or step id
    is null: such a row belongs to no group."""
    found: dict[int, Finding] = {}
    for flag, name in computation.id_columns():
        column = batch.column(name)
        if column.null_count:
            for row in np.flatnonzero(np.asarray(column.is_null())).tolist():
                message = f"the {'group' if flag == '--group-col' else 'step'} id ({flag}) is null"
                found.setdefault(first_row + row, Finding(file, first_row + row, name, "null", message))
    return [found[row] for row in sorted(found)]


def _side(
    packed: PackedBatch,
    spec: AdvantageSpec,
    computation: Computation,
    valid: pa.RecordBatch,
    scores: Optional[np.ndarray],
    statistics,
) -> tuple[np.ndarray, np.ndarray]:
    """The advantages and returns of one side under ``spec``: a grouped estimator's from each
    row's advantage out of the score ``statistics``, any other by the dispatch alone."""
    if spec.estimator not in GROUPED_ESTIMATORS:
        return compute_packed(packed, spec, computation.kernel, computation.device)
    if statistics is None:
        raise ValueError(f"estimator {spec.estimator!r}: the score statistics of the input are needed")
    step_keys = valid.column(spec.step_by) if spec.step_by is not None else None
    advantages = statistics.row_advantages(spec.estimator, scores, valid.column(spec.group_by), step_keys)
    row_inputs = {ROW_ADVANTAGE: advantages}
    return compute_packed(packed, spec, computation.kernel, computation.device, row_inputs)


def computed_batches(
    rollout: RolloutFile,
    computation: Computation,
    read: Optional[list[str]] = None,
    statistics=None,
    compute_sides: bool = True,
) -> Iterator[ComputedBatch]:
    """Every batch of ``rollout`` checked, packed, with new and old advantages computed.
    ``read``: the columns to read (None: all). ``statistics``: the score statistics
    (:class:`gaecli.advantages.estimators.ScoreStatistics`) of this file's groups, merged over
    the input, when a side is a grouped estimator. ``compute_sides`` False: only the checks,
    the packing and each row's score (the score-statistics pass; ``new`` and ``old`` empty)."""
    columns = computation.columns
    file = str(rollout.path)
    dtype = output_float_type(rollout.schema, columns).to_pandas_dtype()
    new_spec = computation.new_spec
    row_inputs = new_spec.row_inputs if new_spec.variants else ()
    critic_free = computation.critic_free
    first_row = first_token = 0
    for batch in rollout.iter_batches(computation.batch_rows, read, columns.loss_mask):
        check_stop()  # a signal whose KeyboardInterrupt third-party code swallowed (gaecli.stop)
        check = check_batch(batch, columns, file, first_row, row_inputs=row_inputs)
        null_ids = id_findings(batch, computation, file, first_row)
        if null_ids:
            check, _ = with_findings(check, null_ids, first_row)
        valid = batch
        if not check.ok:
            if computation.on_invalid == "stop":
                raise InvalidDataError(first_error(check.findings))
            valid = batch.filter(pa.array(~check.invalid))
        packed = pack_batch(valid, columns, dtype, check if valid is batch else None)
        if row_inputs:
            packed.row_inputs = row_input_arrays(valid, new_spec)
        scores = None
        if critic_free:
            from gaecli.advantages.estimators import row_scores

            scores, _ = row_scores(packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards)
            if not np.isfinite(scores).all():  # finite rewards whose sum overflowed: the row is rejected in every pass
                bad = np.flatnonzero(~np.isfinite(scores))
                valid_rows = np.flatnonzero(~check.invalid)
                name = columns.rewards or columns.terminal_reward
                overflow = [
                    Finding(file, first_row + int(valid_rows[row]), name, "overflow", "the score overflowed")
                    for row in bad.tolist()
                ]
                if computation.on_invalid == "stop":
                    raise InvalidDataError(overflow[0])
                check, keep = with_findings(check, overflow, first_row)
                valid = batch.filter(pa.array(~check.invalid))
                packed = drop_rows(packed, keep, np.repeat(keep, np.diff(packed.offsets)))
                scores = scores[keep]
        if not compute_sides:
            empty = np.zeros(0, dtype=dtype)
            yield ComputedBatch(
                batch, valid, check, first_row, first_token, packed, empty, empty, empty, None, scores=scores
            )
            first_row += batch.num_rows
            first_token += packed.tokens
            continue
        new, new_returns = _side(packed, new_spec, computation, valid, scores, statistics)
        outputs = {columns.advantages: new, columns.returns: new_returns}
        olds = []
        for side, spec in zip(computation.old_sides, computation.old_specs):
            if spec is not None:
                old, old_returns = _side(packed, spec, computation, valid, scores, statistics)
                outputs.update(zip(side.output_columns, (old, old_returns)))
            else:
                old = stored_column(valid, side.advantages_column, packed.offsets, columns.loss_mask, file, first_row)
                old_returns = None
                if side.returns_column is not None:
                    old_returns = stored_column(
                        valid, side.returns_column, packed.offsets, columns.loss_mask, file, first_row
                    )
            olds.append((old, old_returns))
        if not olds:  # nothing to compare with: the new side itself
            olds.append((new, new_returns))
        overflow = overflow_findings(outputs, packed.offsets, np.flatnonzero(~check.invalid), file, first_row)
        if overflow:
            if computation.on_invalid == "stop":
                raise InvalidDataError(overflow[0])
            check, keep = with_findings(check, overflow, first_row)
            valid = batch.filter(pa.array(~check.invalid))
            tokens = np.repeat(keep, np.diff(packed.offsets))
            packed = drop_rows(packed, keep, tokens)
            if row_inputs:
                packed.row_inputs = row_input_arrays(valid, new_spec)
            new, new_returns = new[tokens], new_returns[tokens]
            olds = [(old[tokens], None if old_returns is None else old_returns[tokens]) for old, old_returns in olds]
            scores = None if scores is None else scores[keep]
        (old, old_returns), olds = olds[0], tuple(olds)
        yield ComputedBatch(
            batch, valid, check, first_row, first_token, packed, new, new_returns, old, old_returns, olds, scores
        )
        first_row += batch.num_rows
        first_token += packed.tokens


def overflow_findings(
    outputs: dict[str, Optional[np.ndarray]], offsets: np.ndarray, batch_rows: np.ndarray, file: str, first_row: int
) -> list[Finding]:
    """``overflow`` findings (one per row, the lowest row first) for rows where a computed
    output (column name → flat array over the valid rows, ``offsets`` theirs) holds NaN
    or ±Inf: inputs that passed the checks but overflowed in the computation. ``batch_rows``
    maps a valid row to its row in the batch. Costs one read of each output, at its own
    width, when all are finite (:func:`gaecli.stats.all_finite`)."""
    from gaecli.stats import all_finite

    found: dict[int, Finding] = {}
    for name, flat in outputs.items():
        if flat is None or all_finite(flat):
            continue
        positions = np.flatnonzero(~np.isfinite(flat))
        rows, first = np.unique(np.searchsorted(offsets, positions, side="right") - 1, return_index=True)
        for row, position in zip(rows.tolist(), positions[first].tolist()):  # only the rows that overflowed
            file_row = first_row + int(batch_rows[row])
            found.setdefault(
                file_row,
                Finding(
                    file,
                    file_row,
                    name,
                    "overflow",
                    f"{name!r} overflowed to {flat[position].item()} at token {position - offsets[row]}",
                ),
            )
    return [found[row] for row in sorted(found)]


def with_findings(check: BatchCheck, findings: list[Finding], first_row: int) -> tuple[BatchCheck, np.ndarray]:
    """``check`` with more error findings (rows numbered in the file) added, and which of the
    rows valid before are still valid (bool, one per row valid before)."""
    invalid = check.invalid.copy()
    was_valid = ~invalid
    invalid[np.array([finding.row - first_row for finding in findings], dtype=np.int64)] = True
    counts = dict(check.counts)
    for finding in findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    return BatchCheck(check.findings + findings, invalid, counts), ~invalid[was_valid]


def check_file(schema: pa.Schema, file: str, computation: "Computation") -> None:
    """The checks of one file before its rows are read: the documented columns and types
    (:class:`InvalidDataError`), the ``--normalize-by`` column, and the stored columns of
    the old sides, ``--against`` / ``--against-returns`` (lists of floats) (:class:`GAEUsageError`)."""
    check_rollout_schema(schema, computation.columns, file)
    check_scalar_column(schema, file, "--normalize-by", computation.normalize_by)
    check_variant_columns(schema, file, computation.variants)
    for flag, name in computation.id_columns():
        check_scalar_column(schema, file, flag, name)
    stored = [
        pair
        for side in computation.old_sides
        for pair in (("--against", side.advantages_column), ("--against-returns", side.returns_column))
    ]
    for flag, name in stored:
        if name is None:
            continue
        if name not in schema.names:
            raise GAEUsageError(f"{file}: {flag} column {name!r} is missing (have: {', '.join(schema.names)})")
        arrow_type = schema.field(name).type
        if not (is_list_type(arrow_type) and is_real_type(arrow_type.value_type)):
            raise GAEUsageError(
                f"{file}: {flag} column {name!r} is {arrow_type}, expected a list of float32 or float64"
            )
