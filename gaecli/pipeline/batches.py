"""The streamed batches of one file: each checked, packed and computed for the new side and
every old side of the run's :class:`gaecli.pipeline.description.Computation`
(:func:`computed_batches`), with the per-file checks before any row is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import GROUPED_ESTIMATORS, TURN_ROW_ESTIMATORS
from gaecli.advantages.dispatch import (
    ROW_ADVANTAGE,
    SCREENED_MASK_DTYPES,
    SCREENED_VALUE_DTYPES,
    TEACHER_KL,
    screened_kernel,
)
from gaecli.advantages.distillation import with_distillation
from gaecli.advantages.spec import AdvantageSpec
from gaecli.advantages.statistics import COMPONENT, OUTCOME_SCORES, RESPONSE_SCORES
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
    is_scalar_number_type,
    numeric_numpy,
    output_float_type,
)
from gaecli.io.reader import RolloutFile
from gaecli.pipeline.description import Computation
from gaecli.pipeline.options import VariantOptions
from gaecli.pipeline.packing import (
    PackedBatch,
    compute_packed,
    compute_screened_packed,
    drop_rows,
    pack_batch,
    row_input_arrays,
    stored_column,
)
from gaecli.pipeline.token_inputs import batch_paths, check_token_columns, token_input_findings
from gaecli.pipeline.turn_rows import (
    batch_turn_operand,
    check_turn_columns,
    episode_side,
    rejected_episode_findings,
    settled_values_of,
)
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
        ("--turn-ids-col", "turn_ids", variants.turn_ids_col),
    )
    for flag, role, name in wanted:
        if name is None:
            continue
        if name not in schema.names:
            raise GAEUsageError(f"{file}: {flag} column {name!r} is missing (have: {', '.join(schema.names)})")
        if not row_input_type_ok(role, schema.field(name).type):
            arrow_type = schema.field(name).type
            raise GAEUsageError(f"{file}: {flag} column {name!r} is {arrow_type}, expected {ROW_INPUT_TYPES[role]}")


@dataclass
class ComputedBatch:
    """One streamed batch: as read (``batch``), its valid rows (``valid``, all of them but
    under ``on_invalid="skip"``) and their check, where it starts in the file, the packed
    valid rows, and new and old advantages and returns (not whitened; flat, the values'
    dtype; old returns None when unknown). ``olds``: (advantages, returns) of every old side
    in the order of :attr:`Computation.old_sides`; ``old`` and ``old_returns`` are the
    first's. ``row_diff``: the figures of ``new`` against ``old`` made where the outputs
    were screened (:func:`computed_batches`' ``compare``), None when not made."""

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
    row_diff: Optional[object] = None
    paths: Optional[np.ndarray] = None
    turns: Optional[dict] = None

    def __post_init__(self) -> None:
        if self.olds is None:
            self.olds = ((self.old, self.old_returns),)

    def keys(self, name: Optional[str]) -> Optional[pa.Array]:
        """The valid rows' values of column ``name`` (None when ``name`` is None)."""
        return self.valid.column(name) if name is not None else None

    def operand(self, name: str) -> np.ndarray:
        """An array by the name a statistic gives it: ``new``, ``old`` (the first old
        side) or ``old:K`` (the old side K, counted from 0), per token; ``scores``, per row (and
        ``response-scores``, ``outcome-scores``: a trainer profile's,
        :func:`gaecli.advantages.estimators.operand_scores`); ``component:NAME``, the valid rows'
        values of column NAME (float64)."""
        if name.startswith("old:"):
            return self.olds[int(name[4:])][0]
        if name.startswith(COMPONENT):
            return row_numbers(self.valid, name[len(COMPONENT) :])
        if name in (RESPONSE_SCORES, OUTCOME_SCORES):  # a trainer profile's score
            from gaecli.advantages.estimators import operand_scores

            packed = self.packed
            return operand_scores(name, self.scores, packed.rewards, packed.offsets, packed.terminal_rewards)
        return getattr(self, name)


def row_numbers(batch: pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` of ``batch``, a number per row, as float64 ``[B]`` (a null as NaN)."""
    column = batch.column(name).cast(pa.float64())
    return numeric_numpy(column.fill_null(np.nan) if column.null_count else column)


def estimator_inputs(valid: pa.RecordBatch, spec: AdvantageSpec) -> dict[str, np.ndarray]:
    """The estimator's own per-row numbers ``spec`` reads (remax's baseline reward, gdpo's
    components) from a checked batch, by column: float64 ``[B]``."""
    names = [spec.baseline_rewards, *(spec.reward_components or ())]
    return {name: row_numbers(valid, name) for name in names if name is not None}


def estimator_input_findings(
    batch: pa.RecordBatch, computation: Computation, file: str, first_row: int
) -> list[Finding]:
    """``null`` and ``non-finite`` findings (one per row, the lowest row first) for rows whose
    baseline reward or reward component is null, NaN or ±Inf."""
    found: dict[int, Finding] = {}
    for flag, name in computation.estimator_input_columns():
        numbers = row_numbers(batch, name)
        what = "baseline reward" if flag == "--baseline-reward-col" else "reward component"
        for row in np.flatnonzero(~np.isfinite(numbers)).tolist():
            null = not batch.column(name)[row].is_valid
            code, value = ("null", "null") if null else ("non-finite", numbers[row].item())
            message = f"the {what} ({flag}) is {value}"
            found.setdefault(first_row + row, Finding(file, first_row + row, name, code, message))
    return [found[row] for row in sorted(found)]


ID_MEANINGS = {
    "--group-col": "group id",
    "--step-col": "step id",
    "--episode-col": "episode id",
    "--turn-col": "turn index",
    "--state-col": "state id",
}
"""What each per-row id is, for the messages."""


def id_findings(batch: pa.RecordBatch, computation: Computation, file: str, first_row: int) -> list[Finding]:
    """``null`` findings (one per row, the lowest row first) for rows whose group or step id
    is null: such a row belongs to no group."""
    found: dict[int, Finding] = {}
    for flag, name in computation.id_columns():
        column = batch.column(name)
        if column.null_count:
            for row in np.flatnonzero(np.asarray(column.is_null())).tolist():
                message = f"the {ID_MEANINGS[flag]} ({flag}) is null"
                found.setdefault(first_row + row, Finding(file, first_row + row, name, "null", message))
    return [found[row] for row in sorted(found)]


def _side(
    packed: PackedBatch,
    spec: AdvantageSpec,
    computation: Computation,
    valid: pa.RecordBatch,
    scores: Optional[np.ndarray],
    statistics,
    paths: Optional[np.ndarray] = None,
    file_rows: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The advantages and returns of one side under ``spec``: a grouped estimator's from each
    row's advantage out of the score ``statistics``, optimal-token-baseline's from each token's
    ``paths`` and the (group, position) ``statistics``, a turn-row estimator's from the
    settled turn rows (``file_rows``: the rows' places in the file), any other by the
    dispatch alone."""
    if spec.over_episodes and spec.estimator not in TURN_ROW_ESTIMATORS:
        return episode_side(packed, spec, computation, statistics, file_rows)
    if spec.estimator in TURN_ROW_ESTIMATORS:
        advantages = settled_values_of(statistics, spec, file_rows)
        return compute_packed(packed, spec, computation.kernel, computation.device, {ROW_ADVANTAGE: advantages})
    inputs = estimator_inputs(valid, spec)
    if spec.estimator == "opd":
        inputs[TEACHER_KL] = packed.teacher_kl
    if paths is not None and spec.log_probs is not None:
        from gaecli.advantages.estimators import token_baseline_inputs

        group_keys = valid.column(spec.group_by)
        row_inputs = token_baseline_inputs(statistics, spec, paths, packed.trainable, packed.offsets, group_keys)
        return compute_packed(packed, spec, computation.kernel, computation.device, row_inputs)
    if spec.estimator not in GROUPED_ESTIMATORS:
        if not inputs:  # a side that reads no input of its own
            return compute_packed(packed, spec, computation.kernel, computation.device)
        return compute_packed(packed, spec, computation.kernel, computation.device, inputs)
    if statistics is None:
        raise ValueError(f"estimator {spec.estimator!r}: the score statistics of the input are needed")
    from gaecli.advantages.estimators import side_scores, statistics_row_advantages

    step_keys = valid.column(spec.step_by) if spec.step_by is not None else None
    scores = side_scores(spec, scores, packed.rewards, packed.offsets, packed.terminal_rewards)
    advantages = statistics_row_advantages(statistics, spec, scores, valid.column(spec.group_by), step_keys, inputs)
    row_inputs = {ROW_ADVANTAGE: advantages}
    return compute_packed(packed, spec, computation.kernel, computation.device, row_inputs)


@dataclass(frozen=True)
class _FileBatches:
    """What every batch of one file is computed with (:func:`computed_batches`): ``screen``,
    the new side's screened kernel (None: the checks run in full on every batch), and
    ``screened``, the columns it screens."""

    file: str
    computation: Computation
    dtype: np.dtype
    row_inputs: tuple
    statistics: object
    compute_sides: bool
    screen: object
    screened: tuple
    compare: Optional[float] = None


def _file_batches(
    rollout: RolloutFile, computation: Computation, statistics, compute_sides: bool, compare: Optional[float] = None
) -> _FileBatches:
    """The per-file settings of :func:`computed_batches`. The new side's kernel screens the
    batch when it has a screened form for the spec (:func:`gaecli.advantages.dispatch.screened_kernel`),
    the outputs and the mask have dtypes it reads, no side is critic-free (their scores read
    the rewards first) and no GAE variant reads per-row inputs; it screens the mask and the
    values and rewards it reads as stored (not rewards that KL terms are added to)."""
    columns = computation.columns
    dtype = np.dtype(output_float_type(rollout.schema, columns).to_pandas_dtype())
    new_spec = computation.new_spec
    row_inputs = tuple(new_spec.row_inputs) if new_spec.variants else ()
    screen = None
    plain = not computation.critic_free and not row_inputs and computation.turn_rows is None
    if compute_sides and plain and dtype.name in SCREENED_VALUE_DTYPES:
        mask_dtype = np.dtype(rollout.schema.field(columns.loss_mask).type.value_type.to_pandas_dtype())
        if mask_dtype.name in SCREENED_MASK_DTYPES:
            screen = screened_kernel(new_spec, computation.kernel, computation.device)
    screened = ()
    if screen is not None:
        rewards = columns.rewards if columns.kl_coef is None else None
        screened = tuple(name for name in (columns.loss_mask, columns.values, rewards) if name is not None)
    return _FileBatches(
        str(rollout.path), computation, dtype, row_inputs, statistics, compute_sides, screen, screened, compare
    )


def computed_batches(
    rollout: RolloutFile,
    computation: Computation,
    read: Optional[list[str]] = None,
    statistics=None,
    compute_sides: bool = True,
    compare: Optional[float] = None,
) -> Iterator[ComputedBatch]:
    """Every batch of ``rollout`` checked, packed, with new and old advantages computed.
    ``read``: the columns to read (None: all). ``statistics``: the score statistics
    (:class:`gaecli.advantages.statistics.KeyedStatistics`) of this file's groups, merged over
    the input, when a side is a grouped estimator. ``compute_sides`` False: only the checks,
    the packing and each row's score (the score-statistics pass; ``new`` and ``old`` empty).

    Where the new side's kernel screens its input (:func:`_file_batches`), a batch is checked
    without the rules the kernel applies in its own pass (finite values and rewards, mask
    values 0 or 1); when that check finds a fault or the kernel reports one, the batch is
    checked and computed again with every rule, which names the fault as always.

    ``compare``: the tolerance of the caller's figures of ``new`` against ``old``
    (:func:`gaecli.stats.diff_rows`, no returns): with it they are made in the read that
    screens both for NaN and ±Inf (:func:`gaecli.stats.screened_diff_rows`, in
    :attr:`ComputedBatch.row_diff`) instead of a read of its own; when either is not finite
    the outputs are screened as without it and the figures left to the caller."""
    run = _file_batches(rollout, computation, statistics, compute_sides, compare)
    first_row = first_token = 0
    for batch in rollout.iter_batches(computation.batch_rows, read, computation.columns.loss_mask):
        check_stop()  # a signal whose KeyboardInterrupt third-party code swallowed (gaecli.stop)
        computed = _computed_batch(run, batch, first_row, first_token, screened=True) if run.screen else None
        if computed is None:
            computed = _computed_batch(run, batch, first_row, first_token, screened=False)
        yield computed
        first_row += batch.num_rows
        first_token += computed.packed.tokens


@dataclass
class _ValidRows:
    """The valid rows of one batch as the steps of :func:`_computed_batch` narrow them."""

    check: BatchCheck
    valid: pa.RecordBatch
    packed: PackedBatch
    scores: Optional[np.ndarray] = None
    paths: Optional[np.ndarray] = None

    def drop(self, run: _FileBatches, batch: pa.RecordBatch, findings: list[Finding], first_row: int) -> np.ndarray:
        """Drop the rows of error ``findings`` (rows in the file); returns which tokens of the
        rows valid before are kept."""
        self.check, keep = with_findings(self.check, findings, first_row)
        self.valid = batch.filter(pa.array(~self.check.invalid))
        tokens = np.repeat(keep, np.diff(self.packed.offsets))
        self.packed = drop_rows(self.packed, keep, tokens)
        if run.row_inputs:
            self.packed.row_inputs = row_input_arrays(self.valid, run.computation.new_spec)
        self.scores = None if self.scores is None else self.scores[keep]
        self.paths = None if self.paths is None else self.paths[:, tokens]
        return tokens


def _checked_rows(run: _FileBatches, batch: pa.RecordBatch, first_row: int, screened: bool) -> Optional[_ValidRows]:
    """The batch checked (``screened``: without the kernel's rules; None when that check
    finds any fault) and packed: all its rows, or under ``on_invalid="skip"`` its valid
    ones (``"stop"`` raises :class:`InvalidDataError` for the first invalid row)."""
    computation = run.computation
    columns, file = computation.columns, run.file
    left_to_kernel = run.screened if screened else ()
    check = check_batch(batch, columns, file, first_row, row_inputs=run.row_inputs, screened=left_to_kernel)
    null_ids = id_findings(batch, computation, file, first_row) + estimator_input_findings(
        batch, computation, file, first_row
    )
    null_ids += token_input_findings(batch, computation.estimator_token_columns(), columns.loss_mask, file, first_row)
    if null_ids:
        check, _ = with_findings(check, sorted(null_ids, key=lambda finding: finding.row), first_row)
    rejected = rejected_episode_findings(run.statistics, check.invalid, file, first_row, computation)
    if rejected:
        check, _ = with_findings(check, rejected, first_row)
    valid = batch
    if not check.ok:
        if screened:
            return None
        if computation.on_invalid == "stop":
            raise InvalidDataError(first_error(check.findings))
        valid = batch.filter(pa.array(~check.invalid))
    packed = pack_batch(valid, columns, run.dtype, check if valid is batch else None)
    if run.row_inputs:
        packed.row_inputs = row_input_arrays(valid, computation.new_spec)
    return _ValidRows(check, valid, packed)


def _score_rows(run: _FileBatches, batch: pa.RecordBatch, rows: _ValidRows, first_row: int) -> None:
    """Each valid row's score (a critic-free side); a score that overflowed (finite rewards
    whose sum did not stay finite) rejects its row in every pass."""
    from gaecli.advantages.estimators import row_scores

    packed = rows.packed
    rows.scores, _ = row_scores(packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards)
    if np.isfinite(rows.scores).all():
        return
    bad = np.flatnonzero(~np.isfinite(rows.scores))
    valid_rows = np.flatnonzero(~rows.check.invalid)
    name = run.computation.columns.rewards or run.computation.columns.terminal_reward
    overflow = [
        Finding(run.file, first_row + int(valid_rows[row]), name, "overflow", "the score overflowed")
        for row in bad.tolist()
    ]
    if run.computation.on_invalid == "stop":
        raise InvalidDataError(overflow[0])
    rows.drop(run, batch, overflow, first_row)


def _path_rows(run: _FileBatches, batch: pa.RecordBatch, rows: _ValidRows, first_row: int) -> None:
    """Each valid token's return and path weight (an optimal-token-baseline side); a row where
    one did not stay finite (finite inputs whose sum or exp overflowed) is rejected in every pass."""
    rows.paths, broken = batch_paths(rows.valid, rows.packed, run.computation.token_inputs)
    if not broken.any():
        return
    valid_rows = np.flatnonzero(~rows.check.invalid)
    name = run.computation.token_inputs[0]
    overflow = [
        Finding(run.file, first_row + int(valid_rows[row]), name, "overflow", "the return or path weight overflowed")
        for row in np.flatnonzero(broken).tolist()
    ]
    if run.computation.on_invalid == "stop":
        raise InvalidDataError(overflow[0])
    rows.drop(run, batch, overflow, first_row)


def _old_sides(run: _FileBatches, rows: _ValidRows, first_row: int, outputs: dict) -> list:
    """(advantages, returns) of every old side, recomputed or read from its stored columns
    (each output added to ``outputs`` under its column's name)."""
    computation, columns, packed, valid = run.computation, run.computation.columns, rows.packed, rows.valid
    olds = []
    file_rows = first_row + np.flatnonzero(~rows.check.invalid)
    for index, (side, spec) in enumerate(zip(computation.old_sides, computation.old_specs), 1):
        if spec is not None:
            old, old_returns = _side(
                packed, spec, computation, valid, rows.scores, run.statistics, rows.paths, file_rows
            )
            stage, coef = computation.side_distillation(index)
            if stage == "before-whiten":
                old = with_distillation(old, packed.teacher_kl, packed.trainable, coef)
            outputs.update(zip(side.output_columns, (old, old_returns)))
        else:
            old = stored_column(valid, side.advantages_column, packed.offsets, columns.loss_mask, run.file, first_row)
            old_returns = None
            if side.returns_column is not None:
                old_returns = stored_column(
                    valid, side.returns_column, packed.offsets, columns.loss_mask, run.file, first_row
                )
        olds.append((old, old_returns))
    return olds


def _computed_batch(
    run: _FileBatches, batch: pa.RecordBatch, first_row: int, first_token: int, screened: bool
) -> Optional[ComputedBatch]:
    """One batch of :func:`computed_batches`; ``screened``: checked without the kernel's
    rules and computed by the screened kernel, None when either finds a fault."""
    computation, columns = run.computation, run.computation.columns
    rows = _checked_rows(run, batch, first_row, screened)
    if rows is None:
        return None
    if computation.critic_free:
        _score_rows(run, batch, rows, first_row)
    if computation.token_inputs is not None:
        _path_rows(run, batch, rows, first_row)
    if not run.compute_sides:
        empty = np.zeros(0, dtype=run.dtype)
        turns = None
        if computation.turn_rows is not None:
            turns = batch_turn_operand(batch, rows.check.invalid, rows.valid, rows.packed, computation, first_row)
        return ComputedBatch(
            batch, rows.valid, rows.check, first_row, first_token, rows.packed, empty, empty, empty, None,
            scores=rows.scores, paths=rows.paths, turns=turns,
        )  # fmt: skip
    if screened:
        mask = rows.check.flat[columns.loss_mask]
        new, new_returns, clean = compute_screened_packed(rows.packed, computation.new_spec, run.screen, mask)
        if not clean:
            return None
    else:
        file_rows = first_row + np.flatnonzero(~rows.check.invalid)
        new, new_returns = _side(
            rows.packed, computation.new_spec, computation, rows.valid, rows.scores, run.statistics, rows.paths,
            file_rows,
        )  # fmt: skip
    if computation.distillation_stage == "before-whiten":
        new = with_distillation(new, rows.packed.teacher_kl, rows.packed.trainable, columns.opd_coef)
    outputs = {columns.advantages: new, columns.returns: new_returns}
    olds = _old_sides(run, rows, first_row, outputs) or [(new, new_returns)]  # nothing to compare with: the new side
    valid_rows = np.flatnonzero(~rows.check.invalid)
    row_diff, finite = _compared(run, rows.packed, new, olds[0][0])
    overflow = overflow_findings(outputs, rows.packed.offsets, valid_rows, run.file, first_row, finite)
    if overflow:
        if computation.on_invalid == "stop":
            raise InvalidDataError(overflow[0])
        tokens = rows.drop(run, batch, overflow, first_row)
        new, new_returns = new[tokens], new_returns[tokens]
        olds = [(old[tokens], None if old_returns is None else old_returns[tokens]) for old, old_returns in olds]
        row_diff = None  # of the rows before: the caller makes the figures of those kept
    (old, old_returns), olds = olds[0], tuple(olds)
    return ComputedBatch(
        batch, rows.valid, rows.check, first_row, first_token, rows.packed, new, new_returns, old, old_returns, olds,
        rows.scores, row_diff, rows.paths,
    )  # fmt: skip


def _compared(run: _FileBatches, packed: PackedBatch, new: np.ndarray, old: np.ndarray) -> tuple:
    """With :attr:`_FileBatches.compare`, the figures of ``new`` against ``old`` and those
    two (known finite), in one read (:func:`gaecli.stats.screened_diff_rows`); (None, None)
    without it, or when either holds a NaN or ±Inf."""
    if run.compare is None:
        return None, None
    from gaecli.stats import screened_diff_rows

    row_diff = screened_diff_rows(new, old, packed.trainable, packed.offsets, run.compare)
    return (row_diff, (new, old)) if row_diff is not None else (None, None)


def overflow_findings(
    outputs: dict[str, Optional[np.ndarray]],
    offsets: np.ndarray,
    batch_rows: np.ndarray,
    file: str,
    first_row: int,
    finite: Optional[tuple] = None,
) -> list[Finding]:
    """``overflow`` findings (one per row, the lowest row first) for rows where a computed
    output (column name → flat array over the valid rows, ``offsets`` theirs) holds NaN
    or ±Inf: inputs that passed the checks but overflowed in the computation. ``batch_rows``
    maps a valid row to its row in the batch. Costs one read of each output, at its own
    width, when all are finite (:func:`gaecli.stats.all_finite`), but the arrays of
    ``finite`` (known finite: not read again)."""
    from gaecli.stats import all_finite

    found: dict[int, Finding] = {}
    for name, flat in outputs.items():
        if flat is None or any(flat is known for known in finite or ()) or all_finite(flat):
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
    for flag, name in computation.estimator_input_columns():
        check_scalar_column(schema, file, flag, name)
        if not is_scalar_number_type(schema.field(name).type):
            arrow_type = schema.field(name).type
            raise GAEUsageError(f"{file}: {flag} column {name!r} is {arrow_type}, expected a number per row")
    check_token_columns(schema, file, computation.estimator_token_columns())
    check_turn_columns(schema, file, computation)
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
