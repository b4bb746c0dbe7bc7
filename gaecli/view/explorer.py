"""The run behind ``gae view``: its files in input order with their footers (read once), the
whole-run statistics a computation needs, each step's figures computed once by ``gae diff``'s
own unit (:func:`gaecli.diff.run.diff_unit`) in a background thread and kept in memory, and
the JSON documents of the run, step and sample pages. Files are named by their index in the
input list only; nothing is written anywhere."""

from __future__ import annotations

import dataclasses
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaecli.diff.options import DiffOptions
from gaecli.display import display
from gaecli.errors import GAEError, GAEInputError, GAEUsageError
from gaecli.view.sample import SampleSource, old_side_choices, sample_document, side_options
from gaecli.view.tokens import TokenText

STEP_FIGURES = (
    "samples",
    "changed_samples",
    "changed_share",
    "lost_terminal_samples",
    "mean_abs_delta_advantage",
    "max_abs_delta_advantage",
    "trainable_share",
)
"""The figures of a step that the run page shows (of ``gae diff``'s summary, docs/diff.md)."""


VIEW_BATCH_ROWS = 256
"""The rows of a background batch where ``--batch-rows`` is not given: small, so that the
background passes stop for a sample request within a batch (the figures are the same bits
for any batch size)."""

PAUSE_SECONDS = 1.0
"""The longest a background pass waits, at one batch, for the sample requests being served:
a stream of requests slows the passes down but cannot stop them."""


class ViewClosed(Exception):
    """Raised in a background pass at its next batch once the server has stopped."""


class Gate:
    """Sample requests before the background passes: while a request is being computed
    (:meth:`serving`) every pass waits at its next batch (:meth:`pause`), so that the
    request has the cores and the interpreter to itself."""

    def __init__(self) -> None:
        self._serving = 0
        self._closed = False
        self._condition = threading.Condition()

    def close(self) -> None:
        """End the background passes: each raises :class:`ViewClosed` at its next batch."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    @contextmanager
    def serving(self):
        with self._condition:
            self._serving += 1
        try:
            yield
        finally:
            with self._condition:
                self._serving -= 1
                self._condition.notify_all()

    def pause(self) -> None:
        """Wait until no request is being served, at most :data:`PAUSE_SECONDS`."""
        with self._condition:
            self._condition.wait_for(lambda: self._serving == 0 or self._closed, PAUSE_SECONDS)
            if self._closed:
                raise ViewClosed


class ViewProgress:
    """The progress of a background pass, read by the pages: the phase (``statistics``,
    ``figures``, ``done``), rows done of the phase's total, steps done of all. Each batch
    done waits at ``gate`` (:meth:`Gate.pause`) while a sample request is served."""

    def __init__(self, gate: Optional[Gate] = None) -> None:
        self.phase, self.rows, self.total_rows = "figures", 0, 0
        self.steps_done, self.error = 0, None
        self.gate = gate or Gate()

    def start(self, phase: str, total_rows: int) -> None:
        self.phase, self.rows, self.total_rows = phase, 0, total_rows

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.gate.pause()

    def finish(self) -> None:
        pass

    def to_dict(self, steps: int) -> dict:
        return {
            "phase": self.phase,
            "rows": self.rows,
            "total_rows": self.total_rows,
            "steps_done": self.steps_done,
            "steps": steps,
            "error": self.error,
        }


@dataclass
class StepFile:
    """One input file: its name, footer (None when unreadable), the row where each row group
    starts, and the one-line error that keeps it from being shown (None when readable)."""

    index: int
    path: str
    footer: Optional[pq.FileMetaData]
    error: Optional[str] = None
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))

    def to_dict(self) -> dict:
        footer = self.footer
        return {
            "index": self.index,
            "name": display(self.path),
            "rows": None if footer is None else footer.num_rows,
            "row_groups": None if footer is None else footer.num_row_groups,
            "bytes": None
            if footer is None
            else footer.serialized_size
            + sum(footer.row_group(g).total_byte_size for g in range(footer.num_row_groups)),
            "error": self.error,
        }


@dataclass
class StepResult:
    """What a step's figures pass gives: each comparison's summary and hardest groups, the
    per-sample figures (``gae diff --per-sample``'s rows) and each sample's terminal reward."""

    summaries: list[dict]
    groups: list[Optional[list[dict]]]
    per_sample: pa.Table
    rewards: np.ndarray


def _open_file(index: int, path: str, options: DiffOptions) -> StepFile:
    """The file's footer and its schema checked as ``gae diff`` checks it; an unreadable or
    unfit file keeps its one-line error."""
    from gaecli.pipeline import check_file, check_scalar_column
    from gaecli.run import read_footers

    try:
        footer = read_footers([path], strict=True)[0]
        schema = footer.schema.to_arrow_schema()
        check_file(schema, path, options.computation)
        for flag, name in (("--group-by", options.group_by), ("--id-col", options.id_col)):
            check_scalar_column(schema, path, flag, name)
    except GAEError as error:
        return StepFile(index, path, None, display(str(error)))
    sizes = [footer.row_group(group).num_rows for group in range(footer.num_row_groups)]
    return StepFile(index, path, footer, None, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))


def open_run(
    inputs: list, options: DiffOptions, tokenizer: Optional[str] = None, tokens_col: Optional[str] = None
) -> "RunExplorer":
    """A :class:`RunExplorer` over ``inputs`` (paths, directories read by name, globs; in the
    order given), computing what ``options`` (``gae diff``'s) describe. Only footers are read
    here. Raises :class:`GAEUsageError` for a computation the view does not show yet (turn
    rows, episodes) and for a tokenizer that cannot be loaded; a bad input file is not an
    error: it is shown with its one-line message."""
    from gaecli.io.paths import input_files

    computation = options.computation
    if computation.turn_rows is not None or computation.episode_carried is not None:
        raise GAEUsageError(
            "gae view shows one row per sample: --episode-col and --turn-col (turn rows) are not supported by it "
            "yet; compare such runs with gae diff"
        )
    if options.group_by is None and options.group_by_id is not None:
        options = dataclasses.replace(options, group_by=options.group_by_id)  # groups for the step page
    if options.batch_rows is None:
        options = dataclasses.replace(options, batch_rows=VIEW_BATCH_ROWS)
    files = [_open_file(index, str(path), options) for index, path in enumerate(input_files(list(inputs)))]
    if not files:
        raise GAEUsageError("no input files found")
    return RunExplorer(files, options, TokenText(tokenizer, tokens_col))


class RunExplorer:
    """A run's files and what the pages show of them. :meth:`start` begins the background
    work (the whole-run statistics where the computation needs them, then each step's figures
    in input order, a step a page asks for first); the documents read what is done so far."""

    def __init__(self, files: list[StepFile], options: DiffOptions, tokens: TokenText) -> None:
        self.files, self.options, self.tokens = files, options, tokens
        self.gate = Gate()
        self.progress = ViewProgress(self.gate)
        if options.computation.spans_inputs:
            self.progress.phase = "statistics"  # the whole-run pass comes first
        self._steps: dict[int, StepResult] = {}
        self._errors: dict[int, str] = {}
        self._wanted: list[int] = []
        self._condition = threading.Condition()
        self._statistics: Optional[tuple[dict, dict]] = None if options.computation.spans_inputs else ({}, {})
        self._thread: Optional[threading.Thread] = None
        self._side_passes: dict[str, SidePass] = {}
        self._choices: dict[int, list[dict]] = {}
        self.warmed = False
        self.sources = [SampleSource(file.path, file.footer, file.starts, options, tokens) for file in files]

    @property
    def readable(self) -> list[StepFile]:
        return [file for file in self.files if file.error is None]

    @property
    def errors(self) -> list[str]:
        """The one-line error of every file that cannot be shown, in input order."""
        return [file.error for file in self.files if file.error is not None]

    # ------------------------------------------------------------------ the background work

    def start(self) -> None:
        """Start the background thread (a daemon: a Ctrl-C does not wait for it)."""
        self._thread = threading.Thread(target=self._work, name="gae-view-figures", daemon=True)
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stop the background passes at their next batch and wait for them, at most
        ``timeout`` seconds each: the process then exits with no thread inside a native
        library (a thread still reading or compiling at exit can abort the interpreter)."""
        self.gate.close()
        threads = [self._thread, *(side_pass.thread for side_pass in list(self._side_passes.values()))]
        for thread in threads:
            if thread is not None:
                thread.join(timeout)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until every step's figures are done (True) or ``timeout`` seconds passed."""
        with self._condition:
            return self._condition.wait_for(lambda: self.progress.phase in ("done", "failed"), timeout)

    def warm(self, with_statistics: bool = False) -> bool:
        """Compute the first row of the first readable file as its sample page would (its
        first comparison, unwhitened unless ``with_statistics``: with the run's statistics,
        once they are done; the row read alone, not its row group), and its figures as the
        background pass would: the kernels and modules of both paths compiled or loaded (from
        numba's cache) before a request needs them, so that neither the first request nor the
        background's start holds the interpreter while a request is served. True when done;
        False where the row cannot be computed without the run's statistics (a grouped
        estimator: warmed again after them) or there is no readable row."""
        index = next((f.index for f in self.files if f.error is None and f.footer.num_rows), None)
        if index is None:
            return False
        from gaecli.diff.per_sample import per_sample_schema
        from gaecli.diff.run import diff_rollout
        from gaecli.io.memory import TableRollout

        source = self.sources[index]
        head = source.head()
        statistics = tuple(part.get(index) for part in self._statistics) if with_statistics else (None, None)
        moments, scores = statistics
        try:
            sample_document(source, 0, "side:0", statistics, head)
            schema = per_sample_schema(source.footer.schema.to_arrow_schema(), self.options)
            diff_rollout(index, TableRollout(head), source.path, self.options, moments, schema, scores)
        except (GAEError, ValueError):  # only the warming is lost: a bad row is shown on its page
            return False
        self.warmed = True
        return True

    def _work(self) -> None:
        try:
            if not self.warmed:
                self.warm()
            self._compute_statistics()
            if not self.warmed:
                self.warm(with_statistics=True)
            self.progress.phase = "figures"
            while True:
                index = self._next_step()
                if index is None:
                    break
                self._compute_step(index)
            self.progress.phase = "done"
        except Exception as error:  # shown on the page; the pages of computed steps still work
            self.progress.error, self.progress.phase = display(str(error)), "failed"
        with self._condition:
            self._condition.notify_all()

    def _compute_statistics(self) -> None:
        """The pre-passes over every readable file (``--normalize``'s moments, the grouped
        estimators' scores), once, before any figure: the run driver's own."""
        if self._statistics is not None:
            return
        self._statistics = run_statistics(self.readable, self.options, self.progress)
        with self._condition:
            self._condition.notify_all()

    def _next_step(self) -> Optional[int]:
        with self._condition:
            pending = [index for index in self._wanted if index not in self._steps]
            if pending:
                return pending[0]
        todo = [
            file.index for file in self.readable if file.index not in self._steps and file.index not in self._errors
        ]
        return todo[0] if todo else None

    def _compute_step(self, index: int) -> None:
        from gaecli.diff.per_sample import per_sample_schema
        from gaecli.diff.run import diff_unit

        file = self.files[index]
        moments, scores = (part.get(index) for part in self._statistics)
        schema = per_sample_schema(file.footer.schema.to_arrow_schema(), self.options)
        try:
            part = diff_unit(index, file.path, self.options, moments, schema, file.footer, scores, self.progress)
            rewards = self.sources[index].terminal_rewards()
        except GAEError as error:
            with self._condition:
                self._errors[index] = display(str(error))
                self._condition.notify_all()
            return
        result = StepResult(
            summaries=[comparison.accumulator.figures() for comparison in part.comparisons],
            groups=[
                None if comparison.groups is None else comparison.groups.entries(comparison.groups.hardest())
                for comparison in part.comparisons
            ],
            per_sample=pa.Table.from_batches(part.per_sample, schema),
            rewards=rewards,
        )
        with self._condition:
            self._steps[index] = result
            self.progress.steps_done += 1
            self._condition.notify_all()

    def step(self, index: int, timeout: float = 0.0) -> Optional[StepResult]:
        """The figures of step ``index`` when done (waiting at most ``timeout`` seconds); a
        step asked for and not done is computed next."""
        with self._condition:
            if index not in self._steps and index not in self._wanted:
                self._wanted.insert(0, index)
            self._condition.wait_for(lambda: index in self._steps or index in self._errors, timeout)
            return self._steps.get(index)

    def statistics_of(self, index: int, timeout: float) -> Optional[tuple]:
        """The (moments, scores) of file ``index`` once the pre-passes are done (None before)."""
        with self._condition:
            self._condition.wait_for(lambda: self._statistics is not None, timeout)
            if self._statistics is None:
                return None
            return tuple(part.get(index) for part in self._statistics)

    def choices(self, index: int) -> list[dict]:
        """The old sides the sample page of file ``index`` offers (:func:`old_side_choices`),
        worked out once per file."""
        with self._condition:
            found = self._choices.get(index)
        if found is None:
            file = self.files[index]
            found = old_side_choices(self.options, file.footer.schema.to_arrow_schema(), file.path)
            with self._condition:
                self._choices[index] = found
        return found

    def _statistics_for(self, key: str, index: int, timeout: float) -> tuple[Optional[tuple], ViewProgress]:
        """The (moments, scores) of file ``index`` that old side ``key`` is computed with, and
        the progress of the pass that gives them: the run's own for its comparisons; none for a
        side computed from its row alone; else that side's own whole-run pass, started in the
        background the first time it is asked for (its result None until done)."""
        if key.startswith("side:"):
            return self.statistics_of(index, timeout), self.progress
        options, _ = side_options(self.options, key)
        if not options.computation.spans_inputs:
            return (None, None), self.progress
        with self._condition:
            side_pass = self._side_passes.get(key)
            if side_pass is None:
                side_pass = self._side_passes[key] = SidePass(self.readable, options, self.gate)
        return side_pass.statistics_of(index, timeout), side_pass.progress

    # ------------------------------------------------------------------ the documents

    def run_document(self) -> dict:
        """The run page: every file (name, rows, row groups, size, error), each computed step's
        figures (per comparison, :data:`STEP_FIGURES`, the masked share and the mean terminal
        reward), the comparisons' names and the progress."""
        files = []
        for file in self.files:
            entry = file.to_dict()
            entry["error"] = entry["error"] or self._errors.get(file.index)
            result = self._steps.get(file.index)
            entry["figures"] = (
                None if result is None else [_step_figures(summary, result) for summary in result.summaries]
            )
            files.append(entry)
        return {
            "files": files,
            "comparisons": [side.name for side in self.options.sides],
            "new": self.options.new_spec.estimator,
            "progress": self.progress.to_dict(len(self.readable)),
        }

    def check_index(self, index: int) -> StepFile:
        """File ``index`` of the input list; :class:`LookupError` when there is none."""
        if not 0 <= index < len(self.files):
            raise LookupError(f"no step {index}: the run has {len(self.files)} files")
        return self.files[index]

    def step_document(self, index: int, side: int = 0, timeout: float = 0.0) -> dict:
        """The step page: ``ready`` False (with the progress) until its figures are done;
        then comparison ``side``'s summary, hardest groups and one entry per sample."""
        file = self.check_index(index)
        if file.error is not None or index in self._errors:
            return {"index": index, "name": display(file.path), "error": file.error or self._errors[index]}
        if not 0 <= side < len(self.options.sides):
            raise LookupError(f"no comparison {side}")
        result = self.step(index, timeout)
        document = {"index": index, "name": display(file.path), "comparisons": [s.name for s in self.options.sides]}
        if result is None:
            return {**document, "ready": False, "progress": self.progress.to_dict(len(self.readable))}
        samples = _side_rows(result.per_sample, self.options.sides[side].name)
        from gaecli.diff.per_sample import group_column_in

        group_name = group_column_in(samples.column_names)  # --group-by's own name: "group" on the page
        columns = {
            "group" if name == group_name else name: samples.column(name).to_pylist()
            for name in samples.column_names
            if name not in ("comparison", "file")
        }
        columns["reward"] = _finite_list(result.rewards)
        return {
            **document,
            "ready": True,
            "side": side,
            "summary": result.summaries[side],
            "groups": result.groups[side],
            "samples": columns,
        }

    def sample_document(self, index: int, row: int, old: Optional[str] = None, timeout: float = 60.0) -> dict:
        """The sample page of row ``row`` of file ``index``: its tokens and every per-token
        number (:func:`gaecli.view.sample.sample_document`), with the old side ``old`` (a key
        of :meth:`choices`; None: the first comparison), and its neighbours in its group and
        by rank of max |Δ| when the step's figures are done."""
        file = self.check_index(index)
        if file.error is not None:
            return {"index": index, "error": file.error}
        if not 0 <= row < file.footer.num_rows:
            raise LookupError(f"no row {row} in step {index}: it has {file.footer.num_rows} rows")
        choices = self.choices(index)
        key = old or choices[0]["key"]
        if key not in {choice["key"] for choice in choices}:
            raise LookupError(f"no old side {key!r}")
        statistics, progress = self._statistics_for(key, index, timeout)
        if statistics is None:
            return {"index": index, "row": row, "ready": False, "progress": progress.to_dict(len(self.readable))}
        with self.gate.serving():
            document = sample_document(self.sources[index], row, key, statistics)
        result = self._steps.get(index)
        side = int(key.split(":")[1]) if key.startswith("side:") else 0
        document.update(
            index=index,
            name=display(file.path),
            ready=True,
            choices=choices,
            old=key,
            navigation=None if result is None else _navigation(result, self.options.sides[side].name, row),
        )
        return document


def run_statistics(readable: list[StepFile], options: DiffOptions, progress: ViewProgress) -> tuple[dict, dict]:
    """The pre-passes of ``options``' computation over the ``readable`` files (the run
    driver's own: ``--normalize``'s moments, the grouped estimators' scores), as (moments,
    scores), each by file index."""
    from gaecli.engines import EngineOptions
    from gaecli.run import Run

    paths, footers = [file.path for file in readable], [file.footer for file in readable]
    run = Run("view", paths, footers, options.computation, EngineOptions(workers=1), progress)
    moments, scores = run.statistics()
    return (
        {file.index: moment for file, moment in zip(readable, moments, strict=True)},
        {file.index: score for file, score in zip(readable, scores, strict=True)},
    )


class SidePass:
    """The whole-run pass of one old side chosen on the sample page whose computation needs
    statistics of the whole run (under ``--normalize``, or a grouped or whitened
    estimator): run once in a background thread, its result kept in memory."""

    def __init__(self, readable: list[StepFile], options: DiffOptions, gate: Gate) -> None:
        self.progress = ViewProgress(gate)
        self.progress.phase = "statistics"
        self._result: Optional[tuple[dict, dict]] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(readable, options), name="gae-view-side", daemon=True)
        self._thread.start()

    def _work(self, readable: list[StepFile], options: DiffOptions) -> None:
        try:
            self._result = run_statistics(readable, options, self.progress)
            self.progress.phase = "done"
        except GAEError as error:
            self.progress.error, self.progress.phase = display(str(error)), "failed"
        except ViewClosed:
            self.progress.phase = "failed"
        self._done.set()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def statistics_of(self, index: int, timeout: float) -> Optional[tuple]:
        """File ``index``'s (moments, scores) of the pass, None until it is done. Raises
        :class:`GAEInputError` with the pass's one-line error when it failed."""
        self._done.wait(timeout)
        if self.progress.error is not None:
            raise GAEInputError(self.progress.error)
        if self._result is None:
            return None
        return tuple(part.get(index) for part in self._result)


def _side_rows(per_sample: pa.Table, name: str) -> pa.Table:
    import pyarrow.compute as pc

    return per_sample.filter(pc.equal(per_sample.column("comparison"), name))


def _finite_list(values: np.ndarray) -> list:
    """``values`` as a JSON list, None for NaN and ±Inf."""
    values = np.asarray(values, dtype=np.float64)
    listed = values.tolist()
    if not np.isfinite(values).all():
        listed = [value if finite else None for value, finite in zip(listed, np.isfinite(values).tolist())]
    return listed


def _step_figures(summary: dict, result: StepResult) -> dict:
    figures = {name: summary.get(name) for name in STEP_FIGURES}
    share = summary.get("trainable_share")
    figures["masked_share"] = None if share is None else 1.0 - share
    rewards = result.rewards[np.isfinite(result.rewards)]
    figures["reward_mean"] = float(rewards.mean()) if rewards.size else None
    return figures


def _navigation(result: StepResult, name: str, row: int) -> dict:
    """The rows before and after ``row`` in its group (in row order) and by rank of max |Δ|
    (largest first, NaN first, ties by row), and its rank."""
    samples = _side_rows(result.per_sample, name)
    rows = samples.column("row").to_numpy()
    ranks = np.nan_to_num(samples.column("max_abs_delta_advantage").to_numpy(zero_copy_only=False), nan=np.inf)
    order = rows[np.lexsort((rows, -ranks))]
    rank = int(np.flatnonzero(order == row)[0])
    navigation = {
        "rank": rank + 1,
        "of": len(order),
        "prev_rank": int(order[rank - 1]) if rank > 0 else None,
        "next_rank": int(order[rank + 1]) if rank + 1 < len(order) else None,
        "group": None,
        "prev_group": None,
        "next_group": None,
    }
    from gaecli.diff.per_sample import group_column_in

    group_name = group_column_in(samples.column_names)  # --group-by's own name
    if group_name is not None:
        groups = samples.column(group_name)
        here = groups[int(np.flatnonzero(rows == row)[0])]
        navigation["group"] = here.as_py()
        import pyarrow.compute as pc

        members = rows[np.asarray(pc.equal(groups, here).fill_null(False))] if here.is_valid else np.array([row])
        place = int(np.flatnonzero(members == row)[0])
        navigation["prev_group"] = int(members[place - 1]) if place > 0 else None
        navigation["next_group"] = int(members[place + 1]) if place + 1 < len(members) else None
        navigation["group_size"] = len(members)
    return navigation
