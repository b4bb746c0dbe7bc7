"""Checks of option values, written once for every command's options: each refuses a value
with :class:`gaecli.errors.InvalidOptionError` and one line naming the option as the CLI
spells it. The options dataclasses call them from ``__post_init__``."""

from __future__ import annotations

import math
from typing import Collection, Optional

from gaecli.errors import InvalidOptionError

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
"""The torch device types the kernels run on (``cuda:N`` names one GPU)."""


ON_INVALID_MODES: tuple[str, ...] = ("stop", "skip")
"""What an invalid row does: stop the run, or go to the rejects file while the run goes on."""


def check_choice(option: str, value: object, choices: Collection[str], what: str) -> None:
    """Refuse a ``value`` that is not one of ``choices`` (``what``: what a value names)."""
    if value not in choices:
        raise InvalidOptionError(f"{option}: unknown {what} {value!r}; choose one of: {', '.join(choices)}")


MAX_COUNT = 2**63 - 1
"""The largest count any option takes: the largest 64-bit integer, what Arrow, numpy and
the engines hold a count in (a larger one would overflow deep in the run)."""


def check_count(option: str, value: Optional[int], minimum: int) -> None:
    """Refuse an integer ``value`` below ``minimum`` or above :data:`MAX_COUNT` (None
    passes: the default applies)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(f"{option} must be a whole number, got {value!r}")
    if value < minimum:
        raise InvalidOptionError(f"{option} must be at least {minimum}, got {value}")
    if value > MAX_COUNT:
        raise InvalidOptionError(f"{option} must be at most {MAX_COUNT}, got {value}")


def check_number(option: str, value: Optional[float], low: float = -math.inf, high: float = math.inf) -> None:
    """Refuse a ``value`` that is not a finite number in [``low``, ``high``] (None passes)."""
    if value is None:
        return
    bounds = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}" if math.isfinite(low) else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidOptionError(f"{option} must be a finite number{' ' if bounds else ''}{bounds}, got {value!r}")
    if not low <= value <= high:
        raise InvalidOptionError(f"{option} must be {bounds}, got {value:g}")
