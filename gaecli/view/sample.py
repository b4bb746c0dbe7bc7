"""One sample of a step, computed on demand for the sample page: its row group decoded as far
as the row (and kept among the last few), the row cut out, and its new and old advantages
computed by the run's own description and dispatch (:func:`gaecli.pipeline.computed_batches`,
:func:`gaecli.pipeline.whitened_sides`) with the statistics of the chosen side's computation;
the old side any of the run's comparisons, or a trainer profile, a stored column or another
estimator chosen on the page."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.diff.options import DiffOptions
from gaecli.view.tokens import TokenText

CACHED_ROW_GROUPS = 4
"""Row groups kept per file: a group's samples and the next ones by rank are often in one."""


def stored_candidates(options: DiffOptions, schema: pa.Schema) -> list[str]:
    """The list columns of floats that could hold a trainer's advantages: every one that is
    not an input of the computation (values, rewards, log-probs, masks)."""
    columns = options.columns
    inputs = {columns.values, columns.rewards, columns.loss_mask, columns.log_probs, columns.ref_log_probs}
    inputs |= {columns.teacher_log_probs, columns.response_mask}
    found = []
    for item in schema:
        if item.name in inputs or not (pa.types.is_list(item.type) or pa.types.is_large_list(item.type)):
            continue
        if pa.types.is_floating(item.type.value_type):
            found.append(item.name)
    return found


def old_side_choices(options: DiffOptions, schema: pa.Schema, path: str = "") -> list[dict]:
    """The old sides the page offers (``key``, ``label``): the run's comparisons
    (``side:K``), then every trainer profile (``profile:NAME``), stored column of floats
    (``column:NAME``) and other estimator (``estimator:NAME``) not among them that a file of
    ``schema`` has the inputs of, each computed for one sample when chosen (after its own
    whole-run pass where it needs one: under ``--normalize``, a grouped or whitened
    estimator)."""
    choices = [{"key": f"side:{k}", "label": side.name} for k, side in enumerate(options.sides)]
    taken = {side.name for side in options.sides}
    if options.estimator == "gae":
        from gaecli.advantages.contract import PROFILES

        profiles = PROFILES
    else:
        from gaecli.advantages.estimator_profiles import profile_names

        profiles = profile_names(options.estimator)
    choices += [{"key": f"profile:{name}", "label": f"{name} (profile)"} for name in profiles if name not in taken]
    stored = [name for name in stored_candidates(options, schema) if name not in taken]
    choices += [{"key": f"column:{name}", "label": f"{name} (stored)"} for name in stored]
    choices += [
        {"key": f"estimator:{name}", "label": f"{name} (estimator)"} for name in other_estimators(options, schema, path)
    ]
    return choices


def other_estimators(options: DiffOptions, schema: pa.Schema, path: str) -> list[str]:
    """The estimators other than the new side's and the run's comparisons that can be the old
    side of a file of ``schema`` with ``options``' columns (their options valid, the file
    holding their inputs)."""
    from gaecli.advantages.contract import ESTIMATORS
    from gaecli.errors import GAEError
    from gaecli.pipeline import check_file

    taken = {options.estimator, *(side.estimator for side in options.sides if side.estimator is not None)}
    found = []
    for name in ESTIMATORS:
        if name in taken:
            continue
        try:
            check_file(schema, path, side_options(options, f"estimator:{name}")[0].computation)
        except (GAEError, ValueError):
            continue
        found.append(name)
    return found


def side_options(options: DiffOptions, key: str) -> tuple[DiffOptions, int]:
    """The options computing old side ``key`` (a key of :func:`old_side_choices`) and that
    side's place among their old sides. A grouped estimator's groups are ``--group-col``'s,
    else the page's (``--group-by``)."""
    kind, _, name = key.partition(":")
    if kind == "side":
        return options, int(name)
    plain = dict(against=None, against_returns=None, old_estimator=None, baseline=None)
    if kind == "profile":
        return dataclasses.replace(options, **{**plain, "baseline": name}), 0
    if kind == "estimator":
        from gaecli.advantages.contract import GROUPED_ESTIMATORS

        groups = options.group_by_id or (options.group_by if name in GROUPED_ESTIMATORS else None)
        return dataclasses.replace(options, **{**plain, "old_estimator": name, "group_by_id": groups}), 0
    return dataclasses.replace(options, **{**plain, "against": name}), 0


ROW_BATCHES = 32
"""The batches a row group is decoded in for the sample page: a row costs the decoding of the
group up to its batch (on average about half of it), not of the whole group."""


class GroupReader:
    """One row group of a file decoded from its start in :data:`ROW_BATCHES` batches, as far
    as a row asked for, the batches kept; the file closed once the group is decoded (or by
    :meth:`close`). A read fault is :class:`gaecli.errors.UnreadableFileError`, one line."""

    def __init__(self, path: str, footer: pq.FileMetaData, group: int, columns: tuple[str, ...]) -> None:
        from gaecli.io.reader import RolloutFile

        self.path = path
        self._rows = footer.row_group(group).num_rows
        self._rollout = RolloutFile(path, footer)
        self._batches = self._rollout.parquet.iter_batches(
            max(1, -(-self._rows // ROW_BATCHES)), row_groups=[group], columns=list(columns), use_threads=False
        )
        self._decoded: list[pa.RecordBatch] = []
        self._starts = [0]

    def row(self, local: int) -> pa.Table:
        """Row ``local`` of the group as a one-row table."""
        from gaecli.io.reader import read_errors

        with read_errors(self.path):
            while self._starts[-1] <= local:  # at most ROW_BATCHES batches, each decoded once
                batch = next(self._batches)
                self._decoded.append(batch)
                self._starts.append(self._starts[-1] + batch.num_rows)
                if self._starts[-1] >= self._rows:
                    self.close()
        place = int(np.searchsorted(self._starts, local, side="right") - 1)
        return pa.Table.from_batches([self._decoded[place].slice(local - self._starts[place], 1)])

    def close(self) -> None:
        if self._rollout is not None:
            self._rollout.close()
            self._rollout = None


class SampleSource:
    """Where the samples of one file are read: the columns the chosen side's computation
    reads (and the group, id, token and turn-id columns), one row group at a time, the last
    few kept."""

    def __init__(
        self, path: str, footer: Optional[pq.FileMetaData], starts: np.ndarray, options: DiffOptions, tokens: TokenText
    ) -> None:
        self.path, self.footer, self.starts, self.options, self.tokens = path, footer, starts, options, tokens
        self._groups: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.keys: tuple = ()
        if footer is not None:
            schema = footer.schema.to_arrow_schema()
            self.keys = (options.group_by, options.id_col, tokens.column_in(schema), turn_ids_column(options))

    def columns_of(self, computation) -> tuple[str, ...]:
        """The columns a sample computed by ``computation`` reads, in file order."""
        from gaecli.pipeline import statistics_columns

        return tuple(statistics_columns(self.footer.schema.to_arrow_schema(), computation, self.keys))

    def row_table(self, row: int, computation=None) -> tuple[pa.Table, int]:
        """Row ``row`` of the file as a one-row table of the columns ``computation`` (None:
        the run's) reads, and its row group: the group decoded from its start as far as this
        row, in batches (:class:`GroupReader`), and kept for the next rows."""
        columns = self.columns_of(computation or self.options.computation)
        group = int(np.searchsorted(self.starts, row, side="right") - 1)
        with self._lock:
            reader = self._groups.get((group, columns))
            if reader is None:
                reader = self._groups[(group, columns)] = GroupReader(self.path, self.footer, group, columns)
                while len(self._groups) > CACHED_ROW_GROUPS:
                    self._groups.popitem(last=False)[1].close()
            self._groups.move_to_end((group, columns))
            return reader.row(row - int(self.starts[group])), group

    def head(self, computation=None) -> pa.Table:
        """The file's first row as a one-row table of the columns ``computation`` reads: only
        the first pages decoded (for warming the sample path without reading a row group)."""
        from gaecli.io.reader import RolloutFile

        rollout = RolloutFile(self.path, self.footer)
        try:
            batches = rollout.parquet.iter_batches(
                1, row_groups=[0], columns=list(self.columns_of(computation or self.options.computation))
            )
            return pa.Table.from_batches([next(batches)])
        finally:
            rollout.close()

    def terminal_rewards(self) -> np.ndarray:
        """Every row's terminal reward (float64, NaN where absent): the one scalar column read."""
        name = self.options.columns.terminal_reward
        if self.footer is None or name not in self.footer.schema.to_arrow_schema().names:
            return np.full(0 if self.footer is None else self.footer.num_rows, np.nan)
        from gaecli.io.reader import RolloutFile

        rollout = RolloutFile(self.path, self.footer)
        try:
            column = rollout.parquet.read(columns=[name]).column(name).cast(pa.float64())
        finally:
            rollout.close()
        return column.fill_null(np.nan).to_numpy()


def turn_ids_column(options: DiffOptions) -> Optional[str]:
    """The per-token turn-id column of ``options`` (``--turn-ids-col``), or None."""
    return options.variants.turn_ids_col


def boundaries(trainable: np.ndarray, turn_ids: Optional[np.ndarray] = None) -> tuple[list[int], list[int]]:
    """Where each masked span starts, and where each turn starts: at a change of turn id
    among the trainable tokens where the row has turn ids, else at the first token of each
    run of trainable tokens."""
    mask = np.asarray(trainable, dtype=bool)
    before = np.concatenate([[True], mask[:-1]]) if mask.size else mask
    masked_starts = np.flatnonzero(~mask & before)
    if turn_ids is None or len(turn_ids) != mask.size:
        turn_starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]) if mask.size else mask)
    else:
        positions = np.flatnonzero(mask)
        ids = np.asarray(turn_ids)[positions]
        turn_starts = positions[np.concatenate([[True], ids[1:] != ids[:-1]])] if positions.size else positions
    return masked_starts.tolist(), turn_starts.tolist()


def _turn_ids(table: pa.Table, name: Optional[str]) -> Optional[np.ndarray]:
    if name is None or name not in table.column_names:
        return None
    values = table.column(name)[0].values
    return None if values is None else values.to_numpy(zero_copy_only=False)


def _floats(values: Optional[np.ndarray]) -> Optional[list]:
    """A flat array as a JSON list of float64 numbers (None for NaN and ±Inf)."""
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    listed = values.tolist()
    if not finite.all():
        listed = [value if ok else None for value, ok in zip(listed, finite.tolist())]
    return listed


def _cell(table: pa.Table, name: Optional[str]):
    if name is None or name not in table.column_names:
        return None
    value = table.column(name)[0].as_py()
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def sample_document(
    source: SampleSource, row: int, key: str, statistics: tuple, table: Optional[pa.Table] = None
) -> dict:
    """The numbers of one sample, per token, for old side ``key``: the mask (1 trainable),
    the new and old advantages and returns (None where the old side has no returns), Δ =
    new − old at every position, the values and rewards as computed with (KL included), the
    terminal reward, the tokens' text (:class:`gaecli.view.tokens.TokenText`), the row's id
    and group, where each masked span and each turn starts (:func:`boundaries`).
    ``statistics``: the file's (moments, scores) of the pre-passes of ``key``'s computation
    (None each where not needed). Raises :class:`gaecli.errors.GAEInputError` for a row that
    breaks the format (its one-line message names the row). ``table``: the row as a one-row
    table where read already (None: read by its row group)."""
    from gaecli.io.memory import TableRollout
    from gaecli.pipeline import computed_batches, whitened_sides

    options, place = side_options(source.options, key)
    moments, scores = statistics
    computation = options.computation
    table, group = source.row_table(row, computation) if table is None else (table, 0)
    computed = next(iter(computed_batches(TableRollout(table), computation, None, statistics=scores)))
    new, new_returns, olds = whitened_sides(computed, computation, moments, cast=False)
    old, old_returns = olds[place]
    packed = computed.packed
    new64, old64 = np.asarray(new, np.float64), np.asarray(old, np.float64)
    pieces, text_source = source.tokens.pieces(table, len(new64))
    turn_ids = _turn_ids(table, turn_ids_column(source.options))
    masked_starts, turn_starts = boundaries(packed.trainable, turn_ids)
    return {
        "row": row,
        "row_group": group,
        "length": len(new64),
        "id": _cell(table, source.options.id_col),
        "group": _cell(table, source.options.group_by),
        "old_name": options.sides[place].name,
        "mask": packed.trainable.astype(np.int8).tolist(),
        "new_advantages": _floats(new64),
        "new_returns": _floats(new_returns),
        "old_advantages": _floats(old64),
        "old_returns": _floats(old_returns),
        "delta": _floats(new64 - old64),
        "values": _floats(packed.values),
        "rewards": _floats(packed.rewards),
        "terminal_reward": _floats(packed.terminal_rewards)[0],
        "tokens": pieces,
        "tokens_from": text_source,
        "masked_starts": masked_starts,
        "turn_starts": turn_starts,
        "turns_from": "mask" if turn_ids is None else "ids",
    }
