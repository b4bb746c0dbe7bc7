"""The figures of the comparison per value of a group column (``gae diff --group-by``):
flat per-group arrays merged across batches and files, the groups hit hardest (what the
reports show), and every group as Arrow record batches (the ``--groups-out`` file)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Optional

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaecli.advantages.keyed import KeyTable
from gaecli.comparison.figures import PRODUCT_SUMS, RowFigures, correlations
from gaecli.comparison.keys import json_value
from gaecli.errors import GAEUsageError

GROUP_SUMS = (
    "samples",
    "tokens",
    "trainable_tokens",
    "changed_samples",
    "fully_masked_samples",
    "masked_tail_samples",
    "credit_sum",
    "sum_abs",
    "sum_abs_return",
    "sign_flips",
    *PRODUCT_SUMS,
)
_SUM = {name: index for index, name in enumerate(GROUP_SUMS)}
GROUP_MAXIMA = ("max_abs_delta_advantage", "max_abs_delta_return")

# each group's figures: the keys of a ``groups[]`` entry after ``key``, and the columns of
# the ``--groups-out`` file after ``key`` (docs/diff.md)
GROUP_FIGURES = (
    ("samples", pa.int64()),
    ("tokens", pa.int64()),
    ("trainable_tokens", pa.int64()),
    ("changed_samples", pa.int64()),
    ("changed_share", pa.float64()),
    ("fully_masked_samples", pa.int64()),
    ("masked_tail_samples", pa.int64()),
    ("mean_terminal_credit", pa.float64()),
    ("mean_abs_delta_advantage", pa.float64()),
    ("max_abs_delta_advantage", pa.float64()),
    ("mean_abs_delta_return", pa.float64()),
    ("max_abs_delta_return", pa.float64()),
    ("sign_flip_share", pa.float64()),
    ("correlation", pa.float64()),
)
HARDEST_GROUPS = 20  # the groups the reports list (largest max |Δ advantage|)
GROUPS_PER_BATCH = 65_536  # groups per record batch of the --groups-out file


@numba.njit(cache=True, nogil=True)
def _add_rows(sums, maxima, codes, values, row_maxima):
    # row by row in the order given: each row's values added to its group's sums, and its
    # maxima kept when larger (a NaN sticks, as np.maximum has it)
    for i in range(codes.shape[0]):
        group = codes[i]
        for j in range(values.shape[1]):
            sums[group, j] += values[i, j]
        for j in range(row_maxima.shape[1]):
            value = row_maxima[i, j]
            if value > maxima[group, j] or value != value:
                maxima[group, j] = value


def _grown_rows(array: np.ndarray, needed: int) -> np.ndarray:
    """``array`` ``[n, k]`` copied into one of at least ``needed`` rows (doubling)."""
    grown = np.zeros((max(needed, 2 * array.shape[0]), array.shape[1]), dtype=array.dtype)
    grown[: array.shape[0]] = array
    return grown


class GroupedFigures:
    """The main figures per value of the ``--group-by`` column.

    State: the keys' :class:`gaecli.advantages.keyed.KeyTable` and, per group, the
    :data:`GROUP_SUMS` and :data:`GROUP_MAXIMA` as rows of two flat float64 arrays (136
    bytes a group besides its key), grown by doubling; no Python runs per group or per row.
    Sums are added row by row in file order within a file, and files' sums in input order
    (:meth:`merge`), so they depend neither on the batch size nor on the engine or worker
    count. Groups are numbered (codes) in first-seen order."""

    def __init__(self, baseline: Optional[str]) -> None:
        self.baseline = baseline
        self.table = KeyTable()
        self.size = 0
        self.sums = np.zeros((0, len(GROUP_SUMS)))
        self.maxima = np.zeros((0, len(GROUP_MAXIMA)))
        self.returns_compared = False

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["sums"] = self.sums[: self.size].copy()
        state["maxima"] = self.maxima[: self.size].copy()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.sums = np.array(self.sums)  # writable (a Ray result's arrays are read-only)
        self.maxima = np.array(self.maxima)

    def _grow(self) -> None:
        """Room for every key of the table (new groups start at zero)."""
        if self.table.size > self.sums.shape[0]:
            self.sums = _grown_rows(self.sums, self.table.size)
            self.maxima = _grown_rows(self.maxima, self.table.size)
        self.size = self.table.size

    def update(self, keys: pa.Array, rows: RowFigures) -> np.ndarray:
        """Add one batch's rows under their group keys; returns each row's group code."""
        codes = self.table.encode(keys)
        self._grow()
        with_returns = not np.isnan(rows.max_abs_return).all() if rows.lengths.size else False
        self.returns_compared |= with_returns
        values = np.empty((rows.lengths.size, len(GROUP_SUMS)))
        values[:, _SUM["samples"]] = 1.0
        values[:, _SUM["tokens"]] = rows.lengths
        values[:, _SUM["trainable_tokens"]] = rows.trainable
        values[:, _SUM["changed_samples"]] = rows.changed
        values[:, _SUM["fully_masked_samples"]] = rows.fully_masked
        values[:, _SUM["masked_tail_samples"]] = rows.with_tail
        values[:, _SUM["credit_sum"]] = np.where(rows.with_tail & ~np.isnan(rows.credit), rows.credit, 0.0)
        values[:, _SUM["sum_abs"]] = rows.sum_abs
        values[:, _SUM["sum_abs_return"]] = np.nan_to_num(rows.sum_abs_return)
        values[:, _SUM["sign_flips"]] = rows.sign_flips
        values[:, _SUM[PRODUCT_SUMS[0]] :] = rows.sums
        row_maxima = np.column_stack([rows.max_abs, np.nan_to_num(rows.max_abs_return)]).astype(np.float64)
        _add_rows(self.sums, self.maxima, codes, values, row_maxima)
        return codes

    def merge(self, other: "GroupedFigures") -> None:
        """Add another partition's groups (the next file): sums add, maxima combine, new keys
        come after ours in their first-seen order. Files are merged in input order, so the
        figures do not depend on the engine or the number of workers. While this holds no
        group yet, ``other``'s table and arrays are taken over rather than copied (the same
        figures, half the memory at a million groups): ``other`` is spent by the merge."""
        self.returns_compared |= other.returns_compared
        if other.size == 0:
            return
        if self.size == 0 and self.table.kind is None:
            self.table, self.sums, self.maxima, self.size = other.table, other.sums, other.maxima, other.size
            return
        codes = self.table.encode(other.table.keys())  # distinct: one per group of other
        self._grow()
        self.sums[codes] += other.sums[: other.size]
        self.maxima[codes] = np.maximum(self.maxima[codes], other.maxima[: other.size])

    # ------------------------------------------------------------------------- results

    def hardest(self, count: int = HARDEST_GROUPS) -> np.ndarray:
        """The codes of the ``count`` groups with the largest max |Δ advantage|, largest
        first (a NaN maximum counts as the largest); ties in first-seen order (input file
        order, then row). Linear in the number of groups (a partition, not a sort)."""
        ranks = self.maxima[: self.size, 0]
        ranks = np.where(np.isnan(ranks), np.inf, ranks)
        candidates = np.arange(self.size)
        if self.size > count:
            if count == 0:
                return candidates[:0]
            threshold = ranks[np.argpartition(ranks, self.size - count)[self.size - count]]
            candidates = np.flatnonzero(ranks >= threshold)  # every tie at the cut
        order = np.lexsort((candidates, -ranks[candidates]))
        return candidates[order][:count]

    def figures(self, codes: np.ndarray) -> dict[str, pa.Array]:
        """The :data:`GROUP_FIGURES` of groups ``codes``, as Arrow arrays (null where a
        figure is undefined, as docs/diff.md says)."""
        sums = self.sums[codes]
        maxima = self.maxima[codes]

        def total(name: str) -> np.ndarray:
            return sums[:, _SUM[name]]

        def share(part: np.ndarray, whole: np.ndarray, defined: np.ndarray) -> pa.Array:
            with np.errstate(invalid="ignore", divide="ignore"):
                return pa.array(part / np.where(defined, whole, 1.0), pa.float64(), mask=~defined)

        samples, trainable, tails = total("samples"), total("trainable_tokens"), total("masked_tail_samples")
        with_trainable = trainable > 0
        compared = np.full(codes.size, self.returns_compared)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_abs = np.where(with_trainable, total("sum_abs") / np.where(with_trainable, trainable, 1.0), 0.0)
            mean_abs_return = np.where(
                with_trainable, total("sum_abs_return") / np.where(with_trainable, trainable, 1.0), 0.0
            )
        correlation = correlations(trainable, sums[:, _SUM[PRODUCT_SUMS[0]] :])
        return {
            "samples": pa.array(samples.astype(np.int64)),
            "tokens": pa.array(total("tokens").astype(np.int64)),
            "trainable_tokens": pa.array(trainable.astype(np.int64)),
            "changed_samples": pa.array(total("changed_samples").astype(np.int64)),
            "changed_share": share(total("changed_samples"), samples, samples > 0),
            "fully_masked_samples": pa.array(total("fully_masked_samples").astype(np.int64)),
            "masked_tail_samples": pa.array(tails.astype(np.int64)),
            "mean_terminal_credit": share(total("credit_sum"), tails, (tails > 0) & (self.baseline is not None)),
            "mean_abs_delta_advantage": pa.array(mean_abs, pa.float64()),
            "max_abs_delta_advantage": pa.array(maxima[:, 0], pa.float64()),
            "mean_abs_delta_return": pa.array(mean_abs_return, pa.float64(), mask=~compared),
            "max_abs_delta_return": pa.array(maxima[:, 1], pa.float64(), mask=~compared),
            "sign_flip_share": share(total("sign_flips"), trainable, with_trainable),
            "correlation": pa.array(correlation, pa.float64(), mask=np.isnan(correlation)),
        }

    def entries(self, codes: np.ndarray) -> list[dict]:
        """The ``groups[]`` entries of the JSON report for groups ``codes``, in that order."""
        columns = {"key": self.table.keys().take(pa.array(codes, pa.int64())), **self.figures(codes)}
        listed = {name: column.to_pylist() for name, column in columns.items()}
        listed["key"] = [json_value(key) for key in listed["key"]]
        return [dict(zip(listed, values, strict=True)) for values in zip(*listed.values(), strict=True)]

    def keys(self, key_type: Optional[pa.DataType] = None) -> pa.Array:
        """Every group's key in code order, as ``key_type`` (the group column's type in the
        first input) when given: keys of another file's type that do not fit it are a
        :class:`GAEUsageError`."""
        keys = self.table.keys()
        if key_type is None or keys.type == key_type:
            return keys
        try:
            return keys.cast(key_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise GAEUsageError(f"group keys of type {self.table.key_type} cannot be written as {key_type}") from error

    def batches(
        self,
        comparison: str,
        key_type: Optional[pa.DataType] = None,
        groups_per_batch: int = GROUPS_PER_BATCH,
        group_by: Optional[str] = None,
    ) -> Iterator[pa.RecordBatch]:
        """Every group as rows of record batches of :func:`groups_schema` (the group column,
        named after ``group_by``, ``comparison``, then the :data:`GROUP_FIGURES`), in key
        order (ascending, nulls last); ``key_type`` as :meth:`keys`. Memory beyond the state:
        the keys, their sort order and one batch of figures."""
        keys = self.keys(key_type)
        order = pc.array_sort_indices(keys, order="ascending", null_placement="at_end").to_numpy()
        schema = groups_schema(keys.type, group_by)
        for start in range(0, order.size, groups_per_batch):
            codes = order[start : start + groups_per_batch]
            figures = self.figures(codes)
            arrays = [
                keys.take(pa.array(codes, pa.int64())),
                pa.array([comparison] * codes.size, pa.string()),
                *(figures[name] for name, _ in GROUP_FIGURES),
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def group_key_type(schema: pa.Schema, column: Optional[str]) -> Optional[pa.DataType]:
    """The type of the group column ``column`` in ``schema`` (a dictionary's value type);
    None without a column."""
    if column is None:
        return None
    arrow_type = schema.field(column).type
    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


def group_column_name(group_by: Optional[str], taken: Iterable[str]) -> str:
    """The name of the group column in a file of figures: the user's group column's own
    name, ``group_`` before it where it would collide with one of the file's other columns
    (``taken``); ``key`` without a name (a caller that gives none)."""
    if group_by is None:
        return "key"
    return f"group_{group_by}" if group_by in set(taken) else group_by


GROUPS_OUT_COLUMNS = ("comparison", *(name for name, _ in GROUP_FIGURES))
"""The columns of the ``--groups-out`` file after its group column."""


def groups_schema(key_type: pa.DataType, group_by: Optional[str] = None) -> pa.Schema:
    """The ``--groups-out`` file's schema: the group column (named after ``group_by``,
    :func:`group_column_name`; the group column's type), ``comparison`` (the old side's
    name), then the :data:`GROUP_FIGURES`."""
    figures = (pa.field(name, arrow_type) for name, arrow_type in GROUP_FIGURES)
    key = pa.field(group_column_name(group_by, GROUPS_OUT_COLUMNS), key_type)
    return pa.schema([key, pa.field("comparison", pa.string()), *figures])
