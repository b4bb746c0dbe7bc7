"""The figures of the comparison per value of a group column (``gae diff --group-by``),
merged exactly across batches and files."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyarrow as pa

from gaecli.comparison.figures import PRODUCT_SUMS, RowFigures, correlation, ratio
from gaecli.comparison.keys import json_value
from gaecli.grouping import encode_keys

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


class GroupedFigures:
    """The main figures per value of the ``--group-by`` column. Sums are added row by row
    in file order within a file (``np.add.at``), and files' sums in input order
    (:meth:`merge`), so they depend neither on the batch size nor on the engine."""

    def __init__(self, baseline: Optional[str]) -> None:
        self.baseline = baseline
        self.codes: dict[Any, int] = {}
        self.keys: list = []
        self.sums = np.zeros((0, len(GROUP_SUMS)))
        self.max_abs = np.zeros(0)  # max |Δ advantage| per group
        self.max_abs_return = np.zeros(0)  # max |Δ return| per group
        self.returns_compared = False

    def _codes(self, keys: list) -> np.ndarray:
        """The group code of each key; a key not seen yet gets the next code (first-seen
        order) and zero sums and maxima."""
        codes = np.empty(len(keys), dtype=np.int64)
        for index, key in enumerate(keys):
            code = self.codes.get(key)
            if code is None:
                code = self.codes[key] = len(self.keys)
                self.keys.append(key)
            codes[index] = code
        grow = len(self.keys) - self.sums.shape[0]
        if grow > 0:
            self.sums = np.vstack([self.sums, np.zeros((grow, self.sums.shape[1]))])
            self.max_abs = np.concatenate([self.max_abs, np.zeros(grow)])
            self.max_abs_return = np.concatenate([self.max_abs_return, np.zeros(grow)])
        return codes

    def update(self, keys: pa.Array, rows: RowFigures) -> np.ndarray:
        """Add one batch's rows under their group keys; returns each row's group code."""
        local, uniques = encode_keys(keys)
        codes = self._codes(uniques)[local]
        with_returns = not np.isnan(rows.max_abs_return).all() if rows.lengths.size else False
        self.returns_compared |= with_returns
        credit = np.where(rows.with_tail & ~np.isnan(rows.credit), rows.credit, 0.0)
        values = np.column_stack(
            [
                np.ones(rows.lengths.size),
                rows.lengths,
                rows.trainable,
                rows.changed,
                rows.fully_masked,
                rows.with_tail,
                credit,
                rows.sum_abs,
                np.nan_to_num(rows.sum_abs_return),
                rows.sign_flips,
                rows.sums,
            ]
        ).astype(np.float64)
        np.add.at(self.sums, codes, values)
        np.maximum.at(self.max_abs, codes, rows.max_abs)
        np.maximum.at(self.max_abs_return, codes, np.nan_to_num(rows.max_abs_return))
        return codes

    def merge(self, other: "GroupedFigures") -> None:
        """Add another partition's groups (the next file): sums add, maxima combine, new keys
        come after ours in their first-seen order. Files are merged in input order, so the
        figures do not depend on the engine or the number of workers."""
        codes = self._codes(other.keys)
        self.sums[codes] += other.sums
        self.max_abs[codes] = np.maximum(self.max_abs[codes], other.max_abs)
        self.max_abs_return[codes] = np.maximum(self.max_abs_return[codes], other.max_abs_return)
        self.returns_compared |= other.returns_compared

    def result(self) -> list[dict]:
        """One dict per group, in key order (first-seen order when keys do not sort)."""
        order = list(range(len(self.keys)))
        try:
            order.sort(key=lambda code: (self.keys[code] is None, self.keys[code]))
        except TypeError:
            pass
        groups = []
        for code in order:
            row = dict(zip(GROUP_SUMS, self.sums[code].tolist(), strict=True))
            samples, trainable = int(row["samples"]), int(row["trainable_tokens"])
            tail = int(row["masked_tail_samples"])
            groups.append(
                {
                    "key": json_value(self.keys[code]),
                    "samples": samples,
                    "tokens": int(row["tokens"]),
                    "trainable_tokens": trainable,
                    "changed_samples": int(row["changed_samples"]),
                    "changed_share": ratio(row["changed_samples"], samples),
                    "fully_masked_samples": int(row["fully_masked_samples"]),
                    "masked_tail_samples": tail,
                    "mean_terminal_credit": row["credit_sum"] / tail if tail and self.baseline is not None else None,
                    "mean_abs_delta_advantage": row["sum_abs"] / trainable if trainable else 0.0,
                    "max_abs_delta_advantage": float(self.max_abs[code]),
                    "mean_abs_delta_return": (
                        (row["sum_abs_return"] / trainable if trainable else 0.0) if self.returns_compared else None
                    ),
                    "max_abs_delta_return": float(self.max_abs_return[code]) if self.returns_compared else None,
                    "sign_flip_share": ratio(row["sign_flips"], trainable),
                    "correlation": correlation(trainable, [row[name] for name in PRODUCT_SUMS]),
                }
            )
        return groups
