"""``gae recompute`` as a library: stream rollout Parquet files, check every batch, compute
advantages and returns (docs/semantics.md), write the files back with them added
(atomically), and compare against a trainer profile on the way. The options and report
(:mod:`.options`), what an output holds (:mod:`.output`) and the run (:mod:`.run`)."""

from gaecli.recompute.options import FileOutcome, RecomputeOptions, RecomputeReport
from gaecli.recompute.run import recompute_file, recompute_files

__all__ = ["FileOutcome", "RecomputeOptions", "RecomputeReport", "recompute_file", "recompute_files"]
