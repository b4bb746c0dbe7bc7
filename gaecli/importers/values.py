"""How an importer reads and shows one value of a dump: checked int64 integers, what a
tensor is (:func:`describe`) and the bounded text every message shows of a value
(:func:`shown`), which never walks more than a few dozen entries of whatever a dump holds."""

from __future__ import annotations

from typing import Any, Optional

import torch

from gaecli.errors import GAEInputError

INT64_RANGE = (-(2**63), 2**63 - 1)
# What a message shows of a value from a dump (shown): at most this many characters, the
# first SHOWN_ITEMS entries of a container, SHOWN_DEPTH containers deep. A 3 KB dump can
# hold a tuple of 2^90 shared leaves or a list 300,000 levels deep: repr() never ends or
# overflows the stack on them.
SHOWN_CHARACTERS = 60
SHOWN_ITEMS = 4
SHOWN_DEPTH = 3


def integer(value: Any, what: str, path: Any, minimum: Optional[int] = None) -> int:
    """An int64 integer (at least ``minimum`` when given) from an int or a one-element
    integer tensor; else :class:`GAEInputError`. A bool (``True``, a bool tensor) is no
    integer: refused, never taken as 0 or 1."""
    if is_dense(value) and value.numel() == 1 and value.dim() <= 1 and _is_integer_dtype(value.dtype):
        number = int(value.item())
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise GAEInputError(f"{path}: {what} is {shown(value)}, expected an integer")
    if not INT64_RANGE[0] <= number <= INT64_RANGE[1]:
        raise GAEInputError(f"{path}: {what} is {shown(number)}, out of the int64 range")
    if minimum is not None and number < minimum:
        raise GAEInputError(f"{path}: {what} is {number}, expected {minimum} or more")
    return number


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def is_dense(value: Any) -> bool:
    """A tensor with its numbers in memory (strided: not sparse, not nested)."""
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def describe(value: Any) -> str:
    """What ``value`` is, by its type (a tensor: its dimensions, layout and shape); reads no entry."""
    if isinstance(value, torch.Tensor):
        layout = "" if value.layout == torch.strided else f"{str(value.layout).removeprefix('torch.')} "
        return f"a {value.dim()}-D {layout}tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def shown(value: Any) -> str:
    """``value`` as a message shows it: its repr when short; else bounded whatever it holds
    (at most :data:`SHOWN_CHARACTERS` characters, a container's first :data:`SHOWN_ITEMS`
    entries to :data:`SHOWN_DEPTH` levels, a tensor by :func:`describe`, an integer of
    many digits by their count). Walks a few dozen entries at most: every message that
    shows a value from a dump goes through here."""
    text = _shown(value, SHOWN_DEPTH)
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 1] + "…"


def _shown(value: Any, depth: int) -> str:
    if isinstance(value, torch.Tensor):
        return describe(value)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {digit_count(value):,} digits"
    if value is None or isinstance(value, (bool, int, float, complex, torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, (str, bytes)):
        return repr(value[:SHOWN_CHARACTERS]) + ("…" if len(value) > SHOWN_CHARACTERS else "")
    if isinstance(value, (list, tuple, dict)):
        opening, closing = {list: "[]", tuple: "()"}.get(type(value), "{}")
        if not value:
            return opening + closing
        if depth == 0:
            return f"{opening}…{closing}"
        entries = list(value.items())[:SHOWN_ITEMS] if isinstance(value, dict) else value[:SHOWN_ITEMS]
        parts = [
            f"{_shown(entry[0], depth - 1)}: {_shown(entry[1], depth - 1)}"
            if isinstance(value, dict)
            else _shown(entry, depth - 1)
            for entry in entries
        ]
        if len(value) > SHOWN_ITEMS:
            parts.append("…")
        single = "," if isinstance(value, tuple) and len(value) == 1 else ""
        return f"{opening}{', '.join(parts)}{single}{closing}"
    return f"a {type(value).__name__}"


def digit_count(number: int) -> int:
    """The decimal digits of ``number`` without ``str()`` (refused beyond 4,300 digits)."""
    number = abs(number)
    estimate = max(1, int(number.bit_length() * 0.30102999566398120))
    return estimate + (number >= 10**estimate)


def key_list(mapping: dict) -> str:
    return ", ".join(key if isinstance(key, str) else shown(key) for key in mapping) or "no keys"
