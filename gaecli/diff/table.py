"""``gae diff`` on a table in memory (:mod:`gaecli.io.memory`), computed by the command's own
unit and merge (:func:`gaecli.diff.run.diff_rollout`) after the run driver's pre-passes over
it (:func:`gaecli.run.reader_statistics`), so every figure is the command's bits."""

from __future__ import annotations

from typing import Any

from gaecli.io.memory import TableRollout, refuse_writes, to_arrow


def diff_table(table: Any, **options: Any):
    """``gae diff`` on a table (the kinds :func:`gaecli.recompute_table` takes): the same
    :class:`gaecli.diff.DiffReport` that :func:`gaecli.diff_files` returns for a file of these
    rows, with ``file`` None in ``files`` and in the top samples, whose ``row`` is the table
    row. ``options``: the fields of :class:`gaecli.DiffOptions` but ``per_sample``,
    ``groups_out`` and ``report_paths`` (nothing is written). Raises as :func:`gaecli.recompute_table`.

    Computed in memory by the command's own unit (:func:`gaecli.diff.run.diff_rollout`) and
    merge, so every figure is the command's, bit for bit; error messages name the table
    where they would name a file."""
    from gaecli.diff.options import DiffOptions
    from gaecli.diff.run import diff_report, diff_rollout, merge_parts
    from gaecli.run import reader_statistics

    refuse_writes("diff_table", options)
    diff = DiffOptions(**options)
    arrow, _ = to_arrow(table)
    rollout = TableRollout(arrow)
    moments, scores = reader_statistics(rollout, diff.computation, whole="the input")
    part = diff_rollout(0, rollout, None, diff, moments, None, scores)
    return diff_report(diff, [part], merge_parts([part], diff))
