"""One run over planned input files: each footer read once, the pre-passes a computation
needs (the critic-free estimators' scores, the ``--normalize`` or ``reinforce++`` moments),
then one unit per file, all on one engine session, the progress shown per phase; and the same
pre-passes over one reader in memory (a table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import pyarrow.parquet as pq

from gaecli.engines import EngineOptions, EngineSession, map_units
from gaecli.errors import GAEUsageError, RunInterrupted
from gaecli.io.reader import RolloutFile
from gaecli.progress import Progress

if TYPE_CHECKING:  # the data path is imported by the runs that compute (validate does not)
    from gaecli.pipeline.description import Computation


def read_footers(paths: list, strict: bool = False) -> list[Optional[pq.FileMetaData]]:
    """Each file's footer, read once for the whole run (the passes and units reuse it): None
    for a file that cannot be read, whose unit then fails with the reason, or with
    ``strict`` its error raised (:class:`gaecli.errors.UnreadableFileError`)."""
    footers = []
    for path in paths:
        try:
            rollout = RolloutFile(path)
        except GAEUsageError:
            if strict:
                raise
            footers.append(None)
            continue
        try:
            footers.append(rollout.parquet.metadata)
        finally:
            rollout.close()
    return footers


def total_rows(footers: list[Optional[pq.FileMetaData]]) -> int:
    """Rows of the readable files (for progress; unreadable ones count 0 and fail later)."""
    return sum(footer.num_rows for footer in footers if footer is not None)


@dataclass
class Run:
    """The files of one run (every input, in order: the pre-passes read them all) with their
    footers (:func:`read_footers`), what they compute (None: no computation, as for
    validate), the engine and the progress."""

    phase: str
    files: list[str]
    footers: list[Optional[pq.FileMetaData]]
    computation: Optional["Computation"]
    engine: EngineOptions
    progress: Progress

    def statistics(self, session: Optional[EngineSession] = None) -> tuple[list, list]:
        """Per file, the moments and the score statistics its unit needs (None where the
        computation needs none): the pre-passes, each one unit per file, merged in input
        order (:func:`gaecli.run.passes.engine_pre_passes`)."""
        if self.computation is None:
            return [None] * len(self.files), [None] * len(self.files)
        from gaecli.run.passes import engine_pre_passes

        scores, moments = engine_pre_passes(self, session)
        return moments, scores

    def execute(
        self,
        unit: Callable,
        tasks: Callable[[int, object, object], tuple],
        todo: Optional[list[int]] = None,
        stop_on_failure: bool = True,
        interrupted: Optional[Callable[[list], BaseException]] = None,
    ) -> list:
        """The pre-passes, then ``unit(*tasks(index, moments, scores))`` for each file
        ``index`` of ``todo`` (None: every file) on one engine session, the results in that
        order (a :class:`gaecli.engines.TaskFailure` for a failed unit, None for one not
        started). ``interrupted``: makes the error raised for a Ctrl-C or SIGTERM from the
        results so far (None for a unit not finished; all None before the units started)."""
        todo = list(range(len(self.files))) if todo is None else todo
        results: list = [None] * len(todo)
        units_started = False
        try:
            with EngineSession() as session:  # one pool (or Ray) for every pass
                moments, scores = self.statistics(session)
                self.progress.start(self.phase, total_rows([self.footers[index] for index in todo]))
                try:
                    units_started = True
                    units = [tasks(index, moments[index], scores[index]) for index in todo]
                    labels = [self.files[index] for index in todo]
                    results = map_units(
                        unit,
                        units,
                        labels,
                        self.engine,
                        stop_on_failure=stop_on_failure,
                        progress=self.progress,
                        session=session,
                    )
                finally:
                    self.progress.finish()
        except KeyboardInterrupt as error:
            if interrupted is None:
                raise
            if units_started and isinstance(error, RunInterrupted) and error.results is not None:
                results = error.results
            raise interrupted(results) from error
        return results


def reader_statistics(rollout, computation: "Computation", whole: str) -> tuple[object, object]:
    """The moments and score statistics (None where not needed) of one open reader in memory
    (a table): the pre-passes of :meth:`Run.statistics` over its rows alone (``whole``: what
    messages call it)."""
    from gaecli.advantages.statistics import merged_in_order
    from gaecli.pipeline import checked_moments, rollout_statistics, score_statistics, side_moments
    from gaecli.pipeline.turn_rows import settle_turn_rows

    scores = None
    if computation.needs_scores:
        declared = score_statistics(computation)
        scores, _ = merged_in_order(declared, [rollout_statistics(rollout, computation, declared)])
        settle_turn_rows(scores, [], computation, [str(rollout.path)])
    if not (computation.whitening or any(computation.estimator_whitened)):
        return None, scores
    sides = side_moments(computation)
    statistics = tuple(statistic for statistic in sides if statistic is not None)
    merged, _ = merged_in_order(statistics, [rollout_statistics(rollout, computation, statistics, scores=scores)])
    moments = tuple(None if side is None else merged[side] for side in sides)
    if not computation.critic_free:  # under --normalize; a step of an estimator may have nothing to whiten
        checked_moments(moments, computation.normalize_by, whole=whole)
    return moments, scores
