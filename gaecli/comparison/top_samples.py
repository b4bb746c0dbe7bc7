"""The samples with the largest max |Δ advantage| (``gae diff``'s top samples), each kept
with its per-token arrays for the plots (memory: K × length), the same list for any
batching or partition."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from gaecli.comparison.keys import json_value


@dataclass
class TopSample:
    """One of the samples with the largest max |Δ advantage|, with its per-token arrays
    (new and old advantages, trainable mask) for the plots."""

    file_index: int
    file: str
    row: int
    id: Any
    group: Any
    length: int
    trainable_tokens: int
    masked_share: float
    masked_tail: int
    max_abs_delta_advantage: float
    mean_abs_delta_advantage: float
    max_abs_delta_return: Optional[float]
    sign_flips: int
    terminal_credit: Optional[float]
    changed: bool
    new: np.ndarray = field(repr=False)
    old: np.ndarray = field(repr=False)
    trainable: np.ndarray = field(repr=False)

    @property
    def order(self) -> tuple:
        """Largest max |Δ| first; ties by file, then row."""
        return (-self.max_abs_delta_advantage, self.file_index, self.row)

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "row": self.row,
            "id": json_value(self.id),
            "group": json_value(self.group),
            "length": self.length,
            "trainable_tokens": self.trainable_tokens,
            "masked_share": self.masked_share,
            "masked_tail": self.masked_tail,
            "max_abs_delta_advantage": self.max_abs_delta_advantage,
            "mean_abs_delta_advantage": self.mean_abs_delta_advantage,
            "max_abs_delta_return": self.max_abs_delta_return,
            "sign_flips": self.sign_flips,
            "terminal_credit": self.terminal_credit,
            "changed": self.changed,
        }


def finite_or_none(value: float) -> Optional[float]:
    """``value`` as a float, or None when it is NaN or infinite (a figure not defined)."""
    value = float(value)
    return value if math.isfinite(value) else None


class TopSamples:
    """The K samples with the largest max |Δ advantage| (samples without any difference are
    not listed), ties broken by (file, row): per batch a partition picks at most K
    candidates, which are merged into the kept list only when they beat its last entry."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.entries: list[TopSample] = []

    def candidates(self, max_abs: np.ndarray) -> np.ndarray:
        """Rows of a batch that may enter: at most K, the largest first, ties by row."""
        if self.k == 0:
            return np.zeros(0, dtype=np.int64)
        rows = np.flatnonzero(max_abs > 0.0)
        if rows.size > self.k:
            scores = max_abs[rows]
            kth = np.partition(scores, rows.size - self.k)[rows.size - self.k]
            above, equal = rows[scores > kth], rows[scores == kth]
            rows = np.concatenate([above, equal[: self.k - above.size]])
        if len(self.entries) == self.k:
            worst = self.entries[-1].max_abs_delta_advantage
            rows = rows[max_abs[rows] >= worst]
        return rows

    def offer(self, entries: list[TopSample]) -> None:
        self.entries = sorted(self.entries + entries, key=lambda entry: entry.order)[: self.k]

    def merge(self, other: "TopSamples") -> None:
        """Add another partition's top samples: the K first by the same order key (largest
        max |Δ|, then file, then row), so any partition gives the same list."""
        self.offer(other.entries)
