"""What ``gae recompute`` and ``gae diff`` share: the device and per-file checks, the
streamed, checked and packed batches with new (masked) and old advantages computed by the
one dispatch (:mod:`gaecli.advantages.dispatch`), and the keyed-statistics pass of one file
(order-fixed and mergeable: the ``--normalize`` moments, the critic-free estimators' scores;
the passes over every file on an engine are :mod:`gaecli.run.passes`).

Everything here works on one file at a time and takes only picklable arguments, so the
engines (:mod:`gaecli.engines`) can run it in other processes or on other machines.

The package: :mod:`.options` (the shared options), :mod:`.description` (what a run
computes, built from any command's options), :mod:`.packing` (one batch as flat
buffers), :mod:`.batches` (a file's computed batches), :mod:`.passes` (the passes before the
computing one), :mod:`.stored_advantages` (``gae validate``'s rules on stored advantages)."""

from gaecli.advantages.whiten import whiten_rows
from gaecli.pipeline.batches import (
    ComputedBatch,
    check_file,
    check_rollout_schema,
    check_scalar_column,
    check_variant_columns,
    computed_batches,
    id_findings,
    overflow_findings,
    with_findings,
)
from gaecli.pipeline.description import ComparisonSide, Computation, describe_run, old_side_spec
from gaecli.pipeline.options import (
    EstimatorInputs,
    VariantOptions,
    check_device,
    check_estimators,
)
from gaecli.pipeline.packing import PackedBatch, compute_packed, drop_rows, pack_batch, row_input_arrays, stored_column
from gaecli.pipeline.passes import (
    checked_moments,
    file_statistics,
    rollout_statistics,
    score_statistics,
    side_moments,
    statistics_columns,
    whitened_sides,
)

__all__ = [
    "ComparisonSide",
    "Computation",
    "ComputedBatch",
    "EstimatorInputs",
    "PackedBatch",
    "VariantOptions",
    "check_device",
    "check_estimators",
    "check_file",
    "check_rollout_schema",
    "check_scalar_column",
    "check_variant_columns",
    "checked_moments",
    "compute_packed",
    "describe_run",
    "computed_batches",
    "drop_rows",
    "file_statistics",
    "id_findings",
    "old_side_spec",
    "overflow_findings",
    "pack_batch",
    "rollout_statistics",
    "row_input_arrays",
    "score_statistics",
    "side_moments",
    "statistics_columns",
    "stored_column",
    "whiten_rows",
    "whitened_sides",
    "with_findings",
]
