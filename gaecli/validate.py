"""``gae validate`` as a library: stream rollout files through the shared checks
(:mod:`gaecli.checks`) and collect every finding — file, row, id, column, rule, severity,
message — with exact counts per rule, plus duplicate ids within each file.

Memory stays bounded by the batch size, except for what grows with the data: the findings
listed (capped by ``max_findings`` per rule), with ``id_columns`` the id values of the file being
checked (duplicates are found once the file has been read), and with ``group_col`` a few
figures per group of it (:mod:`gaecli.pipeline.stored_advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaecli._version import __version__
from gaecli.advantages.contract import ESTIMATORS
from gaecli.advantages.episodes import TurnRows
from gaecli.advantages.spec import AdvantageSpec, RowInput
from gaecli.checks import (
    ROW_INPUT_TYPES,
    Finding,
    check_batch,
    check_row_input_schema,
    check_schema,
    missing_column,
)
from gaecli.comparison.keys import json_value
from gaecli.engines import EngineOptions, TaskFailure
from gaecli.errors import GAEUsageError, InvalidOptionError, UnreadableFileError
from gaecli.io.filesystem import total_size
from gaecli.io.format import Columns, list_parts
from gaecli.io.paths import ReportPath, check_writes, discover_inputs, report_writes
from gaecli.io.reader import RolloutFile
from gaecli.options import check_choice, check_count
from gaecli.pipeline.description import columns_read
from gaecli.pipeline.stored_advantages import DEFAULT_STORED, StoredAdvantages
from gaecli.pipeline.turn_rows import add_turn_rows, episode_findings, turn_column_findings, turn_row_findings
from gaecli.progress import NoProgress, Progress
from gaecli.rules import ERROR, RULES, WARNING, cap_per_rule
from gaecli.run import Run

if TYPE_CHECKING:
    from gaecli.pipeline import VariantOptions

DEFAULT_MAX_FINDINGS = 1000

OK = "ok"
INVALID = "invalid"
UNREADABLE = "unreadable"


@dataclass
class FileResult:
    """What validation found in one input file.

    ``status``: ``ok`` (no error; warnings allowed), ``invalid`` (at least one error) or
    ``unreadable`` (``message`` says why). ``rows`` is the file's row count (None when it
    could not be opened); ``rows_checked`` the rows that went through the row rules (0 when
    the schema failed).
    """

    file: str
    rows: Optional[int] = None
    rows_checked: int = 0
    errors: int = 0
    warnings: int = 0
    message: Optional[str] = None

    @property
    def status(self) -> str:
        if self.message is not None:
            return UNREADABLE
        return INVALID if self.errors else OK

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "status": self.status,
            "rows": self.rows,
            "rows_checked": self.rows_checked,
            "errors": self.errors,
            "warnings": self.warnings,
            "message": self.message,
        }


@dataclass
class ValidationReport:
    """The result of validating some files.

    ``findings`` lists the first ``max_findings`` findings of each rule found (``listed``: how
    many of each); ``counts`` holds every finding per rule code (all codes present, 0 when none).
    """

    files: list[FileResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {code: 0 for code in RULES})
    max_findings: Optional[int] = DEFAULT_MAX_FINDINGS
    listed: dict[str, int] = field(default_factory=dict)
    estimator: str = "gae"

    @property
    def errors(self) -> int:
        return sum(n for code, n in self.counts.items() if RULES[code].severity == ERROR)

    @property
    def warnings(self) -> int:
        return sum(n for code, n in self.counts.items() if RULES[code].severity == WARNING)

    @property
    def unreadable(self) -> list[FileResult]:
        return [f for f in self.files if f.status == UNREADABLE]

    @property
    def truncated(self) -> bool:
        """Whether some findings are counted but not listed."""
        return len(self.findings) < self.errors + self.warnings

    def exit_code(self, strict: bool = False) -> int:
        """2 when a file could not be read (whatever else was found), 1 on errors (or on
        warnings when ``strict``), else 0."""
        if self.unreadable:
            return 2
        if self.errors or strict and self.warnings:
            return 1
        return 0

    def to_dict(self) -> dict:
        """The JSON document of ``gae validate --json`` (described in docs/validate.md)."""
        return {
            "version": __version__,
            "estimator": self.estimator,
            "files": [f.to_dict() for f in self.files],
            "findings": [_finding_document(f) for f in self.findings],
            "counts": dict(self.counts),
            "errors": self.errors,
            "warnings": self.warnings,
            "unreadable": [{"file": f.file, "message": f.message} for f in self.unreadable],
            "max_findings": self.max_findings,
            "truncated": self.truncated,
        }

    def _add(self, result: FileResult, findings: list[Finding], counts: dict[str, int]) -> None:
        for code, count in counts.items():
            self.counts[code] += count
            if RULES[code].severity == ERROR:
                result.errors += count
            else:
                result.warnings += count
        self.findings.extend(cap_per_rule(findings, self.max_findings, self.listed))

    def room(self, code: str) -> Optional[int]:
        """How many more findings of rule ``code`` may be listed (None: no limit)."""
        return None if self.max_findings is None else max(self.max_findings - self.listed.get(code, 0), 0)


def _finding_document(finding: Finding) -> dict:
    document = finding.to_dict()
    document["id"] = _json_value(document["id"])
    return document


def _json_value(value):
    """An id as JSON can hold it (:func:`gaecli.comparison.keys.json_value`), an id of
    several columns as an object of them."""
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    return json_value(value)


# ----------------------------------------------------------------------------- ids


def _comparable_id_type(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        return _comparable_id_type(arrow_type.value_type)
    return any(
        test(arrow_type)
        for test in (
            pa.types.is_integer,
            pa.types.is_floating,
            pa.types.is_boolean,
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_fixed_size_binary,
            pa.types.is_temporal,
            pa.types.is_decimal,
        )
    )


def check_id_columns(schema: pa.Schema, id_columns: Sequence[str], file: str) -> list[Finding]:
    """File-level findings for id columns that are missing or hold values that cannot be
    compared (lists, structs)."""
    findings = []
    for name in id_columns:
        if name not in schema.names:
            findings.append(missing_column(file, name, schema.names, "id column"))
        elif schema.names.count(name) > 1:
            continue  # a duplicate-column finding of check_schema
        elif not _comparable_id_type(schema.field(name).type):
            findings.append(
                Finding(
                    file,
                    None,
                    name,
                    "wrong-type",
                    f"id column {name!r} is {schema.field(name).type}, expected numbers, strings or dates",
                )
            )
    return findings


class _RowIds:
    """The id of a row of a batch or table, looked up only when a finding needs it: the
    value of the one id column, or ``{column: value}`` for several."""

    def __init__(self, table: pa.RecordBatch | pa.Table, id_columns: Sequence[str]) -> None:
        self.arrays = [(name, table.column(name)) for name in id_columns]

    def __getitem__(self, row: int):
        values = {name: _json_value(array[row].as_py()) for name, array in self.arrays}
        return next(iter(values.values())) if len(values) == 1 else values


def _describe_id(id_value) -> str:
    if isinstance(id_value, dict):
        return "(" + ", ".join(f"{key}={value!r}" for key, value in id_value.items()) + ")"
    return repr(id_value)


def duplicate_id_findings(ids: pa.Table, file: str, limit: Optional[int] = None) -> tuple[int, list[Finding]]:
    """Rows of ``ids`` (one row per file row, one column per id column) whose id appeared at
    an earlier row: how many, and findings for the first ``limit`` of them in row order.

    Vectorised: a stable sort by id, then equal neighbours. Rows with a null (or NaN) in
    any id column are not compared.
    """
    rows = ids.num_rows
    if rows < 2:
        return 0, []
    names = ids.column_names
    order = pc.sort_indices(ids, sort_keys=[(name, "ascending") for name in names])
    ordered = ids.take(order).combine_chunks()
    same_as_previous = np.ones(rows - 1, dtype=bool)
    for name in names:
        column = ordered.column(name)
        equal = pc.equal(column.slice(1), column.slice(0, rows - 1)).fill_null(False)
        same_as_previous &= np.asarray(
            equal.combine_chunks() if isinstance(equal, pa.ChunkedArray) else equal, dtype=bool
        )
    if not same_as_previous.any():
        return 0, []
    order_rows = np.asarray(order)
    positions = np.arange(rows)
    run_starts = np.maximum.accumulate(np.where(np.concatenate([[True], ~same_as_previous]), positions, 0))
    duplicate_positions = np.flatnonzero(same_as_previous) + 1
    duplicate_rows = order_rows[duplicate_positions]
    first_rows = order_rows[run_starts[duplicate_positions]]
    by_row = np.argsort(duplicate_rows, kind="stable")
    if limit is not None:
        by_row = by_row[:limit]
    column = ",".join(names)
    row_ids = _RowIds(ids.combine_chunks(), names)
    findings = []
    for index in by_row.tolist():
        row, first = int(duplicate_rows[index]), int(first_rows[index])
        id_value = row_ids[row]
        findings.append(
            Finding(
                file,
                row,
                column,
                "duplicate-id",
                f"id {_describe_id(id_value)} appears already at row {first}",
                id_value,
            )
        )
    return int(duplicate_rows.size), findings


# ----------------------------------------------------------------------------- files


def _discover(inputs: Sequence[str | Path], footers: dict) -> list[FileResult]:
    """One result per input file, in order, each file once; an input that names nothing,
    and a match that is no regular file (a dangling link, a FIFO:
    :func:`gaecli.io.paths.discover_inputs`), is an unreadable entry; every file's row
    count read from its footer, read once for the run (``footers``: ``id(result)`` → footer)."""
    results: list[FileResult] = []
    seen: set[Path] = set()
    for item in inputs:
        unreadable: list[tuple[Path, str]] = []
        try:
            found, _ = discover_inputs([str(item)], unreadable=unreadable)
        except GAEUsageError as error:
            results.append(FileResult(str(item), message=str(error)))
            continue
        entries = [(path, None) for path, _root in found] + unreadable
        for path, message in sorted(entries, key=lambda entry: entry[0]) if unreadable else entries:
            if message is not None:
                results.append(FileResult(str(path), message=message))
                continue
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            result = FileResult(str(path))
            try:
                rollout = RolloutFile(path)
            except UnreadableFileError as error:
                result.message = str(error)
            else:
                result.rows = rollout.num_rows
                footers[id(result)] = rollout.parquet.metadata
                rollout.close()
            results.append(result)
    return results


def _validate_file(
    rollout: RolloutFile,
    result: FileResult,
    report: ValidationReport,
    columns: Columns,
    id_columns: Sequence[str],
    batch_rows: Optional[int],
    progress: Progress,
    row_inputs: Sequence[RowInput] = (),
    turns=None,
    stored: StoredAdvantages = DEFAULT_STORED,
    estimator: str = "gae",
) -> Optional[TurnRows]:
    file = result.file
    schema_findings = check_schema(rollout.schema, columns, file) + check_row_input_schema(
        rollout.schema, row_inputs, file
    )
    if turns is not None:
        schema_findings += turn_column_findings(rollout.schema, file, turns)
    id_findings = check_id_columns(rollout.schema, id_columns, file)
    stored_findings, stored_checks = stored.file_checks(rollout.schema, file, columns)
    file_findings = schema_findings + id_findings + stored_findings
    counts: dict[str, int] = {}
    for finding in file_findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    report._add(result, file_findings, counts)
    if any(f.severity == ERROR for f in schema_findings):
        progress.advance(rollout.num_rows, 0)
        return None  # the row rules need the documented columns and types
    rows = None if turns is None else TurnRows()

    usable_ids = [name for name in id_columns if not any(f.column == name for f in id_findings)]
    wanted = {name for _, name in columns.token_columns()} | {
        columns.terminal_reward,
        columns.response_length,
        *usable_ids,
        *(needed.name for needed in row_inputs),
        *(() if turns is None else turns.names()),
        *(() if stored_checks is None else stored_checks.names()),
    }
    read = [name for name in rollout.schema.names if name in wanted]
    id_batches: list[pa.RecordBatch] = []
    first_row = 0
    try:
        for batch in rollout.iter_batches(batch_rows, read, columns.loss_mask):
            ids = _RowIds(batch, usable_ids) if usable_ids else None
            check = check_batch(
                batch,
                columns,
                file,
                first_row,
                warnings=True,
                ids=ids,
                max_findings=report.max_findings,
                listed=report.listed,
                row_inputs=row_inputs,
                estimator=estimator,
            )
            findings, counts = check.findings, check.counts
            if stored_checks is not None:  # the rules on stored advantages, merged in row order
                cap = report.max_findings
                findings, counts = stored_checks.add(batch, check, first_row, ids, cap, findings, counts)
            report._add(result, findings, counts)
            if rows is not None:
                _add_turn_rows(rows, batch, check, result, report, first_row, turns, columns.terminal_reward)
            if usable_ids:
                id_batches.append(
                    pa.RecordBatch.from_arrays([_decoded(batch.column(n)) for n in usable_ids], usable_ids)
                )
            first_row += batch.num_rows
            result.rows_checked = first_row
            mask_offsets, _ = list_parts(batch.column(columns.loss_mask))
            progress.advance(batch.num_rows, int(mask_offsets[-1]))
    except UnreadableFileError as error:
        result.message = str(error)
        progress.advance(rollout.num_rows - first_row, 0)
    if id_batches:
        room = report.room("duplicate-id")
        duplicates, findings = duplicate_id_findings(pa.Table.from_batches(id_batches), file, room)
        if duplicates:
            report._add(result, findings, {"duplicate-id": duplicates})
    if stored_checks is not None and result.message is None:
        row_ids = _RowIds(pa.Table.from_batches(id_batches), usable_ids) if id_batches else None
        report._add(result, *stored_checks.finish(row_ids, report.max_findings))
    return rows


def _add_turn_rows(rows, batch, check, result, report, first_row: int, turns, terminal: str) -> None:
    """A batch's turn-row findings (null ids, turn indices and turn rewards) and its turn rows."""
    findings = turn_row_findings(batch, result.file, first_row, turns)
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    report._add(result, findings, counts)
    invalid = check.invalid.copy()
    invalid[[finding.row - first_row for finding in findings]] = True
    add_turn_rows(rows, batch, invalid, first_row, turns, terminal)


def _decoded(array: pa.Array) -> pa.Array:
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def validate_files(
    inputs: Sequence[str | Path],
    columns: Optional[Columns] = None,
    *,
    id_columns: Optional[Sequence[str]] = None,
    max_findings: Optional[int] = DEFAULT_MAX_FINDINGS,
    batch_rows: Optional[int] = None,
    progress: Optional[Progress] = None,
    engine: Optional[EngineOptions] = None,
    report_paths: Sequence[ReportPath] = (),
    variants: Optional[VariantOptions] = None,
    turn_rows=None,
    against: Optional[str] = None,
    group_col: Optional[str] = None,
    estimator: str = "gae",
) -> ValidationReport:
    """Check rollout files against every rule in :data:`gaecli.rules.RULES`.

    ``inputs``: file paths, directories (read recursively for ``*.parquet``) or globs; a
    file named twice is checked once. An input that names nothing, an entry named like an
    input that is no regular file (a dangling symlink, a symlink loop, a FIFO), or a file
    that cannot be read as Parquet (or reached on its store), becomes an ``unreadable``
    entry of ``files``; the other files are still checked. A file whose schema fails (a
    required column missing or of the wrong type) gets file-level findings (``row`` None)
    and its rows are not checked.

    ``id_columns``: one or more columns that together identify a sample; findings carry the
    id, and rows repeating an earlier row's id within a file get a ``duplicate-id`` warning.
    A missing id column is a ``missing-column`` error (the rows are still checked, without
    ids). ``max_findings``: list at most this many findings of each rule (None: all; counts stay exact).
    Files are streamed ``batch_rows`` rows at a time (None: about a million tokens a batch,
    :func:`gaecli.io.reader.rows_for_tokens`), reading only the columns the rules need.
    Files are checked by ``engine`` (default: in this process; ``gae validate`` defaults to
    local worker processes); the findings are concatenated in input order, so the report is
    the same for any engine and worker count. ``report_paths``: files the
    caller will write reports to (e.g. ``--json``), refused before any file is checked when
    one is an input (:func:`gaecli.io.paths.check_writes`). ``variants``: the per-row
    columns of the GAE variants to check too (``--turn-rewards-col``, ``--truncated-col``,
    ``--bootstrap-col``; their rules: ``turn-rewards-*``, ``truncated-null``, ``truncated-value``,
    ``bootstrap-invalid``; docs/variants.md). ``turn_rows``: the columns of turn rows
    (:class:`gaecli.pipeline.description.TurnColumns`, docs/episodes.md) to check: their
    types, null ids, turn indices and turn rewards, and over every file the episodes' rules
    ``duplicate-turn`` and ``episode-mismatch``. ``against``: the stored per-token advantages
    (:class:`gaecli.pipeline.stored_advantages.StoredAdvantages`; None: ``advantages`` where a
    file has it, ``'none'``: none) for the rules ``whitened-over-masked``, ``nonzero-at-masked``
    and, with ``group_col`` (the prompt-group ids, rows compared within each file),
    ``normalised-twice``, ``group-mean-batch-std`` and ``equal-rewards-nonzero``. ``estimator``:
    the estimator the files are for (:data:`gaecli.advantages.contract.ESTIMATORS`): only the
    columns it reads are required (a critic-free one reads no values:
    :func:`gaecli.pipeline.description.columns_read`), and a masked tail is worded for it. Raises
    :class:`gaecli.errors.InvalidOptionError` (a :class:`GAEUsageError`) for a bad option
    value, before any file is read, and :class:`GAEUsageError` for refused report paths;
    never for bad data.
    """
    columns = columns or Columns()
    id_columns = list(dict.fromkeys(id_columns or ()))
    check_count("--batch-rows", batch_rows, 1)
    check_count("--max-findings", max_findings, 0)
    check_choice("--estimator", estimator, ESTIMATORS, "estimator")
    columns = columns_read(columns, (estimator,))
    if any(not name for name in id_columns):
        raise InvalidOptionError("--id-col: a column name is empty")
    row_inputs = variant_row_inputs(variants)
    stored = StoredAdvantages(against, group_col)
    footers: dict = {}
    report = ValidationReport(files=_discover(inputs, footers), max_findings=max_findings, estimator=estimator)
    check_writes([result.file for result in report.files], report_writes(report_paths))
    readable = [result for result in report.files if result.status != UNREADABLE]
    files = [result.file for result in readable]
    engine = (engine or EngineOptions(workers=1)).for_inputs(total_size(files))
    run = Run("validate", files, [footers[id(result)] for result in readable], None, engine, progress or NoProgress())

    def task(index: int, _moments, _scores) -> tuple:
        return (
            readable[index], columns, id_columns, max_findings, batch_rows, row_inputs, run.footers[index], turn_rows,
            stored, estimator,
        )  # fmt: skip

    parts = run.execute(_validate_unit, task, stop_on_failure=False)
    if turn_rows is not None:
        _episode_findings(parts, [result.file for result in readable], turn_rows, columns.terminal_reward)
    merged = {id(result): part for result, part in zip(readable, parts)}
    for index, result in enumerate(report.files):
        part = merged.get(id(result))
        if part is None:
            continue
        if isinstance(part, TaskFailure):  # a worker that died
            result.message = part.message
            continue
        report.files[index] = part.file
        for code, count in part.counts.items():
            report.counts[code] += count
        report.findings.extend(cap_per_rule(part.findings, report.max_findings, report.listed))
    return report


def _episode_findings(parts: list, files: list[str], turns, terminal: str) -> None:
    """The episodes' findings over every file, added to each file's part."""
    turn_rows = [part.turns if isinstance(part, _FilePart) else None for part in parts]
    for part, findings in zip(parts, episode_findings(turn_rows, files, turns, terminal)):
        for finding in findings:
            part.findings.append(finding)
            part.counts[finding.code] = part.counts.get(finding.code, 0) + 1
            part.file.errors += 1  # the episodes' rules are errors


@dataclass
class _FilePart:
    """What validating one file found: its result, findings (at most ``max_findings``)
    and exact counts per rule, its turn rows where asked; the parent concatenates them in
    input order."""

    file: FileResult
    findings: list[Finding]
    counts: dict[str, int]
    turns: Optional[TurnRows] = None

    @property
    def rows(self) -> int:
        return self.file.rows or 0

    tokens = 0


def _validate_unit(
    result: FileResult,
    columns: Columns,
    id_columns: list[str],
    max_findings: Optional[int],
    batch_rows: Optional[int],
    row_inputs: tuple = (),
    footer=None,
    turns=None,
    stored: StoredAdvantages = DEFAULT_STORED,
    estimator: str = "gae",
    progress: Optional[Progress] = None,
) -> _FilePart:
    """Validate one file on its own (the work unit of every engine; ``footer``: the file's,
    read when it was found)."""
    report = ValidationReport(files=[result], max_findings=max_findings)
    try:
        rollout = RolloutFile(result.file, footer)
    except UnreadableFileError as error:  # gone or changed since it was opened
        result.message = str(error)
        if progress is not None:
            progress.advance(result.rows, 0)
        return _FilePart(result, [], {})
    try:
        rows = _validate_file(
            rollout, result, report, columns, id_columns, batch_rows, progress or NoProgress(), row_inputs, turns,
            stored, estimator,
        )  # fmt: skip
    finally:
        rollout.close()
    return _FilePart(result, report.findings, {code: n for code, n in report.counts.items() if n}, rows)


def variant_row_inputs(variants: Optional[VariantOptions]) -> tuple[RowInput, ...]:
    """The per-row inputs of the GAE variants whose columns ``variants`` names."""
    if variants is None:
        return ()
    spec = AdvantageSpec(1.0, 1.0, **variants.spec_fields())
    return tuple(needed for needed in spec.row_inputs if needed.role in ROW_INPUT_TYPES)


def validate_file(input: str | Path, columns: Optional[Columns] = None, **options) -> ValidationReport:
    """:func:`validate_files` for one file."""
    return validate_files([input], columns, **options)
