"""Turn rows on the data path (docs/episodes.md): the per-file checks of their columns, what
each batch adds to the turn-rows statistic (:func:`turn_operand`), the episodes checked and
settled once every file's rows are merged (:func:`settle_turn_rows`: the first fault stops the
run, or the episode's rows are rejected), and in the computing pass each row's settled
advantage and the rejection of an episode's rows (:func:`rejected_episode_findings`)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.episodes import TurnRows
from gaecli.advantages.statistics import TURN_ROWS
from gaecli.checks import Finding
from gaecli.errors import GAEUsageError, InvalidDataError
from gaecli.pipeline.description import Computation


def check_turn_columns(schema: pa.Schema, file: str, computation: Computation) -> None:
    """The turn index column (``--turn-col``) holds integers (:class:`GAEUsageError`); the
    other turn-row columns are checked as every id and per-row number is."""
    turns = computation.turn_rows
    if turns is None or turns.turn not in schema.names:
        return
    arrow_type = schema.field(turns.turn).type
    if not pa.types.is_integer(arrow_type):
        raise GAEUsageError(f"{file}: --turn-col column {turns.turn!r} is {arrow_type}, expected an integer per row")


def turn_operand(
    batch: pa.RecordBatch, invalid: np.ndarray, valid: pa.RecordBatch, outcomes, turns, step, first_row, carries=None
):
    """What one batch adds to the turn-rows statistic (:class:`gaecli.advantages.episodes.TurnRows`):
    its valid rows' turn index, turn reward, outcome (``outcomes``: their terminal rewards),
    file row, group, state and step ids (``turns``: the :class:`TurnColumns`; ``step``: the
    step id column or None), the carry figures of masked GAE over episodes (``carries``:
    :func:`gaecli.advantages.episodes.carry_figures`, None where not computed), and the episode
    ids and rows of its rejected rows (``invalid``: bool per row of ``batch``)."""
    rows = first_row + np.arange(batch.num_rows, dtype=np.int64)
    reward = np.zeros(valid.num_rows)
    if turns.turn_rewards is not None:
        reward = np.asarray(valid.column(turns.turn_rewards).cast(pa.float64()).fill_null(np.nan))
    operand = {
        "turn": np.asarray(valid.column(turns.turn).cast(pa.int64())),
        "reward": reward,
        "outcome": np.asarray(outcomes, dtype=np.float64),
        "row": rows[~invalid],
        "group": valid.column(turns.group) if turns.group is not None else None,
        "state": valid.column(turns.state) if turns.state is not None else None,
        "step": valid.column(step) if step is not None else None,
    }
    operand.update(carries or {})
    if invalid.any():
        operand["invalid_keys"] = batch.column(turns.episode).filter(pa.array(invalid))
        operand["invalid_rows"] = rows[invalid]
    return operand


def turn_rows_of(statistics) -> Optional[TurnRows]:
    """The turn rows among a file's statistics (None: none)."""
    if statistics is None:
        return None
    return next((statistics[statistic] for statistic in statistics.statistics if statistic.quantity == TURN_ROWS), None)


def settle_turn_rows(merged, parts: list, computation: Computation, labels: list[str]) -> None:
    """Check the episodes of the merged turn rows over every input and compute each turn-row
    side on them (:meth:`TurnRows.settle`), then hand each file's part (``parts``, in input
    order, as :func:`gaecli.advantages.statistics.merged_in_order` cut them) its rows'
    results. The first fault in input order stops the run (:class:`InvalidDataError`, naming
    the file, row, column and the episode's other row) unless invalid rows are skipped."""
    turns = turn_rows_of(merged)
    if turns is None:
        return
    specs = tuple(spec for spec in computation.specs if spec.over_episodes)
    faults = turns.settle(specs, labels)
    if faults and computation.on_invalid == "stop":
        fault = faults[0]
        columns = computation.turn_rows
        column = {"turn": columns.turn, "outcome": computation.columns.terminal_reward, "group": columns.group}
        raise InvalidDataError(
            Finding(labels[fault.part], fault.row, column.get(fault.role, columns.episode), fault.code, fault.message)
        )
    for part in parts:
        turn_rows_of(part).take_settled(turns)


def rejected_episode_findings(statistics, batch_invalid: np.ndarray, file: str, first_row: int, computation):
    """``episode-rejected`` findings for the rows of a batch (those valid so far:
    ``batch_invalid`` False) whose episode was rejected when the episodes were settled."""
    turns = turn_rows_of(statistics)
    if turns is None or not turns.reasons:
        return []
    file_rows = first_row + np.flatnonzero(~batch_invalid)
    places = turns.places(file_rows)
    hit = np.flatnonzero(turns.rejected[places])
    column = computation.turn_rows.episode
    return [
        Finding(file, int(file_rows[index]), column, "episode-rejected", turns.reasons[int(places[index])])
        for index in hit.tolist()
    ]


def settled_values_of(statistics, spec, file_rows: np.ndarray) -> np.ndarray:
    """The settled value of the side ``spec`` over turn rows at each of ``file_rows`` (a
    turn-row estimator's advantage; masked GAE's terminal reward over episodes)."""
    turns = turn_rows_of(statistics)
    if turns is None or spec not in turns.results:
        raise ValueError(f"estimator {spec.estimator!r}: the turn rows of the input are needed")
    return turns.settled(spec, file_rows)


def turn_column_findings(schema: pa.Schema, file: str, turns) -> list[Finding]:
    """``gae validate``'s file-level findings of the turn-row columns (``turns``, a
    :class:`gaecli.pipeline.description.TurnColumns`): ``missing-column`` for one that is
    absent, ``wrong-type`` for a turn index that is not an integer or a turn reward that is not
    a number."""
    from gaecli.io.format import is_scalar_number_type

    named = (("--episode-col", turns.episode), ("--turn-col", turns.turn), ("--turn-rewards-col", turns.turn_rewards),
             ("--group-col", turns.group), ("--state-col", turns.state))  # fmt: skip
    findings = []
    for flag, name in named:
        if name is None:
            continue
        if name not in schema.names:
            findings.append(Finding(file, None, name, "missing-column", f"the {flag} column {name!r} is missing"))
            continue
        arrow_type = schema.field(name).type
        integer = flag == "--turn-col" and not pa.types.is_integer(arrow_type)
        number = flag == "--turn-rewards-col" and not is_scalar_number_type(arrow_type)
        if integer or number:
            expected = "an integer" if integer else "a number"
            message = f"the {flag} column {name!r} is {arrow_type}, expected {expected} per row"
            findings.append(Finding(file, None, name, "wrong-type", message))
    return findings


def turn_row_findings(batch: pa.RecordBatch, file: str, first_row: int, turns) -> list[Finding]:
    """``null`` findings for a turn row's null ids, turn index or turn reward and
    ``non-finite`` for a turn reward that is NaN or ±Inf (one per row, the lowest row first)."""
    found: dict[int, Finding] = {}
    named = (("episode id", turns.episode), ("turn index", turns.turn), ("group id", turns.group),
             ("state id", turns.state), ("turn reward", turns.turn_rewards))  # fmt: skip
    for what, name in named:
        if name is None:
            continue
        column = batch.column(name)
        if column.null_count:
            for row in np.flatnonzero(np.asarray(column.is_null())).tolist():
                found.setdefault(first_row + row, Finding(file, first_row + row, name, "null", f"the {what} is null"))
    if turns.turn_rewards is None:
        return [found[row] for row in sorted(found)]
    rewards = np.asarray(batch.column(turns.turn_rewards).cast(pa.float64()).fill_null(0.0))
    for row in np.flatnonzero(~np.isfinite(rewards)).tolist():
        message = f"the turn reward is {rewards[row].item()}"
        found.setdefault(first_row + row, Finding(file, first_row + row, turns.turn_rewards, "non-finite", message))
    return [found[row] for row in sorted(found)]


def add_turn_rows(rows: TurnRows, batch: pa.RecordBatch, invalid: np.ndarray, first_row: int, turns, terminal: str):
    """Add one batch's turn rows to ``rows`` (``gae validate``: the rows valid under every
    rule, and the episodes of the others)."""
    valid = batch.filter(pa.array(~invalid)) if invalid.any() else batch
    outcomes = np.asarray(valid.column(terminal).cast(pa.float64()))
    rows.add(valid.column(turns.episode), turn_operand(batch, invalid, valid, outcomes, turns, None, first_row))


def episode_findings(parts: list, labels: list[str], turns, terminal: str) -> list[list[Finding]]:
    """``gae validate``'s findings of the episodes over every file: the parts' turn rows
    (one :class:`TurnRows` per file, in input order; None for a file not read) merged and
    checked (``duplicate-turn``, ``episode-mismatch``), one list per part."""
    merged = TurnRows()
    read = [index for index, part in enumerate(parts) if part is not None]
    for index in read:
        merged.merge(parts[index])
    found: list[list[Finding]] = [[] for _ in parts]
    column = {"turn": turns.turn, "outcome": terminal, "group": turns.group}
    for fault in merged.settle((), [labels[index] for index in read]):
        if fault.code == "episode-rejected":  # the invalid row has its own finding
            continue
        finding = Finding(labels[read[fault.part]], fault.row, column[fault.role], fault.code, fault.message)
        found[read[fault.part]].append(finding)
    return found


def episode_carry_figures(packed, valid: pa.RecordBatch, computation: Computation) -> dict:
    """The carry figures of masked GAE over episodes of a packed batch's rows
    (:func:`gaecli.advantages.episodes.carry_figures`): each row's own masked GAE with its turn
    reward as its terminal reward."""
    from dataclasses import replace

    from gaecli.advantages.episodes import carry_figures, row_spec
    from gaecli.pipeline.packing import compute_packed

    spec, turns = computation.episode_carried, computation.turn_rows
    terminal = np.zeros(valid.num_rows, dtype=packed.terminal_rewards.dtype)
    if turns.turn_rewards is not None and spec.turn_rewards is not None:
        terminal = np.asarray(valid.column(turns.turn_rewards).cast(pa.float64())).astype(terminal.dtype)
    own = replace(packed, terminal_rewards=terminal, uploaded={})
    advantages, _ = compute_packed(own, row_spec(spec), computation.kernel, computation.device)
    return carry_figures(advantages, packed.values, packed.trainable, packed.offsets)


def episode_side(packed, spec, computation: Computation, statistics, file_rows: np.ndarray):
    """A side over episodes (but a turn-row estimator's) of a packed batch's rows: masked GAE or
    reinforce++, each row's own with the settled terminal reward (its turn reward and the carry
    from its episode's later rows); an outcome estimator, its episode's advantage on each row."""
    from dataclasses import replace

    from gaecli.advantages.contract import CARRIED
    from gaecli.advantages.dispatch import ROW_ADVANTAGE
    from gaecli.advantages.episodes import row_spec
    from gaecli.pipeline.packing import compute_packed

    settled = settled_values_of(statistics, spec, file_rows)
    if spec.estimator not in CARRIED:
        inputs = {ROW_ADVANTAGE: settled}
        return compute_packed(packed, row_spec(spec), computation.kernel, computation.device, inputs)
    carried = replace(packed, terminal_rewards=settled.astype(packed.terminal_rewards.dtype), uploaded={})
    return compute_packed(carried, row_spec(spec), computation.kernel, computation.device)


def batch_turn_operand(batch: pa.RecordBatch, invalid: np.ndarray, valid: pa.RecordBatch, packed, computation,
                       first_row: int) -> dict:  # fmt: skip
    """:func:`turn_operand` of a checked and packed batch of the statistics pass, with the
    carry figures where a side's recursion runs over episodes and each row's part of its
    episode's score where a side is critic-free."""
    carries = {} if computation.episode_carried is None else episode_carry_figures(packed, valid, computation)
    if computation.critic_free:  # an outcome estimator's part of each episode's score
        from gaecli.advantages.estimators import row_scores

        zeros = np.zeros(valid.num_rows)
        carries["score_part"], tokens = row_scores(packed.rewards, packed.trainable, packed.offsets, zeros)
        carries.setdefault("tokens", tokens)
    outcomes = packed.terminal_rewards
    turns, step = computation.turn_rows, computation.step_by
    return turn_operand(batch, invalid, valid, outcomes, turns, step, first_row, carries)
