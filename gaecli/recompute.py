"""``gae recompute`` as a library: stream rollout Parquet files, check every batch, compute
masked-GAE advantages and returns, write the files back with them added (atomically), and
compare against a baseline on the way."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli._version import __version__
from gaecli.checks import BatchCheck, check_batch, check_schema, first_error, row_reasons
from gaecli.diff import DiffAccumulator
from gaecli.errors import GAEInputError, GAEUsageError, InvalidDataError
from gaecli.io.format import Columns, list_parts, list_type_like, numeric_numpy, output_float_type
from gaecli.io.paths import FileJob, plan_outputs, with_suffix
from gaecli.io.reader import DEFAULT_BATCH_ROWS, RolloutFile
from gaecli.io.writer import AtomicParquetWriter
from gaecli.kl import check_kl_options, kl_rewards
from gaecli.progress import NoProgress, Progress
from gaecli.semantics import WHITEN_EPSILON, baseline_gae_packed, check_discount
from gaecli.stats import GroupedMoments, row_moments

REJECTS_SUFFIX = ".rejected"
REASON_COLUMN = "reason"
METADATA_PREFIX = "gaecli."


@dataclass(frozen=True)
class RecomputeOptions:
    """Everything that shapes a recompute run (the CLI options, one to one).

    ``normalize``: whiten the advantages over all trainable tokens of all inputs;
    ``normalize_by``: whiten within groups of rows sharing this column's value (implies
    normalize). ``on_invalid``: ``"stop"`` (first invalid row stops the run) or ``"skip"``
    (invalid rows go whole to ``<output>.rejected.parquet`` with a ``reason`` column).
    """

    gamma: float
    lambd: float
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: int = DEFAULT_BATCH_ROWS
    columns: Columns = field(default_factory=Columns)
    normalize: bool = False
    normalize_by: Optional[str] = None
    replace: bool = False
    keep_baseline: bool = False
    baseline: str = "unmasked"
    on_invalid: str = "stop"
    overwrite: bool = False
    tolerance: float = 1e-6

    @property
    def whitening(self) -> bool:
        return self.normalize or self.normalize_by is not None

    @property
    def baseline_columns(self) -> tuple[str, str]:
        suffix = self.baseline.replace("-", "_")
        return f"advantages_{suffix}", f"returns_{suffix}"


@dataclass
class FileOutcome:
    """What became of one input file."""

    source: str
    output: str
    rows: int = 0
    tokens: int = 0
    rejected_rows: int = 0
    rejects_file: Optional[str] = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RecomputeReport:
    """The result of a run: files written, kernel used, and the comparison summary."""

    files: list[FileOutcome]
    kernel: str
    options: RecomputeOptions
    summary: dict

    @property
    def rejected_rows(self) -> int:
        return sum(f.rejected_rows for f in self.files)

    def to_dict(self) -> dict:
        return {
            "version": __version__,
            "gamma": self.options.gamma,
            "lambd": self.options.lambd,
            "kernel": self.kernel,
            "normalize": normalize_label(self.options),
            "files": [f.to_dict() for f in self.files],
            "rows": sum(f.rows for f in self.files),
            "rejected_rows": self.rejected_rows,
            "summary": self.summary,
        }


def normalize_label(options: RecomputeOptions) -> str:
    if options.normalize_by is not None:
        return f"by:{options.normalize_by}"
    return "all" if options.normalize else "none"


# ----------------------------------------------------------------------------- batches


@dataclass
class PackedBatch:
    """One batch as flat numpy buffers: values, rewards (float), trainable (bool),
    zero-based offsets ``[B + 1]``, terminal rewards ``[B]``."""

    values: np.ndarray
    rewards: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    terminal_rewards: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])


def pack_batch(batch: pa.RecordBatch, columns: Columns, dtype: np.dtype) -> PackedBatch:
    """Flat buffers of a checked batch (zero-copy where Arrow allows); an absent values or
    rewards column (``None``) is taken as zeros. With ``columns.kl_coef`` the rewards are
    the rewards column (if any) plus ``−kl_coef · KL`` of the log-prob columns, summed in
    float64 and then cast to ``dtype``."""
    offsets, mask_flat = list_parts(batch.column(columns.loss_mask))
    mask = numeric_numpy(mask_flat)
    trainable = mask if mask.dtype == np.bool_ else mask != 0

    def stored(name: str) -> np.ndarray:
        return numeric_numpy(list_parts(batch.column(name))[1])

    def floats(name: Optional[str]) -> np.ndarray:
        if name is None:
            return np.zeros(offsets[-1], dtype=dtype)
        return stored(name).astype(dtype, copy=False)

    if columns.kl_coef is None:
        rewards = floats(columns.rewards)
    else:
        rewards = kl_rewards(stored(columns.log_probs), stored(columns.ref_log_probs), columns.kl_coef, columns.kl_estimator)
        if columns.rewards is not None:
            rewards += stored(columns.rewards)
        rewards = rewards.astype(dtype, copy=False)
    terminal = np.asarray(batch.column(columns.terminal_reward)).astype(dtype, copy=False)
    return PackedBatch(floats(columns.values), rewards, trainable, offsets, terminal)


def compute_packed(packed: PackedBatch, gamma: float, lambd: float, kernel: str, device: str, semantics: str) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (flat numpy, the values' dtype) of a packed batch under
    ``semantics`` ("masked" or a baseline)."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = [torch.from_numpy(a) for a in (packed.values, packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards)]
    if device != "cpu":
        tensors = [t.to(device) for t in tensors]
    advantages, returns = baseline_gae_packed(
        *tensors, gamma=gamma, lambd=lambd, semantics=semantics, kernel=kernel, validate=False
    )
    return advantages.cpu().numpy(), returns.cpu().numpy()


def _group_keys(batch: pa.RecordBatch, options: RecomputeOptions) -> Optional[pa.Array]:
    return batch.column(options.normalize_by) if options.normalize_by is not None else None


def _whiten(advantages: np.ndarray, packed: PackedBatch, moments: GroupedMoments, keys, everywhere: bool) -> np.ndarray:
    """Whiten with each row's group statistics; masked positions stay 0 unless
    ``everywhere`` (the baselines, whose trainers whiten every position)."""
    means, stds = moments.row_stats(keys, packed.offsets.size - 1, WHITEN_EPSILON)
    lengths = np.diff(packed.offsets)
    token_means = np.repeat(means, lengths)
    token_stds = np.repeat(stds, lengths)
    whitened = (advantages.astype(np.float64) - token_means) / token_stds
    if not everywhere:
        whitened = np.where(packed.trainable, whitened, 0.0)
    return whitened.astype(advantages.dtype)


# ----------------------------------------------------------------------------- the run


class _Run:
    """One recompute run over planned jobs (kept private: :func:`recompute_files` is the API)."""

    def __init__(self, jobs: list[FileJob], options: RecomputeOptions, progress: Progress) -> None:
        from gaecli.kernels import resolve_kernel

        self.jobs = jobs
        self.options = options
        self.progress = progress
        self.kernel = resolve_kernel(options.kernel, options.device)
        self.files = [RolloutFile(job.source) for job in jobs]
        self.new_moments = GroupedMoments()
        self.old_moments = GroupedMoments()
        self.diff = DiffAccumulator(options.gamma, options.lambd, options.baseline, options.tolerance)
        for job, rollout in zip(jobs, self.files):
            self._check_file(job, rollout)

    def _check_file(self, job: FileJob, rollout: RolloutFile) -> None:
        options, columns = self.options, self.options.columns
        findings = check_schema(rollout.schema, columns, str(job.source))
        error = first_error(findings)
        if error is not None:
            raise InvalidDataError(error)
        if options.normalize_by is not None and options.normalize_by not in rollout.schema.names:
            raise GAEUsageError(f"{job.source}: --normalize-by column {options.normalize_by!r} is missing")
        if options.normalize_by is not None and pa.types.is_nested(rollout.schema.field(options.normalize_by).type):
            raise GAEUsageError(
                f"{job.source}: --normalize-by column {options.normalize_by!r} is "
                f"{rollout.schema.field(options.normalize_by).type}; group by a column of scalars (ids, strings, numbers)"
            )
        new_names = self._new_column_names()
        clash = [name for name in new_names if name in rollout.schema.names]
        if clash and not options.replace:
            raise GAEUsageError(
                f"{job.source}: column {clash[0]!r} exists already; pick another name "
                f"(--advantages-col/--returns-col) or give --replace"
            )
        read = {name for _, name in columns.token_columns()} | {columns.terminal_reward}
        overlap = read & set(new_names)
        if overlap:
            raise GAEUsageError(f"output column {sorted(overlap)[0]!r} is also an input column; choose another name")

    def _new_column_names(self) -> list[str]:
        names = [self.options.columns.advantages, self.options.columns.returns]
        if self.options.keep_baseline:
            names.extend(self.options.baseline_columns)
        return names

    def _checked(self, batch: pa.RecordBatch, job: FileJob, first_row: int) -> tuple[pa.RecordBatch, BatchCheck]:
        """The valid rows of ``batch`` (all of them, or an error in stop mode)."""
        check = check_batch(batch, self.options.columns, str(job.source), first_row)
        if check.ok:
            return batch, check
        if self.options.on_invalid == "stop":
            raise InvalidDataError(first_error(check.findings))
        return batch.filter(pa.array(~check.invalid)), check

    def _batches(self, index: int, columns: Optional[list[str]] = None):
        job, rollout = self.jobs[index], self.files[index]
        first_row = 0
        for batch in rollout.iter_batches(self.options.batch_rows, columns):
            valid, check = self._checked(batch, job, first_row)
            yield batch, valid, check, first_row
            first_row += batch.num_rows

    def collect_statistics(self) -> None:
        """First pass of ``--normalize``: exact per-group moments of new and old advantages."""
        options, columns = self.options, self.options.columns
        needed = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
        if options.normalize_by is not None:
            needed.add(options.normalize_by)
        self.progress.start("statistics", sum(f.num_rows for f in self.files))
        for index, rollout in enumerate(self.files):
            present = [name for name in rollout.schema.names if name in needed]
            dtype = output_float_type(rollout.schema, columns).to_pandas_dtype()
            for batch, valid, _, _ in self._batches(index, present):
                packed = pack_batch(valid, columns, dtype)
                keys = _group_keys(valid, options)
                for semantics, moments in (("masked", self.new_moments), (options.baseline, self.old_moments)):
                    advantages, _ = compute_packed(packed, options.gamma, options.lambd, self.kernel, options.device, semantics)
                    moments.add(keys, *row_moments(advantages, packed.trainable, packed.offsets))
                self.progress.advance(batch.num_rows, packed.tokens)
        self.progress.finish()
        for key, group in self.new_moments.groups.items():
            if group.count == 0:
                where = "the input" if key is None else f"group {options.normalize_by}={key!r}"
                raise GAEInputError(f"cannot normalize: {where} has no trainable token")

    def write(self) -> list[FileOutcome]:
        """Second (or only) pass: compute, write every output to its temp file, then move all
        of them into place together. Any failure removes every temp file."""
        options = self.options
        writers: list[AtomicParquetWriter] = []
        outcomes: list[FileOutcome] = []
        self.progress.start("recompute", sum(f.num_rows for f in self.files))
        try:
            for index, (job, rollout) in enumerate(zip(self.jobs, self.files)):
                outcome = FileOutcome(str(job.source), str(job.target))
                self._write_file(index, outcome, writers)
                outcomes.append(outcome)
            for writer in writers:
                writer.close()
            for writer in writers:
                writer.commit()
        except BaseException:
            for writer in reversed(writers):
                writer.abort()
            raise
        finally:
            self.progress.finish()
        return outcomes

    def _output_schema(self, rollout: RolloutFile, job: FileJob) -> tuple[pa.Schema, pa.DataType]:
        options, columns = self.options, self.options.columns
        float_type = output_float_type(rollout.schema, columns)
        list_type = list_type_like(rollout.schema, columns, float_type)
        schema = rollout.schema
        for name in self._new_column_names():
            new_field = pa.field(name, list_type)
            if name in schema.names:
                schema = schema.set(schema.get_field_index(name), new_field)
            else:
                schema = schema.append(new_field)
        metadata = dict(rollout.schema.metadata or {})
        metadata.update({
            f"{METADATA_PREFIX}version".encode(): __version__.encode(),
            f"{METADATA_PREFIX}gamma".encode(): repr(float(options.gamma)).encode(),
            f"{METADATA_PREFIX}lambd".encode(): repr(float(options.lambd)).encode(),
            f"{METADATA_PREFIX}kernel".encode(): self.kernel.encode(),
            f"{METADATA_PREFIX}normalize".encode(): normalize_label(options).encode(),
            f"{METADATA_PREFIX}columns".encode(): columns.to_json().encode(),
            f"{METADATA_PREFIX}source".encode(): job.source.name.encode(),
        })
        return schema.with_metadata(metadata), list_type

    def _write_file(self, index: int, outcome: FileOutcome, writers: list[AtomicParquetWriter]) -> None:
        options, columns = self.options, self.options.columns
        job, rollout = self.jobs[index], self.files[index]
        schema, list_type = self._output_schema(rollout, job)
        dtype = list_type.value_type.to_pandas_dtype()
        offsets_type = pa.int64() if pa.types.is_large_list(list_type) else pa.int32()
        list_class = pa.LargeListArray if pa.types.is_large_list(list_type) else pa.ListArray
        writer = AtomicParquetWriter(job.target, schema, compression=rollout.compression)
        writers.append(writer)
        rejects: Optional[AtomicParquetWriter] = None
        for batch, valid, check, first_row in self._batches(index):
            if valid.num_rows != batch.num_rows:
                if rejects is None:
                    rejects_schema = batch.schema.append(pa.field(REASON_COLUMN, pa.string())).with_metadata(rollout.schema.metadata)
                    rejects = AtomicParquetWriter(with_suffix(job.target, REJECTS_SUFFIX), rejects_schema, compression=rollout.compression)
                    writers.append(rejects)
                    outcome.rejects_file = str(rejects.target)
                reasons = row_reasons(check)
                invalid_rows = np.flatnonzero(check.invalid)
                rejected = batch.filter(pa.array(check.invalid))
                reason_array = pa.array([reasons[first_row + int(row)] for row in invalid_rows], pa.string())
                rejects.write(pa.RecordBatch.from_arrays([*rejected.columns, reason_array], schema=rejects.schema))
                outcome.rejected_rows += rejected.num_rows
            packed = pack_batch(valid, columns, dtype)
            keys = _group_keys(valid, options)
            advantages, returns = compute_packed(packed, options.gamma, options.lambd, self.kernel, options.device, "masked")
            old_advantages, old_returns = compute_packed(packed, options.gamma, options.lambd, self.kernel, options.device, options.baseline)
            if options.whitening:
                advantages = _whiten(advantages, packed, self.new_moments, keys, everywhere=False)
                old_advantages = _whiten(old_advantages, packed, self.old_moments, keys, everywhere=True)
            self.diff.update(advantages, old_advantages, packed.trainable, packed.offsets)
            offsets_array = pa.array(packed.offsets, offsets_type)
            new_columns = {
                columns.advantages: advantages,
                columns.returns: returns,
            }
            if options.keep_baseline:
                new_columns.update(zip(options.baseline_columns, (old_advantages, old_returns)))
            arrays = {name: valid.column(name) for name in valid.schema.names}
            for name, flat in new_columns.items():
                arrays[name] = list_class.from_arrays(offsets_array, pa.array(flat), type=list_type)
            writer.write(pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema))
            outcome.rows += valid.num_rows
            outcome.tokens += packed.tokens
            self.progress.advance(batch.num_rows, packed.tokens)


def _check_device(device: str) -> None:
    """Refuse (:class:`GAEUsageError`) a device that is not cpu or cuda, or CUDA where
    torch cannot use it."""
    import torch

    try:
        device_type = torch.device(device).type
    except (RuntimeError, TypeError) as error:
        raise GAEUsageError(f"unknown device {device!r}; use cpu or cuda") from error
    if device_type not in ("cpu", "cuda"):
        raise GAEUsageError(f"device {device!r} is not supported; use cpu or cuda")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise GAEUsageError(f"device {device!r}: CUDA is not available to torch here; use --device cpu")


def recompute_files(
    inputs: list[str | Path],
    output: str | Path,
    options: RecomputeOptions,
    progress: Optional[Progress] = None,
) -> RecomputeReport:
    """Recompute advantages and returns for rollout files and write them with the columns
    added.

    ``inputs``: file paths, directories (read recursively for ``*.parquet``) or globs. One
    plain file → ``output`` is a file; otherwise a directory mirroring each input's path
    relative to its root. All outputs appear together at the end or not at all.

    Raises :class:`gaecli.errors.InvalidDataError` (a :class:`GAEInputError`) for rows that
    break the format (stop mode), :class:`GAEInputError` for bad options, and
    :class:`gaecli.errors.GAEUsageError` for refused operations and unreadable files.
    """
    check_discount(options.gamma, options.lambd)
    if options.on_invalid not in ("stop", "skip"):
        raise GAEInputError(f"on_invalid must be 'stop' or 'skip', got {options.on_invalid!r}")
    if options.batch_rows < 1:
        raise GAEInputError(f"batch_rows must be at least 1, got {options.batch_rows}")
    _check_device(options.device)
    if options.columns.kl_coef is not None:
        check_kl_options(options.columns.kl_coef, options.columns.kl_estimator)
    if options.normalize_by is not None and not options.normalize:
        options = replace(options, normalize=True)
    suffixes = (REJECTS_SUFFIX,) if options.on_invalid == "skip" else ()
    jobs = plan_outputs([str(i) for i in inputs], str(output), overwrite=options.overwrite, suffixes=suffixes)
    run = _Run(jobs, options, progress or NoProgress())
    if options.whitening:
        run.collect_statistics()
    outcomes = run.write()
    return RecomputeReport(outcomes, run.kernel, options, run.diff.result())


def recompute_file(
    input: str | Path, output: str | Path, options: RecomputeOptions, progress: Optional[Progress] = None
) -> RecomputeReport:
    """:func:`recompute_files` for one input file written to one output file."""
    return recompute_files([input], output, options, progress)
