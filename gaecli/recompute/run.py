"""The recompute run: what is particular to it on the one run driver (:class:`gaecli.run.Run`):
the outputs planned, ``--skip-existing``, the unit of one file (its output and rejects file
written whole or not at all) and the outcomes merged into the report."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.advantages.statistics import Moments
from gaecli.comparison.figures import DiffAccumulator
from gaecli.engines import EngineOptions
from gaecli.errors import GAEUsageError
from gaecli.io.filesystem import is_stream, remove_dead_temps, total_size
from gaecli.io.paths import FileJob, plan_outputs, report_writes, with_suffix
from gaecli.io.reader import RolloutFile
from gaecli.io.writer import AtomicParquetWriter, failure_reason
from gaecli.pipeline import computed_batches
from gaecli.pipeline.rejects import rejected_batch
from gaecli.progress import NoProgress, Progress
from gaecli.recompute.options import REJECTS_SUFFIX, FileOutcome, RecomputeOptions, RecomputeReport
from gaecli.recompute.output import (
    check_job,
    existing_output,
    identity_record,
    input_identity,
    output_batch,
    output_schema,
)
from gaecli.run import SKIPPED, Run, failed_run, interrupted_run, raise_first_failure, read_footers, stamp


@dataclass
class FileResult:
    """What the work unit of one file sends back: its outcome and its part of the summary
    (merged in input order by the parent)."""

    outcome: FileOutcome
    diff: DiffAccumulator

    @property
    def rows(self) -> int:
        return self.outcome.rows

    @property
    def tokens(self) -> int:
        return self.outcome.tokens


def _credit_baseline(options: RecomputeOptions) -> Optional[str]:
    """The baseline whose terminal credit the summary reports (None: no GAE baseline)."""
    return None if options.critic_free else options.baseline


def output_batches(
    rollout, options: RecomputeOptions, schema: pa.Schema, list_type: pa.DataType, moments, scores, compared=True
):
    """Each computed batch of an open reader (a file's, or a table's) with its output batch
    and the advantages compared (:func:`gaecli.recompute.output.output_batch`):
    ``(computed, output, advantages, old advantages)``. ``compared``: the summary's figures
    are made; without ``moments`` (the advantages compared are those computed) they are made
    in the read that screens the outputs (:attr:`gaecli.pipeline.ComputedBatch.row_diff`)."""
    compare = options.tolerance if compared and moments is None else None
    for computed in computed_batches(rollout, options.computation, statistics=scores, compare=compare):
        output, advantages, old_advantages = output_batch(computed, options, schema, list_type, moments)
        yield computed, output, advantages, old_advantages


class _Rejects:
    """The rejects file of one output, opened at the first invalid row (a temp file renamed
    into place with the output)."""

    def __init__(self, rollout: RolloutFile, job: FileJob, replaced: bool, writers: list, outcome: FileOutcome):
        self.rollout, self.job, self.replaced, self.writers, self.outcome = rollout, job, replaced, writers, outcome
        self.writer: Optional[AtomicParquetWriter] = None

    def write(self, computed) -> None:
        """The invalid rows of a computed batch, each with its reason
        (:func:`gaecli.pipeline.rejects.rejected_batch`)."""
        rejected = rejected_batch(computed)
        if self.writer is None:
            schema = rejected.schema.with_metadata(self.rollout.schema.metadata)
            self.writer = AtomicParquetWriter(
                with_suffix(self.job.target, REJECTS_SUFFIX),
                schema,
                compression=self.rollout.compression,
                overwrite=self.replaced,
            )
            self.writers.insert(0, self.writer)
            self.outcome.rejects_file = str(self.writer.target)
        self.writer.write(pa.RecordBatch.from_arrays(rejected.columns, schema=self.writer.schema))
        self.outcome.rejected_rows += rejected.num_rows


def recompute_job(
    job: FileJob,
    options: RecomputeOptions,
    moments: Optional[tuple[Moments, Moments]] = None,
    footer: Optional[pq.FileMetaData] = None,
    scores=None,
    identity: Optional[dict[str, str]] = None,
    recomputed: Optional[str] = None,
    progress: Optional[Progress] = None,
) -> FileResult:
    """Recompute one input file into its output (the work unit of every engine).

    ``options``: the run's, with its :attr:`~gaecli.RecomputeOptions.computation`;
    ``moments``: the merged ``--normalize``
    statistics (new, old) of this file's groups when whitening; ``footer``: the file's footer
    when the parent has read it (not read again); ``scores``: the merged score statistics of
    this file's groups for a grouped estimator (:func:`gaecli.run.passes.engine_file_scores`);
    ``identity``: the metadata of the inputs it is computed from
    (:func:`gaecli.recompute.output.identity_record`); ``recomputed``: why an existing output
    of ``--skip-existing`` is replaced (in the outcome).
    The output (and its rejects file, written first) goes to a temp file renamed into place
    once it is whole; any failure removes it. A run owns the output's rejects file: one
    left by an earlier run that this one does not write is removed once the output is in
    place, when the output is replaced (``--overwrite``, or ``recomputed``).
    ``progress`` (optional) is advanced per batch. Raises the errors of
    :func:`recompute_files` for this one file.
    """
    outcome = FileOutcome(str(job.source), str(job.target), recomputed=recomputed)
    diff = DiffAccumulator(options.gamma, options.lambd, _credit_baseline(options), options.tolerance)
    rollout = RolloutFile(job.source, footer)
    writers: list[AtomicParquetWriter] = []
    try:
        check_job(rollout.schema, job, options)
        replaced = options.overwrite or recomputed is not None  # a recomputed output replaces the one it found
        schema, list_type = output_schema(rollout, job, options, identity)
        writer = AtomicParquetWriter(job.target, schema, compression=rollout.compression, overwrite=replaced)
        writers.append(writer)
        rejects = _Rejects(rollout, job, replaced, writers, outcome)
        for computed, output, advantages, old_advantages in output_batches(
            rollout, options, schema, list_type, moments, scores
        ):
            if computed.valid.num_rows != computed.batch.num_rows:
                rejects.write(computed)
            packed = computed.packed
            diff.update(advantages, old_advantages, packed.trainable, packed.offsets, row_diff=computed.row_diff)
            writer.write(output)
            outcome.rows += computed.valid.num_rows
            outcome.tokens += packed.tokens
            if progress is not None:
                progress.advance(computed.batch.num_rows, packed.tokens)
        for each in writers:
            each.close()
        for each in writers:  # the rejects file first: an output in place means its rejects are too
            each.commit()
        if rejects.writer is None and replaced and not is_stream(job.target):  # a device or FIFO replaces nothing
            _remove_stale(with_suffix(job.target, REJECTS_SUFFIX))
    except BaseException:
        for each in reversed(writers):
            each.abort()
        raise
    finally:
        rollout.close()
    return FileResult(outcome, diff)


def _remove_stale(path) -> None:
    """Remove an earlier run's side file of an output just replaced (absent: nothing to do)."""
    try:
        if isinstance(path, Path):
            path.unlink(missing_ok=True)
        elif path.exists():
            path.filesystem.delete_file(path.fs_path)
    except (pa.ArrowException, OSError) as error:
        raise GAEUsageError(
            f"{path}: cannot remove the rejects file of an earlier run ({failure_reason(error)}); "
            f"the new output is in place and wrote none"
        ) from error


def _identities(jobs: list[FileJob], footers: list, spans: bool) -> list[dict[str, str]]:
    """Each job's :func:`gaecli.recompute.output.identity_record`: its own input's identity,
    and with ``spans`` (:func:`gaecli.recompute.output.spans_inputs`) every input's."""
    each = [input_identity(job.source, footer) for job, footer in zip(jobs, footers)]
    return [identity_record(identity, each if spans else None) for identity in each]


def _remove_leftovers(target: Path) -> None:
    """Temp files of ``target`` and its rejects file whose owner process is gone (a killed
    worker, a kill -9 of an earlier run); a concurrent run's temp files stay. Object
    stores have none (the output is streamed to its key, which appears only when whole)."""
    if not isinstance(target, Path) or is_stream(target):
        return
    for candidate in (target, with_suffix(target, REJECTS_SUFFIX)):
        remove_dead_temps(candidate)


# ----------------------------------------------------------------------------- the run


def recompute_files(
    inputs: list[str | Path],
    output: str | Path,
    options: RecomputeOptions,
    progress: Optional[Progress] = None,
    engine: Optional[EngineOptions] = None,
) -> RecomputeReport:
    """Recompute advantages and returns for rollout files and write them with the columns
    added.

    ``inputs``: file paths, directories (read recursively for ``*.parquet``) or globs. One
    plain file → ``output`` is a file; otherwise a directory mirroring each input's path
    relative to its root. Files are processed by ``engine`` (default: in this process, one
    after the other; ``gae recompute`` defaults to a local worker per core, at most one per
    256 MB of input); each output appears whole once its file is done, or not at all. With
    ``options.skip_existing`` outputs in place and whole are left alone (``skipped`` in the
    report).

    Raises :class:`gaecli.errors.InvalidDataError` (a :class:`GAEInputError`) for rows that
    break the format (stop mode) and :class:`gaecli.errors.GAEUsageError` for refused
    operations and unreadable files — as they are for a run over one file. When files of a multi-file run fail,
    :class:`gaecli.errors.InvalidFilesError` (all failed for invalid data) or
    :class:`gaecli.errors.UnusableFilesError`, listing the outputs written and not written.
    The ``--normalize`` statistics pass runs over every input first; a failure there
    writes nothing. Bad option values raise :class:`gaecli.errors.InvalidOptionError` (a
    :class:`GAEInputError` too) when the options are made, before any work.
    """
    engine = engine or EngineOptions(workers=1)  # a library call stays in this process unless told
    jobs = _plan(inputs, output, options)
    footers = read_footers([job.source for job in jobs])  # once per file: the passes and units reuse them
    identities = _identities(jobs, footers, options.computation.spans_inputs)
    resumed = [
        existing_output(job, options, identity) if options.skip_existing else (False, None)
        for job, identity in zip(jobs, identities)
    ]
    skipped = [keep for keep, _ in resumed]
    todo = [index for index, skip in enumerate(skipped) if not skip]
    if options.on_invalid == "stop":  # every schema checked before any output is written
        for index in todo:
            if footers[index] is not None:
                check_job(footers[index].schema.to_arrow_schema(), jobs[index], options)
    stamps = [stamp(job.target) for job in jobs]
    run = Run(
        "recompute",
        [job.source for job in jobs],
        footers,
        options.computation,
        engine.for_inputs(total_size([jobs[index].source for index in todo])),
        progress or NoProgress(),
    )

    def per_job(results: list) -> list:
        done = iter(results)
        return [SKIPPED if skip else next(done) for skip in skipped]

    def interrupted(results: list) -> BaseException:
        return interrupted_run([job.target for job in jobs], per_job(results), stamps, _remove_leftovers)

    def task(index: int, moments, scores) -> tuple:
        return (jobs[index], options, moments, footers[index], scores, identities[index], resumed[index][1])

    missing = _missing_directories(jobs)
    try:
        results = per_job(run.execute(recompute_job, task, todo, options.on_invalid == "stop", interrupted))
        return _report(jobs, results, options)
    except BaseException:  # failed or interrupted: no empty directory of this run's making is left
        _remove_empty(missing)
        raise


def _missing_directories(jobs: list[FileJob]) -> list[Path]:
    """The local directories the outputs go to that do not exist yet (the run creates them),
    deepest first."""
    missing: set[Path] = set()
    for job in jobs:
        if not isinstance(job.target, Path):
            continue
        parent = Path(os.path.abspath(job.target)).parent
        while parent not in missing and not os.path.lexists(parent) and parent != parent.parent:
            missing.add(parent)
            parent = parent.parent
    return sorted(missing, key=lambda path: len(path.parts), reverse=True)


def _remove_empty(directories: list[Path]) -> None:
    """Remove each of ``directories`` (deepest first) that exists and is empty; one that
    holds something (an output written whole, another process's file) stays."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            pass


def _plan(inputs: list, output, options: RecomputeOptions) -> list[FileJob]:
    """The jobs of a run, every output checked (:func:`gaecli.io.paths.plan_outputs`), the
    temp files of earlier runs' dead processes removed."""
    # a run that may replace outputs owns their rejects files (written or removed): checked too
    owns_rejects = options.on_invalid == "skip" or options.overwrite or options.skip_existing
    jobs = plan_outputs(
        [str(i) for i in inputs],
        str(output),
        overwrite=options.overwrite or options.skip_existing,
        suffixes=(REJECTS_SUFFIX,) if owns_rejects else (),
        reports=report_writes(options.report_paths),
    )
    for job in jobs:
        _remove_leftovers(job.target)
    return jobs


def _report(jobs: list[FileJob], results: list, options: RecomputeOptions) -> RecomputeReport:
    """The report of a run (its files' outcomes in input order, their summaries merged), or
    the error of the first failure (one file) or of the files that failed."""
    if any(result is not SKIPPED and not isinstance(result, FileResult) for result in results):
        for job, result in zip(jobs, results):
            if result is not SKIPPED and not isinstance(result, FileResult):
                _remove_leftovers(job.target)
        if len(jobs) == 1:
            raise_first_failure(results)
        raise failed_run([job.target for job in jobs], results, options.on_invalid == "stop")
    diff = DiffAccumulator(options.gamma, options.lambd, _credit_baseline(options), options.tolerance)
    outcomes: list[FileOutcome] = []
    for job, result in zip(jobs, results):
        if result is SKIPPED:
            outcomes.append(FileOutcome(str(job.source), str(job.target), skipped=True))
            continue
        diff.merge(result.diff)
        outcomes.append(result.outcome)
    return RecomputeReport(outcomes, options.computation.kernel, options, _summary(diff, options))


COMPARED_FIGURES = ("changed_samples", "mean_abs_delta_advantage", "max_abs_delta_advantage")
"""The figures of the summary that compare the new advantages with an old side."""


def _summary(diff: DiffAccumulator, options: RecomputeOptions) -> dict:
    """The run's summary: ``baseline`` what the new advantages were compared with (a GAE
    profile, the critic-free estimator's trainer profile), None when nothing was: then the
    :data:`COMPARED_FIGURES` are None too (not zeros that read as "nothing changed")."""
    summary = diff.result()
    if options.old_sides:
        return {**summary, "baseline": options.baseline}
    return {**summary, "baseline": None, **dict.fromkeys(COMPARED_FIGURES)}


def recompute_file(
    input: str | Path, output: str | Path, options: RecomputeOptions, progress: Optional[Progress] = None
) -> RecomputeReport:
    """:func:`recompute_files` for one input file written to one output file."""
    return recompute_files([input], output, options, progress)
