"""What every ``gae import FORMAT`` shares: one import run (:func:`run_import`: finding the
inputs, the format's plan, writing the output whole or not at all), loading ``torch.save``
files safely, and building Arrow columns from per-sample tensors (see docs/import.md)."""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, TypedDict

import numpy as np
import pyarrow as pa
import torch

from gaecli._version import __version__
from gaecli.display import display
from gaecli.errors import GAEInputError, GAEUsageError
from gaecli.importers.report import ImportReport
from gaecli.importers.values import describe, is_dense, shown
from gaecli.io.filesystem import AnyPath, RemotePath, to_path
from gaecli.io.paths import ReportPath, check_writes, discover_inputs, report_writes
from gaecli.io.writer import AtomicParquetWriter
from gaecli.progress import NoProgress, Progress

METADATA_PREFIX = "gaecli."
MAX_LIST_TOKENS = 2**31 - 1  # int32 list offsets

_ARROW_INTEGERS = {
    torch.bool: pa.bool_(),
    torch.uint8: pa.uint8(),
    torch.int8: pa.int8(),
    torch.int16: pa.int16(),
    torch.int32: pa.int32(),
    torch.int64: pa.int64(),
}
_TORCH_OF_ARROW = {
    pa.bool_(): torch.bool,
    pa.uint8(): torch.uint8,
    pa.int8(): torch.int8,
    pa.int16(): torch.int16,
    pa.int32(): torch.int32,
    pa.int64(): torch.int64,
    pa.float32(): torch.float32,
    pa.float64(): torch.float64,
}


@dataclass(frozen=True)
class DumpField:
    """How one dump key becomes an output column. ``kind``: ``"mask"`` or ``"float"``
    (per-token lists), ``"real"`` or ``"integer"`` (one scalar per sample); ``minimum``:
    the least value an integer may take (counts and lengths: 0)."""

    key: str
    column: str
    kind: str
    required: bool = False
    minimum: Optional[int] = None  # counts and lengths: 0 (a negative one is refused)

    @property
    def per_token(self) -> bool:
        return self.kind in ("mask", "float")


# The dump keys miles and slime share, in output column order (after rollout_id and rank).
FIELDS: tuple[DumpField, ...] = (
    DumpField("sample_indices", "sample_index", "integer"),
    DumpField("values", "values", "float", required=True),
    DumpField("loss_masks", "loss_mask", "mask", required=True),
    DumpField("rewards", "terminal_reward", "real", required=True),
    DumpField("response_lengths", "response_length", "integer", minimum=0),
    DumpField("total_lengths", "total_length", "integer", minimum=0),
    DumpField("log_probs", "log_probs", "float"),
    DumpField("ref_log_probs", "ref_log_probs", "float"),
    DumpField("advantages", "trained_advantages", "float"),
    DumpField("returns", "trained_returns", "float"),
)
FIELDS_BY_KEY = {f.key: f for f in FIELDS}
ROWS_KEY = "loss_masks"  # the list whose length is the number of samples


# ----------------------------------------------------------------------------- inputs and output


def plan_import(
    paths: Sequence[str | Path],
    output: str | Path,
    overwrite: bool,
    patterns: tuple[str, ...],
    report_paths: Sequence[ReportPath] = (),
) -> tuple[list[AnyPath], AnyPath]:
    """The input files (paths, directories read recursively for ``patterns``, globs, URIs;
    each file once, in the order found) and the output path, checked: :class:`GAEUsageError`
    for nothing to read, an output that is a directory, that exists without ``overwrite``,
    or that (like any of ``report_paths``, the files the caller writes reports to) is an
    input or another written path (:func:`gaecli.io.paths.check_writes`)."""
    found, _ = discover_inputs([str(p) for p in paths], patterns=patterns)
    sources: list[AnyPath] = []
    seen: set = set()
    for source, _ in found:
        resolved = source.resolve()
        if resolved not in seen:
            seen.add(resolved)
            sources.append(source)
    if not sources:
        raise GAEUsageError("give at least one dump file, directory or glob")
    target = to_path(str(output))
    if target.is_dir():
        raise GAEUsageError(
            f"{output}: is a directory; name the Parquet file to write (e.g. {target / 'rollouts.parquet'})"
        )
    check_writes(sources, [("output", target), *report_writes(report_paths)], overwrite=overwrite)
    return sources, target


def open_binary(path: AnyPath):
    """A readable binary stream of ``path`` (a local file, or an object through its
    pyarrow file system); :class:`GAEUsageError` when it cannot be opened."""
    try:
        if isinstance(path, RemotePath):
            return path.filesystem.open_input_stream(path.fs_path)
        return open(path, "rb")
    except IsADirectoryError:
        raise GAEUsageError(f"{path}: is a directory, not a dump file") from None
    except (OSError, pa.ArrowException) as error:
        raise GAEUsageError(f"{path}: cannot read ({getattr(error, 'strerror', None) or error})") from None


def schema_metadata(format_name: str, sources: list[str]) -> dict[str, str]:
    return {
        f"{METADATA_PREFIX}version": __version__,
        f"{METADATA_PREFIX}imported_from": format_name,
        f"{METADATA_PREFIX}import_sources": json.dumps([display(source) for source in sources]),
    }


def write_batches(
    target: AnyPath,
    schema: pa.Schema,
    batches: Iterable[tuple[pa.RecordBatch, int]],
    progress: Optional[Progress],
    total_rows: int,
    *,
    overwrite: bool = False,
) -> None:
    """Write ``batches`` (record batch, its token count; each its own row group) to
    ``target`` atomically (zstd): whole at the end, or nothing when reading or converting
    any of them fails; without ``overwrite`` a file that appeared at ``target`` meanwhile
    is not replaced (:class:`AtomicParquetWriter`). ``total_rows`` (0: unknown) sizes the
    progress bar."""
    progress = progress or NoProgress()
    writer = AtomicParquetWriter(target, schema, compression="zstd", overwrite=overwrite)
    progress.start("import", total_rows)
    try:
        for batch, tokens in batches:
            writer.write(batch)
            progress.advance(batch.num_rows, tokens)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    finally:
        progress.finish()


class ImportOptions(TypedDict, total=False):
    """The keywords every ``import_X`` takes: ``overwrite`` (replace an existing output),
    ``progress`` (a :class:`gaecli.progress.Progress`), ``report_paths`` (files the caller
    writes reports to, e.g. ``--json``: checked with the output before anything is read)."""

    overwrite: bool
    progress: Optional[Progress]
    report_paths: Sequence[ReportPath]


@dataclass
class ImportPlan:
    """What a format's reader makes of the checked inputs: the output ``schema``; the
    ``report`` so far (``batches`` fill it in as they are written); the ``batches``
    (record batch, its token count); ``count_rows`` (the rows to write, for the progress
    bar: called only when there is one); ``finish`` (what the report gets once the output
    is written)."""

    schema: pa.Schema
    report: ImportReport
    batches: Iterable[tuple[pa.RecordBatch, int]]
    count_rows: Callable[[], int]
    finish: Callable[[], None] = lambda: None


def run_import(
    paths: Sequence[str | Path],
    output: str | Path,
    patterns: tuple[str, ...],
    plan: Callable[[list[AnyPath], str], ImportPlan],
    *,
    overwrite: bool = False,
    progress: Optional[Progress] = None,
    report_paths: Sequence[ReportPath] = (),
) -> ImportReport:
    """One import run, whatever the format: the inputs found and every written path checked
    (:func:`plan_import`), the format's ``plan`` of the sources, its batches written whole
    or not at all (:func:`write_batches`), then its report."""
    sources, target = plan_import(paths, output, overwrite, patterns, report_paths)
    planned = plan(sources, str(output))
    total_rows = planned.count_rows() if progress else 0
    write_batches(target, planned.schema, planned.batches, progress, total_rows, overwrite=overwrite)
    planned.finish()
    return planned.report


def check_unchanged(path: AnyPath, unchanged: bool) -> None:
    """:class:`GAEUsageError` unless the file at ``path``, loaded again to be converted, is
    still what the first pass checked (``unchanged``)."""
    if not unchanged:
        raise GAEUsageError(f"{path}: the file changed while it was being imported; run the import again")


# ----------------------------------------------------------------------------- loading torch.save files


def load_dump(path: AnyPath) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU (memory-mapped when a local file
    allows), with load failures turned into one-line errors.

    A file that needs more than tensors, numbers, strings, lists, tuples and dicts (an
    arbitrary pickled object) raises :class:`GAEInputError`: its code is never run. A file
    that cannot be read or is not a ``torch.save`` file raises :class:`GAEUsageError`.
    """
    try:
        if isinstance(path, RemotePath):
            with open_binary(path) as stream:
                return torch.load(io.BytesIO(stream.read()), map_location="cpu", weights_only=True)
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap can only be used" not in str(error):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy (pre-zip) format
    except GAEUsageError:
        raise
    except RecursionError:
        raise GAEInputError(
            f"{path}: refused: the dump nests lists, tuples or dicts deeper than Python can read"
        ) from None
    except pickle.UnpicklingError as error:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
        if "Weights only load failed" not in text:
            raise GAEUsageError(f"{path}: cannot read as a torch.save file ({first_line(error)})") from None
        detail = _unpickler_detail(text)
        if not re.search(r"GLOBAL|allowlist|must be imported", detail):  # foreign bytes, not a refused object
            raise GAEUsageError(f"{path}: cannot read as a torch.save file ({detail})") from None
        global_name = re.search(r"GLOBAL ([\w.]+)", detail)
        raise GAEInputError(
            f"{path}: refused: the dump holds a pickled Python object "
            f"({global_name.group(1) if global_name else detail}) besides tensors, "
            f"numbers, strings, lists and dicts; gaecli loads dumps with torch.load(weights_only=True) and never "
            f"unpickles arbitrary objects. Re-save the dump with plain types only"
        ) from None
    except IsADirectoryError:
        raise GAEUsageError(f"{path}: is a directory, not a dump file") from None
    except OSError as error:
        raise GAEUsageError(f"{path}: cannot read ({error.strerror or error})") from None
    except Exception as error:  # noqa: BLE001 - the weights-only unpickler fails on foreign bytes in many ways
        raise GAEUsageError(
            f"{path}: cannot read as a torch.save file ({type(error).__name__}: {first_line(error)})"
        ) from None


def first_line(error: BaseException) -> str:
    """The first non-blank line of an error's message (its type's name when there is none)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _unpickler_detail(text: str) -> str:
    """The weights-only unpickler's own reason inside torch's long message (what follows
    ``WeightsUnpickler error:``, or the lines after the first), one line."""
    _, marker, after = text.rpartition("WeightsUnpickler error:")
    body = after if marker else text.partition("\n")[2]
    lines = [line.strip() for line in body.splitlines() if line.strip() and "torch.load" not in line]
    return lines[0] if lines else "an object torch will not load safely"


# ----------------------------------------------------------------------------- values


def entry_name(where: str, sample: int) -> str:
    """Sample ``sample``'s entry of what ``where`` names: ``[*]`` in it stands for the
    sample's place (``samples[*]['values']``); else the index is appended."""
    return where.replace("[*]", f"[{sample}]", 1) if "[*]" in where else f"{where}[{sample}]"


def check_per_sample(
    entries: Any, dump_field: DumpField, rows: int, where: str, rows_name: str = repr(ROWS_KEY)
) -> Optional[set[torch.dtype]]:
    """Check one key's per-sample entries (``where`` names them, e.g. ``file: rollout_data['values']``):
    one entry per sample (``rows``, as many as ``rows_name`` has; a tensor of scalars 1-D),
    dense 1-D real tensors for a per-token key, of numbers (not bool) where it holds numbers
    rather than a mask (returns their dtypes)."""
    if not isinstance(entries, (list, tuple)) and not (not dump_field.per_token and is_dense(entries)):
        raise GAEInputError(f"{where} is {describe(entries)}, expected a list with one entry per sample")
    if isinstance(entries, torch.Tensor) and entries.dim() != 1:
        raise GAEInputError(f"{where} is {describe(entries)}, expected a list or a 1-D tensor of one entry per sample")
    count = entries.numel() if isinstance(entries, torch.Tensor) else len(entries)
    if count != rows:
        raise GAEInputError(f"{where} has {count} entries but {rows_name} has {rows}: one entry per sample expected")
    if not dump_field.per_token:
        return None
    is_vector = [is_dense(entry) and entry.dim() == 1 for entry in entries]
    if not all(is_vector):
        sample = is_vector.index(False)
        raise GAEInputError(
            f"{entry_name(where, sample)} is {describe(entries[sample])}, expected a dense 1-D tensor "
            f"(the sample's per-token {dump_field.key})"
        )
    dtypes = {entry.dtype for entry in entries}
    if any(dtype.is_complex for dtype in dtypes):
        raise GAEInputError(f"{where} holds complex tensors, expected real numbers")
    if dump_field.kind == "float" and torch.bool in dtypes:
        raise GAEInputError(f"{where} holds bool tensors, expected numbers (the per-token {dump_field.key})")
    return dtypes


def differences(*sides: tuple[str, Sequence[str]]) -> str:
    """``"LABEL a, b; LABEL c"``: each side's label and names, for the sides with any (what
    one holds and another lacks)."""
    return "; ".join(f"{label} {', '.join(names)}" for label, names in sides if names)


def check_same_keys(dumps: Sequence[Any]) -> None:
    """Every dump (``.keys``, ``.path``) has the first one's keys; else :class:`GAEInputError`
    saying which file has which."""
    for dump in dumps[1:]:
        keys = dumps[0].keys
        if dump.keys != keys:
            difference = differences(
                (f"only {dumps[0].path} has", sorted(keys - dump.keys)),
                (f"only {dump.path} has", sorted(dump.keys - keys)),
            )
            raise GAEInputError(f"the dumps differ in their keys ({difference}); import files of one run together")


def arrow_value_type(dump_field: DumpField, dtypes: set[torch.dtype]) -> pa.DataType:
    """The Arrow element type of a per-token column holding tensors of ``dtypes`` (all
    files): float64 stays float64, other floats become float32; a mask keeps bool and
    integer types."""
    if not dtypes:
        return pa.int8() if dump_field.kind == "mask" else pa.float32()
    dtype = reduce(torch.promote_types, sorted(dtypes, key=str))
    if dump_field.kind == "mask" and dtype in _ARROW_INTEGERS:
        return _ARROW_INTEGERS[dtype]
    return pa.float64() if dtype == torch.float64 else pa.float32()


def list_offsets(lengths: np.ndarray, too_many: Optional[Callable[[int], str]] = None) -> np.ndarray:
    """The int64 offsets ``[B + 1]`` of lists of ``lengths``. With ``too_many``: lists of
    more tokens than one Parquet list column of a file part holds (int32 offsets) raise
    :class:`GAEInputError` with ``too_many(tokens)``."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if too_many is not None and offsets[-1] > MAX_LIST_TOKENS:
        raise GAEInputError(too_many(int(offsets[-1])))
    return offsets


def token_column(tensors: Sequence[torch.Tensor], value_type: pa.DataType, where: str) -> tuple[pa.Array, np.ndarray]:
    """A list column from per-sample 1-D tensors: one ``torch.cat``, offsets from the
    lengths, no loop over tokens. Also returns the lengths ``[B]``."""
    lengths = np.array([tensor.numel() for tensor in tensors], dtype=np.int64)
    offsets = list_offsets(
        lengths,
        lambda total: (
            f"{where} holds {total:,} tokens, more than one Parquet list column "
            f"of a file part can hold ({MAX_LIST_TOKENS:,}); split the dump"
        ),
    )
    dtype = _TORCH_OF_ARROW[value_type]
    flat = torch.cat([tensor.detach().to(dtype) for tensor in tensors]) if len(tensors) else torch.zeros(0, dtype=dtype)
    array = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(flat.numpy()), type=pa.list_(value_type)
    )
    return array, lengths


def scalar_column(entries: Any, dump_field: DumpField, where: str, nullable: bool = False) -> pa.Array:
    """One number per sample from a list of numbers / one-element tensors, or a 1-D tensor;
    ``None`` entries become nulls when ``nullable``. Bools are refused (no number), as are
    integers out of range and, for a field with a ``minimum``, values below it."""
    integer_kind = dump_field.kind == "integer"
    numpy_dtype = np.int64 if integer_kind else np.float64
    expected = "integers" if integer_kind else "numbers"
    if isinstance(entries, torch.Tensor):
        if not is_dense(entries) or entries.dim() != 1:
            raise GAEInputError(f"{where} is {describe(entries)}, expected a 1-D tensor of {expected}")
        dtype = entries.dtype
        if dtype.is_complex or dtype == torch.bool or integer_kind and dtype.is_floating_point:
            raise GAEInputError(f"{where} is a {dtype} tensor, expected {expected}")
        array = entries.detach().to(torch.int64 if integer_kind else torch.float64).numpy()
        return pa.array(_at_least(array, dump_field, where))
    numbers = [entry.item() if _is_number_tensor(entry) else entry for entry in entries]
    allowed = (int,) if integer_kind else (int, float)
    is_number = [
        isinstance(number, allowed) and not isinstance(number, bool) or nullable and number is None
        for number in numbers
    ]
    if not all(is_number):
        sample = is_number.index(False)
        raise GAEInputError(
            f"{entry_name(where, sample)} is {shown(numbers[sample])}, "
            f"expected {'an integer' if integer_kind else 'a number'}"
        )
    nulls = np.array([number is None for number in numbers], dtype=bool)
    try:
        array = np.array([0 if number is None else number for number in numbers], dtype=numpy_dtype)
    except OverflowError:
        limit = "int64" if integer_kind else "float64"
        raise GAEInputError(f"{where} holds an integer out of the {limit} range") from None
    return pa.array(_at_least(array, dump_field, where), mask=nulls if nulls.any() else None)


def _is_number_tensor(entry: Any) -> bool:
    """A one-element dense tensor of at most one dimension (a sample's number)."""
    return is_dense(entry) and entry.numel() == 1 and entry.dim() <= 1


def _at_least(array: np.ndarray, dump_field: DumpField, where: str) -> np.ndarray:
    """``array``, checked against ``dump_field.minimum`` (the first entry below it named)."""
    if dump_field.minimum is not None and array.size and array.min() < dump_field.minimum:
        sample = int(np.flatnonzero(array < dump_field.minimum)[0])
        raise GAEInputError(f"{entry_name(where, sample)} is {array[sample]}, expected {dump_field.minimum} or more")
    return array


def output_schema(
    keys: frozenset[str], value_types: dict[str, pa.DataType], format_name: str, sources: list[str]
) -> pa.Schema:
    """``rollout_id``, ``rank``, then the column of each of :data:`FIELDS` present in ``keys``."""
    columns = [pa.field("rollout_id", pa.int64()), pa.field("rank", pa.int64())]
    for dump_field in FIELDS:
        if dump_field.key not in keys:
            continue
        if dump_field.per_token:
            arrow_type = pa.list_(value_types[dump_field.key])
        else:
            arrow_type = pa.int64() if dump_field.kind == "integer" else pa.float64()
        columns.append(pa.field(dump_field.column, arrow_type))
    return pa.schema(columns, metadata=schema_metadata(format_name, sources))


def fields_batch(
    data: dict[str, Any],
    rollout_id: int,
    ranks: np.ndarray,
    keys: frozenset[str],
    schema: pa.Schema,
    value_types: dict[str, pa.DataType],
    where: Callable[[str], str],
) -> tuple[pa.RecordBatch, int, int]:
    """Per-sample lists keyed by :data:`FIELDS` keys (``data[key][i]``: sample i) as a record
    batch of ``schema``; also its token count and the rows whose per-token lists differ in
    length from ``loss_masks`` or ``response_lengths``. ``where(key)`` formats a key for messages."""
    rows = ranks.size
    arrays: dict[str, pa.Array] = {
        "rollout_id": pa.array(np.full(rows, rollout_id, dtype=np.int64)),
        "rank": pa.array(ranks.astype(np.int64)),
    }
    lengths: dict[str, np.ndarray] = {}
    for dump_field in FIELDS:
        if dump_field.key not in keys:
            continue
        named = where(dump_field.key)
        if dump_field.per_token:
            arrays[dump_field.column], lengths[dump_field.key] = token_column(
                data[dump_field.key], value_types[dump_field.key], named
            )
        else:
            arrays[dump_field.column] = scalar_column(
                data[dump_field.key], dump_field, named, nullable=dump_field.key == "sample_indices"
            )
    mask_lengths = lengths[ROWS_KEY]
    mismatch = np.zeros(rows, dtype=bool)
    for key_lengths in lengths.values():
        mismatch |= key_lengths != mask_lengths
    if "response_lengths" in keys:
        mismatch |= arrays["response_length"].to_numpy(zero_copy_only=False) != mask_lengths
    batch = pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema)
    return batch, int(mask_lengths.sum()), int(mismatch.sum())


@dataclass
class FieldsOutput:
    """The output of an import of :data:`FIELDS` (miles, slime): the keys every dump holds,
    the Arrow element type of each per-token column, the schema and the report."""

    keys: frozenset[str]
    value_types: dict[str, pa.DataType]
    schema: pa.Schema
    report: ImportReport

    @classmethod
    def of(
        cls,
        dumps: Sequence[Any],
        keys: frozenset[str],
        format_name: str,
        optional_keys: Sequence[str],
        output: str,
        notes: Optional[list[str]] = None,
    ) -> "FieldsOutput":
        """The output of ``dumps`` (each with ``.path``, ``.keys``, ``.dtypes``,
        ``.other_keys``; checked to hold the same keys, ``keys``)."""
        check_same_keys(dumps)
        value_types = {
            f.key: arrow_value_type(f, set().union(*(dump.dtypes[f.key] for dump in dumps)))
            for f in FIELDS
            if f.per_token and f.key in keys
        }
        schema = output_schema(keys, value_types, format_name, [dump.path.name for dump in dumps])
        report = ImportReport(
            output=output,
            files=[],
            columns=list(schema.names),
            format=format_name,
            missing_keys=[key for key in optional_keys if key not in keys],
            ignored_keys=sorted(set().union(*(dump.other_keys for dump in dumps))),
            notes=[] if notes is None else notes,
        )
        return cls(keys, value_types, schema, report)

    def batch(
        self, data: dict[str, Any], rollout_id: int, ranks: np.ndarray, where: Callable[[str], str]
    ) -> tuple[pa.RecordBatch, int]:
        """:func:`fields_batch` of ``data``; its rows of mismatched lengths go to the report."""
        batch, tokens, mismatches = fields_batch(
            data, rollout_id, ranks, self.keys, self.schema, self.value_types, where
        )
        self.report.length_mismatch_rows += mismatches
        return batch, tokens
