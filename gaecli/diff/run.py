"""The run of ``gae diff``: one work unit per file (the comparisons of its batches with every
old side, each batch read once and its new side computed once), merged in input order, so
the report is the same for any engine and worker count."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.advantages.statistics import Moments
from gaecli.comparison.figures import DiffAccumulator, RowFigures
from gaecli.comparison.groups import GroupedFigures, group_key_type, groups_schema
from gaecli.comparison.token_sample import TokenSample, update_samples
from gaecli.comparison.top_samples import TopSample, TopSamples, finite_or_none
from gaecli.diff.options import DiffOptions
from gaecli.diff.per_sample import per_sample_batch, per_sample_schema
from gaecli.diff.report import ComparisonResult, DiffReport
from gaecli.engines import EngineOptions
from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import to_path, total_size
from gaecli.io.paths import check_writes, input_files, report_writes
from gaecli.io.reader import RolloutFile
from gaecli.pipeline import check_file, check_scalar_column, computed_batches, whitened_sides
from gaecli.pipeline.description import ComparisonSide
from gaecli.pipeline.rejects import SkippedRows, rejects_schema
from gaecli.progress import NoProgress, Progress
from gaecli.run import Run, raise_first_failure, read_footers


def _check_file(schema: pa.Schema, file: str, options: DiffOptions) -> None:
    check_file(schema, file, options.computation)
    for flag, name in (("--group-by", options.group_by), ("--id-col", options.id_col)):
        check_scalar_column(schema, file, flag, name)


def _read_columns(schema: pa.Schema, options: DiffOptions) -> list[str]:
    columns = options.columns
    wanted = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    stored = [name for side in options.sides for name in (side.advantages_column, side.returns_column)]
    named = (*stored, options.normalize_by, options.group_by, options.id_col, options.group_by_id, options.step_by)
    wanted |= {name for name in named if name is not None}
    wanted |= set(options.variants.columns()) | {name for _, name in options.computation.estimator_input_columns()}
    wanted |= {name for _, name in options.computation.id_columns()}
    wanted |= {name for _, name in options.computation.estimator_token_columns()}
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
                side.gae_semantics,
                options.tolerance,
                quantiles=True,
                new_semantics=options.new_spec.semantics,
            ),
            groups=GroupedFigures(side.gae_semantics) if options.group_by is not None else None,
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
    :class:`ComparisonPart` per old side (in the order of ``options.sides``), the file's
    ``--per-sample`` batches (one per read batch, every comparison's rows in it) and the rows
    skipped under ``--on-invalid skip``."""

    file: str
    rows: int
    tokens: int
    comparisons: list[ComparisonPart]
    per_sample: Optional[list[pa.RecordBatch]] = field(default=None, repr=False)
    skipped: SkippedRows = field(default_factory=SkippedRows)

    @classmethod
    def empty(cls, file: str, options: DiffOptions) -> "FilePart":
        """A part without rows yet: an empty :class:`ComparisonPart` per old side."""
        return cls(
            file=file, rows=0, tokens=0, comparisons=[ComparisonPart.empty(side, options) for side in options.sides],
            skipped=SkippedRows(keep=options.rejects is not None),
        )  # fmt: skip

    def merge(self, other: "FilePart") -> None:
        """Add every comparison of ``other`` to ours, and its skipped rows after ours."""
        for mine, theirs in zip(self.comparisons, other.comparisons, strict=True):
            mine.merge(theirs)
        self.skipped.merge(other.skipped)


def diff_unit(
    index: int,
    path: str,
    options: DiffOptions,
    moments: Optional[tuple[Moments, ...]] = None,
    per_sample: Optional[pa.Schema] = None,
    footer: Optional[pq.FileMetaData] = None,
    scores=None,
    progress: Optional[Progress] = None,
) -> FilePart:
    """Diff one file (the work unit of every engine; file ``index`` in the input order,
    which keys its top samples and token sample): :func:`diff_rollout` of the file opened.
    ``footer``: the file's footer when read already (it is then not read again)."""
    rollout = RolloutFile(path, footer)
    try:
        return diff_rollout(index, rollout, path, options, moments, per_sample, scores, progress)
    finally:
        rollout.close()


def diff_rollout(
    index: int,
    rollout,
    file: Optional[str],
    options: DiffOptions,
    moments: Optional[tuple[Moments, ...]] = None,
    per_sample: Optional[pa.Schema] = None,
    scores=None,
    progress: Optional[Progress] = None,
) -> FilePart:
    """Diff the rows of an open reader (a file's, or a table's; ``file``: its name in the
    report): each batch read and its new side computed once, then compared with every old
    side. ``moments``: the merged ``--normalize``
    statistics (of the file's groups), or those of a ``reinforce++`` estimator's whitening
    (the new side's, then one per old side: :func:`gaecli.pipeline.whitened_sides`);
    ``per_sample``: the ``--per-sample`` schema, when one is written; ``scores``: the score
    statistics of this file's groups for a grouped estimator. ``progress`` (optional) is
    advanced per batch. Under ``--on-invalid skip`` the invalid rows are left out of every
    comparison and counted (read whole for ``--rejects``)."""
    computation = options.computation
    part = FilePart.empty(file, options)
    if per_sample is not None:
        part.per_sample = []
    where = str(rollout.path)
    _check_file(rollout.schema, where, options)
    read = None if options.rejects is not None else _read_columns(rollout.schema, options)
    for computed in computed_batches(rollout, computation, read, statistics=scores):
        batch, packed = computed.batch, computed.packed
        first_row, first_token = computed.first_row, computed.first_token
        file_rows = first_row + np.flatnonzero(~computed.check.invalid)  # the compared rows, in the file
        part.skipped.add(computed, where)
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
            _offer_top(comparison.top, options, index, file, computed.valid, packed, new, old, rows, file_rows,
                       group_keys)  # fmt: skip
            figures.append((comparison.side.name, rows))
        samples = [comparison.sample for comparison in part.comparisons]
        update_samples(samples, [(new, old) for old, _ in olds], packed.trainable, index, first_token)
        if per_sample is not None:
            part.per_sample.append(
                per_sample_batch(per_sample, file, file_rows, figures, computed.keys(options.id_col), group_keys)
            )
        part.rows, part.tokens = first_row + batch.num_rows, first_token + packed.tokens
        if progress is not None:
            progress.advance(batch.num_rows, packed.tokens)
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
    file_rows: np.ndarray,
    group_keys: Optional[pa.Array],
) -> None:
    """Offer the rows of ``batch`` (the compared rows of a read batch, ``file_rows`` their rows
    in the file) with the largest max |Δ advantage| to ``top``."""
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
                row=int(file_rows[row]),
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


def _run(paths: list[Path], options: DiffOptions, progress: Progress, engine: EngineOptions) -> DiffReport:
    """The diff over ``paths`` on the one run driver (:class:`gaecli.run.Run`): every file's
    footer read once and its schema checked here first, the pre-passes, then one
    :func:`diff_unit` per file on ``engine``, merged in input order (so the report is the
    same for any engine and worker count)."""
    files = [str(path) for path in paths]
    footers = []
    for file in files:  # the one read of each footer (the passes reuse it), its schema checked
        footers += read_footers([file], strict=True)
        _check_file(footers[-1].schema.to_arrow_schema(), file, options)
    schema = footers[0].schema.to_arrow_schema() if footers else None
    per_sample = per_sample_schema(schema, options) if schema is not None and options.per_sample is not None else None
    key_type = group_key_type(schema, options.group_by) if schema is not None else None
    run = Run("diff", files, footers, options.computation, engine.for_inputs(total_size(files)), progress)
    writers = _Outputs(options, per_sample, key_type, schema)  # opened before any work, committed together after
    try:

        def task(index: int, moments, scores) -> tuple:
            return (index, files[index], options, moments, per_sample, footers[index], scores)

        results = run.execute(diff_unit, task)
        raise_first_failure(results)
        merged = merge_parts(results, options)
        writers.write(results, merged)
    except BaseException:
        writers.abort()
        raise
    return diff_report(options, results, merged)


def merge_parts(results: list[FilePart], options: DiffOptions) -> FilePart:
    """The parts of every file merged, in input order, into fresh objects (a Ray result's
    arrays are read-only)."""
    merged = FilePart.empty("", options)
    for part in results:
        merged.merge(part)
    return merged


def diff_report(options: DiffOptions, results: list[FilePart], merged: FilePart) -> DiffReport:
    """The report of a diff: its files (rows, tokens), the rows skipped and each comparison's figures."""
    return DiffReport(
        options=options,
        kernel=options.computation.kernel,
        files=[{"file": part.file, "rows": part.rows, "tokens": part.tokens} for part in results],
        skipped=merged.skipped.to_dict(),
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


class _Outputs:
    """The ``--per-sample``, ``--groups-out`` and ``--rejects`` files of a diff, opened before
    any work and committed together after the last file (or all aborted); the rejects file's
    schema is the first file's (:func:`gaecli.pipeline.rejects.rejects_schema`)."""

    def __init__(self, options: DiffOptions, per_sample: Optional[pa.Schema], key_type, first=None) -> None:
        from gaecli.io.writer import AtomicParquetWriter

        self.key_type, self.group_by, self.writers = key_type, options.group_by, []
        self.per_sample = self.groups = None
        if per_sample is not None:
            self.per_sample = AtomicParquetWriter(to_path(options.per_sample), per_sample, overwrite=options.overwrite)
            self.writers.append(self.per_sample)
        if options.groups_out is not None:
            try:
                self.groups = AtomicParquetWriter(
                    to_path(options.groups_out), groups_schema(key_type, options.group_by), overwrite=options.overwrite
                )
            except BaseException:
                self.abort()
                raise
            self.writers.append(self.groups)
        self.rejects = None
        if options.rejects is not None and first is not None:
            try:
                schema = rejects_schema(first)
                self.rejects = AtomicParquetWriter(to_path(options.rejects), schema, overwrite=options.overwrite)
            except BaseException:
                self.abort()
                raise
            self.writers.append(self.rejects)

    def write(self, results: list[FilePart], merged: FilePart) -> None:
        """Every file's per-sample rows in input order, every group's figures; then commit."""
        for part in results:
            for comparison in part.comparisons:
                comparison.groups = None  # merged: the part's group arrays are not needed again
            if self.per_sample is not None:
                for batch in part.per_sample:
                    self.per_sample.write(batch)
                part.per_sample = None
        if self.groups is not None:
            for comparison in merged.comparisons:
                for batch in comparison.groups.batches(comparison.side.name, self.key_type, group_by=self.group_by):
                    self.groups.write(batch)
        for batch in merged.skipped.batches if self.rejects is not None else ():
            self.rejects.write(_rejected_rows(batch, self.rejects.schema))
        for writer in self.writers:
            writer.close()
        for writer in self.writers:
            writer.commit()

    def abort(self) -> None:
        for writer in reversed(self.writers):
            writer.abort()


def _rejected_rows(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Rejected rows of some file as the rejects file holds them (the first file's types)."""
    if batch.schema.equals(schema):
        return batch
    try:
        return pa.Table.from_batches([batch]).cast(schema).combine_chunks().to_batches()[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as error:
        file = batch.column(0)[0].as_py()
        raise GAEUsageError(
            f"{file}: --rejects holds one set of columns, the first file's, and this file's differ ({error})"
        ) from error


def _check_outputs(paths: list[Path], options: DiffOptions) -> None:
    """The report paths, ``--per-sample``, ``--groups-out`` and ``--rejects`` through the one
    rule of :func:`gaecli.io.paths.check_writes` (none may be an input or another report; no
    directory; a report's directory must exist; the per-sample, groups and rejects files, data
    files, not replaced unless ``options.overwrite``) — before any work is done."""
    check_writes(
        paths,
        [
            *report_writes(options.report_paths),
            ("per-sample file", options.per_sample),
            ("groups file", options.groups_out),
            ("rejects file", options.rejects),
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
    contract). Old: ``options.sides``, the stored ``options.against`` column, then each name
    of the ``options.baseline`` list recomputed from the same values, rewards and mask (or
    another estimator); every comparison in one pass over the data, each giving the figures a
    run with that side alone gives, bit for bit. Only trainable tokens are compared. With ``options.per_sample`` one
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
    paths = input_files(list(inputs))
    _check_outputs(paths, options)
    return _run(paths, options, progress or NoProgress(), engine or EngineOptions(workers=1))


def diff_file(input: str | Path, options: DiffOptions, progress: Optional[Progress] = None) -> DiffReport:
    """:func:`diff_files` for one file."""
    return diff_files([input], options, progress)
