"""``gae recompute`` on a table in memory (:mod:`gaecli.io.memory`), computed by the command's
own unit (:func:`gaecli.recompute.run.output_batches`) after the run driver's pre-passes over
it (:func:`gaecli.run.reader_statistics`), so the numbers are the command's bits."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gaecli.io.memory import TableJob, TableRollout, from_arrow, refuse_writes, to_arrow


def recompute_table(table: Any, **options: Any) -> Any:
    """``gae recompute`` on a table: the same rows, in the same order, every column kept, with
    the advantages and returns columns added (and the baseline's with ``keep_baseline``),
    returned in the kind given (a pyarrow Table for an ``__arrow_c_stream__`` exporter).

    ``options``: the fields of :class:`gaecli.RecomputeOptions` but ``overwrite``,
    ``skip_existing`` and ``report_paths`` (nothing is written): γ and λ where the estimator
    reads them, ``estimator`` with ``group_by`` / ``step_by``, the GAE ``variants``,
    ``columns`` (a :class:`gaecli.Columns` naming the input and output columns, KL rewards
    included), ``normalize``/``normalize_by`` (whitening over the whole table), ``on_invalid``
    (``"skip"``: the invalid rows are left out of the result). Computed in memory by the
    command's own unit (:func:`gaecli.recompute.run.output_batches`), so the numbers are those
    the command writes for a file of these rows, bit for bit. Raises
    :class:`gaecli.GAEInputError` for an invalid row, naming the table row and column
    (``table, row 3, column 'values': ...``), for a bad option value and for a table it
    cannot read.
    """
    from gaecli.recompute.options import RecomputeOptions
    from gaecli.recompute.output import check_job, output_schema
    from gaecli.recompute.run import output_batches
    from gaecli.run import reader_statistics

    refuse_writes("recompute_table", options)
    arrow, kind = to_arrow(table)
    recompute = RecomputeOptions(**options)
    rollout = TableRollout(arrow)
    job = TableJob()
    check_job(rollout.schema, job, recompute)
    schema, list_type = output_schema(rollout, job, recompute)
    schema = schema.with_metadata(arrow.schema.metadata)  # the table's own metadata (pandas' index), nothing added
    moments, scores = reader_statistics(rollout, recompute.computation, whole="the table")
    outputs = output_batches(rollout, recompute, schema, list_type, moments, scores, compared=False)
    batches = [output for _, output, _, _ in outputs]
    return from_arrow(pa.Table.from_batches(batches, schema=schema), kind)
