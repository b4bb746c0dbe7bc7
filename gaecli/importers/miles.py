"""``gae import miles`` as a library: read miles' training-side dumps
(``--save-debug-train-data``: one ``torch.save``'d dict per rank and rollout, written by
``miles/utils/train_dump_utils.py::save_debug_train_data_for_rank``) without ever unpickling
arbitrary objects, reassemble context-parallel shares, and write one rollout Parquet file in
gaecli's format (see docs/import.md).

A dump is ``{"rollout_id", "rank", "rollout_data", ["cp_rank", "cp_size", "qkv_format"]}``
where ``rollout_data`` maps keys to per-sample lists: per-token entries are 1-D tensors
(``values``, ``loss_masks``, ``log_probs``, ``ref_log_probs``, ``advantages``, ``returns``),
scalar entries are numbers or one-element tensors (``rewards``, ``response_lengths``,
``total_lengths``, ``sample_indices``). With ``cp_size > 1`` the per-token entries other than
``loss_masks`` hold only this rank's share of the response, in miles' zigzag layout.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import torch

from gaecli.errors import GAEInputError
from gaecli.importers.common import (
    FIELDS,
    FIELDS_BY_KEY,
    ROWS_KEY,
    DumpField,
    FieldsOutput,
    ImportOptions,
    ImportPlan,
    check_per_sample,
    check_unchanged,
    list_offsets,
    load_dump,
    run_import,
    scalar_column,
)
from gaecli.importers.report import ImportedFile, ImportReport
from gaecli.importers.values import describe, integer, key_list, shown
from gaecli.io.filesystem import AnyPath
from gaecli.io.paths import INPUT_PATTERNS

if TYPE_CHECKING:
    from typing_extensions import Unpack

DUMP_PATTERNS = INPUT_PATTERNS["torch.save dump"]
TOP_LEVEL_KEYS = ("rollout_id", "rank", "rollout_data")
CONTEXT_PARALLEL_KEYS = ("cp_rank", "cp_size", "qkv_format")
REQUIRED_KEYS = tuple(f.key for f in FIELDS if f.required)
OPTIONAL_KEYS = tuple(f.key for f in FIELDS if not f.required)
# Under context parallelism each rank holds its share of these (miles slices every per-token
# tensor it computes; loss_masks and the scalars stay whole on every rank).
RANK_LOCAL_KEYS = tuple(f.key for f in FIELDS if f.kind == "float")
# What a context-parallel dump must hold to be reassembled (and, for bshd, max_seq_lens).
CONTEXT_PARALLEL_REQUIRED = ("sample_indices", "response_lengths", "total_lengths")
MAX_SEQ_LENS_KEY = "max_seq_lens"
MAX_SEQ_LENS_FIELD = DumpField(MAX_SEQ_LENS_KEY, "", "integer", minimum=0)


# ----------------------------------------------------------------------------- checks


@dataclass
class _Dump:
    """A dump's facts from the first pass: where it sorts, its size, its keys, the dtypes of
    its per-token lists and, under context parallelism, its place in a group."""

    path: AnyPath
    rollout_id: int
    rank: int
    rows: int
    keys: frozenset[str]
    other_keys: frozenset[str]
    dtypes: dict[str, set[torch.dtype]]
    cp_rank: int = 0
    cp_size: int = 1
    qkv_format: str = "thd"
    sample_indices: tuple = ()
    digests: dict[str, bytes] = field(default_factory=dict)

    def same_place(self, other: "_Dump") -> bool:
        return (self.rollout_id, self.rank, self.rows, self.keys, self.cp_rank, self.cp_size) == (
            other.rollout_id,
            other.rank,
            other.rows,
            other.keys,
            other.cp_rank,
            other.cp_size,
        )


def _where(path: AnyPath):
    return lambda key: f"{path}: rollout_data[{key!r}]"


def inspect_dump(path: AnyPath, dump: Any) -> _Dump:
    """Check a loaded dump's structure and return its facts; :class:`GAEInputError` names
    what is wrong (missing keys with the keys present and expected, lists of different
    lengths, per-token entries that are not 1-D tensors, a bad context-parallel rank).

    A ``cp_size = 1`` dump without ``values`` is refused here; a context-parallel one is
    checked for ``values`` once its group is known (an earlier pipeline stage has none)."""
    _check_top_level(path, dump)
    cp_size, cp_rank, qkv_format = _parallel_place(path, dump)
    rollout_id = integer(dump["rollout_id"], "rollout_id", path)
    rank = integer(dump["rank"], "rank", path, minimum=0)
    data = dump["rollout_data"]
    if not isinstance(data, dict):
        raise GAEInputError(f"{path}: rollout_data is {describe(data)}, expected a dict of per-sample lists")
    _check_required(path, data, cp_size, qkv_format)
    keys = frozenset(key for key in data if key in FIELDS_BY_KEY)
    rows, dtypes = _check_lists(path, data, keys)
    other_keys = frozenset(str(key) for key in data if key not in FIELDS_BY_KEY)
    facts = _Dump(path, rollout_id, rank, rows, keys, other_keys, dtypes, cp_rank, cp_size, str(qkv_format))
    if cp_size > 1:
        if MAX_SEQ_LENS_KEY in data:
            check_per_sample(data[MAX_SEQ_LENS_KEY], MAX_SEQ_LENS_FIELD, rows, _where(path)(MAX_SEQ_LENS_KEY))
        facts.sample_indices = tuple(_integers(data, "sample_indices", path).tolist())
        facts.digests = _digests(data, keys, path)
    return facts


def _check_top_level(path: AnyPath, dump: Any) -> None:
    """A dict with :data:`TOP_LEVEL_KEYS`; else :class:`GAEInputError` saying what the file holds."""
    expected = f"expected {', '.join(TOP_LEVEL_KEYS)} (and optionally {', '.join(CONTEXT_PARALLEL_KEYS)})"
    if not isinstance(dump, dict):
        raise GAEInputError(f"{path}: holds {describe(dump)}, not a miles train-data dump (a dict; {expected})")
    missing = [key for key in TOP_LEVEL_KEYS if key not in dump]
    if missing:
        raise GAEInputError(
            f"{path}: not a miles train-data dump: missing {', '.join(missing)}; "
            f"the file has {key_list(dump)}; {expected}"
        )


def _parallel_place(path: AnyPath, dump: dict) -> tuple[int, int, Any]:
    """The dump's ``cp_size``, ``cp_rank`` and ``qkv_format`` (1, 0, ``thd`` without context parallelism), checked."""
    cp_size = integer(dump.get("cp_size", 1), "cp_size", path, minimum=1)
    cp_rank = integer(dump.get("cp_rank", 0), "cp_rank", path, minimum=0)
    qkv_format = dump.get("qkv_format", "thd") if cp_size > 1 else "thd"
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise GAEInputError(f"{path}: cp_rank {cp_rank} with cp_size {cp_size}: expected 0 ≤ cp_rank < cp_size")
    if not isinstance(qkv_format, str) or qkv_format not in ("thd", "bshd"):
        raise GAEInputError(f"{path}: qkv_format is {shown(qkv_format)}, expected 'thd' or 'bshd'")
    return cp_size, cp_rank, qkv_format


def _check_required(path: AnyPath, data: dict, cp_size: int, qkv_format: str) -> None:
    """``rollout_data`` holds the keys required (more under context parallelism, to reassemble the shares)."""
    required = [key for key in REQUIRED_KEYS if cp_size == 1 or key != "values"]
    if cp_size > 1:
        required += list(CONTEXT_PARALLEL_REQUIRED) + ([MAX_SEQ_LENS_KEY] if qkv_format == "bshd" else [])
    missing = [key for key in required if key not in data]
    if missing:
        why = f" (cp_size {cp_size}, qkv_format {qkv_format}: needed to reassemble the shares)" if cp_size > 1 else ""
        raise GAEInputError(
            f"{path}: rollout_data lacks the required key(s) {', '.join(missing)}{why}; it has {key_list(data)}; "
            f"required: {', '.join(REQUIRED_KEYS)}; optional: {', '.join(OPTIONAL_KEYS)}"
        )


def _check_lists(path: AnyPath, data: dict, keys: frozenset[str]) -> tuple[int, dict[str, set[torch.dtype]]]:
    """Every imported key's per-sample list checked; the number of samples and the dtypes of the per-token lists."""
    in_order = sorted(keys, key=list(FIELDS_BY_KEY).index)
    for key in in_order:
        scalars_in_a_tensor = not FIELDS_BY_KEY[key].per_token and isinstance(data[key], torch.Tensor)
        if not isinstance(data[key], (list, tuple)) and not scalars_in_a_tensor:
            raise GAEInputError(
                f"{path}: rollout_data[{key!r}] is {describe(data[key])}, expected a list with one entry per sample"
            )
    rows = len(data[ROWS_KEY])
    dtypes: dict[str, set[torch.dtype]] = {}
    for key in in_order:
        found = check_per_sample(data[key], FIELDS_BY_KEY[key], rows, _where(path)(key))
        if found is not None:
            dtypes[key] = found
    return rows, dtypes


def _integers(data: dict, key: str, path: AnyPath) -> np.ndarray:
    """A scalar key of ``rollout_data`` as an int64 array (checked)."""
    dump_field = MAX_SEQ_LENS_FIELD if key == MAX_SEQ_LENS_KEY else FIELDS_BY_KEY[key]
    return scalar_column(data[key], dump_field, _where(path)(key)).to_numpy(zero_copy_only=False)


def _digests(data: dict, keys: frozenset[str], path: AnyPath) -> dict[str, bytes]:
    """A digest of each imported key's contents (and ``max_seq_lens``): equal digests, equal
    data. Compares the files of a context-parallel group without holding them together."""
    digests = {}
    for key in sorted(keys | ({MAX_SEQ_LENS_KEY} if MAX_SEQ_LENS_KEY in data else set())):
        digest = hashlib.blake2b(digest_size=16)
        dump_field = FIELDS_BY_KEY.get(key, MAX_SEQ_LENS_FIELD)
        if dump_field.per_token:
            tensors = data[key]
            digest.update(np.array([t.numel() for t in tensors], dtype=np.int64).tobytes())
            for dtype in sorted({str(t.dtype) for t in tensors}):
                digest.update(dtype.encode())
            if len(tensors):
                flat = torch.cat([t.detach().reshape(-1) for t in tensors])
                digest.update(flat.contiguous().view(torch.uint8).numpy().tobytes())
        else:
            array = scalar_column(data[key], dump_field, _where(path)(key), nullable=key == "sample_indices")
            digest.update(np.asarray(array.to_numpy(zero_copy_only=False)).tobytes())
        digests[key] = digest.digest()
    return digests


# ----------------------------------------------------------------------------- context parallelism


def zigzag_response_parts(
    total_lengths: np.ndarray, response_lengths: np.ndarray, chunk_sizes: np.ndarray, cp_size: int, cp_rank: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which response indices rank ``cp_rank`` holds of each sample, in its order: two
    half-open ranges per sample, returned as ``starts [B, 2]`` and ``stops [B, 2]``
    (an empty part has start = stop).

    miles' zigzag (``miles/backends/training_utils/cp_utils.py::get_logits_and_tokens_offset_with_cp``):
    with T the total length, P the prompt length and c the chunk size (``ceil(T / 2·cp)``
    for thd, ``ceil(max_seq_len / 2·cp)`` for bshd), rank r holds logit positions
    ``[r·c, (r+1)·c)`` then ``[(2cp−1−r)·c, (2cp−r)·c)``, each cut to ``[P−1, T−1)``;
    response index = position − (P−1).
    """
    total = total_lengths.astype(np.int64)
    prompt_minus_one = total - response_lengths.astype(np.int64) - 1
    chunk_starts = np.stack([cp_rank * chunk_sizes, (2 * cp_size - 1 - cp_rank) * chunk_sizes], axis=1)
    low = np.maximum(chunk_starts, prompt_minus_one[:, None])
    high = np.minimum(chunk_starts + chunk_sizes[:, None], (total - 1)[:, None])
    empty = low >= high
    starts = np.where(empty, 0, low - prompt_minus_one[:, None])
    stops = np.where(empty, 0, high - prompt_minus_one[:, None])
    return starts, stops


def assemble_shares(
    shares: Sequence[Sequence[torch.Tensor]],
    starts: Sequence[np.ndarray],
    stops: Sequence[np.ndarray],
    response_lengths: np.ndarray,
    where: Sequence[str],
) -> list[torch.Tensor]:
    """Put each rank's per-sample shares (``shares[r][i]``) back at their response indices
    (``starts[r]``, ``stops[r]`` from :func:`zigzag_response_parts`): one scatter per rank
    into the flat output, no loop over samples or tokens. A share of the wrong length
    raises :class:`GAEInputError` (``where[r]`` names the rank's file and key)."""
    lengths = response_lengths.astype(np.int64)
    offsets = list_offsets(lengths)
    covered = sum((stop - start).sum(axis=1) for start, stop in zip(starts, stops))
    if lengths.size and not np.array_equal(covered, lengths):
        sample = int(np.flatnonzero(covered != lengths)[0])
        raise GAEInputError(
            f"{where[0]}[{sample}]: the context-parallel shares cover {int(covered[sample])} of the "
            f"response's {int(lengths[sample])} tokens (total_lengths, response_lengths or "
            f"max_seq_lens do not fit the layout)"
        )
    dtypes = sorted({t.dtype for rank_shares in shares for t in rank_shares}, key=str)
    dtype = reduce(torch.promote_types, dtypes) if dtypes else torch.float32
    out = torch.empty(int(offsets[-1]), dtype=dtype)
    for rank_shares, start, stop, named in zip(shares, starts, stops, where):
        widths = stop - start  # [B, 2]
        held = np.array([t.numel() for t in rank_shares], dtype=np.int64)
        expected = widths.sum(axis=1)
        if not np.array_equal(held, expected):
            sample = int(np.flatnonzero(held != expected)[0])
            raise GAEInputError(
                f"{named}[{sample}] holds {int(held[sample])} tokens, but this context-parallel rank's "
                f"share of a {int(lengths[sample])}-token response is {int(expected[sample])}"
            )
        if not held.sum():
            continue
        flat = torch.cat([t.detach().reshape(-1) for t in rank_shares])
        segment_lengths = widths.reshape(-1)
        segment_sources = np.concatenate([[0], np.cumsum(segment_lengths)[:-1]])
        segment_targets = (offsets[:-1, None] + start).reshape(-1)
        positions = np.repeat(segment_targets - segment_sources, segment_lengths) + np.arange(flat.numel())
        out[torch.from_numpy(positions)] = flat.to(dtype)
    return list(torch.split(out, lengths.tolist()))


@dataclass
class _Group:
    """The files of one rollout holding the same samples under context parallelism: one per
    cp_rank (``members``, a tensor-parallel copy read once), plus its data-parallel rank."""

    rollout_id: int
    data_parallel_rank: int
    members: list[_Dump]  # indexed by cp_rank
    copies: list[tuple[_Dump, _Dump]]  # (copy, the member it equals)

    @property
    def lowest_rank(self) -> int:
        return min(d.rank for d in self.members)


def _describe_group(rollout_id: int, dumps: Sequence[_Dump]) -> str:
    indices = dumps[0].sample_indices
    held = f"sample_indices {indices[0]}…{indices[-1]}, {len(indices)} samples" if indices else "no samples"
    ranks = ", ".join(str(d.rank) for d in sorted(dumps, key=lambda d: d.rank))
    return f"rollout {rollout_id}, context-parallel group of ranks {ranks} ({held})"


def _context_parallel_groups(dumps: list[_Dump], notes: list[str]) -> tuple[list[_Group], list[_Dump]]:
    """Group a rollout's context-parallel dumps; returns the groups (data-parallel rank set:
    their order by lowest global rank) and the files skipped (an earlier pipeline stage)."""
    rollout_id = dumps[0].rollout_id
    sizes = sorted({d.cp_size for d in dumps})
    if len(sizes) > 1:
        raise GAEInputError(
            f"rollout {rollout_id}: the dumps have different cp_size ({', '.join(map(str, sizes))}); "
            f"import the files of one run together"
        )
    by_samples, skipped = _by_samples(rollout_id, dumps)
    if skipped:
        ranks = sorted(d.rank for d in skipped)
        notes.append(
            f"rollout {rollout_id}: skipped {len(skipped)} dump(s) without values (ranks {ranks[0]}–{ranks[-1]}: "
            f"earlier pipeline stages; the last stage's files hold the same samples)"
        )
    full_length_keys = [key for key in dumps[0].digests if key not in RANK_LOCAL_KEYS]
    groups = [_group(rollout_id, members, sizes[0], full_length_keys) for members in by_samples.values()]
    groups.sort(key=lambda g: g.lowest_rank)
    for data_parallel_rank, group in enumerate(groups):
        group.data_parallel_rank = data_parallel_rank
    if any(g.copies for g in groups):
        count = sum(len(g.copies) for g in groups)
        notes.append(
            f"rollout {rollout_id}: {count} dump(s) equal to another rank's (tensor-parallel copies) read once"
        )
    return groups, skipped


def _by_samples(rollout_id: int, dumps: list[_Dump]) -> tuple[dict[tuple, list[_Dump]], list[_Dump]]:
    """A rollout's dumps with values by the samples they hold (in the order found); the
    dumps without values (skipped: another file must hold their samples with values)."""
    with_values = {d.sample_indices for d in dumps if "values" in d.keys}
    skipped = []
    by_samples: dict[tuple, list[_Dump]] = {}
    for dump in dumps:
        if "values" not in dump.keys:
            if dump.sample_indices not in with_values:
                raise GAEInputError(
                    f"{dump.path}: rollout_data lacks the required key(s) values, and no file of rollout {rollout_id} "
                    f"holds these samples with values; required: {', '.join(REQUIRED_KEYS)}"
                )
            skipped.append(dump)
            continue
        by_samples.setdefault(dump.sample_indices, []).append(dump)
    return by_samples, skipped


def _group(rollout_id: int, members: list[_Dump], cp_size: int, full_length_keys: list[str]) -> _Group:
    """The dumps holding the same samples as one context-parallel group (data-parallel rank
    set later): one file per cp_rank, equal copies read once, the whole-length keys equal."""
    by_cp_rank: dict[int, list[_Dump]] = {}
    for dump in sorted(members, key=lambda d: d.rank):
        by_cp_rank.setdefault(dump.cp_rank, []).append(dump)
    name = _describe_group(rollout_id, members)
    missing = [cp_rank for cp_rank in range(cp_size) if cp_rank not in by_cp_rank]
    if missing:
        raise GAEInputError(
            f"{name}: no file for cp_rank {', '.join(map(str, missing))} of cp_size {cp_size}; "
            f"import every context-parallel rank's file"
        )
    chosen, copies = [], []
    for cp_rank in range(cp_size):
        first, *others = by_cp_rank[cp_rank]
        for other in others:
            if other.digests != first.digests:
                raise GAEInputError(
                    f"{name}: two different files for cp_rank {cp_rank}: {first.path} and "
                    f"{other.path} (their data differ, so they are no tensor-parallel copies); "
                    f"import one of them"
                )
            copies.append((other, first))
        chosen.append(first)
    for member in chosen[1:]:
        differ = [key for key in full_length_keys if member.digests.get(key) != chosen[0].digests.get(key)]
        if differ:
            raise GAEInputError(
                f"{name}: {member.path} and {chosen[0].path} hold the same samples but "
                f"different {', '.join(differ)} (whole on every context-parallel rank); "
                f"import files of one run"
            )
    return _Group(rollout_id, 0, chosen, copies)


def _assembled_data(group: _Group, loaded: list[Any]) -> dict[str, Any]:
    """One context-parallel group as one ``cp_size = 1`` rollout_data: whole-length keys from
    cp_rank 0, rank-local keys reassembled."""
    first = loaded[0]["rollout_data"]
    member = group.members[0]
    data = {key: first[key] for key in member.keys}
    totals = _integers(first, "total_lengths", member.path)
    responses = _integers(first, "response_lengths", member.path)
    cp_size = member.cp_size
    if member.qkv_format == "bshd":
        lengths = _integers(first, MAX_SEQ_LENS_KEY, member.path)
    else:
        lengths = totals
    chunk_sizes = (lengths + 2 * cp_size - 1) // (2 * cp_size)
    parts = [zigzag_response_parts(totals, responses, chunk_sizes, cp_size, cp_rank) for cp_rank in range(cp_size)]
    for key in RANK_LOCAL_KEYS:
        if key not in member.keys:
            continue
        data[key] = assemble_shares(
            [dump["rollout_data"][key] for dump in loaded],
            [p[0] for p in parts],
            [p[1] for p in parts],
            responses,
            [_where(d.path)(key) for d in group.members],
        )
    return data


# ----------------------------------------------------------------------------- import


@dataclass
class _Unit:
    """One output row group: a ``cp_size = 1`` dump, or a context-parallel group."""

    rollout_id: int
    rank: int
    dumps: list[_Dump]
    group: Optional[_Group] = None


def _units(facts: list[_Dump], notes: list[str]) -> tuple[list[_Unit], list[_Dump]]:
    """Order the dumps into output units; also the dumps skipped."""
    units: list[_Unit] = []
    skipped: list[_Dump] = []
    by_rollout: dict[int, list[_Dump]] = {}
    for dump in facts:
        by_rollout.setdefault(dump.rollout_id, []).append(dump)
    for rollout_id, dumps in by_rollout.items():
        parallel = [d for d in dumps if d.cp_size > 1]
        if parallel and len(parallel) < len(dumps):
            plain = next(d for d in dumps if d.cp_size == 1)
            raise GAEInputError(
                f"rollout {rollout_id}: {plain.path} has cp_size 1 and {parallel[0].path} cp_size "
                f"{parallel[0].cp_size}; import the files of one run together"
            )
        if not parallel:
            units.extend(_Unit(rollout_id, d.rank, [d]) for d in dumps)
            continue
        groups, rollout_skipped = _context_parallel_groups(dumps, notes)
        skipped.extend(rollout_skipped)
        units.extend(_Unit(rollout_id, g.data_parallel_rank, list(g.members), g) for g in groups)
    units.sort(key=lambda unit: (unit.rollout_id, unit.rank))
    return units, skipped


def import_miles(paths: Sequence[str | Any], output: str | Any, **options: Unpack[ImportOptions]) -> ImportReport:
    """Import miles ``--save-debug-train-data`` dumps into one rollout Parquet file.

    ``paths``: dump files, directories (read recursively for ``*.pt`` and ``*.pth``), globs
    or URIs; a file named twice is read once. Rows are ordered by ``rollout_id``, then
    ``rank``, then position in the rank's lists; one row group per dump (per
    context-parallel group). Columns: ``rollout_id``, ``rank``, then, for each dump key
    present, ``sample_index`` (``sample_indices``), ``values``, ``loss_mask``
    (``loss_masks``), ``terminal_reward`` (``rewards``), ``response_length``,
    ``total_length``, ``log_probs``, ``ref_log_probs``, ``trained_advantages``
    (``advantages``), ``trained_returns`` (``returns``). There is no per-token ``rewards``
    column (the dumps hold none): derive KL rewards with ``--kl-coef``.

    ``cp_size > 1``: the files of a rollout holding the same ``sample_indices`` are one
    context-parallel group; the shares of its ``cp_size`` files are put back in response
    order (miles' zigzag layout) and ``rank`` is the group's data-parallel rank (its place
    among the rollout's groups by lowest global rank), so the rows equal those of the same
    data dumped with ``cp_size = 1``. Equal files of several tensor-parallel ranks are read
    once; files without ``values`` holding a group's samples (earlier pipeline stages) are
    skipped; both are noted.

    Every dump is loaded with ``torch.load(weights_only=True)`` twice (first to check and
    order them, then to convert one dump or group at a time, memory-mapped when the file
    allows). The output is written whole or not at all (zstd).

    Raises :class:`GAEInputError` for dumps that break the documented shape (missing
    required keys, lists of different lengths, non-tensor per-token entries, an arbitrary
    pickled object, two files for one rollout and rank, files whose optional keys differ, a
    context-parallel group with a missing or duplicate cp_rank, a share of the wrong length)
    and :class:`GAEUsageError` for paths that name nothing, files that are not
    ``torch.save`` files, an existing output without ``overwrite``, and an output or one of
    ``report_paths`` (files the caller writes reports to, e.g. ``--json``) that is an input
    or another of them (:func:`gaecli.io.paths.check_writes`).
    """
    return run_import(paths, output, DUMP_PATTERNS, _plan, **options)


def _plan(sources: list[AnyPath], output: str) -> ImportPlan:
    """The first pass over the dumps (checked, ordered into units) and the conversion of
    each unit, one at a time, as the output's batches."""
    facts = [inspect_dump(source, load_dump(source)) for source in sources]
    facts.sort(key=lambda dump: (dump.rollout_id, dump.rank))
    for previous, current in zip(facts, facts[1:]):
        if (previous.rollout_id, previous.rank) == (current.rollout_id, current.rank):
            raise GAEInputError(
                f"{previous.path} and {current.path} both hold rollout {current.rollout_id}, "
                f"rank {current.rank}; import one of them"
            )
    notes: list[str] = []
    units, skipped = _units(facts, notes)
    read = [dump for unit in units for dump in unit.dumps]
    keys = read[0].keys if read else facts[0].keys
    out = FieldsOutput.of(read, keys, "miles", OPTIONAL_KEYS, output, notes)

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        for unit in units:
            first = unit.dumps[0]
            ranks = np.full(first.rows, unit.rank, dtype=np.int64)
            batch, tokens = out.batch(_unit_data(unit), unit.rollout_id, ranks, _where(first.path))
            yield batch, tokens
            out.report.files.extend(_unit_files(unit, tokens))

    def finish() -> None:
        skipped_note = "skipped: no values (an earlier pipeline stage)"
        out.report.files.extend(
            ImportedFile(str(dump.path), dump.rollout_id, dump.rank, 0, 0, dump.cp_rank, None, skipped_note)
            for dump in skipped
        )

    return ImportPlan(out.schema, out.report, batches(), lambda: sum(unit.dumps[0].rows for unit in units), finish)


def _unit_data(unit: _Unit) -> dict[str, Any]:
    """A unit's dumps loaded again (checked to be what the first pass saw) as one ``cp_size = 1`` rollout_data."""
    loaded = []
    for dump_facts in unit.dumps:
        dump = load_dump(dump_facts.path)
        check_unchanged(dump_facts.path, inspect_dump(dump_facts.path, dump).same_place(dump_facts))
        loaded.append(dump)
    return _assembled_data(unit.group, loaded) if unit.group else loaded[0]["rollout_data"]


def _unit_files(unit: _Unit, tokens: int) -> list[ImportedFile]:
    """The report's entries of a unit's files: a ``cp_size = 1`` dump, or a context-parallel
    group's members (rows and tokens counted on cp_rank 0's) and its copies."""
    first = unit.dumps[0]
    if unit.group is None:
        return [ImportedFile(str(first.path), unit.rollout_id, first.rank, first.rows, tokens)]
    files = []
    for member in unit.group.members:
        counted = member.cp_rank == 0
        files.append(
            ImportedFile(
                str(member.path),
                unit.rollout_id,
                member.rank,
                first.rows if counted else 0,
                tokens if counted else 0,
                member.cp_rank,
                unit.rank,
                None if counted else "context-parallel share: its rows are counted with cp_rank 0's file",
            )
        )
    for copy, original in unit.group.copies:
        files.append(
            ImportedFile(
                str(copy.path),
                unit.rollout_id,
                copy.rank,
                0,
                0,
                copy.cp_rank,
                unit.rank,
                f"tensor-parallel copy of {original.path}: read once",
            )
        )
    return files
