"""What ``gae recompute`` and ``gae diff`` share: the device and per-file checks, the
streamed, checked and packed batches with new (masked) and old advantages computed by the
one dispatch (:mod:`gaecli.advantages.dispatch`), and the grouped-reduction pass (one file
at a time, exact and mergeable) that ``--normalize`` runs for its statistics.

Everything here works on one file at a time and takes only picklable arguments, so the
engines (:mod:`gaecli.engines`) can run it in other processes or on other machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import (
    CRITIC_FREE,
    ESTIMATOR_PARAMETERS,
    GROUPED_ESTIMATORS,
    STEP_ESTIMATORS,
    TIMESTEPS,
    WHITENED_ESTIMATORS,
)
from gaecli.advantages.dispatch import ROW_ADVANTAGE, compute
from gaecli.advantages.reduction import Reduction, ReductionResult, merge_results, normalize_reduction
from gaecli.advantages.spec import AdvantageSpec, estimator_spec
from gaecli.advantages.whiten import whiten_rows  # noqa: F401 - where diff and recompute take it from
from gaecli.checks import (
    ROW_INPUT_TYPES,
    BatchCheck,
    Finding,
    check_batch,
    check_schema,
    first_error,
    row_input_type_ok,
)
from gaecli.errors import GAEInputError, GAEUsageError, InvalidDataError, InvalidOptionError
from gaecli.grouping import GroupedMoments
from gaecli.io.format import (
    Columns,
    is_list_type,
    is_real_type,
    list_parts,
    numeric_numpy,
    output_float_type,
)
from gaecli.io.reader import RolloutFile
from gaecli.kl import kl_rewards
from gaecli.options import check_choice, check_number
from gaecli.stop import check_stop

# ----------------------------------------------------------------------------- checks


DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
"""The torch device types the kernels run on (``cuda:N`` names one GPU)."""

ON_INVALID_MODES: tuple[str, ...] = ("stop", "skip")
"""What an invalid row does: stop the run, or go to the rejects file while the run goes on."""


def check_device(device: str) -> None:
    """Refuse (:class:`InvalidOptionError`) a device that is not cpu or cuda, or CUDA where
    torch cannot use it. ``cpu`` is accepted without importing torch."""
    if device == "cpu":
        return
    import torch

    try:
        device_type = torch.device(device).type
    except (RuntimeError, TypeError) as error:
        raise InvalidOptionError(f"unknown device {device!r}; use cpu or cuda") from error
    if device_type not in DEVICE_TYPES:
        raise InvalidOptionError(f"device {device!r} is not supported; use cpu or cuda")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise InvalidOptionError(f"device {device!r}: CUDA is not available to torch here; use --device cpu")


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


@dataclass(frozen=True)
class VariantOptions:
    """The GAE variants of the new side (docs/variants.md), as ``gae recompute`` and
    ``gae diff`` take them (``--timestep``, ``--lambd-critic``, ``--lambd-alpha``,
    ``--turn-rewards-col``, ``--truncated-col`` with ``--bootstrap-col``), checked when
    made (:class:`InvalidOptionError` naming the option)."""

    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    turn_rewards_col: Optional[str] = None
    truncated_col: Optional[str] = None
    bootstrap_col: Optional[str] = None

    def __post_init__(self) -> None:
        check_choice("--timestep", self.timestep, TIMESTEPS, "timestep")
        check_number("--lambd-critic", self.lambd_critic, 0.0, 1.0)
        check_number("--lambd-alpha", self.lambd_alpha)
        if self.lambd_alpha is not None and not self.lambd_alpha > 0:
            raise InvalidOptionError(f"--lambd-alpha must be > 0, got {self.lambd_alpha:g}")
        if (self.truncated_col is None) != (self.bootstrap_col is None):
            raise InvalidOptionError("--truncated-col and --bootstrap-col go together: give both or neither")
        named = [name for name in (self.turn_rewards_col, self.truncated_col, self.bootstrap_col) if name is not None]
        if len(set(named)) != len(named):
            raise InvalidOptionError("--turn-rewards-col, --truncated-col and --bootstrap-col name one column twice")

    def spec_fields(self) -> dict:
        """The :class:`AdvantageSpec` fields of these variants."""
        return {
            "timestep": self.timestep,
            "lambd_critic": self.lambd_critic,
            "lambd_alpha": self.lambd_alpha,
            "turn_rewards": self.turn_rewards_col,
            "truncated": self.truncated_col,
            "bootstrap_values": self.bootstrap_col,
        }

    def columns(self) -> list[str]:
        """The per-row columns these variants read."""
        return [name for name in (self.turn_rewards_col, self.truncated_col, self.bootstrap_col) if name is not None]


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


def row_input_arrays(batch: pa.RecordBatch, spec: AdvantageSpec) -> dict:
    """The per-row inputs of the GAE variants ``spec`` reads, from the columns of a checked
    batch (:func:`gaecli.checks.check_row_inputs`), as the dispatch takes them: name →
    bool or float64 ``[B]``, and for the turn rewards (flat float64 ``[U]``, zero-based
    int64 offsets ``[B + 1]``)."""
    arrays: dict = {}
    for needed in spec.row_inputs:
        if needed.role == "turn_rewards":
            offsets, flat = list_parts(batch.column(needed.name))
            arrays[needed.name] = (numeric_numpy(flat).astype(np.float64, copy=False), offsets.astype(np.int64))
        elif needed.role == "truncated":
            arrays[needed.name] = np.asarray(batch.column(needed.name).cast(pa.bool_()).fill_null(False))
        elif needed.role == "bootstrap_values":
            arrays[needed.name] = np.asarray(batch.column(needed.name).cast(pa.float64()).fill_null(np.nan))
    return arrays


def check_estimators(
    estimators: tuple[str, ...],
    gamma: Optional[float],
    lambd: Optional[float],
    group_by: Optional[str],
    step_by: Optional[str],
    normalize: bool,
) -> None:
    """The options of the estimators computed by a command (``estimators``: those of its
    sides, ``gae`` standing for a GAE baseline too), refused with
    :class:`InvalidOptionError` (exit 2): ``--gamma`` / ``--lambd`` missing where an
    estimator reads them or given where none does, ``--group-col`` missing where an estimator
    groups or given where none does, ``--step-col`` given where none has a statistic per
    step, ``--normalize`` / ``--normalize-by`` with a critic-free estimator (docs/estimators.md)."""
    from gaecli.advantages.contract import ESTIMATORS
    from gaecli.options import check_choice, check_number

    for estimator in estimators:
        check_choice("--estimator", estimator, ESTIMATORS, "estimator")
    names = " and ".join(dict.fromkeys(estimators))
    for name, value in (("gamma", gamma), ("lambd", lambd)):
        used = [estimator for estimator in estimators if name in ESTIMATOR_PARAMETERS.get(estimator, ())]
        if used and value is None:
            raise InvalidOptionError(f"--{name} is required by --estimator {used[0]}")
        if not used and value is not None:
            raise InvalidOptionError(f"--{name} is not used by --estimator {names}; leave it out")
        check_number(f"--{name}", value, 0.0, 1.0)
    critic_free = [estimator for estimator in estimators if estimator in CRITIC_FREE]
    if critic_free and normalize:
        raise InvalidOptionError(
            f"--normalize/--normalize-by: --estimator {critic_free[0]} defines its own scaling; leave them out"
        )
    grouped = [estimator for estimator in estimators if estimator in GROUPED_ESTIMATORS]
    if grouped and group_by is None:
        raise InvalidOptionError(f"--estimator {grouped[0]} needs --group-col (the prompt-group id column)")
    if not grouped and group_by is not None:
        raise InvalidOptionError(f"--group-col is not used by --estimator {names}; leave it out")
    if step_by is not None and not any(estimator in STEP_ESTIMATORS for estimator in estimators):
        raise InvalidOptionError(
            f"--step-col is not used by --estimator {names} (it splits gpg's α and the reinforce++ whitening)"
        )


# ----------------------------------------------------------------------------- packing


@dataclass
class PackedBatch:
    """One batch as flat numpy buffers: values, rewards (float), trainable (bool),
    zero-based offsets ``[B + 1]``, terminal rewards ``[B]``; ``arrow_offsets``: the same
    offsets as the input's Arrow array (the mask column's, reused by the output's list
    columns), None when the rows were filtered; ``row_inputs``: the per-row inputs of the
    new side's GAE variants (:func:`row_input_arrays`), empty without them."""

    values: np.ndarray
    rewards: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    terminal_rewards: np.ndarray
    arrow_offsets: Optional[pa.Array] = None
    row_inputs: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])


def pack_batch(
    batch: pa.RecordBatch, columns: Columns, dtype: np.dtype, check: Optional[BatchCheck] = None
) -> PackedBatch:
    """Flat buffers of a checked batch (zero-copy where Arrow allows); an absent values or
    rewards column (``None``) is taken as zeros. With ``columns.kl_coef`` the rewards are
    the rewards column (if any) plus ``−kl_coef · KL`` of the log-prob columns, summed in
    float64 and then cast to ``dtype``. ``check``: the batch's :func:`check_batch`, whose
    flat columns are reused (the batch is not converted twice)."""
    mask_array = batch.column(columns.loss_mask)
    if check is not None and check.offsets is not None:
        offsets, flat = check.offsets, check.flat
        mask = flat[columns.loss_mask]
    else:
        offsets, mask_flat = list_parts(mask_array)
        mask, flat = numeric_numpy(mask_flat), {}
    trainable = mask if mask.dtype == np.bool_ else mask != 0
    arrow_offsets = mask_array.offsets  # of the rows in the batch (a sliced array's start where it starts)
    if len(arrow_offsets) and arrow_offsets[0].as_py() != 0:
        arrow_offsets = None

    def stored(name: str) -> np.ndarray:
        if name in flat:
            return flat[name]
        return numeric_numpy(list_parts(batch.column(name))[1])

    def floats(name: Optional[str]) -> np.ndarray:
        if name is None:
            return np.zeros(offsets[-1], dtype=dtype)
        return stored(name).astype(dtype, copy=False)

    if columns.kl_coef is None:
        rewards = floats(columns.rewards)
    else:
        rewards = kl_rewards(
            stored(columns.log_probs), stored(columns.ref_log_probs), columns.kl_coef, columns.kl_estimator
        )
        if columns.rewards is not None:
            rewards += stored(columns.rewards)
        with np.errstate(over="ignore"):  # a KL term beyond the float type: the computed outputs are checked
            rewards = rewards.astype(dtype, copy=False)
    terminal = np.asarray(batch.column(columns.terminal_reward)).astype(dtype, copy=False)
    return PackedBatch(floats(columns.values), rewards, trainable, offsets, terminal, arrow_offsets)


def compute_packed(
    packed: PackedBatch, spec: AdvantageSpec, kernel: str, device: str, row_inputs: Optional[dict] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (flat numpy, the values' dtype) of a packed batch under
    ``spec``, by the one dispatch (:func:`gaecli.advantages.dispatch.compute`): the
    ``native`` kernel on the CPU runs without torch, every other kernel and device on
    tensors, the same bits where both can run. ``row_inputs``: the per-row inputs of a
    critic-free estimator (each row's advantage)."""
    return compute(
        spec,
        packed.values,
        packed.rewards,
        packed.trainable,
        packed.offsets,
        packed.terminal_rewards,
        kernel=kernel,
        device=device,
        row_inputs=row_inputs if row_inputs is not None else packed.row_inputs if spec.variants else None,
    )


def stored_column(
    batch: pa.RecordBatch, name: str, mask_offsets: np.ndarray, mask_name: str, file: str, first_row: int
) -> np.ndarray:
    """The flat numbers of a stored per-token column (``gae diff --against``), checked like
    the data columns: no null, the mask's length on every row, finite."""
    array = batch.column(name)

    def stop(rows: np.ndarray, code: str, message) -> None:
        row = int(rows[0])
        raise InvalidDataError(Finding(file, first_row + row, name, code, message(row)))

    if array.null_count:
        stop(np.flatnonzero(np.asarray(array.is_null())), "null", lambda row: "the list is null")
    offsets, flat = list_parts(array)
    lengths, mask_lengths = np.diff(offsets), np.diff(mask_offsets)
    if (lengths != mask_lengths).any():
        stop(
            np.flatnonzero(lengths != mask_lengths),
            "length-mismatch",
            lambda row: f"{name!r} has {lengths[row]} tokens, {mask_name!r} has {mask_lengths[row]}",
        )
    if flat.null_count:
        positions = np.flatnonzero(np.asarray(flat.is_null()))
        stop(np.searchsorted(offsets, positions, side="right") - 1, "null", lambda row: "the list holds a null")
    numbers = numeric_numpy(flat)
    if not np.isfinite(numbers).all():
        position = int(np.flatnonzero(~np.isfinite(numbers))[0])
        stop(
            np.searchsorted(offsets, [position], side="right") - 1,
            "non-finite",
            lambda row: f"{name!r} is {numbers[position].item()} at token {position - offsets[row]}",
        )
    return numbers


# ----------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class Computation:
    """What the batches of a file are computed with (picklable; the kernel resolved).

    New advantages: ``new`` (an :class:`AdvantageSpec`; None: the masked contract with γ,
    λ and ``variants``, the GAE variants of the new side, whose per-row columns are checked
    with every batch), computed once per batch. Old advantages: ``sides``, the old sides of
    the comparison (:class:`gaecli.comparison.sides.ComparisonSide`), each computed or read
    per batch; when empty, the one side of ``old_semantics`` (the baseline recomputed) or,
    with ``against``, the stored column (and ``against_returns``). ``on_invalid``:
    ``"stop"`` raises on the first invalid row, ``"skip"`` computes the valid rows only."""

    gamma: float
    lambd: float
    kernel: str
    device: str
    batch_rows: int
    columns: Columns
    old_semantics: Optional[str] = "unmasked"
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
        else the ``old_estimator``, the stored ``against`` column or the ``old_semantics``
        baseline; empty when nothing is compared (a critic-free recompute has no baseline)."""
        from gaecli.comparison.sides import ComparisonSide

        if self.sides:
            return tuple(self.sides)
        if self.old_estimator is not None:
            return (ComparisonSide.from_estimator(self.old_estimator),)
        if self.against is not None:
            return (ComparisonSide.stored(self.against, self.against_returns),)
        if self.old_semantics is None:
            return ()
        return (ComparisonSide.baseline(self.old_semantics),)

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
    for batch in rollout.iter_batches(computation.batch_rows, read):
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
    maps a valid row to its row in the batch. Costs one reduction per output when all are
    finite."""
    found: dict[int, Finding] = {}
    for name, flat in outputs.items():
        if flat is None:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(flat.sum(dtype=np.float64)):
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


def drop_rows(packed: PackedBatch, keep: np.ndarray, tokens: np.ndarray) -> PackedBatch:
    """``packed`` with only the rows ``keep`` (bool ``[B]``); ``tokens``: their tokens."""
    lengths = np.diff(packed.offsets)[keep]
    offsets = np.zeros(lengths.size + 1, dtype=packed.offsets.dtype)
    np.cumsum(lengths, out=offsets[1:])
    return PackedBatch(
        packed.values[tokens], packed.rewards[tokens], packed.trainable[tokens], offsets, packed.terminal_rewards[keep]
    )


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


# ----------------------------------------------------------------------------- grouped reductions


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
    from gaecli.engines import TaskFailure, map_units

    progress.start("statistics", total_rows)
    try:
        footers = footers or [None] * len(paths)
        statistics = statistics or [None] * len(paths)
        tasks = [
            (str(path), computation, reduction, footer, scores)
            for path, footer, scores in zip(paths, footers, statistics)
        ]
        parts = map_units(
            file_reduction,
            tasks,
            [str(path) for path in paths],
            engine,
            stop_on_failure=True,
            progress=progress,
            session=session,
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


def new_side_spec(options) -> AdvantageSpec:
    """The whole spec of the new side of ``options`` (recompute's or diff's): its estimator
    with γ, λ and the group and step ids where it reads them
    (:func:`gaecli.advantages.spec.estimator_spec`), the contract, the whitening and the GAE
    variants (what the output metadata records): the one place options become the new
    side's spec, for recompute and diff."""
    normalize = "by" if options.normalize_by is not None else "all" if options.normalize else "none"
    return estimator_spec(
        options.estimator,
        options.gamma,
        options.lambd,
        options.group_col,
        options.step_by,
        normalize=normalize,
        normalize_by=options.normalize_by,
        **options.variants.spec_fields(),
    )


def normalize_label(options) -> str:
    """How ``options`` (recompute's or diff's) whiten: ``none``, ``all`` or ``by:COLUMN``;
    the value of the ``gaecli.normalize`` metadata key and of the JSON ``normalize``."""
    if options.normalize_by is not None:
        return f"by:{options.normalize_by}"
    return "all" if options.normalize else "none"


# ----------------------------------------------------------------------------- score statistics


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
    from gaecli.engines import TaskFailure, map_units

    progress.start("scores", total_rows)
    try:
        footers = footers or [None] * len(paths)
        tasks = [(str(path), computation, footer) for path, footer in zip(paths, footers)]
        parts = map_units(
            file_scores,
            tasks,
            [str(path) for path in paths],
            engine,
            stop_on_failure=True,
            progress=progress,
            session=session,
        )
    finally:
        progress.finish()
    for part in parts:
        if isinstance(part, TaskFailure):
            part.raise_error()
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
        whitened = np.where(packed.trainable, whiten_rows(new, packed.offsets, moments[0], keys), 0.0)
        new = whitened.astype(new.dtype) if cast else whitened
        for index, ((old, old_returns), side_moments) in enumerate(zip(olds, moments[1:])):
            whitened = whiten_rows(old, packed.offsets, side_moments, keys)
            olds[index] = (whitened.astype(old.dtype) if cast else whitened, old_returns)
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
