"""Group codes and grouped statistics that do not depend on batch size or engine: the
numba hash table of Arrow keys (:class:`KeyTable`), the whitening statistics of
``--normalize`` / ``--normalize-by`` (:class:`GroupedMoments`, compensated sums per group)."""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np
import pyarrow as pa

from gaecli.errors import GAEUsageError


@numba.njit(cache=True, nogil=True)
def _hash_bytes(data, start, end):
    # FNV-1a over the bytes, then a final avalanche (splitmix64) so that the low bits
    # that pick a slot depend on every byte
    h = np.uint64(14695981039346656037)
    for k in range(start, end):
        h = (h ^ np.uint64(data[k])) * np.uint64(1099511628211)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _same_bytes(data, start, end, stored, stored_start, stored_end):
    if end - start != stored_end - stored_start:
        return False
    for k in range(end - start):
        if data[start + k] != stored[stored_start + k]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _encode_rows(slots, slot_hashes, stored, stored_offsets, size, null_code, data, offsets, valid, insert, codes):
    # Open addressing with linear probing: slots hold codes (-1: empty), slot_hashes their
    # keys' hashes; a key's bytes are stored[stored_offsets[code]:stored_offsets[code + 1]].
    # New keys get the next code (first-seen order); with insert False they get -1.
    mask = np.uint64(slots.shape[0] - 1)
    for row in range(offsets.shape[0] - 1):
        if not valid[row]:
            if null_code < 0 and insert:
                null_code = size
                stored_offsets[size + 1] = stored_offsets[size]
                size += 1
            codes[row] = null_code
            continue
        start, end = offsets[row], offsets[row + 1]
        h = _hash_bytes(data, start, end)
        slot = h & mask
        while True:
            code = slots[slot]
            if code < 0:
                if insert:
                    slots[slot] = size
                    slot_hashes[slot] = h
                    first = stored_offsets[size]
                    for k in range(end - start):
                        stored[first + k] = data[start + k]
                    stored_offsets[size + 1] = first + (end - start)
                    code = size
                    size += 1
                codes[row] = code
                break
            if (
                slot_hashes[slot] == h
                and code != null_code
                and _same_bytes(data, start, end, stored, stored_offsets[code], stored_offsets[code + 1])
            ):
                codes[row] = code
                break
            slot = (slot + np.uint64(1)) & mask
    return size, null_code


@numba.njit(cache=True, nogil=True)
def _rehash(slots, slot_hashes, stored, stored_offsets, size, null_code):
    mask = np.uint64(slots.shape[0] - 1)
    for code in range(size):
        if code == null_code:
            continue
        h = _hash_bytes(stored, stored_offsets[code], stored_offsets[code + 1])
        slot = h & mask
        while slots[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        slots[slot] = code
        slot_hashes[slot] = h


def _is_time_like(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_date(arrow_type)
        or pa.types.is_time(arrow_type)
        or pa.types.is_timestamp(arrow_type)
        or pa.types.is_duration(arrow_type)
    )


def _storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """The integer type a date, time, timestamp or duration is stored as."""
    return pa.int64() if arrow_type.bit_width == 64 else pa.int32()


def _key_bytes(keys: pa.Array) -> tuple[str, pa.DataType, np.ndarray, np.ndarray, np.ndarray]:
    """A key column as one byte string per row: (kind, the type keys are returned as, the
    bytes, offsets ``[B + 1]``, validity ``[B]``). Integers, booleans and temporal types are
    their int64 value, floats their float64 bits (one NaN, and −0.0 as 0.0, as Python's
    equality has it), strings and binaries their bytes; any other type its text."""
    if pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    valid = np.ones(len(keys), dtype=bool) if not keys.null_count else np.asarray(keys.is_valid())
    kind_type = keys.type
    if pa.types.is_floating(kind_type):
        numbers = np.asarray(keys.cast(pa.float64()).fill_null(0.0)) + 0.0
        numbers = np.where(np.isnan(numbers), np.nan, numbers)
        return "float", pa.float64(), numbers.view(np.uint8), np.arange(len(keys) + 1, dtype=np.int64) * 8, valid
    if pa.types.is_uint64(kind_type):
        numbers = np.ascontiguousarray(np.asarray(keys.fill_null(0)), dtype=np.uint64)
        return "integer", kind_type, numbers.view(np.uint8), np.arange(len(keys) + 1, dtype=np.int64) * 8, valid
    if pa.types.is_integer(kind_type) or pa.types.is_boolean(kind_type) or _is_time_like(kind_type):
        as_integers = keys.view(_storage_type(kind_type)) if _is_time_like(kind_type) else keys
        numbers = np.ascontiguousarray(np.asarray(as_integers.cast(pa.int64()).fill_null(0)), dtype=np.int64)
        return "integer", kind_type, numbers.view(np.uint8), np.arange(len(keys) + 1, dtype=np.int64) * 8, valid
    if not (
        pa.types.is_string(kind_type)
        or pa.types.is_large_string(kind_type)
        or pa.types.is_binary(kind_type)
        or pa.types.is_large_binary(kind_type)
    ):
        keys, kind_type = keys.cast(pa.string()), pa.string()
    binary = keys.cast(pa.large_binary())
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[binary.offset : binary.offset + len(binary) + 1]
    data = binary.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return "bytes", kind_type, data, offsets, valid


class KeyTable:
    """Dense codes for the distinct values of a key column, in first-seen order (nulls are a
    key of their own): a hash table over each key's bytes (:func:`_key_bytes`) with the
    bytes kept to compare, so codes are exact (a hash collision only costs a probe). Memory
    is proportional to the number of keys (a few dozen bytes each plus their bytes); no
    Python runs per key or per row. Picklable (the hash slots are rebuilt on first use)."""

    def __init__(self) -> None:
        self.kind: Optional[str] = None
        self.key_type: Optional[pa.DataType] = None
        self.size = 0
        self.null_code = -1
        self._stored = np.zeros(64, dtype=np.uint8)
        self._stored_offsets = np.zeros(17, dtype=np.int64)
        self._slots: Optional[np.ndarray] = None
        self._slot_hashes: Optional[np.ndarray] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stored"] = self._stored[: self._stored_offsets[self.size]].copy()
        state["_stored_offsets"] = self._stored_offsets[: self.size + 1].copy()
        state["_slots"] = state["_slot_hashes"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stored = np.array(self._stored)  # writable (a Ray result's arrays are read-only)
        self._stored_offsets = np.array(self._stored_offsets)

    def _reserve(self, keys: int, data_bytes: int) -> None:
        if self._stored_offsets.size < self.size + keys + 1:
            self._stored_offsets = _grown(self._stored_offsets, self.size + keys + 1)
        used = int(self._stored_offsets[self.size])
        if self._stored.size < used + data_bytes:
            self._stored = _grown(self._stored, used + data_bytes)
        if self._slots is None or self._slots.size < 2 * (self.size + keys):
            capacity = 1 << max(4, int(2 * (self.size + keys)).bit_length())
            self._slots = np.full(capacity, -1, dtype=np.int64)
            self._slot_hashes = np.zeros(capacity, dtype=np.uint64)
            _rehash(self._slots, self._slot_hashes, self._stored, self._stored_offsets, self.size, self.null_code)

    def encode(self, keys: pa.Array, insert: bool = True) -> np.ndarray:
        """The code of each key ``[B]`` (int64); new keys are added (``insert``) or get −1."""
        kind, key_type, data, offsets, valid = _key_bytes(keys)
        if self.kind is None:
            self.kind, self.key_type = kind, key_type
        elif kind != self.kind:
            raise GAEUsageError(f"group keys of type {key_type} cannot be matched with keys of type {self.key_type}")
        rows = len(keys)
        self._reserve(rows if insert else 0, int(offsets[-1] - offsets[0]) if insert else 0)
        codes = np.empty(rows, dtype=np.int64)
        self.size, self.null_code = _encode_rows(
            self._slots,
            self._slot_hashes,
            self._stored,
            self._stored_offsets,
            self.size,
            self.null_code,
            data,
            offsets,
            valid,
            insert,
            codes,
        )
        return codes

    def keys(self) -> pa.Array:
        """The distinct keys in code order (an Arrow array of the column's type)."""
        offsets = self._stored_offsets[: self.size + 1]
        data = self._stored[: offsets[-1]]
        validity = None
        if self.null_code >= 0:
            valid = np.ones(self.size, dtype=bool)
            valid[self.null_code] = False
            validity = pa.array(valid).buffers()[1]
        if self.kind == "bytes":
            binary = pa.Array.from_buffers(
                pa.large_binary(), self.size, [validity, pa.py_buffer(offsets.copy()), pa.py_buffer(data.copy())]
            )
            return binary.cast(
                self.key_type
                if pa.types.is_binary(self.key_type)
                or pa.types.is_string(self.key_type)
                or pa.types.is_large_string(self.key_type)
                or pa.types.is_large_binary(self.key_type)
                else pa.string()
            )
        if self.kind is None:
            return pa.array([], pa.null())
        mask = None if validity is None else ~valid
        whole = np.zeros((self.size, 8), dtype=np.uint8)
        present = np.flatnonzero(np.diff(offsets) == 8)  # every code but the null key's
        whole[present] = data[offsets[present][:, None] + np.arange(8)]
        if self.kind == "float":
            return pa.array(whole.reshape(-1).view(np.float64), mask=mask)
        numbers = whole.reshape(-1).view(np.uint64 if pa.types.is_uint64(self.key_type) else np.int64)
        array = pa.array(numbers, mask=mask)
        if _is_time_like(self.key_type):
            return array.cast(_storage_type(self.key_type)).view(self.key_type)
        return array.cast(self.key_type)


def _grown(array: np.ndarray, needed: int) -> np.ndarray:
    """``array`` copied into one of at least ``needed`` elements (doubling)."""
    grown = np.zeros(max(needed, 2 * array.size), dtype=array.dtype)
    grown[: array.size] = array
    return grown


@numba.njit(cache=True, nogil=True)
def _compensated_add(sums, compensations, codes, numbers):
    # Neumaier's compensated summation per group, in the order given: the rounding error of
    # every addition is kept in the group's compensation term.
    for i in range(codes.shape[0]):
        group = codes[i]
        x = numbers[i]
        s = sums[group]
        t = s + x
        if abs(s) >= abs(x):
            compensations[group] += (s - t) + x
        else:
            compensations[group] += (x - t) + s
        sums[group] = t


MOMENT_FIELDS = ("counts", "sums", "sum_errors", "squares", "square_errors")


class GroupedMoments:
    """Per group key (or one group, for whole-input whitening): the count, sum and sum of
    squares of trainable advantages, from per-row figures.

    Sums are compensated (Neumaier) and added row by row in the order the rows are given
    (within a file, file order: the same for every batch size); :meth:`merge` adds other
    parts' groups in the order called (the commands merge per-file parts in input order,
    whatever the engine and worker count). So the statistics are deterministic for a given
    list of files, with an error of about one rounding of each group's total (not exact
    sums: splitting the rows into other files can change the last bits). State: 40 bytes per
    group and the group's key (:class:`KeyTable`)."""

    def __init__(self) -> None:
        self.table: Optional[KeyTable] = None  # None: one group (whole input)
        self.size = 0
        for name in MOMENT_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.int64 if name == "counts" else np.float64))
        self._stats: Optional[tuple[np.ndarray, np.ndarray, float]] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in MOMENT_FIELDS:
            state[name] = state[name][: self.size].copy()
        state["_stats"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in MOMENT_FIELDS:
            setattr(self, name, np.array(getattr(self, name)))  # writable

    def _codes(self, keys: Optional[pa.Array], rows: int, insert: bool) -> np.ndarray:
        if keys is None:
            if self.table is not None:
                raise ValueError("grouped moments: keys needed")
            if insert and self.size == 0:
                self._resize(1)
            return np.zeros(rows, dtype=np.int64)
        if self.table is None:
            if self.size:
                raise ValueError("grouped moments: one group, no keys expected")
            self.table = KeyTable()
        codes = self.table.encode(keys, insert)
        if insert and self.table.size > self.size:
            self._resize(self.table.size)
        return codes

    def _resize(self, size: int) -> None:
        if self.counts.size < size:
            for name in MOMENT_FIELDS:
                setattr(self, name, _grown(getattr(self, name), size))
        self.size = size

    def add(self, keys: pa.Array | None, counts: np.ndarray, sums: np.ndarray, squares: np.ndarray) -> None:
        """Add per-row moments ``[B]`` in row order; ``keys`` is an Arrow array of one group
        key per row (None: one group)."""
        codes = self._codes(keys, counts.size, insert=True)
        np.add.at(self.counts, codes, np.asarray(counts, dtype=np.int64))
        _compensated_add(self.sums, self.sum_errors, codes, np.ascontiguousarray(sums, dtype=np.float64))
        _compensated_add(self.squares, self.square_errors, codes, np.ascontiguousarray(squares, dtype=np.float64))
        self._stats = None

    def merge(self, other: "GroupedMoments") -> np.ndarray:
        """Add another part's groups (new groups keep ``other``'s order after ours); returns
        the code here of each of ``other``'s groups."""
        if other.size == 0:
            return np.zeros(0, dtype=np.int64)
        if other.table is None:
            codes = self._codes(None, other.size, insert=True)
        else:
            codes = self._codes(other.table.keys(), other.size, insert=True)
        np.add.at(self.counts, codes, other.counts[: other.size])
        _compensated_add(self.sums, self.sum_errors, codes, other.sums[: other.size])
        _compensated_add(self.squares, self.square_errors, codes, other.squares[: other.size])
        np.add.at(self.sum_errors, codes, other.sum_errors[: other.size])
        np.add.at(self.square_errors, codes, other.square_errors[: other.size])
        self._stats = None
        return codes

    def subset(self, codes: np.ndarray, table: Optional[KeyTable] = None) -> "GroupedMoments":
        """The groups ``codes`` (distinct) alone, in that order: what one file's unit needs.
        ``table``: a key table holding exactly those keys in that order (the file's part's,
        whose codes :meth:`merge` returned), shared rather than rebuilt."""
        part = GroupedMoments()
        if self.table is not None:
            part.table = table
            if table is None:
                part.table = KeyTable()
                part.table.encode(self.table.keys().take(pa.array(codes)))
        part.size = codes.size
        for name in MOMENT_FIELDS:
            setattr(part, name, getattr(self, name)[codes].copy())
        return part

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Each group's sum and sum of squares (float64 ``[groups]``)."""
        size = self.size
        return self.sums[:size] + self.sum_errors[:size], self.squares[:size] + self.square_errors[:size]

    def key(self, code: int):
        """The key of group ``code`` (None for the whole input)."""
        return None if self.table is None else self.table.keys()[code].as_py()

    def empty_groups(self) -> np.ndarray:
        """The codes of groups without a trainable token."""
        return np.flatnonzero(self.counts[: self.size] == 0)

    def mean_std(self, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """Per group: mean and ``sqrt(var + epsilon)`` with the Bessel-corrected variance (0
        for one token); an empty group gets NaN."""
        if self._stats is None or self._stats[2] != epsilon:
            totals, squares = self.totals()
            counts = self.counts[: self.size]
            with np.errstate(invalid="ignore", divide="ignore"):
                means = totals / counts
                spread = np.maximum(squares - totals * means, 0.0)
                variances = np.where(counts > 1, spread / np.maximum(counts - 1, 1), 0.0)
            self._stats = (means, np.sqrt(variances + epsilon), epsilon)
        return self._stats[0], self._stats[1]

    def row_stats(self, keys: pa.Array | None, rows: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """Per-row mean and std of the row's group."""
        means, stds = self.mean_std(epsilon)
        codes = self._codes(keys, rows, insert=False)
        if (codes < 0).any():
            raise KeyError(f"group {keys[int(np.flatnonzero(codes < 0)[0])].as_py()!r} has no statistics")
        return means[codes], stds[codes]
