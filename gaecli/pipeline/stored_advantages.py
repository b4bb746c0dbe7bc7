"""The rules of ``gae validate`` on the advantages a trainer stored (``--against``, default
``advantages``): how they were normalised (``whitened-over-masked``, ``normalised-twice``,
``group-mean-batch-std``), groups of equal rewards that still carry a signal
(``equal-rewards-nonzero``) and signal at masked tokens (``nonzero-at-masked``); the criteria
and their limits are in docs/validate.md#rules-on-stored-advantages.

A file is one training batch: its statistics are accumulated batch by batch (vectorised:
per-row figures, then keyed sums per group, :class:`gaecli.advantages.keyed.KeyedSums`) and
judged once the file has been read, as the duplicate ids are. Memory: a few figures per group
of the file, whatever its rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa

from gaecli.advantages.estimators import row_scores
from gaecli.advantages.faults import first_per_row, non_finite, rows_of_positions
from gaecli.advantages.keyed import KeyedSums
from gaecli.advantages.statistics import Moments, row_moments
from gaecli.checks import BatchCheck, Finding, Flagged, missing_column
from gaecli.errors import InvalidOptionError
from gaecli.io.format import Columns, is_list_type, is_real_type, list_parts, numeric_numpy
from gaecli.rules import cap_per_rule

DEFAULT_AGAINST = "advantages"
"""The stored column read when ``--against`` is not given (where a file has it)."""
NO_AGAINST = "none"
"""``--against none``: none of these rules."""

MEAN_TOLERANCE = 1e-3
"""A mean is ≈ 0 when ``|mean| ≤ MEAN_TOLERANCE``; the groups' means agree when they lie within it."""
STD_TOLERANCE = 1e-2
"""A std is ≈ 1 when ``|std − 1| ≤ STD_TOLERANCE``; the groups' stds agree when ``max / min − 1`` is within it."""
CLEAR_BIAS = 1e-2
"""A mean is clearly ≠ 0 when ``|mean| > CLEAR_BIAS`` (ten times :data:`MEAN_TOLERANCE`)."""
ZERO_TOLERANCE = 1e-6
"""An advantage is non-zero when ``|A| > ZERO_TOLERANCE``; numbers agree (a row's advantages, a
group's scores) when ``max − min ≤ ZERO_TOLERANCE · max(1, |max|, |min|)``."""
MIN_GROUPS = 2
"""The groups with a spread of advantages that ``normalised-twice`` and ``group-mean-batch-std`` need."""


@dataclass(frozen=True)
class StoredAdvantages:
    """Which stored column the rules read: ``column`` None: :data:`DEFAULT_AGAINST` where a
    file has it (a file without it runs none of them), a name: that column, which every file
    must have (``missing-column`` otherwise), ``'none'``: no rule. ``group``: the prompt-group
    id column of the group rules (None: no group rule)."""

    column: Optional[str] = None
    group: Optional[str] = None

    def __post_init__(self) -> None:
        if self.column is not None and not self.column:
            raise InvalidOptionError("--against: the column name is empty")
        if self.group is not None and not self.group:
            raise InvalidOptionError("--group-col: the column name is empty")
        if self.group is not None and self.off:
            raise InvalidOptionError("--group-col names the groups of the rules on stored advantages: not with "
                                     "--against none")  # fmt: skip

    @property
    def off(self) -> bool:
        return self.column is not None and self.column.lower() == NO_AGAINST

    def file_checks(
        self, schema: pa.Schema, file: str, columns: Columns
    ) -> tuple[list[Finding], Optional["StoredChecks"]]:
        """The file-level findings of the stored and group columns, and the file's checks
        (None where no rule runs: no stored column by default, or one missing or of another type)."""
        name = self.column or DEFAULT_AGAINST
        if self.off or schema.names.count(name) > 1:  # a name held twice is check_schema's finding
            return [], None
        explicit = self.column is not None
        if name not in schema.names:
            return ([missing_column(file, name, schema.names, "--against column")] if explicit else []), None
        arrow_type = schema.field(name).type
        if not (is_list_type(arrow_type) and is_real_type(arrow_type.value_type)):
            message = f"column {name!r} is {arrow_type}, expected a list of float32 or float64"
            return ([Finding(file, None, name, "wrong-type", message)] if explicit else []), None
        findings, group = [], self.group
        if group is not None and group not in schema.names:
            findings.append(missing_column(file, group, schema.names, "--group-col column"))
            group = None
        elif group is not None and pa.types.is_nested(_decoded_type(schema.field(group).type)):
            message = f"column {group!r} is {schema.field(group).type}, expected numbers, strings or dates"
            findings.append(Finding(file, None, group, "wrong-type", message))
            group = None
        return findings, StoredChecks(file, name, group, columns)


DEFAULT_STORED = StoredAdvantages()
"""The default: the rules on the ``advantages`` column where a file has it, without groups."""


def _decoded_type(arrow_type: pa.DataType) -> pa.DataType:
    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


class GroupFigures(KeyedSums):
    """Per group of a file: its valid rows, those with a trainable token (``judged``), the
    sum and sum of squares of their advantages (a row's: the mean of its trainable tokens'),
    the lowest and highest score, the first row and the largest |A| at a trainable token."""

    COUNTS = ("rows", "judged")
    SUMS = ("advantages", "squares")
    LOWS = ("score_low", "first_row")
    HIGHS = ("score_high", "magnitude")


def stored_numbers(batch: pa.RecordBatch, name: str, mask_offsets: np.ndarray, mask_name: str, flagged: Flagged):
    """The stored column's numbers over the mask's tokens (float64 ``[N]``; 0 on a row at
    fault), its faults flagged as the checks flag a token column's: ``null`` (a null list or
    a null in one), ``length-mismatch`` (not the mask's length), ``non-finite`` (the first NaN
    or ±Inf of a row named)."""
    array = batch.column(name)
    offsets, flat = list_parts(array)
    lengths, mask_lengths = np.diff(offsets), np.diff(mask_offsets)
    null_rows = np.asarray(array.is_null()) if array.null_count else np.zeros(batch.num_rows, dtype=bool)
    flagged.flag(null_rows, name, "null", "the list is null")
    if flat.null_count:
        positions = np.flatnonzero(np.asarray(flat.is_null()))
        flagged.flag(rows_of_positions(offsets, positions), name, "null", "the list holds a null")
    differ = (lengths != mask_lengths) & ~null_rows
    flagged.flag(
        differ, name, "length-mismatch",
        lambda row: f"{name!r} has {lengths[row]} tokens, {mask_name!r} has {mask_lengths[row]}",
    )  # fmt: skip
    numbers = numeric_numpy(flat.fill_null(0.0) if flat.null_count else flat).astype(np.float64, copy=False)
    faults = non_finite(numbers, offsets)
    if faults is not None:
        bad_rows, bad_first = faults

        def non_finite_message(row: int) -> str:
            position = bad_first[np.searchsorted(bad_rows, row)]
            return f"{name!r} is {numbers[position].item()} at token {position - offsets[row]}"

        flagged.flag(bad_rows, name, "non-finite", non_finite_message)
    if not (differ.any() or null_rows.any() or offsets[-1] != mask_offsets[-1]):
        return numbers
    rows = np.repeat(np.arange(batch.num_rows), mask_lengths)
    kept = ~(differ | null_rows)[rows]
    aligned = np.zeros(rows.size, dtype=np.float64)
    within = np.arange(rows.size) - mask_offsets[rows]
    aligned[kept] = numbers[offsets[rows[kept]] + within[kept]]
    return aligned


class RowFigures(NamedTuple):
    """Per row of a batch: trainable tokens, sum of the advantages there, their lowest and
    highest and largest |A| (±inf for a row without a trainable token)."""

    trainable: np.ndarray
    sums: np.ndarray
    squares: np.ndarray
    low: np.ndarray
    high: np.ndarray
    magnitude: np.ndarray


def row_figures(numbers: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> RowFigures:
    """:class:`RowFigures` of flat ``numbers`` and bool ``trainable`` ``[N]`` (``offsets`` ``[B + 1]``)."""
    counts, sums, squares = row_moments(numbers, trainable, offsets)
    rows = counts.size
    low, high, magnitude = np.full(rows, np.inf), np.full(rows, -np.inf), np.full(rows, -np.inf)
    some = counts > 0
    if some.any():
        kept = numbers[trainable]
        starts = (np.cumsum(counts) - counts)[some]
        low[some] = np.minimum.reduceat(kept, starts)
        high[some] = np.maximum.reduceat(kept, starts)
        magnitude[some] = np.maximum.reduceat(np.abs(kept), starts)
    return RowFigures(counts, sums, squares, low, high, magnitude)


def agree(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Whether each pair of lowest and highest agrees (:data:`ZERO_TOLERANCE`)."""
    scale = np.maximum(1.0, np.maximum(np.abs(low), np.abs(high)))
    return (high - low) <= ZERO_TOLERANCE * scale


class StoredChecks:
    """The rules on the stored column ``name`` of one file (``group``: the group column, or
    None): :meth:`add` each batch, then :meth:`finish`."""

    def __init__(self, file: str, name: str, group: Optional[str], columns: Columns) -> None:
        self.file, self.name, self.group, self.columns = file, name, group, columns
        self.tokens, self.trainable = Moments(), Moments()  # over every token, over the trainable ones
        self.groups = GroupFigures()
        self.varying = 0  # rows whose advantage differs between their trainable tokens

    def names(self) -> tuple[str, ...]:
        """The columns the rules read (besides the checks' own)."""
        return (self.name,) if self.group is None else (self.name, self.group)

    def add(self, batch: pa.RecordBatch, check: BatchCheck, first_row: int, ids, max_findings: Optional[int],
            findings: Sequence[Finding], counts: dict) -> tuple[list[Finding], dict]:  # fmt: skip
        """Check one batch (checked by :func:`gaecli.checks.check_batch` as ``check``, rows from
        ``first_row``) and add its figures: the stored column's faults (errors) and
        ``nonzero-at-masked``, merged with the batch's ``findings`` and ``counts`` in row order
        (at most ``max_findings`` of each rule listed). Only rows without an error are judged."""
        flagged = Flagged(batch.num_rows)
        offsets, trainable = check.offsets, check.trainable
        numbers = stored_numbers(batch, self.name, offsets, self.columns.loss_mask, flagged)
        if self.group is not None and batch.column(self.group).null_count:
            flagged.flag(np.asarray(batch.column(self.group).is_null()), self.group, "null", "the group id is null")
        valid = ~check.invalid & ~flagged.invalid
        token_valid = np.repeat(valid, np.diff(offsets))
        self._flag_masked(flagged, numbers, trainable | ~token_valid, offsets)
        rows = row_figures(numbers, trainable, offsets)
        everything = row_moments(numbers, np.ones(numbers.size, dtype=bool), offsets)
        self.trainable.add(None, {"counts": rows.trainable[valid], "sums": rows.sums[valid],
                                  "squares": rows.squares[valid]})  # fmt: skip
        self.tokens.add(None, {"counts": everything[0][valid], "sums": everything[1][valid],
                               "squares": everything[2][valid]})  # fmt: skip
        if self.group is not None:
            self._add_groups(batch, check, rows, valid, first_row)
        merged = sorted([*findings, *flagged.findings(self.file, first_row, ids, max_findings)],
                        key=lambda finding: -1 if finding.row is None else finding.row)  # fmt: skip
        total = dict(counts)
        for code, count in flagged.counts.items():
            total[code] = total.get(code, 0) + count
        return cap_per_rule(merged, max_findings), total

    def _flag_masked(self, flagged: Flagged, numbers: np.ndarray, skipped: np.ndarray, offsets: np.ndarray) -> None:
        """``nonzero-at-masked``: a row's non-zero advantages at masked tokens (``skipped``:
        the trainable tokens and those of rows not judged)."""
        positions = np.flatnonzero(~skipped & (np.abs(numbers) > ZERO_TOLERANCE))
        if positions.size == 0:
            return
        rows, first = first_per_row(offsets, positions)
        per_row = np.bincount(rows_of_positions(offsets, positions), minlength=offsets.size - 1)
        name = self.name

        def message(row: int) -> str:
            position = first[np.searchsorted(rows, row)]
            many = per_row[row]
            return (
                f"{name!r} is {numbers[position]:.4g} at masked token {position - offsets[row]} "
                f"({many} masked token{'s' if many != 1 else ''} non-zero): the loss must mask these positions, "
                "or the policy trains on tool output and observations"
            )

        flagged.flag(rows, name, "nonzero-at-masked", message)

    def _add_groups(self, batch, check: BatchCheck, rows: RowFigures, valid: np.ndarray, first_row: int) -> None:
        """Each valid row's figures added to its group's."""
        keys = batch.column(self.group)
        keys = keys.dictionary_decode() if pa.types.is_dictionary(keys.type) else keys
        offsets, trainable = check.offsets, check.trainable
        rewards = check.flat.get(self.columns.rewards) if self.columns.rewards is not None else None
        rewards = np.zeros(trainable.size) if rewards is None else rewards
        terminal = batch.column(self.columns.terminal_reward)
        terminal = numeric_numpy(terminal.fill_null(0) if terminal.null_count else terminal)
        scores, _ = row_scores(rewards, trainable, offsets, terminal)
        judged = rows.trainable > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            advantages = np.where(judged, rows.sums / np.maximum(rows.trainable, 1), 0.0)
        self.varying += int((valid & judged & ~agree(rows.low, rows.high)).sum())
        figures = {
            "rows": np.ones(batch.num_rows, dtype=np.int64),
            "judged": judged.astype(np.int64),
            "advantages": advantages,
            "squares": advantages * advantages,
            "score_low": scores,
            "score_high": scores,
            "first_row": (first_row + np.arange(batch.num_rows)).astype(np.float64),
            "magnitude": rows.magnitude,
        }
        self.groups.add(keys.filter(pa.array(valid)), {name: values[valid] for name, values in figures.items()})

    def finish(self, ids, max_findings: Optional[int]) -> tuple[list[Finding], dict]:
        """The file's findings once every batch is in: the file-level ones
        (``whitened-over-masked``, ``normalised-twice``, ``group-mean-batch-std``), then
        ``equal-rewards-nonzero`` per group in row order (at most ``max_findings`` of each
        rule; ``ids``: each file row's id, or None)."""
        findings, counts = [], {}
        file_level = [("whitened-over-masked", whitened_over_masked(self.name, self.tokens, self.trainable))]
        spread = group_spread(self.groups, self.trainable) if self.group is not None and not self.varying else None
        if spread is not None:
            file_level += [
                ("normalised-twice", normalised_twice(self.name, self.group, spread)),
                ("group-mean-batch-std", group_mean_batch_std(self.name, self.group, spread)),
            ]
        for code, message in file_level:
            if message is not None:
                counts[code] = 1
                findings.append(Finding(self.file, None, self.name, code, message))
        if self.group is not None:
            silent = silent_groups(self.groups)
            if silent.size:
                counts["equal-rewards-nonzero"] = int(silent.size)
                findings += self._silent_group_findings(silent, ids, max_findings)
        return cap_per_rule(findings, max_findings), counts

    def _silent_group_findings(self, codes: np.ndarray, ids, max_findings: Optional[int]) -> list[Finding]:
        first = self.groups.low("first_row")[codes].astype(np.int64)
        order = np.argsort(first, kind="stable")[: max_findings if max_findings is not None else None]
        keys = self.groups.table.keys()
        findings = []
        for index in order.tolist():
            code, row = int(codes[index]), int(first[index])
            score = self.groups.low("score_low")[code]
            message = (
                f"the {self.groups.count('rows')[code]} rows of group {keys[code].as_py()!r} "
                f"({self.group!r}, from row {row}) all score {score:.6g}, yet {self.name!r} reaches "
                f"{self.groups.high('magnitude')[code]:.4g} at trainable tokens: a group whose rewards agree "
                "should carry no learning signal"
            )
            findings.append(Finding(self.file, row, self.name, "equal-rewards-nonzero", message,
                                    None if ids is None else ids[row]))  # fmt: skip
        return findings


def _shown(mean: float) -> float:
    """A mean as a message shows it: 0 within :data:`ZERO_TOLERANCE` (float32 noise)."""
    return 0.0 if abs(mean) <= ZERO_TOLERANCE else mean


def whitened_over_masked(name: str, tokens: Moments, trainable: Moments) -> Optional[str]:
    """``whitened-over-masked``: over every token of the judged rows the mean is ≈ 0 and the
    (Bessel) std ≈ 1, over their trainable tokens (at least 2, and 1 masked token) the mean is
    clearly ≠ 0; the message, or None."""
    if tokens.size == 0 or trainable.size == 0:
        return None
    every, kept = int(tokens.count("counts")[0]), int(trainable.count("counts")[0])
    if kept < 2 or every == kept:
        return None
    (mean,), (variance,) = tokens.mean_variance()
    (kept_mean,), _ = trainable.mean_variance()
    std = math.sqrt(variance)
    if abs(mean) > MEAN_TOLERANCE or abs(std - 1.0) > STD_TOLERANCE or abs(kept_mean) <= CLEAR_BIAS:
        return None
    return (
        f"over all {every} tokens {name!r} has mean {_shown(mean):.2g} and std {std:.4f} (whitened), but over "
        f"the {kept} trainable tokens its mean is {kept_mean:.4g}: the whitening counted the {every - kept} "
        "masked tokens too, so the trainable tokens' advantages are biased by the masked tokens' share of the "
        "statistics"
    )


class GroupSpread(NamedTuple):
    """The groups of a file that show how it was normalised: those of at least 2 rows, every
    one judged (a row without a trainable token counts in the trainer's group statistics but
    shows no advantage), scores that differ and a spread of advantages (std > :data:`MEAN_TOLERANCE`).
    ``means``: their lowest and highest mean; ``stds``: their lowest and highest std, biased
    (``stds[0]``) and Bessel (``stds[1]``); ``ones``: those whose std is ≈ 1 either way;
    ``batch_std``: the Bessel std over every trainable token of the judged rows."""

    groups: int
    means: tuple[float, float]
    stds: tuple[tuple[float, float], tuple[float, float]]
    ones: int
    batch_std: float

    @property
    def mean(self) -> float:
        return (self.means[0] + self.means[1]) / 2

    @property
    def same_mean(self) -> bool:
        return self.means[1] - self.means[0] <= MEAN_TOLERANCE

    @property
    def whitened(self) -> bool:
        return abs(self.batch_std - 1.0) <= STD_TOLERANCE

    def same_stds(self) -> list[tuple[str, float]]:
        """(``biased`` or ``Bessel``, the std) of each way the groups' stds agree."""
        return [
            (way, (low + high) / 2)
            for way, (low, high) in zip(("biased", "Bessel"), self.stds)
            if high <= low * (1.0 + STD_TOLERANCE)
        ]


def group_spread(groups: GroupFigures, trainable: Moments) -> Optional[GroupSpread]:
    """The :class:`GroupSpread` of a file's groups, or None with fewer than :data:`MIN_GROUPS`."""
    if groups.size == 0 or trainable.size == 0:
        return None
    judged = groups.count("judged")
    scored = ~agree(groups.low("score_low"), groups.high("score_high"))
    several = (judged >= 2) & (judged == groups.count("rows")) & scored  # a row without tokens hides its value
    n = judged[several].astype(np.float64)
    sums, squares = groups.total("advantages")[several], groups.total("squares")[several]
    means = sums / n
    spread = np.maximum(squares - sums * means, 0.0)
    biased, bessel = np.sqrt(spread / n), np.sqrt(spread / (n - 1))
    varied = biased > MEAN_TOLERANCE
    if int(varied.sum()) < MIN_GROUPS:
        return None
    means, biased, bessel = means[varied], biased[varied], bessel[varied]
    ones = (np.abs(biased - 1.0) <= STD_TOLERANCE) | (np.abs(bessel - 1.0) <= STD_TOLERANCE)
    _, (variance,) = trainable.mean_variance()
    return GroupSpread(
        int(varied.sum()),
        (float(means.min()), float(means.max())),
        ((float(biased.min()), float(biased.max())), (float(bessel.min()), float(bessel.max()))),
        int(ones.sum()),
        math.sqrt(variance),
    )


def normalised_twice(name: str, group: str, spread: GroupSpread) -> Optional[str]:
    """``normalised-twice``: the batch std ≈ 1, every group's mean the same ``c`` and every
    group's std the same ``k`` (biased or Bessel), but not ``c ≈ 0`` with ``k ≈ 1`` (one group
    normalisation); the message, or None."""
    if not (spread.whitened and spread.same_mean):
        return None
    same = spread.same_stds()
    mean = spread.mean
    if not same or any(abs(mean) <= MEAN_TOLERANCE and abs(std - 1.0) <= STD_TOLERANCE for _, std in same):
        return None
    way, std = same[-1]
    return (
        f"{name!r} is one number per row; over the trainable tokens its std is {spread.batch_std:.4f} (whitened), "
        f"and all {spread.groups} groups of {group!r} share one mean {_shown(mean):.4g} and one std {std:.4g} ({way}): "
        "normalised in the groups, then whitened again over the batch; the second step moved every group's "
        "advantages by the same amount, so the group baselines no longer cancel and groups of equal rewards "
        "are pushed too"
    )


def group_mean_batch_std(name: str, group: str, spread: GroupSpread) -> Optional[str]:
    """``group-mean-batch-std``: the batch std ≈ 1 and every group's mean the same, but the
    groups' stds agree neither way and fewer than half of them are ≈ 1; the message, or None."""
    if not (spread.whitened and spread.same_mean) or spread.same_stds() or 2 * spread.ones >= spread.groups:
        return None
    (low, high), _ = spread.stds
    return (
        f"{name!r} is one number per row, centred on one mean {_shown(spread.mean):.4g} in each of the {spread.groups} "
        f"groups of {group!r}, but the groups' stds range from {low:.4g} to {high:.4g} while the std over the "
        f"trainable tokens is {spread.batch_std:.4f}: a group mean with a batch std; groups with a wider spread "
        "of rewards take larger steps (REINFORCE++-baseline means it; GRPO divides each group by its own std)"
    )


def silent_groups(groups: GroupFigures) -> np.ndarray:
    """``equal-rewards-nonzero``: the codes of the groups of at least 2 rows whose scores agree
    and whose advantages reach |A| > :data:`ZERO_TOLERANCE` at a trainable token."""
    if groups.size == 0:
        return np.zeros(0, dtype=np.int64)
    equal = agree(groups.low("score_low"), groups.high("score_high"))
    return np.flatnonzero((groups.count("rows") >= 2) & equal & (groups.high("magnitude") > ZERO_TOLERANCE))
