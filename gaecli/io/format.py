"""The rollout file format: which columns hold what, and their Arrow types.

One row per sample. List columns may be ``list`` or ``large_list``:
``values`` list<float32|float64>, ``rewards`` list<float32|float64>, ``loss_mask``
list<bool|int|float> of 0/1, ``terminal_reward`` float or int, and optionally
``response_length`` (int, checked against the lists) and, with ``--response-mask-col``, a
response mask list<bool|int|float> of 0/1 (SkyRL's ``response_mask``). With a KL coefficient
(``--kl-coef``) also ``log_probs`` and ``ref_log_probs`` list<float32|float64>. Every other
column passes through.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from gaecli.advantages.kl import check_kl_options
from gaecli.options import check_choice, check_number

OPD_STAGES: tuple[str, ...] = ("before-whiten", "after-whiten")
"""Where the on-policy distillation term joins the new side's advantages: before its
whitening (``--normalize``, the whitening of ``reinforce++`` and gdpo), as slime, miles and
ROLL add it, or after it."""


MASK_ROLES: tuple[str, ...] = ("loss_mask", "response_mask")
"""The roles of the token columns that hold a 0/1 mask (the loss mask, ``--response-mask-col``'s)."""


@dataclass(frozen=True)
class Columns:
    """Names of the columns gaecli reads and writes. ``values`` or ``rewards`` set to None
    means "take them as zero" (``--values-col none``).

    ``kl_coef`` set: per-token rewards are ``rewards − kl_coef · KL`` with KL estimated by
    ``kl_estimator`` (see :mod:`gaecli.advantages.kl`) from the ``log_probs`` and ``ref_log_probs``
    list columns, which are then read and checked like the other token columns.

    On-policy distillation (docs/estimators.md#on-policy-distillation): ``opd_coef`` set, the
    new side's advantages less ``opd_coef · KL(student ‖ teacher)`` at trainable tokens,
    the KL by ``kl_estimator`` from ``log_probs`` and the ``teacher_log_probs`` list column,
    added before the whitening or after it (``opd_stage``); ``old_opd_coef`` set, the same
    term with its own coefficient on every recomputed old side (``gae diff``); ``opd_kl`` True
    (a side is the pure ``opd`` estimator): the teacher's KL is read without a term. Each
    reads and checks both columns like the other token columns.

    ``response_mask`` set (``--response-mask-col``): a per-token 0/1 list column, checked like
    the loss mask and holding it (a trainable token has response mask 1), whose 1s are the
    tokens whitening counts where its statistics are the response's (``tokens="response"``,
    SkyRL's reinforce++; docs/semantics.md#whitening-rules); None: every token of the row."""

    values: Optional[str] = "values"
    rewards: Optional[str] = "rewards"
    loss_mask: str = "loss_mask"
    terminal_reward: str = "terminal_reward"
    response_length: str = "response_length"
    advantages: str = "advantages"
    returns: str = "returns"
    log_probs: str = "log_probs"
    ref_log_probs: str = "ref_log_probs"
    kl_coef: Optional[float] = None
    kl_estimator: str = "k1"
    teacher_log_probs: str = "teacher_log_probs"
    opd_coef: Optional[float] = None
    opd_stage: str = OPD_STAGES[0]
    opd_kl: bool = False
    old_opd_coef: Optional[float] = None
    response_mask: Optional[str] = None

    def __post_init__(self) -> None:
        check_kl_options(self.kl_coef, self.kl_estimator)
        check_number("--opd-coef", self.opd_coef)
        check_number("--old-opd-coef", self.old_opd_coef)
        check_choice("--opd-stage", self.opd_stage, OPD_STAGES, "stage")

    @property
    def reads_teacher(self) -> bool:
        """Whether the teacher's log-probs are read (an OPD term, or the pure estimator)."""
        return self.opd_coef is not None or self.old_opd_coef is not None or self.opd_kl

    def token_columns(self) -> list[tuple[str, str]]:
        """(role, column name) of the per-token list columns that are read."""
        roles = [("values", self.values), ("rewards", self.rewards), ("loss_mask", self.loss_mask)]
        if self.kl_coef is not None or self.reads_teacher:
            roles.append(("log_probs", self.log_probs))
        if self.kl_coef is not None:
            roles.append(("ref_log_probs", self.ref_log_probs))
        if self.reads_teacher:
            roles.append(("teacher_log_probs", self.teacher_log_probs))
        if self.response_mask is not None:
            roles.append(("response_mask", self.response_mask))
        return [(role, name) for role, name in roles if name is not None]

    def to_json(self) -> str:
        document = asdict(self)
        if self.response_mask is None:  # recorded only when set: outputs written before stay current
            del document["response_mask"]
        return json.dumps(document, sort_keys=True)


def is_list_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


def is_real_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_floating(arrow_type) and not pa.types.is_float16(arrow_type)


def is_mask_element_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_boolean(arrow_type) or pa.types.is_integer(arrow_type) or is_real_type(arrow_type)


def is_scalar_number_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_integer(arrow_type) or is_real_type(arrow_type)


def list_parts(array: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Zero-based int64 offsets ``[B + 1]`` and the flat child values of a (possibly sliced)
    list or large_list array. Null rows may own a span of values; callers check nulls."""
    offsets = numeric_numpy(array.offsets).astype(np.int64, copy=False)
    start, end = int(offsets[0]), int(offsets[-1])
    flat = array.values.slice(start, end - start)
    return offsets - start if start else offsets, flat


def numeric_numpy(flat: pa.Array) -> np.ndarray:
    """A numpy view (copy only for booleans) of a flat numeric array without nulls. A
    fixed-width number array is read from its data buffer: Arrow's own conversion imports
    pandas where it is installed (about 0.4 s of a command's start-up)."""
    dtype = _NUMPY_DTYPES.get(flat.type) if isinstance(flat, pa.Array) else None
    if dtype is None or flat.null_count:
        return flat.to_numpy(zero_copy_only=False)
    data = flat.buffers()[1]
    if data is None:  # an empty array may hold no data buffer at all
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(flat), offset=flat.offset * dtype.itemsize)


def numeric_arrow(numbers: np.ndarray) -> pa.Array:
    """A flat Arrow array of a 1-D numpy array of fixed-width numbers, on its buffer (no
    copy of a contiguous array), without the pandas import of ``pa.array``; other arrays
    go through ``pa.array``."""
    arrow_type = _ARROW_TYPES.get(numbers.dtype)
    if arrow_type is None or numbers.ndim != 1:
        return pa.array(numbers)
    numbers = np.ascontiguousarray(numbers)
    return pa.Array.from_buffers(arrow_type, numbers.shape[0], [None, pa.py_buffer(numbers)])


_ARROW_TYPES = {
    np.dtype(np.float16): pa.float16(),
    np.dtype(np.float32): pa.float32(),
    np.dtype(np.float64): pa.float64(),
    **{np.dtype(f"int{bits}"): getattr(pa, f"int{bits}")() for bits in (8, 16, 32, 64)},
    **{np.dtype(f"uint{bits}"): getattr(pa, f"uint{bits}")() for bits in (8, 16, 32, 64)},
}
_NUMPY_DTYPES = {arrow_type: dtype for dtype, arrow_type in _ARROW_TYPES.items()}


def output_float_type(schema: pa.Schema, columns: Columns) -> pa.DataType:
    """The float type of the advantages and returns: the values' type, else the rewards',
    else the log-probs' (with a KL coefficient), else float32."""
    log_probs = columns.log_probs if columns.kl_coef is not None or columns.reads_teacher else None
    for name in (columns.values, columns.rewards, log_probs):
        if name is not None and name in schema.names and is_list_type(schema.field(name).type):
            value_type = schema.field(name).type.value_type
            if is_real_type(value_type):
                return value_type
    return pa.float32()


def list_type_like(schema: pa.Schema, columns: Columns, value_type: pa.DataType) -> pa.DataType:
    """``list`` or ``large_list`` of ``value_type``, following the mask column's list type."""
    mask_type = schema.field(columns.loss_mask).type
    return pa.large_list(value_type) if pa.types.is_large_list(mask_type) else pa.list_(value_type)
