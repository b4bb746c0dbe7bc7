"""``gae import miles`` as a library: read miles / slime training-side dumps
(``--save-debug-train-data``: one ``torch.save``'d dict per data-parallel rank and rollout)
without ever unpickling arbitrary objects, and write them as one rollout Parquet file in
gaecli's format (see docs/import.md).

A dump is ``{"rollout_id", "rank", "rollout_data", ["cp_rank", "cp_size", "qkv_format"]}``
where ``rollout_data`` maps keys to per-sample lists: per-token entries are 1-D tensors
(``values``, ``loss_masks``, ``log_probs``, ``ref_log_probs``, ``advantages``, ``returns``),
scalar entries are numbers or one-element tensors (``rewards``, ``response_lengths``,
``total_lengths``, ``sample_indices``).
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import torch

from gaecli._version import __version__
from gaecli.errors import GAEInputError, GAEUsageError
from gaecli.io.paths import ReportPath, check_writes, discover_inputs, report_writes
from gaecli.io.writer import AtomicParquetWriter
from gaecli.progress import NoProgress, Progress

DUMP_PATTERNS = ("*.pt", "*.pth")
TOP_LEVEL_KEYS = ("rollout_id", "rank", "rollout_data")
CONTEXT_PARALLEL_KEYS = ("cp_rank", "cp_size", "qkv_format")
METADATA_PREFIX = "gaecli."
MAX_LIST_TOKENS = 2**31 - 1  # int32 list offsets


@dataclass(frozen=True)
class DumpField:
    """How one ``rollout_data`` key becomes an output column. ``kind``: ``"mask"`` or
    ``"float"`` (per-token lists), ``"real"`` or ``"integer"`` (one scalar per sample)."""

    key: str
    column: str
    kind: str
    required: bool = False

    @property
    def per_token(self) -> bool:
        return self.kind in ("mask", "float")


# In output column order (after rollout_id and rank).
FIELDS: tuple[DumpField, ...] = (
    DumpField("sample_indices", "sample_index", "integer"),
    DumpField("values", "values", "float", required=True),
    DumpField("loss_masks", "loss_mask", "mask", required=True),
    DumpField("rewards", "terminal_reward", "real", required=True),
    DumpField("response_lengths", "response_length", "integer"),
    DumpField("total_lengths", "total_length", "integer"),
    DumpField("log_probs", "log_probs", "float"),
    DumpField("ref_log_probs", "ref_log_probs", "float"),
    DumpField("advantages", "trained_advantages", "float"),
    DumpField("returns", "trained_returns", "float"),
)
FIELDS_BY_KEY = {f.key: f for f in FIELDS}
REQUIRED_KEYS = tuple(f.key for f in FIELDS if f.required)
OPTIONAL_KEYS = tuple(f.key for f in FIELDS if not f.required)
ROWS_KEY = "loss_masks"  # the list whose length is the number of samples

_ARROW_INTEGERS = {
    torch.bool: pa.bool_(), torch.uint8: pa.uint8(), torch.int8: pa.int8(), torch.int16: pa.int16(),
    torch.int32: pa.int32(), torch.int64: pa.int64(),
}


# ----------------------------------------------------------------------------- report


@dataclass
class ImportedFile:
    """One dump file read: its rollout, rank and how many samples and tokens it held."""

    source: str
    rollout_id: int
    rank: int
    rows: int
    tokens: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ImportReport:
    """What an import wrote.

    ``files`` in output order (rollout_id, then rank); ``columns`` written; ``missing_keys``
    the optional dump keys absent (their columns left out); ``ignored_keys`` dump keys that
    have no column; ``length_mismatch_rows`` rows whose per-token lists differ in length
    from ``loss_masks`` or ``response_lengths`` (imported as they are: ``gae validate``
    lists them).
    """

    output: str
    files: list[ImportedFile]
    columns: list[str]
    missing_keys: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    length_mismatch_rows: int = 0

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    def to_dict(self) -> dict:
        return {
            "version": __version__,
            "format": "miles",
            "output": self.output,
            "rows": self.rows,
            "tokens": self.tokens,
            "files": [f.to_dict() for f in self.files],
            "columns": list(self.columns),
            "missing_keys": list(self.missing_keys),
            "ignored_keys": list(self.ignored_keys),
            "length_mismatch_rows": self.length_mismatch_rows,
            "next_steps": self.next_steps(),
        }

    def next_steps(self) -> list[str]:
        """What to run on the output, one sentence each."""
        steps = []
        if "log_probs" in self.columns and "ref_log_probs" in self.columns:
            steps.append("the file has no per-token rewards column: run gae recompute / gae diff with --kl-coef C "
                         "(KL rewards from log_probs and ref_log_probs) or with --rewards-col none")
        else:
            steps.append("the file has no per-token rewards column and no log-probs: run gae recompute / gae diff "
                         "with --rewards-col none")
        if self.length_mismatch_rows:
            steps.append(f"{self.length_mismatch_rows} row(s) have per-token lists whose lengths differ from loss_mask "
                         f"or response_length: gae validate {self.output} lists them")
        if "trained_advantages" in self.columns:
            steps.append("trained_advantages holds the advantages the run trained on: gae diff --against trained_advantages "
                         "shows how far they are from masked GAE")
        return steps

    def summary_lines(self) -> list[str]:
        """The human summary, one line each (the CLI prints them)."""
        rollouts = sorted({f.rollout_id for f in self.files})
        ranks = sorted({f.rank for f in self.files})
        lines = [
            f"imported {self.rows:,} samples ({self.tokens:,} tokens) from {len(self.files)} dump file(s) "
            f"({_span('rollout', rollouts)}, {_span('rank', ranks)}) into {self.output}",
            f"columns: {', '.join(self.columns)}",
        ]
        if self.missing_keys:
            lines.append(f"not in the dumps (columns left out): {', '.join(self.missing_keys)}")
        if self.ignored_keys:
            lines.append(f"dump keys not imported: {', '.join(self.ignored_keys)}")
        lines.extend(f"note: {step}" for step in self.next_steps())
        return lines


def _span(name: str, numbers: list[int]) -> str:
    if not numbers:
        return f"no {name}"
    if len(numbers) == 1:
        return f"{name} {numbers[0]}"
    return f"{len(numbers)} {name}s {numbers[0]}–{numbers[-1]}"


# ----------------------------------------------------------------------------- loading


def load_dump(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU (memory-mapped when the file
    allows), with load failures turned into one-line errors.

    A file that needs more than tensors, numbers, strings, lists, tuples and dicts (an
    arbitrary pickled object) raises :class:`GAEInputError`: its code is never run. A file
    that cannot be read or is not a ``torch.save`` file raises :class:`GAEUsageError`.
    """
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap can only be used" not in str(error):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy (pre-zip) format
    except pickle.UnpicklingError as error:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
        if "Weights only load failed" not in text:
            raise GAEUsageError(f"{path}: cannot read as a torch.save file ({_first_line(error)})") from None
        detail = _unpickler_detail(text)
        if not re.search(r"GLOBAL|allowlist|must be imported", detail):  # foreign bytes, not a refused object
            raise GAEUsageError(f"{path}: cannot read as a torch.save file ({detail})") from None
        global_name = re.search(r"GLOBAL ([\w.]+)", detail)
        raise GAEInputError(
            f"{path}: refused: the dump holds a pickled Python object ({global_name.group(1) if global_name else detail}) besides tensors, "
            f"numbers, strings, lists and dicts; gaecli loads dumps with torch.load(weights_only=True) and never "
            f"unpickles arbitrary objects. Re-save the dump with plain types only"
        ) from None
    except IsADirectoryError:
        raise GAEUsageError(f"{path}: is a directory, not a dump file") from None
    except OSError as error:
        raise GAEUsageError(f"{path}: cannot read ({error.strerror or error})") from None
    except Exception as error:  # noqa: BLE001 - the weights-only unpickler fails on foreign bytes in many ways
        raise GAEUsageError(f"{path}: cannot read as a torch.save file ({type(error).__name__}: {_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _unpickler_detail(text: str) -> str:
    """The weights-only unpickler's own reason inside torch's long message (what follows
    ``WeightsUnpickler error:``, or the lines after the first), one line."""
    _, marker, after = text.rpartition("WeightsUnpickler error:")
    body = after if marker else text.partition("\n")[2]
    lines = [line.strip() for line in body.splitlines() if line.strip() and "torch.load" not in line]
    return lines[0] if lines else "an object torch will not load safely"


# ----------------------------------------------------------------------------- checks


@dataclass
class _Dump:
    """A dump's facts from the first pass: where it sorts, its size, its keys and the
    dtypes of its per-token lists."""

    path: Path
    rollout_id: int
    rank: int
    rows: int
    keys: frozenset[str]
    other_keys: frozenset[str]
    dtypes: dict[str, set[torch.dtype]]


def _integer(value: Any, what: str, path: Path) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point and not value.dtype.is_complex:
        return int(value.item())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise GAEInputError(f"{path}: {what} is {value!r}, expected an integer")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-D tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def inspect_dump(path: Path, dump: Any) -> _Dump:
    """Check a loaded dump's structure and return its facts; :class:`GAEInputError` names
    what is wrong (missing keys with the keys present and expected, context-parallel
    slices, lists of different lengths, per-token entries that are not 1-D tensors)."""
    expected = f"expected {', '.join(TOP_LEVEL_KEYS)} (and optionally {', '.join(CONTEXT_PARALLEL_KEYS)})"
    if not isinstance(dump, dict):
        raise GAEInputError(f"{path}: holds {_describe(dump)}, not a miles train-data dump (a dict; {expected})")
    missing = [key for key in TOP_LEVEL_KEYS if key not in dump]
    if missing:
        raise GAEInputError(f"{path}: not a miles train-data dump: missing {', '.join(missing)}; "
                            f"the file has {_keys(dump)}; {expected}")
    cp_size = _integer(dump.get("cp_size", 1), "cp_size", path)
    if cp_size > 1:
        cp_rank = dump.get("cp_rank", "?")
        raise GAEInputError(
            f"{path}: cp_size is {cp_size} (context-parallel rank {cp_rank}, qkv_format {dump.get('qkv_format', '?')!s}): "
            f"each per-token tensor holds only this rank's slice of a sample, and reassembling the slices is not "
            f"supported yet; dump with context parallelism off (cp_size 1)"
        )
    rollout_id = _integer(dump["rollout_id"], "rollout_id", path)
    rank = _integer(dump["rank"], "rank", path)
    data = dump["rollout_data"]
    if not isinstance(data, dict):
        raise GAEInputError(f"{path}: rollout_data is {_describe(data)}, expected a dict of per-sample lists")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise GAEInputError(
            f"{path}: rollout_data lacks the required key(s) {', '.join(missing)}; it has {_keys(data)}; "
            f"required: {', '.join(REQUIRED_KEYS)}; optional: {', '.join(OPTIONAL_KEYS)}"
        )
    keys = frozenset(key for key in data if key in FIELDS_BY_KEY)
    for key in sorted(keys, key=list(FIELDS_BY_KEY).index):
        if not isinstance(data[key], (list, tuple)) and not (not FIELDS_BY_KEY[key].per_token and isinstance(data[key], torch.Tensor)):
            raise GAEInputError(f"{path}: rollout_data[{key!r}] is {_describe(data[key])}, expected a list with one entry per sample")
    rows = len(data[ROWS_KEY])
    dtypes: dict[str, set[torch.dtype]] = {}
    for key in sorted(keys, key=list(FIELDS_BY_KEY).index):
        entries = data[key]
        count = entries.numel() if isinstance(entries, torch.Tensor) else len(entries)
        if count != rows:
            raise GAEInputError(f"{path}: rollout_data[{key!r}] has {count} entries but {ROWS_KEY!r} has {rows}: one entry per sample expected")
        if FIELDS_BY_KEY[key].per_token:
            is_vector = [isinstance(entry, torch.Tensor) and entry.dim() == 1 for entry in entries]
            if not all(is_vector):
                sample = is_vector.index(False)
                raise GAEInputError(f"{path}: rollout_data[{key!r}][{sample}] is {_describe(entries[sample])}, expected a 1-D tensor "
                                    f"(the sample's per-token {key})")
            dtypes[key] = {entry.dtype for entry in entries}
            if any(dtype.is_complex for dtype in dtypes[key]):
                raise GAEInputError(f"{path}: rollout_data[{key!r}] holds complex tensors, expected real numbers")
    other_keys = frozenset(str(key) for key in data if key not in FIELDS_BY_KEY)
    return _Dump(path, rollout_id, rank, rows, keys, other_keys, dtypes)


def _keys(mapping: dict) -> str:
    return ", ".join(str(key) for key in mapping) or "no keys"


# ----------------------------------------------------------------------------- columns


def _arrow_value_type(dump_field: DumpField, dtypes: set[torch.dtype]) -> pa.DataType:
    """The Arrow element type of a per-token column holding tensors of ``dtypes`` (all
    files): float64 stays float64, other floats become float32; a mask keeps bool and
    integer types."""
    if not dtypes:
        return pa.int8() if dump_field.kind == "mask" else pa.float32()
    dtype = reduce(torch.promote_types, sorted(dtypes, key=str))
    if dump_field.kind == "mask" and dtype in _ARROW_INTEGERS:
        return _ARROW_INTEGERS[dtype]
    return pa.float64() if dtype == torch.float64 else pa.float32()


_TORCH_OF_ARROW = {
    pa.bool_(): torch.bool, pa.uint8(): torch.uint8, pa.int8(): torch.int8, pa.int16(): torch.int16,
    pa.int32(): torch.int32, pa.int64(): torch.int64, pa.float32(): torch.float32, pa.float64(): torch.float64,
}


def _token_column(tensors: Sequence[torch.Tensor], value_type: pa.DataType, path: Path, key: str) -> tuple[pa.Array, np.ndarray]:
    """A list column from per-sample 1-D tensors: one ``torch.cat``, offsets from the
    lengths, no loop over tokens. Also returns the lengths ``[B]``."""
    lengths = np.array([tensor.numel() for tensor in tensors], dtype=np.int64)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > MAX_LIST_TOKENS:
        raise GAEInputError(f"{path}: rollout_data[{key!r}] holds {offsets[-1]:,} tokens, more than one Parquet list column "
                            f"of a file part can hold ({MAX_LIST_TOKENS:,}); split the dump")
    dtype = _TORCH_OF_ARROW[value_type]
    flat = torch.cat([tensor.detach().to(dtype) for tensor in tensors]) if len(tensors) else torch.zeros(0, dtype=dtype)
    array = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat.numpy()), type=pa.list_(value_type))
    return array, lengths


def _scalar_column(entries: Any, dump_field: DumpField, path: Path) -> pa.Array:
    """One number per sample from a list of numbers / one-element tensors, or a tensor."""
    integer = dump_field.kind == "integer"
    numpy_dtype = np.int64 if integer else np.float64
    if isinstance(entries, torch.Tensor):
        if entries.dtype.is_complex or integer and entries.dtype.is_floating_point:
            raise GAEInputError(f"{path}: rollout_data[{dump_field.key!r}] is a {entries.dtype} tensor, expected {'integers' if integer else 'numbers'}")
        return pa.array(entries.detach().reshape(-1).to(torch.int64 if integer else torch.float64).numpy())
    numbers = [entry.item() if isinstance(entry, torch.Tensor) and entry.numel() == 1 else entry for entry in entries]
    allowed = (int,) if integer else (int, float)
    is_number = [isinstance(number, allowed) for number in numbers]
    if not all(is_number):
        sample = is_number.index(False)
        found = _describe(numbers[sample]) if isinstance(numbers[sample], torch.Tensor) else repr(numbers[sample])
        raise GAEInputError(f"{path}: rollout_data[{dump_field.key!r}][{sample}] is {found}, "
                            f"expected {'an integer' if integer else 'a number'}")
    try:
        return pa.array(np.array(numbers, dtype=numpy_dtype))
    except OverflowError as error:
        raise GAEInputError(f"{path}: rollout_data[{dump_field.key!r}] holds an integer out of the int64 range") from error


def _output_schema(keys: frozenset[str], value_types: dict[str, pa.DataType], sources: list[str]) -> pa.Schema:
    fields = [pa.field("rollout_id", pa.int64()), pa.field("rank", pa.int64())]
    for dump_field in FIELDS:
        if dump_field.key not in keys:
            continue
        if dump_field.per_token:
            arrow_type = pa.list_(value_types[dump_field.key])
        else:
            arrow_type = pa.int64() if dump_field.kind == "integer" else pa.float64()
        fields.append(pa.field(dump_field.column, arrow_type))
    metadata = {
        f"{METADATA_PREFIX}version": __version__,
        f"{METADATA_PREFIX}imported_from": "miles",
        f"{METADATA_PREFIX}import_sources": json.dumps(sources),
    }
    return pa.schema(fields, metadata=metadata)


def _batch(dump: Any, facts: _Dump, schema: pa.Schema, value_types: dict[str, pa.DataType]) -> tuple[pa.RecordBatch, int, int]:
    """One dump as a record batch; also its token count and rows with length mismatches."""
    data = dump["rollout_data"]
    arrays: dict[str, pa.Array] = {
        "rollout_id": pa.array(np.full(facts.rows, facts.rollout_id, dtype=np.int64)),
        "rank": pa.array(np.full(facts.rows, facts.rank, dtype=np.int64)),
    }
    lengths: dict[str, np.ndarray] = {}
    for dump_field in FIELDS:
        if dump_field.key not in facts.keys:
            continue
        if dump_field.per_token:
            arrays[dump_field.column], lengths[dump_field.key] = _token_column(
                data[dump_field.key], value_types[dump_field.key], facts.path, dump_field.key
            )
        else:
            arrays[dump_field.column] = _scalar_column(data[dump_field.key], dump_field, facts.path)
    mask_lengths = lengths[ROWS_KEY]
    mismatch = np.zeros(facts.rows, dtype=bool)
    for key, key_lengths in lengths.items():
        mismatch |= key_lengths != mask_lengths
    if "response_lengths" in facts.keys:
        mismatch |= arrays["response_length"].to_numpy(zero_copy_only=False) != mask_lengths
    batch = pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema)
    return batch, int(mask_lengths.sum()), int(mismatch.sum())


# ----------------------------------------------------------------------------- import


def _plan(paths: Sequence[str | Path], output: Path, overwrite: bool, report_paths: Sequence[ReportPath]) -> list[Path]:
    found, _ = discover_inputs([str(p) for p in paths], patterns=DUMP_PATTERNS)
    remote = [source for source, _ in found if not isinstance(source, Path)]
    if remote:
        raise GAEUsageError(f"{remote[0]}: gae import reads local files only (copy the dumps here first)")
    sources: list[Path] = []
    seen: set[Path] = set()
    for source, _ in found:
        resolved = source.resolve()
        if resolved not in seen:
            seen.add(resolved)
            sources.append(source)
    if output.is_dir():
        raise GAEUsageError(f"{output}: is a directory; name the Parquet file to write (e.g. {output / 'rollouts.parquet'})")
    check_writes(sources, [("output", output), *report_writes(report_paths)])
    if output.exists() and not overwrite:
        raise GAEUsageError(f"{output} exists; give --overwrite to replace it")
    return sources


def import_miles(
    paths: Sequence[str | Path],
    output: str | Path,
    *,
    overwrite: bool = False,
    progress: Optional[Progress] = None,
    report_paths: Sequence[ReportPath] = (),
) -> ImportReport:
    """Import miles / slime ``--save-debug-train-data`` dumps into one rollout Parquet file.

    ``paths``: dump files, directories (read recursively for ``*.pt`` and ``*.pth``) or
    globs; a file named twice is read once. Rows are ordered by ``rollout_id``, then
    ``rank``, then position in the rank's lists; one row group per dump. Columns:
    ``rollout_id``, ``rank``, then, for each dump key present, ``sample_index``
    (``sample_indices``), ``values``, ``loss_mask`` (``loss_masks``), ``terminal_reward``
    (``rewards``), ``response_length``, ``total_length``, ``log_probs``, ``ref_log_probs``,
    ``trained_advantages`` (``advantages``), ``trained_returns`` (``returns``). There is no
    per-token ``rewards`` column (the dumps hold none): derive KL rewards with ``--kl-coef``.

    Every dump is loaded with ``torch.load(weights_only=True)`` twice (first to check and
    order them, then to convert one at a time, memory-mapped when the file allows), so
    memory holds one dump at a time. The output is written atomically (zstd).

    Raises :class:`GAEInputError` for dumps that break the documented shape (missing
    required keys, ``cp_size > 1``, lists of different lengths, non-tensor per-token
    entries, an arbitrary pickled object, two files for one rollout and rank, files whose
    optional keys differ) and :class:`GAEUsageError` for paths that name nothing, files
    that are not ``torch.save`` files, an existing output without ``overwrite``, and an
    output or one of ``report_paths`` (files the caller writes reports to, e.g. ``--json``)
    that is an input or another of them (:func:`gaecli.io.paths.check_writes`).
    """
    output = Path(output)
    progress = progress or NoProgress()
    sources = _plan(paths, output, overwrite, report_paths)
    if not sources:
        raise GAEUsageError("give at least one dump file, directory or glob")
    facts = [inspect_dump(source, load_dump(source)) for source in sources]
    facts.sort(key=lambda dump: (dump.rollout_id, dump.rank))
    for previous, current in zip(facts, facts[1:]):
        if (previous.rollout_id, previous.rank) == (current.rollout_id, current.rank):
            raise GAEInputError(f"{previous.path} and {current.path} both hold rollout {current.rollout_id}, rank {current.rank}; "
                                f"import one of them")
    keys = facts[0].keys
    for dump in facts[1:]:
        if dump.keys != keys:
            only_first, only_here = sorted(keys - dump.keys), sorted(dump.keys - keys)
            difference = "; ".join(part for part in (
                f"only {facts[0].path} has {', '.join(only_first)}" if only_first else "",
                f"only {dump.path} has {', '.join(only_here)}" if only_here else "",
            ) if part)
            raise GAEInputError(f"the dumps differ in their keys ({difference}); import files of one run together")
    value_types = {
        dump_field.key: _arrow_value_type(dump_field, set().union(*(dump.dtypes[dump_field.key] for dump in facts)))
        for dump_field in FIELDS if dump_field.per_token and dump_field.key in keys
    }
    schema = _output_schema(keys, value_types, [dump.path.name for dump in facts])
    report = ImportReport(
        output=str(output),
        files=[],
        columns=list(schema.names),
        missing_keys=[key for key in OPTIONAL_KEYS if key not in keys],
        ignored_keys=sorted(set().union(*(dump.other_keys for dump in facts))),
    )
    writer = AtomicParquetWriter(output, schema, compression="zstd")
    progress.start("import", sum(dump.rows for dump in facts))
    try:
        for dump_facts in facts:
            dump = load_dump(dump_facts.path)
            again = inspect_dump(dump_facts.path, dump)
            if (again.rollout_id, again.rank, again.rows, again.keys) != (dump_facts.rollout_id, dump_facts.rank, dump_facts.rows, dump_facts.keys):
                raise GAEUsageError(f"{dump_facts.path}: the file changed while it was being imported; run the import again")
            batch, tokens, mismatches = _batch(dump, dump_facts, schema, value_types)
            del dump
            writer.write(batch)
            report.files.append(ImportedFile(str(dump_facts.path), dump_facts.rollout_id, dump_facts.rank, dump_facts.rows, tokens))
            report.length_mismatch_rows += mismatches
            progress.advance(dump_facts.rows, tokens)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    finally:
        progress.finish()
    return report
