"""The rows a run leaves out under ``on_invalid="skip"``, shared by every command that skips
them (``gae recompute``'s rejects file beside each output, ``gae diff``'s ``--rejects`` file
and its report): each invalid row of a computed batch, whole as read, with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from gaecli.checks import row_reasons
from gaecli.display import display

REASON_COLUMN = "reason"
"""The column a rejects file adds to the rows: the messages of the row's errors, joined by '; '."""

FILE_COLUMN, ROW_COLUMN = "source_file", "source_row"
"""The columns before the rows in a rejects file over several inputs (``gae diff --rejects``):
the input and the row in it (0-based)."""

NAMED_SKIPPED = 5
"""How many skipped rows a report names (all are counted)."""


def rejects_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a rejects file over several inputs whose rows have ``schema``:
    :data:`FILE_COLUMN`, :data:`ROW_COLUMN`, the row's columns, :data:`REASON_COLUMN`."""
    where = [pa.field(FILE_COLUMN, pa.string()), pa.field(ROW_COLUMN, pa.int64())]
    return pa.schema([*where, *schema.remove_metadata(), pa.field(REASON_COLUMN, pa.string())])


def rejected_batch(computed) -> pa.RecordBatch:
    """The invalid rows of a computed batch (:class:`gaecli.pipeline.ComputedBatch`) as read,
    in row order, with their :data:`REASON_COLUMN` appended (an empty batch when every row is
    valid)."""
    batch, check = computed.batch, computed.check
    reasons = row_reasons(check)
    invalid_rows = np.flatnonzero(check.invalid)
    rejected = batch.filter(pa.array(check.invalid))
    reason_array = pa.array([reasons[computed.first_row + int(row)] for row in invalid_rows], pa.string())
    schema = batch.schema.append(pa.field(REASON_COLUMN, pa.string()))
    return pa.RecordBatch.from_arrays([*rejected.columns, reason_array], schema=schema)


@dataclass
class SkippedRows:
    """The rows a run skipped, in input order: how many (exact), the first
    :data:`NAMED_SKIPPED` of them named (``{"file", "row", "reason"}``), and with ``keep`` the
    rejected batches themselves (:func:`rejected_batch`, with :data:`FILE_COLUMN` and
    :data:`ROW_COLUMN` before the row's columns) for a rejects file. Merged in input order."""

    keep: bool = False
    count: int = 0
    named: list[dict] = field(default_factory=list)
    batches: list[pa.RecordBatch] = field(default_factory=list, repr=False)

    def add(self, computed, file: str) -> None:
        """The invalid rows of ``computed``, a batch of ``file``."""
        invalid_rows = np.flatnonzero(computed.check.invalid)
        if invalid_rows.size == 0:
            return
        self.count += int(invalid_rows.size)
        reasons = row_reasons(computed.check)
        for row in invalid_rows[: max(NAMED_SKIPPED - len(self.named), 0)].tolist():
            file_row = computed.first_row + row
            self.named.append({"file": file, "row": file_row, "reason": reasons[file_row]})
        if self.keep:
            rejected = rejected_batch(computed)
            where = [
                pa.repeat(pa.scalar(display(file), pa.string()), rejected.num_rows),  # the path as printed
                pa.array(computed.first_row + invalid_rows, pa.int64()),
            ]
            schema = rejects_schema(computed.batch.schema)
            self.batches.append(pa.RecordBatch.from_arrays([*where, *rejected.columns], schema=schema))

    def merge(self, other: "SkippedRows") -> None:
        """Add ``other``'s rows (a later input's) after ours."""
        self.count += other.count
        self.named += other.named[: max(NAMED_SKIPPED - len(self.named), 0)]
        self.batches += other.batches

    def to_dict(self) -> dict:
        """``{"count", "rows"}``: every row counted, the first ones named."""
        return {"count": self.count, "rows": list(self.named)}
