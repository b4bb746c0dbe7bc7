"""``gae import slime`` as a library: read slime's training-side dumps (format 2, one
``torch.save``'d file per rollout written by
``slime/observability/train_data_utils.py::save_debug_train_data`` / ``_build_dump_payload``,
already gathered to full length) without ever unpickling arbitrary objects, and write one
rollout Parquet file with the columns of ``gae import miles`` (see docs/import.md).

A dump is ``{"format_version": 2, "rollout_id", "rank", "samples": [...], "dp_shards", ...}``;
each sample is a dict with ``data_parallel_rank``, ``sample_index`` (may be ``None``),
``rollout_position`` and the per-sample columns under their plural keys (``values``,
``loss_masks``, ``rewards``, ``log_probs``…).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from gaecli.errors import GAEInputError
from gaecli.importers.common import (
    FIELDS,
    FIELDS_BY_KEY,
    DumpField,
    FieldsOutput,
    ImportOptions,
    ImportPlan,
    check_per_sample,
    check_unchanged,
    differences,
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
FORMAT_VERSION = 2
TOP_LEVEL_KEYS = ("format_version", "rollout_id", "samples")
SAMPLE_INDEX_KEY = "sample_index"  # a sample's own key; the column of miles' sample_indices
RANK_KEY = "data_parallel_rank"  # a sample's data-parallel rank: the rank column
# The per-sample keys read (miles' rollout_data keys minus sample_indices); values is
# optional here: slime dumps it only when a critic ran.
SAMPLE_FIELDS = tuple(f for f in FIELDS if f.key != "sample_indices")
REQUIRED_KEYS = ("loss_masks", "rewards")
OPTIONAL_KEYS = tuple(f.key for f in SAMPLE_FIELDS if f.key not in REQUIRED_KEYS)
ID_KEYS = (RANK_KEY, SAMPLE_INDEX_KEY)


@dataclass
class _Dump:
    """A dump's facts from the first pass."""

    path: AnyPath
    rollout_id: int
    rows: int
    keys: frozenset[str]  # FIELDS keys present (sample_indices when samples carry sample_index)
    other_keys: frozenset[str]
    dtypes: dict[str, set[torch.dtype]]


def _where(path: AnyPath):
    return lambda key: f"{path}: samples[*][{(SAMPLE_INDEX_KEY if key == 'sample_indices' else key)!r}]"


def inspect_dump(path: AnyPath, dump: Any) -> tuple[_Dump, dict[str, list], np.ndarray]:
    """Check a loaded slime dump and return its facts, its per-sample columns keyed like
    miles' rollout_data, and the data-parallel rank of each sample; :class:`GAEInputError`
    names the file, the sample and the key that is wrong."""
    _check_top_level(path, dump)
    rollout_id = integer(dump["rollout_id"], "rollout_id", path)
    samples = dump["samples"]
    first_keys = _sample_keys(path, samples)
    rows = len(samples)
    columns: dict[str, list] = {f.key: [s[f.key] for s in samples] for f in SAMPLE_FIELDS if f.key in first_keys}
    if SAMPLE_INDEX_KEY in first_keys:
        columns["sample_indices"] = [s[SAMPLE_INDEX_KEY] for s in samples]
    where = _where(path)
    ranks = scalar_column(
        [s[RANK_KEY] for s in samples],
        DumpField(RANK_KEY, "rank", "integer", minimum=0),
        f"{path}: samples[*][{RANK_KEY!r}]",
    ).to_numpy(zero_copy_only=False)
    dtypes: dict[str, set[torch.dtype]] = {}
    for key, entries in columns.items():
        dump_field = FIELDS_BY_KEY[key]
        found = check_per_sample(entries, dump_field, rows, where(key))
        if found is not None:
            dtypes[key] = found
        elif key != "sample_indices":
            scalar_column(entries, dump_field, where(key))
        else:
            scalar_column(entries, dump_field, where(key), nullable=True)
    other = frozenset(str(key) for key in first_keys if key not in FIELDS_BY_KEY and key not in ID_KEYS)
    other |= frozenset(f"(top level) {key}" for key in dump if key not in (*TOP_LEVEL_KEYS, "rank", "dp_shards"))
    return _Dump(path, rollout_id, rows, frozenset(columns), other, dtypes), columns, ranks


def _check_top_level(path: AnyPath, dump: Any) -> None:
    """A dict of format 2 with :data:`TOP_LEVEL_KEYS`; else :class:`GAEInputError` saying what the file is."""
    expected = f"expected format_version {FORMAT_VERSION}, rollout_id, rank, samples, dp_shards"
    if not isinstance(dump, dict):
        raise GAEInputError(f"{path}: holds {describe(dump)}, not a slime train-data dump (a dict; {expected})")
    if "format_version" not in dump and "rollout_data" in dump:
        raise GAEInputError(
            f"{path}: has no format_version but a rollout_data key: a per-rank dump in miles' "
            f"layout (older slime, or miles); read it with gae import miles"
        )
    missing = [key for key in TOP_LEVEL_KEYS if key not in dump]
    if missing:
        raise GAEInputError(
            f"{path}: not a slime train-data dump: missing {', '.join(missing)}; "
            f"the file has {key_list(dump)}; {expected}"
        )
    version = dump["format_version"]
    if version != FORMAT_VERSION:
        raise GAEInputError(
            f"{path}: format_version is {shown(version)}; gae import slime reads format_version "
            f"{FORMAT_VERSION} (slime's _build_dump_payload); other layouts are not supported"
        )


def _sample_keys(path: AnyPath, samples: Any) -> set:
    """The keys every sample holds (checked: a list of dicts of the same keys, the required ones among them)."""
    if not isinstance(samples, (list, tuple)):
        raise GAEInputError(f"{path}: samples is {describe(samples)}, expected a list of per-sample dicts")
    not_dict = [i for i, sample in enumerate(samples) if not isinstance(sample, dict)]
    if not_dict:
        raise GAEInputError(f"{path}: samples[{not_dict[0]}] is {describe(samples[not_dict[0]])}, expected a dict")
    first_keys = set(samples[0]) if samples else set(REQUIRED_KEYS) | {RANK_KEY}
    for i, sample in enumerate(samples):
        if set(sample) != first_keys:
            difference = differences(
                ("has", sorted(map(str, set(sample) - first_keys))),
                ("lacks", sorted(map(str, first_keys - set(sample)))),
            )
            raise GAEInputError(
                f"{path}: samples[{i}] {difference}, unlike samples[0]: every sample needs the same keys"
            )
    lacking = [key for key in (*REQUIRED_KEYS, RANK_KEY) if key not in first_keys]
    if lacking:
        raise GAEInputError(
            f"{path}: samples[0] lacks the required key(s) {', '.join(lacking)}; it has "
            f"{', '.join(map(str, samples[0]))}; required: {', '.join((*REQUIRED_KEYS, RANK_KEY))}; "
            f"optional: {', '.join(OPTIONAL_KEYS)}"
        )
    return first_keys


def import_slime(paths: Sequence[str | Any], output: str | Any, **options: Unpack[ImportOptions]) -> ImportReport:
    """Import slime ``--save-debug-train-data`` dumps (format 2) into one rollout Parquet file.

    ``paths``: dump files, directories (read recursively for ``*.pt`` and ``*.pth``), globs
    or URIs. Rows are ordered by ``rollout_id``, then as the file holds them (slime sorts a
    rollout's samples by ``rollout_position``); one row group per file. Columns: those of
    ``gae import miles`` (``rank`` is each sample's ``data_parallel_rank``, ``sample_index``
    its ``sample_index``, null where ``None``); ``values`` is optional (runs without a
    critic have none).

    Every dump is loaded with ``torch.load(weights_only=True)`` twice (check, then convert
    one file at a time). The output is written whole or not at all.

    Raises :class:`GAEInputError` for a ``format_version`` other than 2, a missing key, a
    sample of another shape than the others, two files of one rollout, files whose keys
    differ; :class:`GAEUsageError` for unreadable inputs and an existing output without
    ``overwrite``.
    """
    return run_import(paths, output, DUMP_PATTERNS, _plan, **options)


def _plan(sources: list[AnyPath], output: str) -> ImportPlan:
    """The first pass over the dumps (checked, one per rollout) and the conversion of each,
    one at a time, as the output's batches."""
    facts = [inspect_dump(source, load_dump(source))[0] for source in sources]
    facts.sort(key=lambda dump: dump.rollout_id)
    for previous, current in zip(facts, facts[1:]):
        if previous.rollout_id == current.rollout_id:
            raise GAEInputError(
                f"{previous.path} and {current.path} both hold rollout {current.rollout_id}; import one of them"
            )
    out = FieldsOutput.of(facts, facts[0].keys, "slime", OPTIONAL_KEYS, output)

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        for dump_facts in facts:
            again, columns, ranks = inspect_dump(dump_facts.path, load_dump(dump_facts.path))
            place = (dump_facts.rollout_id, dump_facts.rows, dump_facts.keys)
            check_unchanged(dump_facts.path, (again.rollout_id, again.rows, again.keys) == place)
            batch, tokens = out.batch(columns, dump_facts.rollout_id, ranks, _where(dump_facts.path))
            del columns
            yield batch, tokens
            out.report.files.append(
                ImportedFile(str(dump_facts.path), dump_facts.rollout_id, None, dump_facts.rows, tokens)
            )

    return ImportPlan(out.schema, out.report, batches(), lambda: sum(dump.rows for dump in facts))
