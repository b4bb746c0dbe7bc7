"""``gae inspect`` as a library: what a rollout file holds and what gae can compute from it,
from its Parquet footer alone (no data page is read): each file's schema, its row and row
group counts, its token count where the footer's statistics give it, the columns gae reads
for the options given (each with its role, present or not), every estimator with whether the
run's own schema check passes for it (:func:`gaecli.pipeline.batches.check_file`, the check
``gae recompute`` and ``gae diff`` make before any row is read), and whether a diff against
stored advantages is possible. The command a user runs first on an unknown dump."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import pyarrow as pa

from gaecli._version import __version__
from gaecli.advantages.contract import (
    CRITIC_FREE,
    ESTIMATOR_INPUTS,
    ESTIMATOR_PARAMETERS,
    ESTIMATORS,
    GROUPED_ESTIMATORS,
    TURN_ESTIMATORS,
    TURN_ROW_ESTIMATORS,
)
from gaecli.advantages.spec import reads_steps
from gaecli.errors import GAEError, GAEUsageError, UnreadableFileError
from gaecli.io.format import Columns, is_list_type, is_real_type
from gaecli.io.paths import check_writes, discover_inputs, report_writes
from gaecli.io.reader import RolloutFile
from gaecli.options import check_choice
from gaecli.pipeline.batches import check_file
from gaecli.pipeline.description import Computation, RunOptions
from gaecli.pipeline.options import EstimatorInputs, VariantOptions, check_estimators

DEFAULT_STORED = "advantages"
"""The stored advantages column looked for when ``against`` is not given."""

VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decoupled λ (--lambd-critic)", ()),
    ("length-adaptive λ (--lambd-alpha)", ()),
    ("relative-position λ (--lambd-schedule)", ()),
    ("turn-level GAE (--timestep turn)", ()),
    ("per-turn rewards", ("turn_rewards_col",)),
    ("truncation bootstrap", ("truncated_col", "bootstrap_col")),
    ("turn ids (--timestep turn)", ("turn_ids_col",)),
)
"""The GAE variants (docs/variants.md) and the :class:`VariantOptions` columns each reads:
one that reads none is computable wherever ``gae`` is; one that reads columns is checked with
``gae`` when its options name them."""

NO_STORED = "no list-of-floats column named 'advantages' or holding 'advantage'"
NO_STATISTICS = "the footer has no statistics: levels counts the tokens plus one per empty or null list"

ID_HINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--group-col", ("group", "uid", "prompt")),
    ("--step-col", ("step", "rollout_id", "iteration")),
    ("--episode-col", ("episode", "trajectory")),
    ("--turn-col", ("turn",)),
)
"""The id options and the words whose presence in a scalar column's name (lower-cased) makes it
a candidate for the option: what ``inspect`` suggests where an estimator needs an id column."""

VARIANT_FLAGS = {
    "turn_rewards_col": "--turn-rewards-col",
    "truncated_col": "--truncated-col",
    "bootstrap_col": "--bootstrap-col",
    "turn_ids_col": "--turn-ids-col",
}


@dataclass(frozen=True)
class InspectOptions:
    """What ``gae inspect`` reads a file for: the columns (``columns``, the options of
    ``gae recompute``), the estimator whose columns are listed (``estimator``), its group and
    step id columns, its own columns (``estimator_inputs``), the GAE variants' columns
    (``variants``) and the stored advantages column of a diff (``against``; None: ``advantages``,
    else every list-of-floats column whose name holds ``advantage`` is offered). γ and λ are
    not asked: they change no column read. ``report_paths``: files the caller will write
    reports to (``--json``), refused when one is an input."""

    columns: Columns = field(default_factory=Columns)
    estimator: str = "gae"
    group_by: Optional[str] = None
    step_by: Optional[str] = None
    estimator_inputs: EstimatorInputs = field(default_factory=EstimatorInputs)
    variants: VariantOptions = field(default_factory=VariantOptions)
    against: Optional[str] = None
    report_paths: tuple = ()

    def __post_init__(self) -> None:
        check_choice("--estimator", self.estimator, ESTIMATORS, "estimator")


@dataclass(frozen=True)
class _Reading(RunOptions):
    """One estimator's run as ``gae recompute`` would describe it (no old side, no whitening),
    checked by the commands' own option check: what ``inspect`` holds each file against."""

    estimator: str
    gamma: Optional[float]
    lambd: Optional[float]
    group_col: Optional[str]
    step_by: Optional[str]
    estimator_inputs: EstimatorInputs
    variants: VariantOptions
    columns: Columns
    normalize: bool = False
    normalize_by: Optional[str] = None
    whitening_rule: None = None
    advantage_clip: None = None
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: None = None
    on_invalid: str = "stop"
    tolerance: float = 0.0
    old_sides: tuple = ()

    def check(self) -> None:
        check_estimators(
            (self.estimator,), self.gamma, self.lambd, self.group_col, self.step_by, False, self.estimator_inputs,
            None, self.variants.turn_rewards_col,
        )  # fmt: skip
        self.check_run()


def estimator_reading(estimator: str, options: InspectOptions) -> Computation:
    """The run of ``estimator`` on ``options``' columns (:class:`gaecli.pipeline.description.Computation`,
    through the one :func:`~gaecli.pipeline.description.describe_run`): each option passed only
    where the estimator reads it (γ and λ as 1 where it reads them, the group id where it groups,
    the step id where it has a statistic per step, its own inputs, the variants' columns for
    ``gae`` and a turn estimator's turn rewards). Raises :class:`gaecli.errors.InvalidOptionError`
    with the commands' words (``--estimator grpo needs --group-col …``) where an option it needs
    is missing."""
    parameters = ESTIMATOR_PARAMETERS.get(estimator, ())
    own = ESTIMATOR_INPUTS.get(estimator, ())
    inputs = options.estimator_inputs
    kept = EstimatorInputs(
        **{name: getattr(inputs, name) if _INPUT_FIELDS[name] in own else None for name in _INPUT_FIELDS}
    )
    turn_rewards = options.variants.turn_rewards_col if estimator in (*TURN_ESTIMATORS, *TURN_ROW_ESTIMATORS) else None
    variants = options.variants if estimator == "gae" else VariantOptions(turn_rewards_col=turn_rewards)
    reading = _Reading(
        estimator=estimator,
        gamma=1.0 if "gamma" in parameters else None,
        lambd=1.0 if "lambd" in parameters else None,
        group_col=options.group_by if estimator in GROUPED_ESTIMATORS else None,
        step_by=options.step_by if reads_steps(estimator) else None,
        estimator_inputs=kept,
        variants=variants,
        columns=options.columns,
    )
    return reading.computation


_INPUT_FIELDS = {
    "baseline_reward_col": "baseline_rewards",
    "reward_cols": "reward_components",
    "reward_weights": "reward_weights",
    "sum_pi_squared_col": "sum_pi_squared",
    "episode_col": "episode_by",
    "turn_col": "turn_by",
    "state_col": "state_by",
    "episode_weight": "episode_weight",
    "step_weight": "step_weight",
}
"""Each :class:`EstimatorInputs` attribute and the spec field it fills (:data:`ESTIMATOR_INPUTS` names fields)."""


def read_columns(computation: Computation, schema: pa.Schema) -> list[tuple[str, str]]:
    """(role, column) of every column ``computation`` reads, each once, in the order the run
    reads them: the token columns by role, the terminal reward, ``response_length`` where the
    file has it, the ids, the estimators' own columns and the variants' per-row columns (by
    the option that names them)."""
    columns = computation.columns
    named = [*columns.token_columns(), ("terminal_reward", columns.terminal_reward)]
    if columns.response_length in schema.names:
        named.append(("response_length", columns.response_length))
    named += list(computation.id_columns())
    named += list(computation.estimator_input_columns())
    named += list(computation.estimator_token_columns())
    variants = computation.variants
    named += [(flag, getattr(variants, name)) for name, flag in VARIANT_FLAGS.items() if getattr(variants, name)]
    seen: dict[str, str] = {}
    for role, name in named:
        seen.setdefault(name, role)
    return [(role, name) for name, role in seen.items()]


def footer_tokens(rollout: RolloutFile, column: str) -> dict:
    """The tokens of list column ``column`` as the footer counts them, no data page read:
    ``tokens`` (the non-null values of its leaf, summed over the row groups' statistics; None
    where a row group has none), ``levels`` (the leaf's level count: the tokens plus one per
    empty or null list, an upper bound; None for a column the file lacks) and ``source``."""
    metadata = rollout.parquet.metadata
    if column not in rollout.schema.names or not is_list_type(rollout.schema.field(column).type):
        return {"column": column, "tokens": None, "levels": None, "source": "no such list column"}
    leaf = next(i for i in range(metadata.num_columns) if metadata.schema.column(i).path.split(".")[0] == column)
    chunks = [metadata.row_group(group).column(leaf) for group in range(metadata.num_row_groups)]
    levels = sum(chunk.num_values for chunk in chunks)
    stats = [chunk.statistics for chunk in chunks]
    if all(stat is not None and stat.has_null_count for stat in stats):
        return {"column": column, "tokens": sum(stat.num_values for stat in stats), "levels": levels,
                "source": "footer statistics"}  # fmt: skip
    return {"column": column, "tokens": None, "levels": levels, "source": NO_STATISTICS}


def _blocker(computation: Computation, schema: pa.Schema, file: str) -> Optional[str]:
    """The first reason the run cannot read ``file`` (its schema check), None when it can."""
    try:
        check_file(schema, file, computation)
    except GAEError as error:
        return str(error)
    return None


def estimator_status(estimator: str, options: InspectOptions, schema: pa.Schema, file: str) -> dict:
    """``{"estimator", "ok", "reason"}``: whether ``estimator`` can be computed from ``file``
    with ``options`` (its options complete, the run's schema check passed), else why not."""
    try:
        computation = estimator_reading(estimator, options)
    except GAEUsageError as error:
        return {"estimator": estimator, "ok": False, "reason": str(error)}
    reason = _blocker(computation, schema, file)
    return {"estimator": estimator, "ok": reason is None, "reason": reason}


def stored_advantages(schema: pa.Schema, against: Optional[str]) -> dict:
    """Whether a diff against stored advantages is possible: ``columns``, the stored advantages
    columns found (``against``, else ``advantages``, else every list-of-floats column whose
    name holds ``advantage``), and for ``against`` given the reason it is not usable."""

    def usable(name: str) -> bool:
        return (
            name in schema.names
            and is_list_type(schema.field(name).type)
            and is_real_type(schema.field(name).type.value_type)
        )

    if against is not None:
        reason = None if usable(against) else (
            f"--against column {against!r} is missing" if against not in schema.names
            else f"--against column {against!r} is {schema.field(against).type}, expected a list of float32 or float64"
        )  # fmt: skip
        return {"columns": [against] if reason is None else [], "reason": reason}
    if usable(DEFAULT_STORED):
        return {"columns": [DEFAULT_STORED], "reason": None}
    found = [name for name in schema.names if "advantage" in name.lower() and usable(name)]
    return {"columns": found, "reason": None if found else NO_STORED}


def id_candidates(schema: pa.Schema) -> dict[str, list[str]]:
    """The columns that may serve each id option of :data:`ID_HINTS` (``{"--group-col": [...]}``):
    the scalar string, integer or binary columns whose name holds one of the option's words, in
    schema order; an option with none is left out. Names, not values: a suggestion to check."""

    from gaecli.advantages.keyed import is_text_type

    def scalar_id(arrow_type: pa.DataType) -> bool:
        return pa.types.is_integer(arrow_type) or is_text_type(arrow_type)

    found = {}
    for flag, words in ID_HINTS:
        names = [f.name for f in schema if scalar_id(f.type) and any(word in f.name.lower() for word in words)]
        if names:
            found[flag] = names
    return found


def variant_status(options: InspectOptions, gae: dict) -> list[dict]:
    """Each GAE variant of :data:`VARIANTS`: computable where ``gae`` is (``gae``: its
    :func:`estimator_status`) and, for one that reads columns, where its options name them."""
    found = []
    for name, needs in VARIANTS:
        missing = [VARIANT_FLAGS[need] for need in needs if getattr(options.variants, need) is None]
        reason = f"give {' and '.join(f'{flag} COLUMN' for flag in missing)}" if missing else gae["reason"]
        found.append({"variant": name, "ok": not missing and gae["ok"], "reason": None if gae["ok"] and not missing
                      else reason})  # fmt: skip
    return found


@dataclass
class FileInspection:
    """What one file holds: ``status`` ``ok`` or ``unreadable`` (``message`` says why); the
    footer's figures, the schema, the columns read for the options' estimator, what can be
    computed and the candidate id columns (dicts, as the JSON document holds them)."""

    file: str
    message: Optional[str] = None
    rows: Optional[int] = None
    row_groups: Optional[int] = None
    created_by: Optional[str] = None
    tokens: Optional[dict] = None
    schema: list[dict] = field(default_factory=list)
    read: list[dict] = field(default_factory=list)
    estimators: list[dict] = field(default_factory=list)
    variants: list[dict] = field(default_factory=list)
    diff: Optional[dict] = None
    candidates: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "unreadable" if self.message is not None else "ok"

    def to_dict(self) -> dict:
        return {"file": self.file, "status": self.status, **{k: v for k, v in self.__dict__.items() if k != "file"}}


@dataclass
class InspectReport:
    """The result of ``gae inspect``: one :class:`FileInspection` per file, in input order."""

    options: InspectOptions
    files: list[FileInspection]

    def exit_code(self) -> int:
        """2 when a file could not be read, else 0 (what a file cannot compute is no error)."""
        return 2 if any(f.status == "unreadable" for f in self.files) else 0

    def to_dict(self) -> dict:
        """The JSON document of ``gae inspect --json`` (described in docs/inspect.md)."""
        return {
            "version": __version__,
            "estimator": self.options.estimator,
            "files": [f.to_dict() for f in self.files],
            "unreadable": [{"file": f.file, "message": f.message} for f in self.files if f.message is not None],
        }


def inspect_rollout(rollout: RolloutFile, options: InspectOptions, result: FileInspection) -> None:
    """Fill ``result`` from the open file's footer."""
    schema, file, metadata = rollout.schema, result.file, rollout.parquet.metadata
    result.rows, result.row_groups, result.created_by = rollout.num_rows, metadata.num_row_groups, metadata.created_by
    result.tokens = footer_tokens(rollout, options.columns.loss_mask)
    statuses = {name: estimator_status(name, options, schema, file) for name in ESTIMATORS}
    chosen = statuses[options.estimator]
    try:
        roles = dict((name, role) for role, name in read_columns(estimator_reading(options.estimator, options), schema))
    except GAEUsageError:  # an option the estimator needs is missing: the columns read whatever it is
        columns = options.columns if options.estimator not in CRITIC_FREE else replace(options.columns, values=None)
        roles = {name: role for role, name in [*columns.token_columns(), ("terminal_reward", columns.terminal_reward)]}
    result.schema = [{"column": f.name, "type": str(f.type), "read_as": roles.get(f.name)} for f in schema]
    result.read = [
        {"role": role, "column": name, "present": name in schema.names,
         "type": str(schema.field(name).type) if name in schema.names else None}
        for name, role in roles.items()
    ]  # fmt: skip
    result.estimators = list(statuses.values())
    result.variants = variant_status(options, statuses["gae"])
    stored = stored_advantages(schema, options.against)
    result.diff = {**stored, "possible": bool(stored["columns"]) and chosen["ok"], "new_side": chosen["reason"]}
    result.candidates = id_candidates(schema)


def inspect_files(inputs: Sequence[str | Path], options: Optional[InspectOptions] = None) -> InspectReport:
    """Inspect rollout files from their footers (:class:`InspectReport`; docs/inspect.md).

    ``inputs``: files, directories (read recursively for ``*.parquet``), globs or URIs; a file
    named twice is inspected once. A file that cannot be opened as Parquet, a dangling link, an
    input that names nothing becomes an ``unreadable`` entry; the others are still inspected.
    Only the footer of each file is read. Raises :class:`GAEUsageError` for refused report
    paths (``options.report_paths``), before any file is opened."""
    options = options or InspectOptions()
    found: list[tuple[str, Optional[str]]] = []
    for item in inputs:
        unreadable: list[tuple[Path, str]] = []
        try:
            paths, _ = discover_inputs([str(item)], unreadable=unreadable)
        except GAEUsageError as error:
            found.append((str(item), str(error)))
            continue
        entries = [(str(path), None) for path, _root in paths] + [(str(path), why) for path, why in unreadable]
        found += sorted(entries) if unreadable else entries
    files = list(dict.fromkeys(found))
    check_writes([file for file, _ in files], report_writes(options.report_paths))
    report = InspectReport(options, [])
    for file, message in files:
        result = FileInspection(file, message)
        report.files.append(result)
        if message is not None:
            continue
        try:
            rollout = RolloutFile(file)
        except UnreadableFileError as error:
            result.message = str(error)
            continue
        try:
            inspect_rollout(rollout, options, result)
        finally:
            rollout.close()
    return report
