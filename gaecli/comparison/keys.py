"""Group keys and sample ids as JSON can hold them (the ``gae diff`` report's ``key``,
``id`` and ``group`` fields)."""

from __future__ import annotations

import math


def json_value(value):
    """A key or id as JSON can hold it: numbers and strings as they are, the rest as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)
