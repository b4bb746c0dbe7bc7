"""Keyed statistics that do not depend on batch size or engine: dense codes of Arrow keys
(:class:`KeyTable`, a numba hash table) and compensated per-key sums of any number of
per-row quantities (:class:`KeyedSums`), added in row order, merged in input order, cut down
to one file's keys and pickled once. The whitening moments and the critic-free estimators'
group and step statistics are both such sums (:mod:`gaecli.advantages.statistics`)."""

from __future__ import annotations

from typing import Mapping, Optional

import numba
import numpy as np
import pyarrow as pa

from gaecli.errors import GAEInputError, GAEUsageError


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


def is_text_type(arrow_type: pa.DataType) -> bool:
    """Whether ids of this Arrow type are kept as their bytes: (large) strings and binaries."""
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
    )


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
    if not is_text_type(kind_type):
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
            return binary.cast(self.key_type if is_text_type(self.key_type) else pa.string())
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
def _add_rows(codes, counts, count_rows, sums, errors, sum_rows, lows, low_rows, highs, high_rows):
    # Every quantity of every row added to its key's, rows in the order given. Sums are
    # Neumaier's compensated summation: the rounding error of every addition is kept in the
    # key's compensation term. Counts are exact; lows and highs keep a NaN once seen.
    for i in range(codes.shape[0]):
        key = codes[i]
        for q in range(count_rows.shape[0]):
            counts[q, key] += count_rows[q, i]
        for q in range(sum_rows.shape[0]):
            x = sum_rows[q, i]
            s = sums[q, key]
            t = s + x
            if abs(s) >= abs(x):
                errors[q, key] += (s - t) + x
            else:
                errors[q, key] += (x - t) + s
            sums[q, key] = t
        for q in range(low_rows.shape[0]):
            x = low_rows[q, i]
            if x < lows[q, key] or x != x:
                lows[q, key] = x
        for q in range(high_rows.shape[0]):
            x = high_rows[q, i]
            if x > highs[q, key] or x != x:
                highs[q, key] = x


@numba.njit(cache=True, nogil=True)
def _add_top_two(codes, tops, seconds, top_rows):
    # The two highest values of every quantity per key, a value seen twice counted twice (a
    # tied maximum is also the second highest); rows in the order given.
    for i in range(codes.shape[0]):
        key = codes[i]
        for q in range(top_rows.shape[0]):
            x = top_rows[q, i]
            if x > tops[q, key]:
                seconds[q, key] = tops[q, key]
                tops[q, key] = x
            elif x > seconds[q, key]:
                seconds[q, key] = x


_KINDS = ("counts", "sums", "errors", "lows", "highs", "tops", "seconds")


class KeyedSums:
    """Per key (coded by a :class:`KeyTable`; or one key for the whole input): exact integer
    sums of the quantities :attr:`COUNTS`, compensated (Neumaier) sums of :attr:`SUMS`, the
    lowest of :attr:`LOWS`, the highest of :attr:`HIGHS` and the two highest of
    :attr:`TOP_TWOS` (with multiplicity). A subclass names its quantities
    and the statistics derived from them (:class:`gaecli.advantages.statistics.Moments`,
    :class:`~gaecli.advantages.statistics.Scores`).

    Rows are added in the order given (within a file, file order: the same for every batch
    size); :meth:`merge` adds other parts' keys in the order called (the commands merge
    per-file parts in input order, whatever the engine and worker count), so the sums are
    the same bits for a given list of files, within about one rounding of each key's exact
    total. State: 8 bytes per quantity and key (16 per sum) and the keys' bytes; no Python
    runs per row or per key. Picklable (only the keys in use travel)."""

    COUNTS: tuple[str, ...] = ()
    SUMS: tuple[str, ...] = ()
    LOWS: tuple[str, ...] = ()
    HIGHS: tuple[str, ...] = ()
    TOP_TWOS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.table: Optional[KeyTable] = None  # None: one key (the whole input)
        self.size = 0
        self.counts = np.zeros((len(self.COUNTS), 0), dtype=np.int64)
        self.sums = np.zeros((len(self.SUMS), 0), dtype=np.float64)
        self.errors = np.zeros((len(self.SUMS), 0), dtype=np.float64)
        self.lows = np.zeros((len(self.LOWS), 0), dtype=np.float64)
        self.highs = np.zeros((len(self.HIGHS), 0), dtype=np.float64)
        self.tops = np.zeros((len(self.TOP_TWOS), 0), dtype=np.float64)
        self.seconds = np.zeros((len(self.TOP_TWOS), 0), dtype=np.float64)
        self._derived: dict = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for kind in _KINDS:
            state[kind] = state[kind][:, : self.size].copy()
        state["_derived"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for kind in _KINDS:
            setattr(self, kind, np.array(getattr(self, kind)))  # writable (a Ray result's arrays are read-only)

    def codes(self, keys: Optional[pa.Array], rows: int, insert: bool = True) -> np.ndarray:
        """The code of each row's key (``keys``: an Arrow array, or None for one key); an
        unknown key gets −1 unless ``insert``."""
        if keys is None:
            if self.table is not None:
                raise ValueError("keyed sums: keys needed")
            if insert and self.size == 0:
                self._resize(1)
            return np.zeros(rows, dtype=np.int64)
        if self.table is None:
            if self.size:
                raise ValueError("keyed sums: one key, no keys expected")
            self.table = KeyTable()
        codes = self.table.encode(keys, insert)
        if insert and self.table.size > self.size:
            self._resize(self.table.size)
        return codes

    def known_codes(self, keys: Optional[pa.Array], rows: int, what: str) -> np.ndarray:
        """:meth:`codes` of keys that must be here; one that is not raises
        :class:`GAEInputError` naming it (``what``: the kind of key)."""
        codes = self.codes(keys, rows, insert=False)
        if rows and (codes < 0).any():
            raise GAEInputError(f"{what} {keys[int(np.flatnonzero(codes < 0)[0])].as_py()!r} has no statistics")
        return codes

    def _resize(self, size: int) -> None:
        if self.capacity < size:
            capacity = max(size, 2 * self.capacity)
            old = self.capacity
            for kind in _KINDS:
                array = getattr(self, kind)
                grown = np.zeros((array.shape[0], capacity), dtype=array.dtype)
                grown[:, :old] = array[:, :old]
                setattr(self, kind, grown)
            self.lows[:, old:] = np.inf
            for kind in ("highs", "tops", "seconds"):
                getattr(self, kind)[:, old:] = -np.inf
        self.size = size

    @property
    def capacity(self) -> int:
        """The keys the arrays have room for."""
        return self.errors.shape[1]

    def add(self, keys: Optional[pa.Array], rows: Mapping[str, np.ndarray]) -> None:
        """Add rows in row order: their keys (an Arrow array, or None for one key) and every
        quantity of the class, by name (``rows[name]``, one value per row)."""
        codes = self.codes(keys, len(keys) if keys is not None else _rows_of(rows))
        if self.TOP_TWOS:
            _add_top_two(codes, self.tops, self.seconds, _stacked(rows, self.TOP_TWOS, np.float64))
        self._add(codes, *(_stacked(rows, names, dtype) for names, dtype in self._layout()))

    def _layout(self):
        return (
            (self.COUNTS, np.int64),
            (self.SUMS, np.float64),
            (self.LOWS, np.float64),
            (self.HIGHS, np.float64),
        )

    def _add(self, codes, counts, sums, lows, highs) -> None:
        _add_rows(codes, self.counts, counts, self.sums, self.errors, sums, self.lows, lows, self.highs, highs)
        self._derived = {}

    def merge(self, other: "KeyedSums") -> np.ndarray:
        """Add another part's keys (new keys after ours, in its order); returns the code here
        of each of its keys."""
        if other.size == 0:
            return np.zeros(0, dtype=np.int64)
        size = other.size
        codes = self.codes(None if other.table is None else other.table.keys(), size)
        part = [np.ascontiguousarray(getattr(other, kind)[:, :size]) for kind in ("counts", "sums", "lows", "highs")]
        if self.TOP_TWOS:  # its two highest of each key added as two rows
            for kind in ("tops", "seconds"):
                _add_top_two(codes, self.tops, self.seconds, np.ascontiguousarray(getattr(other, kind)[:, :size]))
        self._add(codes, *part)
        self.errors[:, codes] += other.errors[:, :size]  # the codes of one part's keys are distinct
        return codes

    def subset(self, codes: np.ndarray, table: Optional[KeyTable] = None) -> "KeyedSums":
        """The keys ``codes`` (distinct) alone, in that order: what one file's unit needs.
        ``table``: a key table holding exactly those keys in that order (the file's part's,
        whose codes :meth:`merge` returned), shared rather than rebuilt."""
        part = type(self)()
        if self.table is not None:
            part.table = table
            if table is None:
                part.table = KeyTable()
                part.table.encode(self.table.keys().take(pa.array(codes, type=pa.int64())))
        part.size = codes.size
        for kind in _KINDS:
            setattr(part, kind, getattr(self, kind)[:, codes].copy())
        return part

    def count(self, name: str) -> np.ndarray:
        """Each key's exact sum of the integer quantity ``name`` (int64 ``[keys]``)."""
        return self.counts[self.COUNTS.index(name), : self.size]

    def total(self, name: str) -> np.ndarray:
        """Each key's compensated sum of ``name`` (float64 ``[keys]``)."""
        index = self.SUMS.index(name)
        return self.sums[index, : self.size] + self.errors[index, : self.size]

    def low(self, name: str) -> np.ndarray:
        """Each key's lowest ``name`` (float64 ``[keys]``; +inf for a key without rows)."""
        return self.lows[self.LOWS.index(name), : self.size]

    def high(self, name: str) -> np.ndarray:
        """Each key's highest ``name`` (float64 ``[keys]``; −inf for a key without rows)."""
        return self.highs[self.HIGHS.index(name), : self.size]

    def top_two(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Each key's highest and second-highest ``name`` (float64 ``[keys]``; a value that
        came twice is both; −inf where a key has fewer rows)."""
        index = self.TOP_TWOS.index(name)
        return self.tops[index, : self.size], self.seconds[index, : self.size]

    def key(self, code: int):
        """The key of ``code`` (None for the whole input)."""
        return None if self.table is None else self.table.keys()[code].as_py()

    def derived(self, name, compute):
        """``compute()``, kept until rows are added or merged (statistics derived from the
        sums, read once per batch)."""
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]


def _rows_of(rows: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(rows.values()))) if rows else 0


def _stacked(rows: Mapping[str, np.ndarray], names: tuple[str, ...], dtype) -> np.ndarray:
    """The quantities ``names`` of some rows as one C-contiguous ``[quantities, rows]`` array."""
    stacked = np.empty((len(names), _rows_of(rows)), dtype=dtype)
    for index, name in enumerate(names):
        stacked[index] = rows[name]
    return stacked


_KEY_KINDS = {"integer": 0, "float": 1, "bytes": 2}


@numba.njit(cache=True, nogil=True)
def _position_key_bytes(kind, data, offsets, token_rows, positions, out_offsets, out):
    # Each entry's key: the kind byte, its row's key bytes, then its position (8 bytes,
    # little-endian): a fixed-width tail, so two keys are equal exactly when both parts are.
    for t in range(token_rows.shape[0]):
        row = token_rows[t]
        start, end = offsets[row], offsets[row + 1]
        first = out_offsets[t]
        out[first] = kind
        for k in range(end - start):
            out[first + 1 + k] = data[start + k]
        position = np.uint64(positions[t])
        tail = first + 1 + (end - start)
        for b in range(8):
            out[tail + b] = np.uint8((position >> np.uint64(8 * b)) & np.uint64(0xFF))


def position_keys(keys: pa.Array, token_rows: np.ndarray, positions: np.ndarray) -> pa.Array:
    """Composite keys (row key, position): one binary key per entry, the key of its row
    (``keys[token_rows[i]]``, coded as :class:`KeyTable` codes it: integers by value, floats by
    their float64 bits, strings by their bytes) followed by ``positions[i]``; a
    :class:`KeyedSums` keyed by them keeps one set of sums per (group, position).
    The rows' keys must not be null."""
    kind, _, data, offsets, valid = _key_bytes(keys)
    if not valid.all():
        raise ValueError("position keys: a row key is null")
    token_rows = np.ascontiguousarray(token_rows, dtype=np.int64)
    lengths = (offsets[1:] - offsets[:-1])[token_rows] + 9
    out_offsets = np.zeros(token_rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    _position_key_bytes(_KEY_KINDS[kind], data, offsets, token_rows, positions, out_offsets, out)
    buffers = [None, pa.py_buffer(out_offsets), pa.py_buffer(out)]
    return pa.Array.from_buffers(pa.large_binary(), token_rows.size, buffers)
