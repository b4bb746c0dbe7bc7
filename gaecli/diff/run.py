"""The run of ``gae diff``: one work unit per file (the comparisons of its batches with every
old side, each batch read once and its new side computed once), merged in input order, so
the report is the same for any engine and worker count."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.advantages.statistics import Moments
from gaecli.comparison.figures import DiffAccumulator, RowFigures
from gaecli.comparison.groups import GroupedFigures, group_key_type, groups_schema
from gaecli.comparison.sides import ComparisonSide
from gaecli.comparison.token_sample import TokenSample
from gaecli.comparison.top_samples import TopSample, TopSamples, finite_or_none
from gaecli.diff.options import DiffOptions
from gaecli.diff.per_sample import per_sample_batch, per_sample_schema
from gaecli.diff.report import ComparisonResult, DiffReport
from gaecli.engines import EngineOptions, EngineSession, TaskFailure, map_units
from gaecli.io.filesystem import to_path, total_size
from gaecli.io.paths import check_writes, discover_inputs, report_writes
from gaecli.io.reader import RolloutFile
from gaecli.pipeline import (
    Computation,
    check_file,
    check_scalar_column,
    computed_batches,
    whitened_sides,
)
from gaecli.progress import NoProgress, Progress
from gaecli.run.passes import engine_file_moments, engine_file_scores


def computation_of(options: DiffOptions, kernel: str) -> Computation:
    """The pipeline settings of a diff (``kernel`` resolved); the values column is not read
    when no side reads values (critic-free estimators only)."""
    reads_values = "gae" in options.side_estimators
    columns = options.columns if reads_values else replace(options.columns, values=None)
    return Computation(
        gamma=options.gamma,
        lambd=options.lambd,
        kernel=kernel,
        device=options.device,
        batch_rows=options.batch_rows,
        columns=columns,
        against=options.against,
        against_returns=options.against_returns,
        normalize_by=options.normalize_by,
        new=options.new_spec,
        sides=options.sides,
        variants=options.variants,
        estimator=options.estimator,
        old_estimator=options.old_estimator,
        group_by=options.group_by_id,
        step_by=options.step_by,
    )


def _check_file(schema: pa.Schema, file: str, options: DiffOptions, computation: Computation) -> None:
    check_file(schema, file, computation)
    for flag, name in (("--group-by", options.group_by), ("--id-col", options.id_col)):
        check_scalar_column(schema, file, flag, name)


def _read_columns(schema: pa.Schema, options: DiffOptions) -> list[str]:
    columns = options.columns
    wanted = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    stored = [name for side in options.sides for name in (side.advantages_column, side.returns_column)]
    named = (*stored, options.normalize_by, options.group_by, options.id_col, options.group_by_id, options.step_by)
    wanted |= {name for name in named if name is not None}
    wanted |= set(options.variants.columns())
    return [name for name in schema.names if name in wanted]


@dataclass
class ComparisonPart:
    """One comparison's share of a file part: the figures (:class:`DiffAccumulator`, with
    its histograms), the groups, the top samples and the token sample."""

    side: ComparisonSide
    accumulator: DiffAccumulator
    groups: Optional[GroupedFigures]
    top: TopSamples
    sample: TokenSample

    @classmethod
    def empty(cls, side: ComparisonSide, options: DiffOptions) -> "ComparisonPart":
        """Empty figures, groups (under ``--group-by``), top samples and token sample."""
        return cls(
            side=side,
            accumulator=DiffAccumulator(
                options.gamma,
                options.lambd,
                side.semantics,
                options.tolerance,
                quantiles=True,
                new_semantics=options.new_spec.semantics,
            ),
            groups=GroupedFigures(side.semantics) if options.group_by is not None else None,
            top=TopSamples(options.top),
            sample=TokenSample(options.scatter_sample),
        )

    def merge(self, other: "ComparisonPart") -> None:
        """Add the figures, groups, top samples and token sample of ``other`` (each merge
        exact, so parts merged in input order give the figures of one pass)."""
        self.accumulator.merge(other.accumulator)
        if self.groups is not None:
            self.groups.merge(other.groups)
        self.top.merge(other.top)
        self.sample.merge(other.sample)


@dataclass
class FilePart:
    """What the work unit of one file sends back, merged in input order by the parent: one
    :class:`ComparisonPart` per old side (in the order of ``options.sides``), and the file's
    ``--per-sample`` batches (one per read batch, every comparison's rows in it)."""

    file: str
    rows: int
    tokens: int
    comparisons: list[ComparisonPart]
    per_sample: Optional[list[pa.RecordBatch]] = field(default=None, repr=False)

    @classmethod
    def empty(cls, file: str, options: DiffOptions) -> "FilePart":
        """A part without rows yet: an empty :class:`ComparisonPart` per old side."""
        return cls(
            file=file, rows=0, tokens=0, comparisons=[ComparisonPart.empty(side, options) for side in options.sides]
        )

    def merge(self, other: "FilePart") -> None:
        """Add every comparison of ``other`` to ours."""
        for mine, theirs in zip(self.comparisons, other.comparisons, strict=True):
            mine.merge(theirs)


def diff_unit(
    index: int,
    path: str,
    options: DiffOptions,
    kernel: str,
    moments: Optional[tuple[Optional[Moments], ...]] = None,
    per_sample: Optional[pa.Schema] = None,
    footer: Optional[pq.FileMetaData] = None,
    scores=None,
    progress: Optional[Progress] = None,
) -> FilePart:
    """Diff one file (the work unit of every engine; file ``index`` in the input order,
    which keys its top samples and token sample): each batch read and its new side computed
    once, then compared with every old side. ``moments``: the merged ``--normalize``
    statistics (of the file's groups), or those of a ``reinforce++`` estimator's whitening
    (the new side's, then one per old side: :func:`gaecli.pipeline.whitened_sides`);
    ``per_sample``: the ``--per-sample`` schema, when one is written; ``footer``: the file's
    footer when read already (it is then not read again); ``scores``: the score statistics of
    this file's groups for a grouped estimator. ``progress`` (optional) is advanced per batch."""
    computation = computation_of(options, kernel)
    part = FilePart.empty(path, options)
    if per_sample is not None:
        part.per_sample = []
    rollout = RolloutFile(path, footer)
    try:
        _check_file(rollout.schema, path, options, computation)
        read = _read_columns(rollout.schema, options)
        for computed in computed_batches(rollout, computation, read, statistics=scores):
            batch, packed = computed.batch, computed.packed
            first_row, first_token = computed.first_row, computed.first_token
            new, new_returns, olds = whitened_sides(computed, computation, moments, cast=False)
            group_keys = computed.keys(options.group_by)
            figures = []
            for comparison, (old, old_returns) in zip(part.comparisons, olds, strict=True):
                rows = comparison.accumulator.update(
                    new,
                    old,
                    packed.trainable,
                    packed.offsets,
                    new_returns=new_returns,
                    old_returns=old_returns,
                    terminal_rewards=packed.terminal_rewards,
                )
                if comparison.groups is not None:
                    comparison.groups.update(group_keys, rows)
                _offer_top(comparison.top, options, index, path, batch, packed, new, old, rows, first_row, group_keys)
                comparison.sample.update(new, old, packed.trainable, index, first_token)
                figures.append((comparison.side.name, rows))
            if per_sample is not None:
                part.per_sample.append(
                    per_sample_batch(per_sample, path, first_row, figures, computed.keys(options.id_col), group_keys)
                )
            part.rows, part.tokens = first_row + batch.num_rows, first_token + packed.tokens
            if progress is not None:
                progress.advance(batch.num_rows, packed.tokens)
    finally:
        rollout.close()
    return part


def _offer_top(
    top: TopSamples,
    options: DiffOptions,
    index: int,
    file: str,
    batch: pa.RecordBatch,
    packed,
    new,
    old,
    rows: RowFigures,
    first_row: int,
    group_keys: Optional[pa.Array],
) -> None:
    candidates = top.candidates(rows.max_abs)
    if candidates.size == 0:
        return
    entries = []
    for row in candidates.tolist():
        start, end = int(packed.offsets[row]), int(packed.offsets[row + 1])
        entries.append(
            TopSample(
                file_index=index,
                file=file,
                row=first_row + row,
                id=batch.column(options.id_col)[row].as_py() if options.id_col is not None else None,
                group=group_keys[row].as_py() if group_keys is not None else None,
                length=int(rows.lengths[row]),
                trainable_tokens=int(rows.trainable[row]),
                masked_share=float(rows.masked_share[row]),
                masked_tail=int(rows.masked_tail[row]),
                max_abs_delta_advantage=float(rows.max_abs[row]),
                mean_abs_delta_advantage=float(rows.mean_abs[row]),
                max_abs_delta_return=finite_or_none(rows.max_abs_return[row]),
                sign_flips=int(rows.sign_flips[row]),
                terminal_credit=finite_or_none(rows.credit[row]),
                changed=bool(rows.changed[row]),
                new=np.array(new[start:end], dtype=np.float64),
                old=np.array(old[start:end], dtype=np.float64),
                trainable=np.array(packed.trainable[start:end], dtype=bool),
            )
        )
    top.offer(entries)


# ----------------------------------------------------------------------------- the run


def _raise_first_failure(results: list) -> None:
    for result in results:
        if isinstance(result, TaskFailure):
            result.raise_error()


def _run(paths: list[Path], options: DiffOptions, progress: Progress, engine: EngineOptions) -> DiffReport:
    """The diff over ``paths``: every file's footer read once and checked here first, the
    ``--normalize`` statistics pass, then one :func:`diff_unit` per file on ``engine``,
    merged in input order (so the report is the same for any engine and worker count)."""
    from gaecli.advantages.kernels import resolve_kernel
    from gaecli.io.writer import AtomicParquetWriter

    kernel = resolve_kernel(options.kernel, options.device, options.new_spec)
    computation = computation_of(options, kernel)
    files = [str(path) for path in paths]
    footers, schema, key_type = [], None, None
    for file in files:
        rollout = RolloutFile(file)  # the one read of the file's footer: the passes reuse it
        try:
            _check_file(rollout.schema, file, options, computation)
            footers.append(rollout.parquet.metadata)
            if file == files[0]:
                schema = per_sample_schema(rollout.schema, options) if options.per_sample is not None else None
                key_type = group_key_type(rollout.schema, options.group_by)
        finally:
            rollout.close()
    total_rows = sum(footer.num_rows for footer in footers)
    engine = engine.for_inputs(total_size(files))
    writers = []  # opened before any work, committed together after the last file
    try:
        per_sample_writer = groups_writer = None
        if schema is not None:
            per_sample_writer = AtomicParquetWriter(to_path(options.per_sample), schema, overwrite=options.overwrite)
            writers.append(per_sample_writer)
        if options.groups_out is not None:
            groups_writer = AtomicParquetWriter(
                to_path(options.groups_out), groups_schema(key_type), overwrite=options.overwrite
            )
            writers.append(groups_writer)
        with EngineSession() as session:  # one pool (or Ray) for both passes
            moments, scores = [None] * len(files), [None] * len(files)
            if computation.needs_scores:  # the critic-free estimators' group statistics, per file
                scores = engine_file_scores(files, computation, engine, progress, total_rows, session)
            if options.whitening or any(computation.estimator_whitened):
                # each unit gets the statistics of its file's groups (or steps) only
                moments = engine_file_moments(
                    files, computation, engine, progress, total_rows, session, footers, scores
                )
            progress.start("diff", total_rows)
            try:
                units = [
                    (index, file, options, kernel, moments[index], schema, footer, scores[index])
                    for index, (file, footer) in enumerate(zip(files, footers))
                ]
                results = map_units(
                    diff_unit, units, files, engine, stop_on_failure=True, progress=progress, session=session
                )
            finally:
                progress.finish()
        _raise_first_failure(results)
        # merged into fresh objects (a Ray result's arrays are read-only), in input order
        merged = FilePart.empty("", options)
        for part in results:
            merged.merge(part)
            for comparison in part.comparisons:
                comparison.groups = None  # merged: the part's group arrays are not needed again
        if per_sample_writer is not None:
            for part in results:
                for batch in part.per_sample:
                    per_sample_writer.write(batch)
                part.per_sample = None
        if groups_writer is not None:
            for comparison in merged.comparisons:
                for batch in comparison.groups.batches(comparison.side.name, key_type):
                    groups_writer.write(batch)
        for writer in writers:
            writer.close()
        for writer in writers:
            writer.commit()
    except BaseException:
        for writer in reversed(writers):
            writer.abort()
        raise
    return DiffReport(
        options=options,
        kernel=kernel,
        files=[{"file": part.file, "rows": part.rows, "tokens": part.tokens} for part in results],
        comparisons=[
            ComparisonResult(
                side=comparison.side,
                summary=comparison.accumulator.figures(),
                groups=None if comparison.groups is None else comparison.groups.entries(comparison.groups.hardest()),
                group_count=None if comparison.groups is None else comparison.groups.size,
                top=comparison.top.entries,
                histogram=comparison.accumulator.histogram,
                scatter=comparison.sample.points(),
            )
            for comparison in merged.comparisons
        ],
    )


def _input_files(inputs: list[str | Path]) -> list[Path]:
    """Every input file once, in a stable order."""
    paths: list[Path] = []
    seen: set[Path] = set()
    for item in inputs:
        found, _ = discover_inputs([str(item)])
        for path, _root in found:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                paths.append(path)
    return paths


def _check_outputs(paths: list[Path], options: DiffOptions) -> None:
    """The report paths, ``--per-sample`` and ``--groups-out`` through the one rule of
    :func:`gaecli.io.paths.check_writes` (none may be an input or another report; no
    directory; a report's directory must exist; the per-sample and groups files, data
    files, not replaced unless ``options.overwrite``) — before any work is done."""
    check_writes(
        paths,
        [
            *report_writes(options.report_paths),
            ("per-sample file", options.per_sample),
            ("groups file", options.groups_out),
        ],
        overwrite=options.overwrite,
    )


def diff_files(
    inputs: list[str | Path],
    options: DiffOptions,
    progress: Optional[Progress] = None,
    engine: Optional[EngineOptions] = None,
) -> DiffReport:
    """Compare masked-GAE advantages with old ones over rollout files, streaming.

    ``inputs``: file paths, directories (read recursively for ``*.parquet``) or globs; a
    file named twice is read once. New advantages: ``options.new_spec`` (masked GAE, the
    contract). Old: ``options.sides``, each name of the ``options.baseline`` list recomputed
    from the same values, rewards and mask, or the stored ``options.against`` column; every
    comparison in one pass over the data, each giving the figures a run with that side alone
    gives, bit for bit. Only trainable tokens are compared. With ``options.per_sample`` one
    Parquet row per sample and comparison is written (atomically).

    ``engine``: where the files are processed, one work unit per file (default: in this
    process, one file after the other; ``gae diff`` defaults to a local worker per core, at
    most one per 256 MB of input).
    The parts are merged in input order with exact merges, so the report, the plots' data
    and the per-sample file are identical for any engine and worker count.

    Raises :class:`GAEUsageError` for a missing column named by an option, a report onto an
    input and unreadable files, and :class:`gaecli.errors.InvalidDataError` for rows that
    break the format. Bad option values raise :class:`gaecli.errors.InvalidOptionError` (a
    :class:`GAEInputError` too) when the options are made, before any work.
    """
    if options.normalize_by is not None and not options.normalize:
        options = replace(options, normalize=True)
    paths = _input_files(list(inputs))
    _check_outputs(paths, options)
    return _run(paths, options, progress or NoProgress(), engine or EngineOptions(workers=1))


def diff_file(input: str | Path, options: DiffOptions, progress: Optional[Progress] = None) -> DiffReport:
    """:func:`diff_files` for one file."""
    return diff_files([input], options, progress)
