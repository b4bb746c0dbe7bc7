"""``gae import nemo-rl`` as a library: stream NeMo-RL's training-data JSONL
(``train_data_step{N}.jsonl``, written by ``nemo_rl/utils/logger.py::Logger.log_batched_dict_as_jsonl``
from the GRPO and PPO loops) into one rollout Parquet file with the columns of
``gae import miles`` that the file has (see docs/import.md).

Each line is one sample; every field a one-element list, plus ``idx``: ``rewards``,
``input_lengths``, ``token_ids``, ``token_loss_mask``, ``sample_loss_mask``, ``advantages``,
``generation_logprobs``, ``prev_logprobs``, ``content`` (optionally ``filtered_rewards``,
``agent_ref``). Token lists cover prompt + response + right padding, index t being token t.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from gaecli.errors import GAEInputError, GAEUsageError
from gaecli.importers.common import (
    MAX_LIST_TOKENS,
    ImportOptions,
    ImportPlan,
    list_offsets,
    open_binary,
    run_import,
    schema_metadata,
)
from gaecli.importers.report import ImportedFile, ImportReport
from gaecli.importers.values import INT64_RANGE, shown
from gaecli.io.filesystem import AnyPath
from gaecli.io.paths import INPUT_PATTERNS

if TYPE_CHECKING:
    from typing_extensions import Unpack

DUMP_PATTERNS = INPUT_PATTERNS["NeMo-RL dump"]
STEP_NAME = re.compile(r"^train_data_step(\d+)\.jsonl$")
FLOAT64_MAX = sys.float_info.max
LONGEST_INTEGER = 400  # characters of a JSON integer literal converted (float64's largest has 309 digits)
BATCH_ROWS = 64  # lines held at once: NeMo-RL's lines hold whole padded sequences
TOKEN_KEYS = ("token_loss_mask", "advantages", "prev_logprobs")
SCALAR_KEYS = ("rewards", "input_lengths", "sample_loss_mask")
REQUIRED_KEYS = (*SCALAR_KEYS, *TOKEN_KEYS, "idx")
FILTERED_REWARDS = "filtered_rewards"  # with dynamic sampling: the rewards the trainer used
PROMPT_KEY = "token_ids"  # prompt + response token ids: the prompt groups come from it
KNOWN_KEYS = (*REQUIRED_KEYS, FILTERED_REWARDS, PROMPT_KEY)
PROMPT_GROUP = pa.field("prompt_group", pa.int64())
SCHEMA_FIELDS = (
    pa.field("rollout_id", pa.int64()),
    pa.field("sample_index", pa.int64()),
    pa.field("loss_mask", pa.list_(pa.float32())),
    pa.field("terminal_reward", pa.float64()),
    pa.field("response_length", pa.int64()),
    pa.field("total_length", pa.int64()),
    pa.field("log_probs", pa.list_(pa.float64())),
    pa.field("trained_advantages", pa.list_(pa.float64())),
)
MISSING_COLUMNS = ("rank", "values", "ref_log_probs", "trained_returns")  # gae import miles' columns the file lacks


def step_of(path: AnyPath) -> int:
    """``N`` of ``train_data_step{N}.jsonl`` (the training step: the rollout_id). A name
    without it, or whose N does not fit the int64 ``rollout_id``, is a usage error (the file
    name is unusable, whatever the file holds)."""
    match = STEP_NAME.match(path.name)
    if match is None:
        raise GAEUsageError(
            f"{path}: cannot tell the training step from the name; NeMo-RL writes "
            f"train_data_step{{N}}.jsonl (rename the file so)"
        )
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > len(str(INT64_RANGE[1])) or int(digits) > INT64_RANGE[1]:
        raise GAEUsageError(
            f"{path}: the step in the name ({len(digits):,} digits) does not fit a rollout_id (int64, at most "
            f"{INT64_RANGE[1]:,}); rename the file"
        )
    return int(digits)


class _LongInteger:
    """A JSON integer literal of more digits than any float64 or int64 holds (not converted:
    Python refuses ``int()`` beyond 4,300 digits, and none would fit a column)."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __str__(self) -> str:
        return f"an integer of {self.digits:,} digits"


def _json_integer(text: str) -> Any:
    return int(text) if len(text) <= LONGEST_INTEGER else _LongInteger(text)


def _shown(value: Any) -> str:
    """A JSON value as a message shows it (bounded: :func:`gaecli.importers.values.shown`)."""
    if isinstance(value, _LongInteger):
        return str(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return shown(value)


@dataclass
class _Line:
    """One sample as read: the line number and the fields gaecli imports."""

    number: int
    sample_index: int
    reward: float
    length: int
    sample_mask: float
    tokens: dict[str, list]
    filtered: bool  # the reward is filtered_rewards


class PromptGroups:
    """The prompt-group id of each row: rows of one step whose prompt token ids (``token_ids[:s]``,
    the tokens before the first trainable one) are identical share an id; ids count the distinct
    (step, prompt) pairs in row order from 0, so that no two steps share one."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.seen: dict[bytes, int] = {}
        self.count = 0

    def ids(self, step: int, prompts: list[bytes]) -> np.ndarray:
        if step != self.step:
            self.step, self.seen = step, {}
        found = np.empty(len(prompts), dtype=np.int64)
        for row, prompt in enumerate(prompts):  # one dict look-up per row, as the row's JSON parse is
            if prompt not in self.seen:
                self.seen[prompt] = self.count
                self.count += 1
            found[row] = self.seen[prompt]
        return found


def _one(record: dict, key: str, where: str) -> Any:
    value = record.get(key)
    if key not in record:
        raise GAEInputError(f"{where}: key {key!r} is missing (NeMo-RL's train data has {', '.join(REQUIRED_KEYS)})")
    if not isinstance(value, list) or len(value) != 1:
        found = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise GAEInputError(f"{where}: {key!r} is {found}, expected a one-element list (one sample per line)")
    return value[0]


def _number(value: Any, key: str, where: str, integer: bool = False) -> Any:
    """``value`` checked: an int (``integer``: in the int64 range) or a number a float64
    holds (an integer literal of 400 digits is none)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, _LongInteger) or isinstance(value, int) and not _fits(value, integer):
        raise GAEInputError(
            f"{where}: {key!r} holds {_shown(value)}, out of the {'int64' if integer else 'float64'} range"
        )
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise GAEInputError(
            f"{where}: {key!r} holds {_shown(value)}, expected {'an integer' if integer else 'a number'}"
        )
    return value


def _fits(number: int, integer: bool) -> bool:
    if integer:
        return INT64_RANGE[0] <= number <= INT64_RANGE[1]
    return abs(number) <= FLOAT64_MAX


def parse_line(
    text: bytes, number: int, source: AnyPath, ignored: set[str], prompts: bool = False
) -> Optional[_Line]:
    """One JSONL line checked (keys, one-element lists, numbers, token lists covering
    ``input_lengths``; ``prompts``: ``token_ids`` too); ``None`` for a blank line. Unknown keys
    are added to ``ignored``."""
    where = f"{source}:{number}"
    if not text.strip():
        return None
    try:
        record = json.loads(text, parse_int=_json_integer)
    except RecursionError:
        raise GAEInputError(f"{where}: refused: the JSON nests arrays or objects deeper than Python can read") from None
    except (ValueError, UnicodeDecodeError) as error:  # json.JSONDecodeError is a ValueError
        raise GAEInputError(f"{where}: not a JSON line ({error})") from None
    if not isinstance(record, dict):
        raise GAEInputError(f"{where}: holds a {type(record).__name__}, expected a JSON object (one sample)")
    ignored.update(str(key) for key in record if key not in KNOWN_KEYS)
    if "idx" not in record:
        raise GAEInputError(f"{where}: key 'idx' is missing (NeMo-RL's train data has {', '.join(REQUIRED_KEYS)})")
    sample_index = _number(record["idx"], "idx", where, integer=True)
    reward_key = FILTERED_REWARDS if FILTERED_REWARDS in record else "rewards"
    if reward_key != "rewards":
        _one(record, "rewards", where)
    reward = _number(_one(record, reward_key, where), reward_key, where)
    length = _number(_one(record, "input_lengths", where), "input_lengths", where, integer=True)
    if length < 0:
        raise GAEInputError(f"{where}: 'input_lengths' is {length}, expected a length ≥ 0")
    sample_mask = _number(_one(record, "sample_loss_mask", where), "sample_loss_mask", where)
    tokens = {}
    for key in (*TOKEN_KEYS, PROMPT_KEY) if prompts else TOKEN_KEYS:
        values = _one(record, key, where)
        if not isinstance(values, list):
            raise GAEInputError(f"{where}: {key!r} holds {type(values).__name__}, expected a list of per-token numbers")
        if len(values) < length:
            raise GAEInputError(f"{where}: {key!r} has {len(values)} entries, fewer than input_lengths ({length})")
        tokens[key] = values[:length]
    return _Line(number, sample_index, float(reward), length, float(sample_mask), tokens, reward_key != "rewards")


def _flat(lines: list[_Line], key: str, source: AnyPath, total: int) -> np.ndarray:
    """One key's token lists of a batch as one float64 array (no Python loop over tokens:
    the types are collected by ``map``); a non-number (a string, null, true) is named with
    its line."""
    values = list(chain.from_iterable(line.tokens[key] for line in lines))
    if not set(map(type, values)) <= {int, float}:
        for line in lines:
            bad = [v for v in line.tokens[key] if type(v) not in (int, float)]
            if bad:
                raise GAEInputError(f"{source}:{line.number}: {key!r} holds {_shown(bad[0])}, expected numbers")
    try:
        return np.fromiter(values, dtype=np.float64, count=total)
    except OverflowError:  # an integer literal beyond the float64 range
        for line in lines:
            bad = [v for v in line.tokens[key] if type(v) is int and not _fits(v, integer=False)]
            if bad:
                raise GAEInputError(
                    f"{source}:{line.number}: {key!r} holds {_shown(bad[0])}, out of the float64 range"
                ) from None
        raise


def lines_batch(
    lines: list[_Line], rollout_id: int, source: AnyPath, schema: pa.Schema, groups: Optional[PromptGroups] = None
) -> tuple[pa.RecordBatch, int]:
    """A batch of samples as a record batch; also its token count. The response is
    ``[s, input_lengths)`` with s the first token whose ``token_loss_mask`` is not 0 (none:
    an empty response), found for the whole batch at once. ``groups``: the ``prompt_group``
    column too, from ``token_ids[:s]`` (:class:`PromptGroups`)."""
    lengths = np.array([line.length for line in lines], dtype=np.int64)
    offsets = list_offsets(lengths)
    total = int(offsets[-1])
    mask, advantages, log_probs = (_flat(lines, key, source, total) for key in TOKEN_KEYS)
    position = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    first = np.full(lengths.size, -1, dtype=np.int64)
    trainable = np.flatnonzero(mask != 0)
    rows_of = np.searchsorted(offsets[1:], trainable, side="right")
    # the first trainable token of each row: the first hit of each row among the sorted hits
    is_first = np.ones(trainable.size, dtype=bool)
    is_first[1:] = rows_of[1:] != rows_of[:-1]
    first[rows_of[is_first]] = position[trainable[is_first]]
    starts = np.where(first < 0, lengths, first)
    keep = position >= np.repeat(starts, lengths)
    response_lengths = lengths - starts
    out_offsets = list_offsets(
        response_lengths,
        lambda _: (
            f"{source}: lines {lines[0].number}–{lines[-1].number} hold more tokens than one Parquet "
            f"list column of a file part can ({MAX_LIST_TOKENS:,})"
        ),
    )
    sample_masks = np.array([line.sample_mask for line in lines], dtype=np.float64)
    loss_mask = (mask[keep] * np.repeat(sample_masks, response_lengths)).astype(np.float32)
    arrow_offsets = pa.array(out_offsets.astype(np.int32))

    def token_list(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(arrow_offsets, pa.array(values), type=pa.list_(value_type))

    arrays = [
        pa.array(np.full(lengths.size, rollout_id, dtype=np.int64)),
        pa.array(np.array([line.sample_index for line in lines], dtype=np.int64)),
        token_list(loss_mask, pa.float32()),
        pa.array(np.array([line.reward for line in lines], dtype=np.float64)),
        pa.array(response_lengths),
        pa.array(lengths),
        token_list(log_probs[keep], pa.float64()),
        token_list(advantages[keep], pa.float64()),
    ]
    if groups is not None:
        ids = _flat(lines, PROMPT_KEY, source, total)  # token ids are exact in float64 (below 2**53)
        prompts = [ids[begin : begin + start].tobytes() for begin, start in zip(offsets[:-1].tolist(), starts.tolist())]
        arrays.append(pa.array(groups.ids(rollout_id, prompts)))
    return pa.RecordBatch.from_arrays(arrays, schema=schema), int(response_lengths.sum())


def _lines(stream, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary stream (a local file or an object store's), read in chunks."""
    parts: list[bytes] = []
    while chunk := stream.read(chunk_bytes):
        *complete, rest = chunk.split(b"\n")
        if complete:
            yield b"".join(parts) + complete[0]
            yield from complete[1:]
            parts = []
        parts.append(rest)
    if any(parts):
        yield b"".join(parts)


def _has_prompts(path: AnyPath) -> bool:
    """Whether the first sample line of ``path`` has ``token_ids`` (then every line must have
    them, and the import writes ``prompt_group``); a first line that is no JSON object: False
    (its parse names the fault)."""
    with open_binary(path) as stream:
        for text in _lines(stream):
            if text.strip():
                try:
                    record = json.loads(text, parse_int=_json_integer)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    return False
                return isinstance(record, dict) and PROMPT_KEY in record
    return False


def _count_lines(path: AnyPath) -> int:
    """The number of lines (for the progress bar): bytes counted, nothing parsed."""
    count = 0
    with open_binary(path) as stream:
        while chunk := stream.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def import_nemo_rl(
    paths: Sequence[str | Any], output: str | Any, *, batch_rows: int = BATCH_ROWS, **options: Unpack[ImportOptions]
) -> ImportReport:
    """Import NeMo-RL ``train_data_step{N}.jsonl`` files into one rollout Parquet file.

    ``paths``: files, directories (read recursively for ``train_data_step*.jsonl``), globs
    or URIs. Rows are ordered by step N (numerically), then line. Per line: the response
    is ``[s, input_lengths)`` with s the first token whose ``token_loss_mask`` is not 0;
    ``loss_mask = token_loss_mask[s:L] · sample_loss_mask``, ``trained_advantages =
    advantages[s:L]``, ``log_probs = prev_logprobs[s:L]``, ``terminal_reward`` =
    ``filtered_rewards`` when the line has it (the rewards the trainer used under dynamic
    sampling), else ``rewards``; ``rollout_id`` = N, ``sample_index`` = ``idx``; where the
    first line of the first file has ``token_ids`` (then every line must), ``prompt_group``:
    rows of one step with identical ``token_ids[:s]`` share it (:class:`PromptGroups`), for
    ``--group-col prompt_group``. There is no ``values`` column (GRPO runs without a critic):
    recompute with a critic-free ``--estimator`` or ``--values-col none``.

    The files are streamed: memory holds ``batch_rows`` lines at a time. The output is
    written whole or not at all.

    Raises :class:`GAEInputError` naming file, line and key for a line that breaks the
    documented shape; :class:`GAEUsageError` for unreadable inputs, a file name without
    the step, an existing output without ``overwrite``.
    """
    return run_import(paths, output, DUMP_PATTERNS, lambda sources, out: _plan(sources, out, batch_rows), **options)


def _plan(sources: list[AnyPath], output: str, batch_rows: int) -> ImportPlan:
    """The files in step order (named so, one per step), streamed ``batch_rows`` lines at a time."""
    steps = sorted(((step_of(source), source) for source in sources), key=lambda pair: pair[0])
    for (step, previous), (next_step, current) in zip(steps, steps[1:]):
        if step == next_step:
            raise GAEInputError(f"{previous} and {current} both hold step {step}; import one of them")
    groups = PromptGroups() if steps and _has_prompts(steps[0][1]) else None
    fields = [*SCHEMA_FIELDS, *([PROMPT_GROUP] if groups is not None else [])]
    schema = pa.schema(fields, metadata=schema_metadata("nemo-rl", [source.name for _, source in steps]))
    ignored: set[str] = set()
    report = ImportReport(
        output=output, files=[], columns=list(schema.names), format="nemo-rl", missing_keys=[], notes=[]
    )
    used_filtered = False

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        nonlocal used_filtered
        for step, source in steps:
            rows = tokens = 0
            with open_binary(source) as stream:
                pending: list[_Line] = []
                for number, text in enumerate(_lines(stream), start=1):
                    line = parse_line(text, number, source, ignored, groups is not None)
                    if line is None:
                        continue
                    used_filtered = used_filtered or line.filtered
                    pending.append(line)
                    if len(pending) == batch_rows:
                        batch, batch_tokens = lines_batch(pending, step, source, schema, groups)
                        rows, tokens = rows + batch.num_rows, tokens + batch_tokens
                        pending = []
                        yield batch, batch_tokens
                if pending:
                    batch, batch_tokens = lines_batch(pending, step, source, schema, groups)
                    rows, tokens = rows + batch.num_rows, tokens + batch_tokens
                    yield batch, batch_tokens
            report.files.append(ImportedFile(str(source), step, None, rows, tokens))

    def finish() -> None:
        report.ignored_keys = sorted(ignored)
        report.missing_keys = list(MISSING_COLUMNS)
        if groups is None:
            report.notes.append(
                "no token_ids in the dump: no prompt_group column; the group-relative estimators (grpo, rloo, …) "
                "need a prompt-group id column of your own (--group-col)"
            )
        if used_filtered:
            report.notes.append(
                "terminal_reward is filtered_rewards (dynamic sampling: the rewards the trainer used); "
                "rewards (before filtering) is not imported"
            )

    return ImportPlan(schema, report, batches(), lambda: sum(_count_lines(source) for _, source in steps), finish)
