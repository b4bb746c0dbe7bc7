"""The recompute run: plan the outputs, read each footer once, the ``--normalize`` pass, one
unit per file on the engine, and the outcome of a run where files failed or were stopped."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.advantages.statistics import Moments
from gaecli.checks import row_reasons
from gaecli.comparison.figures import DiffAccumulator
from gaecli.display import display
from gaecli.engines import (
    EXIT_INVALID_DATA,
    EXIT_UNUSABLE,
    FINISHED,
    EngineOptions,
    EngineSession,
    TaskFailure,
    map_units,
)
from gaecli.errors import (
    FilesFailedError,
    GAEUsageError,
    InvalidFilesError,
    RunInterrupted,
    UnusableFilesError,
)
from gaecli.io.filesystem import is_stream, remove_dead_temps, total_size
from gaecli.io.paths import FileJob, plan_outputs, report_writes, with_suffix
from gaecli.io.reader import RolloutFile, read_metadata
from gaecli.io.writer import AtomicParquetWriter, failure_reason
from gaecli.pipeline import computed_batches, new_side_spec
from gaecli.progress import NoProgress, Progress
from gaecli.recompute.options import REASON_COLUMN, REJECTS_SUFFIX, FileOutcome, RecomputeOptions, RecomputeReport
from gaecli.recompute.output import (
    check_job,
    computation_of,
    existing_output,
    identity_record,
    input_identity,
    output_batch,
    output_schema,
    spans_inputs,
)
from gaecli.run.passes import engine_file_moments, engine_file_scores


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


def recompute_job(
    job: FileJob,
    options: RecomputeOptions,
    kernel: str,
    moments: Optional[tuple[Optional[Moments], ...]] = None,
    footer: Optional[pq.FileMetaData] = None,
    scores=None,
    identity: Optional[dict[str, str]] = None,
    recomputed: Optional[str] = None,
    progress: Optional[Progress] = None,
) -> FileResult:
    """Recompute one input file into its output (the work unit of every engine).

    ``kernel``: the resolved kernel name; ``moments``: the merged ``--normalize``
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
    computation = computation_of(options, kernel)
    outcome = FileOutcome(str(job.source), str(job.target), recomputed=recomputed)
    diff = DiffAccumulator(options.gamma, options.lambd, _credit_baseline(options), options.tolerance)
    rollout = RolloutFile(job.source, footer)
    writers: list[AtomicParquetWriter] = []
    try:
        check_job(rollout.schema, job, options, computation)
        replaced = options.overwrite or recomputed is not None  # a recomputed output replaces the one it found
        schema, list_type = output_schema(rollout, job, options, kernel, identity)
        writer = AtomicParquetWriter(job.target, schema, compression=rollout.compression, overwrite=replaced)
        writers.append(writer)
        rejects: Optional[AtomicParquetWriter] = None
        for computed in computed_batches(rollout, computation, statistics=scores):
            batch, valid, check, first_row, packed = (
                computed.batch,
                computed.valid,
                computed.check,
                computed.first_row,
                computed.packed,
            )
            if valid.num_rows != batch.num_rows:
                if rejects is None:
                    rejects_schema = batch.schema.append(pa.field(REASON_COLUMN, pa.string())).with_metadata(
                        rollout.schema.metadata
                    )
                    rejects = AtomicParquetWriter(
                        with_suffix(job.target, REJECTS_SUFFIX),
                        rejects_schema,
                        compression=rollout.compression,
                        overwrite=replaced,
                    )
                    writers.insert(0, rejects)
                    outcome.rejects_file = str(rejects.target)
                reasons = row_reasons(check)
                invalid_rows = np.flatnonzero(check.invalid)
                rejected = batch.filter(pa.array(check.invalid))
                reason_array = pa.array([reasons[first_row + int(row)] for row in invalid_rows], pa.string())
                rejects.write(pa.RecordBatch.from_arrays([*rejected.columns, reason_array], schema=rejects.schema))
                outcome.rejected_rows += rejected.num_rows
            output, advantages, old_advantages = output_batch(
                computed, options, schema, list_type, moments, computation
            )
            diff.update(advantages, old_advantages, packed.trainable, packed.offsets)
            writer.write(output)
            outcome.rows += valid.num_rows
            outcome.tokens += packed.tokens
            if progress is not None:
                progress.advance(batch.num_rows, packed.tokens)
        for each in writers:
            each.close()
        for each in writers:  # the rejects file first: an output in place means its rejects are too
            each.commit()
        if rejects is None and replaced and not is_stream(job.target):  # a device or FIFO replaces nothing
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


def _read_footers(paths: list[Path]) -> list[Optional[pq.FileMetaData]]:
    """Each file's footer, read once for the whole run (None for a file that cannot be read:
    its unit fails with the reason)."""
    footers = []
    for path in paths:
        try:
            footers.append(read_metadata(path))
        except (pa.ArrowException, OSError, GAEUsageError):
            footers.append(None)
    return footers


def _total_rows(footers: list[Optional[pq.FileMetaData]]) -> int:
    """Rows of the readable files (for progress; unreadable ones count 0 and fail later)."""
    return sum(footer.num_rows for footer in footers if footer is not None)


def _remove_leftovers(target: Path) -> None:
    """Temp files of ``target`` and its rejects file whose owner process is gone (a killed
    worker, a kill -9 of an earlier run); a concurrent run's temp files stay. Object
    stores have none (the output is streamed to its key, which appears only when whole)."""
    if not isinstance(target, Path) or is_stream(target):
        return
    for candidate in (target, with_suffix(target, REJECTS_SUFFIX)):
        remove_dead_temps(candidate)


SKIPPED = object()  # a job left alone under --skip-existing


def _failed_run(jobs: list[FileJob], results: list, stopped: bool) -> FilesFailedError:
    """The error of a multi-file run where some files failed: which outputs were written
    (or skipped, being whole already) and which were not, and why."""
    written, not_written, lines, worst = [], [], [], EXIT_INVALID_DATA
    for job, result in zip(jobs, results):
        if result is SKIPPED:
            written.append(str(job.target))
            lines.append(f"  skipped (whole already): {display(job.target)}")
            continue
        if isinstance(result, FileResult):
            written.append(str(job.target))
            lines.append(f"  written: {display(job.target)}")
            continue
        not_written.append(str(job.target))
        if isinstance(result, TaskFailure):
            worst = max(worst, result.code)
            lines.append(f"  not written: {display(job.target)} ({result.message})")
        else:
            lines.append(f"  not written: {display(job.target)} (not started: the run stopped at the first failure)")
    failed = sum(isinstance(result, TaskFailure) for result in results)
    message = (
        f"{failed} of {len(jobs)} files failed; {len(written)} written, {len(not_written)} not written"
        + (" (--on-invalid stop: files not started were cancelled)" if stopped and failed < len(not_written) else "")
        + ":\n"
        + "\n".join(lines)
    )
    error_class = UnusableFilesError if worst == EXIT_UNUSABLE else InvalidFilesError
    return error_class(message, written, not_written)


def _stamp(target) -> Optional[tuple]:
    """What identifies the local file at ``target`` now (None: none there, or remote)."""
    try:
        status = target.stat() if isinstance(target, Path) else None
    except OSError:
        return None
    return None if status is None else (status.st_ino, status.st_mtime_ns, status.st_size)


def _interrupted_run(jobs: list[FileJob], per_job: list, stamps: list) -> RunInterrupted:
    """The error of a run stopped by Ctrl-C or SIGTERM: which outputs are in place (whole)
    and which are not (absent; their temp files removed). ``stamps``: each target's
    :func:`_stamp` before the run; a local output renamed into place by a unit stopped
    before it could report it counts as written (a rename puts only whole files there)."""
    written, not_written, lines = [], [], []
    for job, result, stamp in zip(jobs, per_job, stamps):
        if result is SKIPPED:
            written.append(str(job.target))
            lines.append(f"  skipped (whole already): {display(job.target)}")
        elif isinstance(result, FileResult) or result is FINISHED or _stamp(job.target) not in (stamp, None):
            written.append(str(job.target))
            lines.append(f"  written: {display(job.target)}")
        else:
            _remove_leftovers(job.target)  # a worker killed after the grace period
            not_written.append(str(job.target))
            why = result.message if isinstance(result, TaskFailure) else "stopped or not started"
            lines.append(f"  not written: {display(job.target)} ({why})")
    message = (
        f"interrupted; {len(written)} of {len(jobs)} outputs written (whole), {len(not_written)} not written "
        f"(no partial output left):\n" + "\n".join(lines)
    )
    return RunInterrupted(message, written=written, not_written=not_written)


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
    from gaecli.advantages.kernels import resolve_kernel

    engine = engine or EngineOptions(workers=1)  # a library call stays in this process unless told
    if options.normalize_by is not None and not options.normalize:
        options = replace(options, normalize=True)
    kernel = resolve_kernel(options.kernel, options.device, new_side_spec(options))
    # a run that may replace outputs owns their rejects files (written or removed): checked too
    owns_rejects = options.on_invalid == "skip" or options.overwrite or options.skip_existing
    suffixes = (REJECTS_SUFFIX,) if owns_rejects else ()
    jobs = plan_outputs(
        [str(i) for i in inputs],
        str(output),
        overwrite=options.overwrite or options.skip_existing,
        suffixes=suffixes,
        reports=report_writes(options.report_paths),
    )
    for job in jobs:
        _remove_leftovers(job.target)
    footers = _read_footers([job.source for job in jobs])  # once per file: the units reuse them
    identities = _identities(jobs, footers, spans_inputs(options, computation_of(options, kernel)))
    resumed = [
        existing_output(job, options, kernel, identity) if options.skip_existing else (False, None)
        for job, identity in zip(jobs, identities)
    ]
    skipped = [keep for keep, _ in resumed]
    progress = progress or NoProgress()

    todo = [job for job, skip in zip(jobs, skipped) if not skip]
    if options.on_invalid == "stop":  # every schema checked before any output is written
        computation = computation_of(options, kernel)
        for job, footer, skip in zip(jobs, footers, skipped):
            if footer is not None and not skip:
                check_job(footer.schema.to_arrow_schema(), job, options, computation)
    engine = engine.for_inputs(total_size([job.source for job in todo]))
    results: list = [None] * len(todo)
    stamps = [_stamp(job.target) for job in jobs]
    writing = False  # the statistics pass writes nothing
    try:
        with EngineSession() as session:  # one pool (or Ray) for both passes
            moments, scores = [None] * len(jobs), [None] * len(jobs)
            computation = computation_of(options, kernel)
            if computation.needs_scores:  # the critic-free estimators' group statistics, per file
                scores = engine_file_scores(
                    [job.source for job in jobs], computation, engine, progress, _total_rows(footers), session, footers
                )
            if options.whitening or any(computation.estimator_whitened):  # each unit gets its file's groups only
                moments = engine_file_moments(
                    [job.source for job in jobs],
                    computation,
                    engine,
                    progress,
                    _total_rows(footers),
                    session,
                    footers,
                    scores,
                )
            progress.start("recompute", _total_rows([f for f, skip in zip(footers, skipped) if not skip]))
            try:
                writing = True
                units = [
                    (job, options, kernel, file_moments, footer, file_scores, identity, why)
                    for job, file_moments, footer, file_scores, identity, (skip, why) in zip(
                        jobs, moments, footers, scores, identities, resumed
                    )
                    if not skip
                ]
                results = map_units(
                    recompute_job,
                    units,
                    [str(job.source) for job in todo],
                    engine,
                    stop_on_failure=options.on_invalid == "stop",
                    progress=progress,
                    session=session,
                )
            finally:
                progress.finish()
    except KeyboardInterrupt as error:
        if writing and isinstance(error, RunInterrupted) and error.results is not None:
            results = error.results
        done = iter(results)
        raise _interrupted_run(jobs, [SKIPPED if skip else next(done) for skip in skipped], stamps) from error
    done = iter(results)
    per_job = [SKIPPED if skip else next(done) for skip in skipped]
    failures = [result for result in results if not isinstance(result, FileResult)]
    if failures:
        for job, result in zip(jobs, per_job):
            if result is not SKIPPED and not isinstance(result, FileResult):
                _remove_leftovers(job.target)
        if len(jobs) == 1:
            failures[0].raise_error()
        raise _failed_run(jobs, per_job, options.on_invalid == "stop")

    diff = DiffAccumulator(options.gamma, options.lambd, _credit_baseline(options), options.tolerance)
    outcomes: list[FileOutcome] = []
    for job, result in zip(jobs, per_job):
        if result is SKIPPED:
            outcomes.append(FileOutcome(str(job.source), str(job.target), skipped=True))
            continue
        diff.merge(result.diff)
        outcomes.append(result.outcome)
    return RecomputeReport(outcomes, kernel, options, diff.result())


def recompute_file(
    input: str | Path, output: str | Path, options: RecomputeOptions, progress: Optional[Progress] = None
) -> RecomputeReport:
    """:func:`recompute_files` for one input file written to one output file."""
    return recompute_files([input], output, options, progress)
