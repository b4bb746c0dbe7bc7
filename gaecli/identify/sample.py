"""The rows ``gae identify`` reads: the first of the input, checked as ``gae diff --against``
checks them, as flat float64 buffers with the stored column beside them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaecli.advantages.contract import PROFILE_VARIANTS
from gaecli.identify.options import IdentifyOptions
from gaecli.pipeline import PackedBatch, check_file, check_scalar_column, computed_batches
from gaecli.progress import NoProgress, Progress

PROFILE_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(name for names in PROFILE_VARIANTS.values() for name in names))
"""The GAE variant fields a trainer profile takes (the truncation bootstrap's): those identify reads."""


@dataclass
class Sample:
    """The rows read, packed: flat float64 ``values``, ``rewards``, ``stored`` (the
    ``--against`` column) and ``stored_returns`` (None without ``--against-returns``), bool
    ``trainable`` ``[N]``; int64 ``offsets`` ``[B + 1]``; float64 ``terminal_rewards``
    ``[B]``; ``group_codes`` int64 ``[B]`` (the ``--group-col`` value's index, equal values
    one group across every file) or None; ``response``: the response mask (bool ``[N]``,
    ``--response-mask-col``, as :func:`gaecli.pipeline.pack_batch` reads it) or None (every
    token is the response); ``variants``: the GAE variant fields read, each the column it
    names (``truncated`` and ``bootstrap_values``, ``--truncated-col`` / ``--bootstrap-col``;
    empty without them) and ``row_inputs``: those columns' per-row arrays (column → bool or
    float64 ``[B]``, as :func:`gaecli.pipeline.row_input_arrays` reads them for diff's
    profiles); where each row comes from (``files``, the index
    into them ``file_index`` and the row in its file ``file_rows``); ``input_rows``: the rows
    of the whole input (from the footers) and ``complete``: whether every row was read."""

    values: np.ndarray
    rewards: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    terminal_rewards: np.ndarray
    stored: np.ndarray
    stored_returns: Optional[np.ndarray]
    group_codes: Optional[np.ndarray]
    files: list[Optional[str]]
    file_index: np.ndarray
    file_rows: np.ndarray
    input_rows: int
    complete: bool
    response: Optional[np.ndarray] = None
    variants: dict = field(default_factory=dict)
    row_inputs: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.offsets.size - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def row_of_token(self) -> np.ndarray:
        """Each token's row (int64 ``[N]``)."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), np.diff(self.offsets))

    @property
    def trainable_counts(self) -> np.ndarray:
        """Each row's trainable tokens (int64 ``[B]``)."""
        return np.bincount(self.row_of_token[self.trainable], minlength=self.rows).astype(np.int64)

    @property
    def packed(self) -> PackedBatch:
        """The rows as the commands' one batch (:class:`gaecli.pipeline.PackedBatch`, the
        response mask and the variants' per-row inputs with them), for
        :func:`gaecli.pipeline.compute_packed`."""
        arrays = (self.values, self.rewards, self.trainable, self.offsets, self.terminal_rewards)
        return PackedBatch(*arrays, row_inputs=self.row_inputs, response=self.response)

    def subset(self, keep: np.ndarray) -> "Sample":
        """The rows ``keep`` (bool ``[B]``) of the sample, in order (``complete`` False)."""
        lengths = np.diff(self.offsets)
        tokens = np.repeat(keep, lengths)
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])

        def rows(array):
            return None if array is None else array[keep]

        def token(array):
            return None if array is None else array[tokens]

        return Sample(
            values=token(self.values),
            rewards=token(self.rewards),
            trainable=token(self.trainable),
            offsets=offsets,
            terminal_rewards=rows(self.terminal_rewards),
            stored=token(self.stored),
            stored_returns=token(self.stored_returns),
            group_codes=rows(self.group_codes),
            files=self.files,
            file_index=rows(self.file_index),
            file_rows=rows(self.file_rows),
            input_rows=self.input_rows,
            complete=False,
            response=token(self.response),
            variants=self.variants,
            row_inputs={name: array[keep] for name, array in self.row_inputs.items()},
        )

    def where(self, row: int) -> str:
        """Row ``row`` of the sample as a reader finds it: ``file row K`` (``row K`` for a table)."""
        file = self.files[int(self.file_index[row])]
        place = f"row {int(self.file_rows[row])}"
        return place if file is None else f"{file} {place}"


@dataclass
class _Part:
    values: np.ndarray
    rewards: np.ndarray
    trainable: np.ndarray
    lengths: np.ndarray
    terminal: np.ndarray
    stored: np.ndarray
    stored_returns: Optional[np.ndarray]
    groups: Optional[pa.Array]
    file_index: int
    file_rows: np.ndarray
    response: Optional[np.ndarray]
    row_inputs: dict


def _take(computed, rows: int, file_index: int, group_col: Optional[str]) -> _Part:
    """The first ``rows`` valid rows of a computed batch."""
    packed = computed.packed
    end = int(packed.offsets[rows])
    stored, stored_returns = computed.olds[0]

    def head(array):
        return np.asarray(array[:end], dtype=np.float64)

    return _Part(
        values=head(packed.values),
        rewards=head(packed.rewards),
        trainable=np.asarray(packed.trainable[:end], dtype=bool),
        lengths=np.diff(packed.offsets[: rows + 1]).astype(np.int64),
        terminal=np.asarray(packed.terminal_rewards[:rows], dtype=np.float64),
        stored=head(stored),
        stored_returns=None if stored_returns is None else head(stored_returns),
        groups=None if group_col is None else computed.valid.column(group_col).slice(0, rows),
        file_index=file_index,
        file_rows=computed.first_row + np.arange(rows, dtype=np.int64),
        response=None if packed.response is None else np.asarray(packed.response[:end], dtype=bool),
        row_inputs={name: array[:rows] for name, array in packed.row_inputs.items()},
    )


def read_sample(
    rollouts: Iterable[tuple[Optional[str], object]],
    options: IdentifyOptions,
    input_rows: int,
    progress: Optional[Progress] = None,
) -> Sample:
    """The first rows of ``rollouts`` (each ``(name, open reader)``, in input order; the
    readers are not closed): at most ``options.sample_rows`` (0: all) and
    ``options.sample_tokens`` tokens, every row checked as ``gae diff --against`` checks it
    (the first invalid row raises :class:`gaecli.errors.InvalidDataError` naming it)."""
    progress = progress or NoProgress()
    computation = options.reading
    limit_rows = options.sample_rows or None
    parts: list[_Part] = []
    files: list[Optional[str]] = []
    rows = tokens = 0
    complete = True
    for index, (name, rollout) in enumerate(rollouts):
        files.append(name)
        where = str(rollout.path)
        check_file(rollout.schema, where, computation)
        check_scalar_column(rollout.schema, where, "--group-col", options.group_col)
        read = _read_columns(rollout.schema, options)
        for computed in computed_batches(rollout, computation, read):
            take = computed.packed.offsets.size - 1
            if limit_rows is not None:
                take = min(take, limit_rows - rows)
            within = np.flatnonzero(computed.packed.offsets[1 : take + 1] > options.sample_tokens - tokens)
            if within.size:
                take = max(int(within[0]), 1 if rows == 0 else 0)
            if take > 0:
                part = _take(computed, take, index, options.group_col)
                parts.append(part)
                rows += take
                tokens += int(part.lengths.sum())
                progress.advance(take, int(part.lengths.sum()))
            if take < computed.packed.offsets.size - 1:
                complete = False
                break
        if not complete:
            break
    fields = options.variants.spec_fields()
    variants = {name: fields[name] for name in PROFILE_FIELDS if fields[name] is not None}
    return _packed(parts, files, input_rows, complete, variants)


def _read_columns(schema: pa.Schema, options: IdentifyOptions) -> list[str]:
    columns = options.columns
    wanted = {name for _, name in columns.token_columns()} | {columns.terminal_reward, columns.response_length}
    wanted |= {name for name in (options.against, options.against_returns, options.group_col) if name is not None}
    wanted |= set(options.variants.columns())
    return [name for name in schema.names if name in wanted]


def _packed(
    parts: list[_Part], files: list[Optional[str]], input_rows: int, complete: bool, variants: dict
) -> Sample:
    def joined(name: str, dtype) -> np.ndarray:
        arrays = [getattr(part, name) for part in parts]
        return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

    lengths = joined("lengths", np.int64)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    stored_returns = response = None
    if parts and parts[0].stored_returns is not None:
        stored_returns = joined("stored_returns", np.float64)
    if parts and parts[0].response is not None:
        response = joined("response", bool)
    row_inputs = {}
    for name, column in variants.items():  # each part holds them all (the reading's spec reads every one)
        arrays = [part.row_inputs[column] for part in parts]
        row_inputs[column] = np.concatenate(arrays) if arrays else np.zeros(0, bool if name == "truncated" else float)
    group_codes = None
    if parts and parts[0].groups is not None:
        keys = pa.chunked_array([part.groups for part in parts])
        group_codes = np.asarray(pc.dictionary_encode(keys).combine_chunks().indices, dtype=np.int64)
    file_index = np.concatenate([np.full(part.lengths.size, part.file_index) for part in parts]) if parts else []
    return Sample(
        values=joined("values", np.float64),
        rewards=joined("rewards", np.float64),
        trainable=joined("trainable", bool),
        offsets=offsets,
        terminal_rewards=joined("terminal", np.float64),
        stored=joined("stored", np.float64),
        stored_returns=stored_returns,
        group_codes=group_codes,
        files=files,
        file_index=np.asarray(file_index, dtype=np.int64),
        file_rows=joined("file_rows", np.int64),
        input_rows=input_rows,
        complete=complete,
        response=response,
        variants=variants,
        row_inputs=row_inputs,
    )
