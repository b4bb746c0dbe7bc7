"""``gae import skyrl`` as a library: read SkyRL's training-input dumps
(``global_step_{N}_training_input.pkl``, written by ``skyrl/train/trainer.py``
``RayPPOTrainer.train`` → ``dump_data`` → ``TrainingInputBatch.save`` when
``trainer.dump_data_batch`` is set) through a restricted unpickler, cut each sample's
response out of SkyRL's right-aligned ``[B, R]`` tensors, optionally recover from the
returns the token rewards SkyRL drops, and write one rollout Parquet file (see
docs/import.md).

A dump's ``batch_dict`` holds ``response_mask`` and ``loss_mask`` ``[B, R]`` (the response in
the last ``response_length`` columns of each row, padding first), ``values``,
``action_log_probs``, ``base_action_log_probs``, ``advantages``, ``returns``, ``kl``,
``rollout_logprobs`` ``[B, R]`` (each may be None or absent), ``sequences`` and
``attention_mask`` ``[B, S]`` and maybe tensor lists; its ``metadata`` maybe ``pad_size``
and ``policy_prompt_boundaries``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from gaecli.errors import GAEInputError, GAEUsageError
from gaecli.importers.common import (
    MAX_LIST_TOKENS,
    METADATA_PREFIX,
    DumpField,
    ImportOptions,
    ImportPlan,
    check_same_keys,
    check_unchanged,
    list_offsets,
    run_import,
    schema_metadata,
)
from gaecli.importers.report import ImportedFile, ImportReport
from gaecli.importers.skyrl_pickle import INPUT_BATCH, Rebuilt, entry_array, load_training_input
from gaecli.importers.skyrl_rewards import Recovery, check_recovery
from gaecli.importers.values import INT64_RANGE, describe, integer, key_list, shown
from gaecli.io.filesystem import AnyPath
from gaecli.io.paths import INPUT_PATTERNS

if TYPE_CHECKING:
    from typing_extensions import Unpack

DUMP_PATTERNS = INPUT_PATTERNS["SkyRL dump"]
STEP_NAME = re.compile(r"^global_step_(\d+)_training_input\.pkl$")
RESPONSE_MASK = "response_mask"  # cuts the response out of each row; not written
# The [B, R] keys written, in output column order (rewards and terminal_reward follow loss_mask).
TOKEN_FIELDS: tuple[DumpField, ...] = (
    DumpField("values", "values", "float"),
    DumpField("loss_mask", "loss_mask", "mask", required=True),
    DumpField("action_log_probs", "log_probs", "float"),
    DumpField("base_action_log_probs", "ref_log_probs", "float"),
    DumpField("rollout_logprobs", "rollout_log_probs", "float"),
    DumpField("kl", "kl", "float"),
    DumpField("advantages", "trained_advantages", "float"),
    DumpField("returns", "trained_returns", "float"),
)
FIELDS_BY_KEY = {f.key: f for f in TOKEN_FIELDS}
REQUIRED_KEYS = (RESPONSE_MASK, "loss_mask")
OPTIONAL_KEYS = tuple(f.key for f in TOKEN_FIELDS if not f.required)
BOUNDARIES = "policy_prompt_boundaries"
GROUPS_KEY = f"(metadata) {BOUNDARIES}"  # among a dump's keys when it has them: the group_index column
STATE_KEYS = ("batch_dict", "batch_size", "metadata")


# ----------------------------------------------------------------------------- one dump


@dataclass
class _Dump:
    """A dump's facts from the first pass."""

    path: AnyPath
    step: int
    rows: int
    tokens: int
    pad_rows: int
    groups: int  # the group ids the dump takes: its prompts, then one per padding row (0 without boundaries)
    keys: frozenset[str]  # the TOKEN_FIELDS keys present (and GROUPS_KEY when it has boundaries)
    other_keys: frozenset[str]
    dtypes: dict[str, np.dtype]

    def place(self) -> tuple:
        return (self.step, self.rows, self.tokens, self.pad_rows, self.groups, self.keys, self.dtypes)


@dataclass
class _Arrays:
    """A dump's data: the response columns of each row (bool ``[B, R]``), its lengths, the
    ``[B, R]`` arrays by key, the batch-padding rows and the group of every row within the
    dump (``[B]``: the prompts 0 … P−1, then P, P+1, … one per padding row; None without
    boundaries)."""

    response: np.ndarray
    lengths: np.ndarray
    tokens: dict[str, np.ndarray]
    pad: np.ndarray
    groups: Optional[np.ndarray]


def inspect_dump(path: AnyPath, loaded: Any, recovery: Optional[Recovery]) -> tuple[_Dump, _Arrays]:
    """Check a loaded SkyRL dump and return its facts and its data; :class:`GAEInputError`
    names the file, the key (and the row and column) that is wrong."""
    batch_dict, rows, metadata = _state(path, loaded)
    step = step_of(path, metadata)
    lacking = [key for key in REQUIRED_KEYS if batch_dict.get(key) is None]
    if lacking:
        raise GAEInputError(
            f"{path}: batch_dict lacks {', '.join(lacking)} (or holds None); it has {key_list(batch_dict)}; "
            f"required: {', '.join(REQUIRED_KEYS)}; optional: {', '.join(OPTIONAL_KEYS)}"
        )
    arrays = {
        key: entry_array(batch_dict[key], f"{path}: batch_dict[{key!r}]")
        for key in (RESPONSE_MASK, *FIELDS_BY_KEY)
        if batch_dict.get(key) is not None
    }
    _check_arrays(path, arrays, rows)
    response = _response(path, arrays.pop(RESPONSE_MASK))
    lengths = response.sum(axis=1, dtype=np.int64)
    pad_rows = _pad_rows(path, metadata, rows)
    pad = np.arange(rows) >= rows - pad_rows
    bounds = metadata.get(BOUNDARIES)
    groups = None if bounds is None else _groups(path, bounds, rows - pad_rows, pad_rows)
    if recovery is not None:
        recovery.check(path, arrays, response)
    keys = frozenset(arrays) | (frozenset() if groups is None else {GROUPS_KEY})
    other = frozenset(
        str(key) for key, entry in batch_dict.items() if entry is not None and key not in (RESPONSE_MASK, *arrays)
    )
    dtypes = {key: array.dtype for key, array in arrays.items()}
    group_count = 0 if groups is None or not groups.size else int(groups[-1]) + 1
    dump = _Dump(path, step, rows, int(lengths.sum()), pad_rows, group_count, keys, other, dtypes)
    return dump, _Arrays(response, lengths, arrays, pad, groups)


def _state(path: AnyPath, loaded: Any) -> tuple[dict, int, dict]:
    """The batch's ``batch_dict``, ``batch_size`` and ``metadata`` (``{}`` for None),
    checked: a TrainingInputBatch rebuilt from a state of those keys."""
    if isinstance(loaded, Rebuilt) and loaded.kind != INPUT_BATCH:
        raise GAEInputError(f"{path}: holds a SkyRL {loaded.kind}, not the {INPUT_BATCH} that dump_data writes")
    if not isinstance(loaded, Rebuilt):
        keys = f" (keys: {key_list(loaded)})" if isinstance(loaded, dict) else ""
        raise GAEInputError(
            f"{path}: holds {describe(loaded)}{keys}, not a SkyRL {INPUT_BATCH} (dump_data pickles one, "
            f"as _rebuild_tensor_batch of its state)"
        )
    state = loaded.state
    if not isinstance(state, dict):
        raise GAEInputError(f"{path}: the {INPUT_BATCH}'s state is {describe(state)}, expected a dict")
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise GAEInputError(
            f"{path}: the {INPUT_BATCH}'s state lacks {', '.join(missing)}; it has {key_list(state)}; "
            f"expected {', '.join(STATE_KEYS)}, device"
        )
    batch_dict, metadata = state["batch_dict"], state["metadata"]
    if not isinstance(batch_dict, dict):
        raise GAEInputError(f"{path}: batch_dict is {describe(batch_dict)}, expected a dict of tensor entries")
    if metadata is not None and not isinstance(metadata, dict):
        raise GAEInputError(f"{path}: metadata is {describe(metadata)}, expected a dict")
    return batch_dict, integer(state["batch_size"], "batch_size", path, minimum=0), metadata or {}


def step_of(path: AnyPath, metadata: dict) -> int:
    """``N`` of ``global_step_{N}_training_input.pkl``; for another name the metadata's
    ``global_step``. A step that is neither, or one no int64 holds, is a usage error
    (rename the file)."""
    match = STEP_NAME.match(path.name)
    if match is not None:
        digits = match.group(1).lstrip("0") or "0"
        if len(digits) > len(str(INT64_RANGE[1])) or int(digits) > INT64_RANGE[1]:
            raise GAEUsageError(
                f"{path}: the step in the name ({len(digits):,} digits) does not fit the step column (int64, "
                f"at most {INT64_RANGE[1]:,}); rename the file"
            )
        return int(digits)
    if metadata.get("global_step") is not None:
        return integer(metadata["global_step"], "metadata['global_step']", path, minimum=0)
    raise GAEUsageError(
        f"{path}: cannot tell the training step: the name is not global_step_{{N}}_training_input.pkl (what "
        f"SkyRL's dump_data writes) and the metadata holds no global_step; rename the file so"
    )


def _check_arrays(path: AnyPath, arrays: dict[str, np.ndarray], rows: int) -> None:
    """Every array ``[batch_size, R]`` of one R; numbers (not bool) where a key holds numbers."""
    mask_shape = arrays[RESPONSE_MASK].shape
    for key, array in arrays.items():
        where = f"{path}: batch_dict[{key!r}]"
        if array.ndim != 2 or array.shape[0] != rows:
            raise GAEInputError(f"{where} has shape {array.shape}, expected (batch_size, R) with batch_size {rows}")
        if array.shape != mask_shape:
            raise GAEInputError(
                f"{where} has shape {array.shape} but response_mask {mask_shape}: the response-level "
                f"tensors share one shape"
            )
        if key in FIELDS_BY_KEY and FIELDS_BY_KEY[key].kind == "float" and array.dtype == np.bool_:
            raise GAEInputError(f"{where} is a bool tensor, expected numbers")


def _first(flags: np.ndarray) -> tuple[int, int]:
    """(row, column) of the first true entry of a 2-D bool array (row-major order)."""
    return divmod(int(flags.argmax()), flags.shape[1])


def _response(path: AnyPath, mask: np.ndarray) -> np.ndarray:
    """``response_mask`` as bool, checked: 0 or 1 everywhere, and right-aligned (no 0 after
    a 1 in a row: SkyRL's layout puts the padding first)."""
    where = f"{path}: batch_dict['response_mask']"
    with np.errstate(invalid="ignore"):
        ones = mask == 1
        wrong = ~(ones | (mask == 0))
    if wrong.any():
        row, column = _first(wrong)
        raise GAEInputError(f"{where} row {row}, column {column} is {shown(mask[row, column].item())}, expected 0 or 1")
    ended = ones[:, :-1] & ~ones[:, 1:]
    if ended.any():
        row, column = _first(ended)
        raise GAEInputError(
            f"{where} row {row}, column {column + 1} is 0 after a 1: SkyRL's response-level tensors are "
            f"right-aligned (padding first, the response in the last response_length columns)"
        )
    return ones


def _pad_rows(path: AnyPath, metadata: dict, rows: int) -> int:
    """The metadata's ``pad_size`` (0 without one): the batch's last rows are padding."""
    if metadata.get("pad_size") is None:
        return 0
    pad_rows = integer(metadata["pad_size"], "metadata['pad_size']", path, minimum=0)
    if pad_rows > rows:
        raise GAEInputError(f"{path}: metadata['pad_size'] is {pad_rows}, more than the batch's {rows} rows")
    return pad_rows


def _groups(path: AnyPath, bounds: Any, samples: int, pad_rows: int) -> np.ndarray:
    """The group of each row of the batch within the dump: k for the rows of the k-th
    ``(start, end)`` pair of ``policy_prompt_boundaries`` (consecutive pairs from row 0 to
    ``samples``, the batch less its padding), then P, P+1, … for the ``pad_rows`` padding
    rows after the P prompts, a group each (as SkyRL gives each its own uid, ``pad{i}``).
    The types are collected by ``map`` (no Python loop over the prompts)."""
    where = f"{path}: metadata[{BOUNDARIES!r}]"
    expected = "expected a list of (start, end) row pairs"
    if not isinstance(bounds, (list, tuple)) or not set(map(type, bounds)) <= {tuple, list}:
        raise GAEInputError(f"{where} is {shown(bounds)}, {expected}")
    if bounds and set(map(len, bounds)) != {2}:
        raise GAEInputError(f"{where} is {shown(bounds)}, {expected}")
    flat = list(chain.from_iterable(bounds))
    if not set(map(type, flat)) <= {int}:
        raise GAEInputError(f"{where} is {shown(bounds)}, {expected} (integers)")
    try:
        table = np.array(flat, dtype=np.int64).reshape(-1, 2)
    except OverflowError:
        raise GAEInputError(f"{where} holds a row out of the int64 range") from None
    starts, ends = table[:, 0], table[:, 1]
    expected_starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
    wrong = (starts != expected_starts) | (ends <= starts)
    if wrong.any():
        prompt = int(wrong.argmax())
        raise GAEInputError(
            f"{where}[{prompt}] is {shown(tuple(bounds[prompt]))}: expected consecutive (start, end) row pairs "
            f"from row 0, each of one row or more (this one from row {expected_starts[prompt]})"
        )
    covered = int(ends[-1]) if ends.size else 0
    if covered != samples:
        raise GAEInputError(
            f"{where} covers rows 0 to {covered}, but the batch has {samples} rows before its padding "
            f"(pad_size): the boundaries cover every prompt's rows"
        )
    prompts = np.repeat(np.arange(starts.size, dtype=np.int64), ends - starts)
    return np.concatenate([prompts, starts.size + np.arange(pad_rows, dtype=np.int64)])


# ----------------------------------------------------------------------------- the output


def _value_type(dump_field: DumpField, dtypes: set[np.dtype]) -> np.dtype:
    """The element type of a per-token column over every file's dtype: a mask keeps bool
    and integer types; float64 stays float64; other numbers become float32."""
    dtype = np.result_type(*sorted(dtypes, key=str))
    if dump_field.kind == "mask" and dtype.kind in "biu":
        return dtype
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def output_schema(
    keys: frozenset[str], value_types: dict[str, np.dtype], recovery: Optional[Recovery], sources: list[str]
) -> pa.Schema:
    """``step``, ``row``, ``group_index`` (with boundaries), ``is_batch_pad``,
    ``response_length``, then the column of each of :data:`TOKEN_FIELDS` present in
    ``keys``, with ``rewards`` and ``terminal_reward`` after ``loss_mask`` when recovered."""
    columns = [pa.field("step", pa.int64()), pa.field("row", pa.int64())]
    if GROUPS_KEY in keys:
        columns.append(pa.field("group_index", pa.int64()))
    columns += [pa.field("is_batch_pad", pa.bool_()), pa.field("response_length", pa.int64())]
    for dump_field in TOKEN_FIELDS:
        if dump_field.key in keys:
            columns.append(pa.field(dump_field.column, pa.list_(pa.from_numpy_dtype(value_types[dump_field.key]))))
        if dump_field.key == "loss_mask" and recovery is not None:
            columns += [pa.field("rewards", pa.list_(pa.float64())), pa.field("terminal_reward", pa.float64())]
    metadata = schema_metadata("skyrl", sources)
    if recovery is not None:
        metadata[f"{METADATA_PREFIX}recovered_rewards"] = json.dumps(recovery.to_dict())
    return pa.schema(columns, metadata=metadata)


def dump_batch(
    dump: _Dump,
    arrays: _Arrays,
    schema: pa.Schema,
    value_types: dict[str, np.dtype],
    recovery: Optional[Recovery],
    first_group: int,
) -> tuple[pa.RecordBatch, int]:
    """One dump as a record batch of ``schema`` (and its token count): every ``[B, R]``
    array cut to its rows' response columns at once (a boolean index: no loop over rows);
    ``group_index`` is ``first_group`` plus each row's group within the dump (the groups
    the earlier dumps of the file took)."""
    response, lengths = arrays.response, arrays.lengths
    offsets = list_offsets(
        lengths,
        lambda total: (
            f"{dump.path} holds {total:,} response tokens, more than one Parquet list column of a file part "
            f"can hold ({MAX_LIST_TOKENS:,})"
        ),
    )
    arrow_offsets = pa.array(offsets.astype(np.int32))

    def token_list(matrix: np.ndarray, dtype: np.dtype) -> pa.Array:
        flat = matrix[response].astype(dtype, copy=False)
        return pa.ListArray.from_arrays(arrow_offsets, pa.array(flat), type=pa.list_(pa.from_numpy_dtype(dtype)))

    columns: dict[str, pa.Array] = {
        "step": pa.array(np.full(dump.rows, dump.step, dtype=np.int64)),
        "row": pa.array(np.arange(dump.rows, dtype=np.int64)),
        "is_batch_pad": pa.array(arrays.pad),
        "response_length": pa.array(lengths),
    }
    if arrays.groups is not None:
        columns["group_index"] = pa.array(first_group + arrays.groups)
    for key, matrix in arrays.tokens.items():
        columns[FIELDS_BY_KEY[key].column] = token_list(matrix, value_types[key])
    if recovery is not None:
        rewards = recovery.rewards(arrays.tokens["returns"], arrays.tokens.get("values"))
        terminal = np.zeros(dump.rows, dtype=np.float64)
        if rewards.shape[1]:  # the last response token is column R−1 of every non-empty row
            terminal = np.where(lengths > 0, rewards[:, -1], 0.0)
            rewards[:, -1] = 0.0
        columns["rewards"] = token_list(rewards, np.dtype(np.float64))
        columns["terminal_reward"] = pa.array(terminal)
    batch = pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
    return batch, int(lengths.sum())


class SkyRLImportReport(ImportReport):
    """The report of ``gae import skyrl``: the steps (not rollouts) in its summary, and
    next steps that say where the rewards are (recovered, or to be recovered)."""

    def next_steps(self) -> list[str]:
        steps = [step for step in super().next_steps() if "per-token rewards column" not in step]
        if "terminal_reward" in self.columns:
            rewards = (
                "the file has rewards and terminal_reward recovered from the returns: gae recompute / gae diff read "
                "them as they are (no --kl-coef: a KL penalty SkyRL put in the rewards is in them already)"
            )
        else:
            rewards = (
                "the file has no rewards and no terminal_reward (SkyRL drops them before dumping), which gae "
                "recompute / gae diff need: import again with --estimator gae --gamma G --lambd L (a run with a "
                "critic) or --estimator reinforce++ --gamma G to recover them"
            )
        steps.insert(0 if "values" in self.columns else 1, rewards)
        return steps

    def summary_lines(self) -> list[str]:
        lines = super().summary_lines()
        steps = sorted({f.rollout_id for f in self.files})
        if not steps:
            span = "no step"
        else:
            span = f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps {steps[0]}–{steps[-1]}"
        lines[0] = (
            f"imported {self.rows:,} samples ({self.tokens:,} tokens) from {len(self.files)} dump file(s) "
            f"({span}) into {self.output}"
        )
        return lines


def _notes(facts: list[_Dump], keys: frozenset[str], recovery: Optional[Recovery]) -> list[str]:
    """What the report says of the dumps: where the rewards are, the groups, the padding."""
    if recovery is None:
        notes = [
            "SkyRL drops the rewards before dumping: no rewards or terminal_reward column; --estimator gae --gamma G "
            "--lambd L (a GAE run) or --estimator reinforce++ --gamma G recovers them from the returns; the rewards "
            "of grpo, rloo and maxrl runs cannot be recovered (their returns are the normalised score)"
        ]
    else:
        curve = f"γ = {recovery.gamma:g}" + ("" if recovery.lambd is None else f", λ = {recovery.lambd:g}")
        read = "the returns and values" if recovery.estimator == "gae" else "the returns"
        notes = [
            f"rewards and terminal_reward recovered from {read} as SkyRL's {recovery.estimator} computed them "
            f"({curve}), exact but for the float32 rounding of the stored numbers; terminal_reward is the last "
            f"response token's reward (its rewards entry is 0), any per-token penalty SkyRL added there (a KL in "
            f"the reward) included"
        ]
    if GROUPS_KEY not in keys:
        notes.append(
            f"the dumps' metadata has no {BOUNDARIES}: no group_index column; SkyRL drops the uids before dumping, "
            f"so the grouped estimators (grpo, rloo, …) cannot be recomputed from this file"
        )
    elif len(facts) > 1:
        notes.append(
            f"group_index numbers the groups of the {len(facts)} steps in one sequence, in step order: no two steps "
            f"share a group id, so --group-col never joins them"
        )
    pad_rows = sum(dump.pad_rows for dump in facts)
    if pad_rows:
        grouped = " and a group_index of its own each (SkyRL's pad{i} uids)" if GROUPS_KEY in keys else ""
        notes.append(
            f"{pad_rows} batch-padding row(s) (metadata pad_size: copies of row 0 with loss_mask 0, added by SkyRL's "
            f"pad_training_input_batch) imported with is_batch_pad true{grouped}; they train "
            f"nothing (every estimator gives them 0) but count where a statistic spans the batch (gpg's α, a batch "
            f"--norm-mean or --norm-std, --norm-tokens response): drop them (is_batch_pad) to leave them out"
        )
    return notes


# ----------------------------------------------------------------------------- the import


def import_skyrl(
    paths: Sequence[str | Any],
    output: str | Any,
    *,
    estimator: Optional[str] = None,
    gamma: Optional[float] = None,
    lambd: Optional[float] = None,
    **options: Unpack[ImportOptions],
) -> ImportReport:
    """Import SkyRL ``global_step_{N}_training_input.pkl`` dumps into one rollout Parquet file.

    ``paths``: dump files, directories (read recursively for
    ``global_step_*_training_input.pkl``), globs or URIs. Each file is read through a
    restricted unpickler that admits only the names a SkyRL training-input dump holds
    (mapped to gaecli's own stand-ins: nothing of the file is ever run). Rows: every row of
    every dump, ordered by step N (numerically), then file name, then batch row; each
    holds the response columns of its row (``response_mask`` 1: the last
    ``response_length`` columns). Columns: ``step``, ``row``, ``group_index`` (the prompt,
    from the metadata's ``policy_prompt_boundaries``, numbered across the whole file in
    row order so that no two steps share one; each padding row a group of its own; left
    out without boundaries), ``is_batch_pad`` (the last ``pad_size`` rows), ``response_length``,
    then ``values``, ``loss_mask``, ``log_probs``, ``ref_log_probs``, ``rollout_log_probs``,
    ``kl``, ``trained_advantages``, ``trained_returns`` as the dumps have them.

    SkyRL drops the rewards before dumping. ``estimator`` ``"gae"`` (with ``gamma`` and
    ``lambd``) or ``"reinforce++"`` (with ``gamma``) recovers them from the returns (and
    values): ``rewards`` (0 on the last token) and ``terminal_reward`` (the last token's).

    Every dump is read twice (check, then convert one at a time). The output is written
    whole or not at all.

    Raises :class:`InvalidOptionError` for estimator options that do not go together (an
    estimator whose rewards cannot be recovered: grpo, rloo, maxrl);
    :class:`GAEInputError` for a refused pickled object, a missing key, a shape or a
    ``response_mask`` that breaks SkyRL's layout, boundaries that do not cover the batch,
    two files of one step, files whose keys differ; :class:`GAEUsageError` for
    unreadable inputs (no pickle), a step neither the name nor the metadata gives, an
    existing output without ``overwrite``.
    """
    recovery = check_recovery(estimator, gamma, lambd)
    return run_import(paths, output, DUMP_PATTERNS, lambda sources, out: _plan(sources, out, recovery), **options)


def _plan(sources: list[AnyPath], output: str, recovery: Optional[Recovery]) -> ImportPlan:
    """The first pass over the dumps (checked, one per step) and the conversion of each,
    one at a time, as the output's batches."""
    facts = [inspect_dump(source, load_training_input(source), recovery)[0] for source in sources]
    facts.sort(key=lambda dump: (dump.step, dump.path.name))
    for previous, current in zip(facts, facts[1:]):
        if previous.step == current.step:
            raise GAEInputError(f"{previous.path} and {current.path} both hold step {current.step}; import one of them")
    check_same_keys(facts)
    keys = facts[0].keys
    value_types = {
        key: _value_type(FIELDS_BY_KEY[key], {dump.dtypes[key] for dump in facts}) for key in keys if key != GROUPS_KEY
    }
    schema = output_schema(keys, value_types, recovery, [dump.path.name for dump in facts])
    report = SkyRLImportReport(
        output=output,
        files=[],
        columns=list(schema.names),
        format="skyrl",
        missing_keys=[key for key in OPTIONAL_KEYS if key not in keys],
        ignored_keys=sorted(set().union(*(dump.other_keys for dump in facts))),
        notes=_notes(facts, keys, recovery),
    )

    def batches() -> Iterator[tuple[pa.RecordBatch, int]]:
        first_group = 0  # the groups the earlier dumps took: group ids are unique over the file
        for dump in facts:
            again, arrays = inspect_dump(dump.path, load_training_input(dump.path), recovery)
            check_unchanged(dump.path, again.place() == dump.place())
            batch, tokens = dump_batch(dump, arrays, schema, value_types, recovery, first_group)
            first_group += dump.groups
            del arrays
            yield batch, tokens
            report.files.append(ImportedFile(str(dump.path), dump.step, None, dump.rows, tokens))

    return ImportPlan(schema, report, batches(), lambda: sum(dump.rows for dump in facts))
