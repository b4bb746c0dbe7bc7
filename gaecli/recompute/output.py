"""What a recompute output holds: its new columns and schema, the metadata recording how it
was computed and from which inputs, each output batch, and the ``--skip-existing`` check of
an output in place."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from gaecli._version import __version__
from gaecli.advantages.statistics import Moments
from gaecli.display import display
from gaecli.errors import (
    GAEUsageError,
)
from gaecli.io.filesystem import AnyPath, RemotePath
from gaecli.io.format import list_type_like, numeric_arrow, output_float_type
from gaecli.io.paths import FileJob, with_suffix
from gaecli.io.reader import RolloutFile, read_schema
from gaecli.pipeline import check_file, whitened_sides
from gaecli.recompute.options import METADATA_PREFIX, REJECTS_SUFFIX, RecomputeOptions


def new_column_names(options: RecomputeOptions) -> list[str]:
    """The columns a run adds (distinct, none of those it reads: checked with the options)."""
    return [name for _, name in options.written_columns]


def check_job(schema: pa.Schema, job: FileJob, options: RecomputeOptions) -> None:
    """Refuse an input its run cannot read, or whose columns a written column would replace
    without ``--replace`` (the written columns among themselves and against the columns the
    run reads are checked with the options: :func:`gaecli.recompute.options.check_written_columns`)."""
    check_file(schema, str(job.source), options.computation)
    new_names = new_column_names(options)
    clash = [name for name in new_names if name in schema.names]
    if clash and not options.replace:
        raise GAEUsageError(
            f"{job.source}: column {clash[0]!r} exists already; pick another name "
            f"(--advantages-col/--returns-col) or give --replace"
        )


def output_schema(
    rollout: RolloutFile,
    job: FileJob,
    options: RecomputeOptions,
    identity: Optional[dict[str, str]] = None,
) -> tuple[pa.Schema, pa.DataType]:
    """The output's schema (the input's, the new columns added or replaced) with the
    metadata recording the computation and ``identity`` (:func:`identity_record`), and the
    list type of the new columns: the float type the advantages are computed in
    (:func:`gaecli.io.format.output_float_type` of the columns the run reads: a critic-free
    estimator reads no values, so its outputs take the rewards' type)."""
    columns = options.computation.columns
    float_type = output_float_type(rollout.schema, columns)
    list_type = list_type_like(rollout.schema, columns, float_type)
    schema = rollout.schema
    for name in new_column_names(options):
        new_field = pa.field(name, list_type)
        if name in schema.names:
            schema = schema.set(schema.get_field_index(name), new_field)
        else:
            schema = schema.append(new_field)
    metadata = dict(rollout.schema.metadata or {})
    record = {
        "version": __version__,
        **computation_record(options),
        "baseline": options.baseline,
        "on_invalid": options.on_invalid,
        "source": display(job.source.name),  # printable: no raw bytes, no secrets
        **(identity or {}),
    }
    metadata.update({f"{METADATA_PREFIX}{key}".encode(): value.encode() for key, value in record.items()})
    return schema.with_metadata(metadata), list_type


def computation_record(options: RecomputeOptions) -> dict[str, str]:
    """What an output's metadata records about how it was computed, key (without the
    ``gaecli.`` prefix) → value as written, from the run's description
    (:attr:`gaecli.RecomputeOptions.computation`) and the columns written; ``--skip-existing``
    keeps an output only when all of these match (the kernel too: kernels agree to their accuracy,
not bitwise, docs/semantics.md; the batch size and the workers, which give the same bits, are
not recorded). ``on_invalid`` and
    ``source`` are recorded but not compared: a whole output holds the same rows under either
    mode unless a rejects file exists beside it (which the resume checks), and the inputs are
    compared by their identity (:func:`identity_record`: another input or a changed one means
    recompute, not refuse). ``spec`` is every field of the new side's spec (the GAE variants
    and the whitening included), as JSON: an output computed with another spec is not the one
    asked for."""
    computation = options.computation
    spec = computation.new_spec
    record = {
        "gamma": "none" if spec.gamma is None else repr(float(spec.gamma)),
        "lambd": "none" if spec.lambd is None else repr(float(spec.lambd)),
        "kernel": computation.kernel,
        "normalize": spec.normalize_label,
        "columns": options.columns.to_json(),
        "keep_baseline": json.dumps(options.keep_baseline),
        "spec": json.dumps(spec.to_dict(), sort_keys=True),
    }
    if options.keep_baseline:  # the baseline's columns are written only then
        record["baseline"] = options.baseline
        taken = [spec.to_dict() for spec in computation.old_specs if spec is not None and spec.variants]
        if taken:  # recorded only then (areal's truncation bootstrap): an output written without it is stale
            record["baseline_specs"] = json.dumps(taken, sort_keys=True)
    if spec.critic_free:  # recorded only then, so that outputs written before stay current
        record["estimator"] = spec.estimator
        record["group_col"] = spec.group_by or ""
        record["step_col"] = spec.step_by or ""
    return record


def input_identity(path: AnyPath, footer: Optional[pq.FileMetaData]) -> Optional[dict]:
    """What identifies an input as this run reads it: where it is (resolved; a URI by its
    scheme and its path in the file system, never the credentials or options of its
    query), its size and modification time (ns) now, and the rows its footer counts (read
    once, at planning). None when it cannot be read (its unit fails with the reason)."""
    if footer is None:
        return None
    try:
        if isinstance(path, RemotePath):
            info = path.info()
            where, size, mtime = f"{urlsplit(str(path)).scheme}://{path.fs_path}", info.size, info.mtime_ns
        else:
            status = os.stat(path)
            where, size, mtime = os.path.realpath(path), status.st_size, status.st_mtime_ns
    except (pa.ArrowException, OSError):
        return None
    return {"path": where, "size": size, "mtime_ns": mtime, "rows": footer.num_rows}


def identity_record(identity: Optional[dict], every: Optional[list[Optional[dict]]]) -> dict[str, str]:
    """The metadata entries (keys without the ``gaecli.`` prefix) of an output's inputs:
    ``input``, its own input's :func:`input_identity` as JSON; ``inputs``, where the output
    depends on every input (``every`` given: :attr:`gaecli.pipeline.Computation.spans_inputs`),
    a digest of the sorted identities of all of them."""
    record = {"input": json.dumps(identity, sort_keys=True)}
    if every is not None:
        listed = sorted(json.dumps(each, sort_keys=True) for each in every)
        record["inputs"] = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
    return record


def _identity_difference(metadata: dict, identity: dict[str, str]) -> Optional[str]:
    """Why an output recording the run's computation was not computed from these inputs
    as they are now (None: it was), in words for the summary."""
    have = metadata.get(f"{METADATA_PREFIX}input".encode())
    if have is None:
        return "its output records no input identity (written by an earlier gaecli)"
    try:
        had = json.loads(have.decode())
    except ValueError:
        had = None
    wanted = json.loads(identity["input"])
    if wanted is None:
        return "its input cannot be read now"
    if not isinstance(had, dict) or had.get("path") != wanted.get("path"):
        return "its output was computed from another input"
    for field in ("size", "mtime_ns", "rows"):
        if had.get(field) != wanted.get(field):
            return f"the input changed since its output was written ({field} {had.get(field)}, now {wanted.get(field)})"
    if metadata.get(f"{METADATA_PREFIX}inputs".encode(), b"").decode() != identity.get("inputs", ""):
        return "the inputs of the run changed since its output was written (its statistics span every input)"
    return None


def first_difference(key: str, have: str, want: str) -> str:
    """The first field where two recorded values differ, in words: ``columns`` (a JSON
    object) is compared field by field."""
    if key in ("columns", "spec"):
        try:
            had, wanted = json.loads(have), json.loads(want)
        except ValueError:
            had = None
        if isinstance(had, dict):
            for name in sorted(set(had) | set(wanted)):
                old_value = had.get(name, "(not recorded)")
                if old_value != wanted.get(name):
                    return f"{key}.{name} {json.dumps(old_value)}, not {json.dumps(wanted.get(name))}"
    return f"{key} {have or '(not recorded)'}, not {want}"


def output_batch(
    computed,
    options: RecomputeOptions,
    schema: pa.Schema,
    list_type: pa.DataType,
    moments: Optional[tuple[Moments, ...]] = None,
):
    """One output batch of ``schema`` from a computed batch (:func:`gaecli.pipeline.computed_batches`):
    its valid rows with the new columns added, the advantages whitened with ``moments`` when
    given and clipped by ``--advantage-clip`` (:func:`gaecli.pipeline.whitened_sides`).
    Returns ``(batch, advantages, old advantages)`` (flat, as written)."""
    packed, valid = computed.packed, computed.valid
    advantages, returns, old_advantages, old_returns = (
        computed.new,
        computed.new_returns,
        computed.old,
        computed.old_returns,
    )
    if moments is not None or options.computation.new_spec.advantage_clip is not None:
        advantages, returns, olds = whitened_sides(computed, options.computation, moments)
        old_advantages, old_returns = olds[0]
    offsets_type = pa.int64() if pa.types.is_large_list(list_type) else pa.int32()
    list_class = pa.LargeListArray if pa.types.is_large_list(list_type) else pa.ListArray
    offsets_array = packed.arrow_offsets  # the input's, reused when no row was dropped
    if offsets_array is None or offsets_array.type != offsets_type:
        offsets_array = pa.array(packed.offsets, offsets_type)
    new_columns = {options.columns.advantages: advantages, options.columns.returns: returns}
    if options.keep_baseline:
        new_columns.update(zip(options.baseline_columns, (old_advantages, old_returns)))
    arrays = {name: valid.column(name) for name in valid.schema.names}
    for name, flat in new_columns.items():
        arrays[name] = list_class.from_arrays(offsets_array, numeric_arrow(flat), type=list_type)
    return (
        pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema),
        advantages,
        old_advantages,
    )


def existing_output(job: FileJob, options: RecomputeOptions, identity: dict[str, str]) -> tuple[bool, Optional[str]]:
    """Under ``--skip-existing``: ``(True, None)`` when the job's output is in place and
    whole (a readable Parquet footer with gaecli metadata recording the same computation:
    :func:`computation_record`; its rejects file, if any, readable too) and was computed
    from these inputs as they are now (``identity``: :func:`identity_record`);
    ``(False, None)`` when it is absent; ``(False, why)`` when it is ours but computed from
    another input, or an input changed since: it is recomputed, and the summary says why.
    Anything else is refused (:class:`GAEUsageError`), naming the first field that differs:
    the file is not ours to replace."""
    if not job.target.exists():
        return False, None
    rejects = with_suffix(job.target, REJECTS_SUFFIX)
    try:
        metadata = read_schema(job.target).metadata or {}
        if options.on_invalid == "skip" and rejects.exists():
            read_schema(rejects)
    except (pa.ArrowException, OSError) as error:
        raise GAEUsageError(
            f"{job.target} exists but is not a whole Parquet file ({error}); "
            f"remove it or give --overwrite instead of --skip-existing"
        ) from error
    if f"{METADATA_PREFIX}version".encode() not in metadata:
        raise GAEUsageError(f"{job.target} exists but was not written by gaecli; remove it or give --overwrite")
    for key, value in computation_record(options).items():
        have = metadata.get(f"{METADATA_PREFIX}{key}".encode(), b"").decode()
        if have != value:
            raise GAEUsageError(
                f"{job.target} exists but was written with {first_difference(key, have, value)}; "
                f"give --overwrite to replace it"
            )
    why = _identity_difference(metadata, identity)
    return why is None, why
