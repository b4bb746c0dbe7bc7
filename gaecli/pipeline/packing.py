"""One batch as flat numpy buffers (:class:`PackedBatch`): the columns packed once, KL rewards
added, a spec computed on them by the one dispatch, stored columns read, rows dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.dispatch import (
    RESPONSE_MASK,
    as_numpy,
    compute,
    compute_screened_flat,
    device_tensors,
    runs_on_tensors,
)
from gaecli.advantages.kl import kl_estimate, kl_rewards
from gaecli.advantages.spec import AdvantageSpec
from gaecli.checks import (
    BatchCheck,
    Finding,
)
from gaecli.errors import InvalidDataError
from gaecli.io.format import (
    Columns,
    list_parts,
    numeric_numpy,
)


def row_input_arrays(batch: pa.RecordBatch, spec: AdvantageSpec) -> dict:
    """The per-row inputs of the GAE variants ``spec`` reads, from the columns of a checked
    batch (:func:`gaecli.checks.check_row_inputs`), as the dispatch takes them: name →
    bool or float64 ``[B]``, and for the turn rewards (flat float64 ``[U]``, zero-based
    int64 offsets ``[B + 1]``), for the turn ids int64 ``[N]``."""
    arrays: dict = {}
    for needed in spec.row_inputs:
        if needed.role == "turn_rewards":
            offsets, flat = list_parts(batch.column(needed.name))
            arrays[needed.name] = (numeric_numpy(flat).astype(np.float64, copy=False), offsets.astype(np.int64))
        elif needed.role == "turn_ids":  # one per token: flat [N] int64
            arrays[needed.name] = numeric_numpy(list_parts(batch.column(needed.name))[1]).astype(np.int64)
        elif needed.role == "truncated":
            arrays[needed.name] = np.asarray(batch.column(needed.name).cast(pa.bool_()).fill_null(False))
        elif needed.role == "bootstrap_values":
            arrays[needed.name] = np.asarray(batch.column(needed.name).cast(pa.float64()).fill_null(np.nan))
    return arrays


@dataclass
class PackedBatch:
    """One batch as flat numpy buffers: values, rewards (float), trainable (bool),
    zero-based offsets ``[B + 1]``, terminal rewards ``[B]``; ``arrow_offsets``: the same
    offsets as the input's Arrow array (the mask column's, reused by the output's list
    columns), None when the rows were filtered; ``row_inputs``: the per-row inputs of the
    new side's GAE variants (:func:`row_input_arrays`), empty without them; ``teacher_kl``:
    the per-token KL of the student's log-probs from the teacher's (float64 ``[N]``, the
    on-policy distillation term before its coefficient), None unless the teacher is read;
    ``response``: the response mask (``--response-mask-col``, bool ``[N]``: the tokens whitening
    over the response's tokens counts, SkyRL's), None without it (every token)."""

    values: np.ndarray
    rewards: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    terminal_rewards: np.ndarray
    arrow_offsets: Optional[pa.Array] = None
    row_inputs: dict = field(default_factory=dict)
    uploaded: dict = field(default_factory=dict, repr=False)
    teacher_kl: Optional[np.ndarray] = None
    response: Optional[np.ndarray] = None

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def tensors(self, device) -> list:
        """The five buffers as tensors on ``device`` (values, rewards, trainable, int64
        offsets, terminal rewards), uploaded on the first call and kept: a batch goes to the
        device once, whatever the number of sides computed on it."""
        key = str(device)
        if key not in self.uploaded:
            arrays = (self.values, self.rewards, self.trainable, self.offsets.astype(np.int64, copy=False))
            self.uploaded[key] = device_tensors((*arrays, self.terminal_rewards), device)
        return self.uploaded[key]


def pack_batch(
    batch: pa.RecordBatch, columns: Columns, dtype: np.dtype, check: Optional[BatchCheck] = None
) -> PackedBatch:
    """Flat buffers of a checked batch (zero-copy where Arrow allows); an absent values or
    rewards column (``None``) is taken as zeros. With ``columns.kl_coef`` the rewards are
    the rewards column (if any) plus ``−kl_coef · KL`` of the log-prob columns, summed in
    float64 and then cast to ``dtype``. ``check``: the batch's :func:`check_batch`, whose
    flat columns and trainable tokens are reused (the batch is not converted twice)."""
    mask_array = batch.column(columns.loss_mask)
    trainable = None
    if check is not None and check.offsets is not None:
        offsets, flat, trainable = check.offsets, check.flat, check.trainable
        mask = flat[columns.loss_mask]
    else:
        offsets, mask_flat = list_parts(mask_array)
        mask, flat = numeric_numpy(mask_flat), {}
    if trainable is None:
        trainable = mask if mask.dtype == np.bool_ else mask != 0
    arrow_offsets = mask_array.offsets  # of the rows in the batch (a sliced array's start where it starts)
    if len(arrow_offsets) and arrow_offsets[0].as_py() != 0:
        arrow_offsets = None

    def stored(name: str) -> np.ndarray:
        if name in flat:
            return flat[name]
        return numeric_numpy(list_parts(batch.column(name))[1])

    def floats(name: Optional[str]) -> np.ndarray:
        if name is None:
            return np.zeros(offsets[-1], dtype=dtype)
        return stored(name).astype(dtype, copy=False)

    if columns.kl_coef is None:
        rewards = floats(columns.rewards)
    else:
        rewards = kl_rewards(
            stored(columns.log_probs), stored(columns.ref_log_probs), columns.kl_coef, columns.kl_estimator
        )
        if columns.rewards is not None:
            rewards += stored(columns.rewards)
        with np.errstate(over="ignore"):  # a KL term beyond the float type: the computed outputs are checked
            rewards = rewards.astype(dtype, copy=False)
    terminal = numeric_numpy(batch.column(columns.terminal_reward)).astype(dtype, copy=False)
    packed = PackedBatch(floats(columns.values), rewards, trainable, offsets, terminal, arrow_offsets)
    if columns.reads_teacher:
        packed.teacher_kl = kl_estimate(
            stored(columns.log_probs), stored(columns.teacher_log_probs), columns.kl_estimator
        )
    if columns.response_mask is not None:
        response = stored(columns.response_mask)
        packed.response = response if response.dtype == np.bool_ else response != 0
    return packed


def compute_packed(
    packed: PackedBatch, spec: AdvantageSpec, kernel: str, device: str, row_inputs: Optional[dict] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (flat numpy, the values' dtype) of a packed batch under
    ``spec``, by the one dispatch (:func:`gaecli.advantages.dispatch.compute`): the
    ``native`` kernel on the CPU runs without torch, every other kernel and device on
    tensors, the same bits where both can run; the buffers go to a device once per batch
    (:meth:`PackedBatch.tensors`). ``row_inputs``: the per-row inputs of a critic-free
    estimator (each row's advantage); a critic-free one is given the response mask too
    (:data:`gaecli.advantages.dispatch.RESPONSE_MASK`, where the batch has one)."""
    row_inputs = row_inputs if row_inputs is not None else packed.row_inputs if spec.variants else None
    if spec.critic_free and packed.response is not None:
        row_inputs = {**(row_inputs or {}), RESPONSE_MASK: packed.response}
    if not spec.critic_free and runs_on_tensors(spec, kernel, device):
        return as_numpy(compute(spec, *packed.tensors(device), kernel=kernel, row_inputs=row_inputs))
    arrays = (packed.values, packed.rewards, packed.trainable, packed.offsets, packed.terminal_rewards)
    return compute(spec, *arrays, kernel=kernel, device=device, row_inputs=row_inputs)


def compute_screened_packed(packed: PackedBatch, spec: AdvantageSpec, screened, mask: np.ndarray):
    """Advantages, returns and ``clean`` of a packed batch by a screened kernel (``screened``:
    :func:`gaecli.advantages.dispatch.screened_kernel`), which reads ``mask``, the batch's
    mask as stored, instead of ``trainable`` (:func:`gaecli.advantages.dispatch.compute_screened_flat`)."""
    arrays = (packed.values, packed.rewards, mask, packed.offsets, packed.terminal_rewards)
    return compute_screened_flat(screened, spec, *arrays)


def stored_column(
    batch: pa.RecordBatch, name: str, mask_offsets: np.ndarray, mask_name: str, file: str, first_row: int
) -> np.ndarray:
    """The flat numbers of a stored per-token column (``gae diff --against``), checked like
    the data columns: no null, the mask's length on every row, finite."""
    array = batch.column(name)

    def stop(rows: np.ndarray, code: str, message) -> None:
        row = int(rows[0])
        raise InvalidDataError(Finding(file, first_row + row, name, code, message(row)))

    if array.null_count:
        stop(np.flatnonzero(np.asarray(array.is_null())), "null", lambda row: "the list is null")
    offsets, flat = list_parts(array)
    lengths, mask_lengths = np.diff(offsets), np.diff(mask_offsets)
    if (lengths != mask_lengths).any():
        stop(
            np.flatnonzero(lengths != mask_lengths),
            "length-mismatch",
            lambda row: f"{name!r} has {lengths[row]} tokens, {mask_name!r} has {mask_lengths[row]}",
        )
    if flat.null_count:
        positions = np.flatnonzero(np.asarray(flat.is_null()))
        stop(np.searchsorted(offsets, positions, side="right") - 1, "null", lambda row: "the list holds a null")
    numbers = numeric_numpy(flat)
    if not np.isfinite(numbers).all():
        position = int(np.flatnonzero(~np.isfinite(numbers))[0])
        stop(
            np.searchsorted(offsets, [position], side="right") - 1,
            "non-finite",
            lambda row: f"{name!r} is {numbers[position].item()} at token {position - offsets[row]}",
        )
    return numbers


def drop_rows(packed: PackedBatch, keep: np.ndarray, tokens: np.ndarray) -> PackedBatch:
    """``packed`` with only the rows ``keep`` (bool ``[B]``); ``tokens``: their tokens."""
    lengths = np.diff(packed.offsets)[keep]
    offsets = np.zeros(lengths.size + 1, dtype=packed.offsets.dtype)
    np.cumsum(lengths, out=offsets[1:])
    kept = PackedBatch(
        packed.values[tokens], packed.rewards[tokens], packed.trainable[tokens], offsets, packed.terminal_rewards[keep]
    )
    kept.teacher_kl = None if packed.teacher_kl is None else packed.teacher_kl[tokens]
    kept.response = None if packed.response is None else packed.response[tokens]
    return kept
