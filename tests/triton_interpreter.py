"""Triton's interpreter for the tests: the switch that makes Triton kernels run on CPU
tensors, and a log-step ``tl.associative_scan`` for it.

The interpreter runs a scan with a user combine function one element at a time (about a
millisecond per element), which would make the triton kernel's test grid take many minutes.
:func:`use_log_step_scan` replaces that loop with a Hillis–Steele scan that calls the same
combine function on whole arrays, ``ceil(log2(n))`` times: the same associative scan, with a
different (fixed) grouping of the combinations, as the GPU's own scan has.
"""

from __future__ import annotations

import os

import numpy as np


def interpret_triton_unless_cuda() -> None:
    """Set ``TRITON_INTERPRET=1`` when no CUDA device is present (and the variable is unset).

    Triton reads the variable when a kernel is defined, so this must run before anything
    imports :mod:`gaecli.advantages.kernels.triton`. On a CUDA machine the compiled kernel is tested.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def use_log_step_scan() -> bool:
    """Make the interpreter's generic scan a log-step scan (its own loop stays at hand as
    ``ScanOps.one_at_a_time_scan``); False when Triton is missing."""
    try:
        from triton.runtime.interpreter import ScanOps
    except ImportError:
        return False
    if ScanOps.generic_scan is not _log_step_scan:
        ScanOps.one_at_a_time_scan = ScanOps.generic_scan
        ScanOps.generic_scan = _log_step_scan
    return True


def _log_step_scan(self, inputs):
    """Inclusive forward scan of the tensors ``inputs`` along ``self.axis``:
    ``out[i] = x[0] ⊕ … ⊕ x[i]``, computed as ``out[i] ← out[i − s] ⊕ out[i]`` for
    ``s = 1, 2, 4, …`` (the earlier elements always the left operand)."""
    axis = self.axis
    dtypes = [tensor.dtype for tensor in inputs]
    current = [np.array(tensor.handle.data) for tensor in inputs]
    length = current[0].shape[axis]
    step = 1
    while step < length:
        # Blocks keep their power-of-two shape: the earlier operand is the array rolled by
        # ``step``; the wrapped-around first ``step`` results are discarded.
        earlier = [self.to_tensor(np.roll(array, step, axis), dtype) for array, dtype in zip(current, dtypes)]
        later = [self.to_tensor(array, dtype) for array, dtype in zip(current, dtypes)]
        with np.errstate(all="ignore"):
            combined = self.combine_fn.fn(*earlier, *later)
        combined = combined if isinstance(combined, tuple) else (combined,)
        keep = (np.arange(length) >= step).reshape([-1 if dim == axis else 1 for dim in range(current[0].ndim)])
        current = [np.where(keep, result.handle.data, array) for array, result in zip(current, combined)]
        step *= 2
    return [self.to_tensor(array, dtype) for array, dtype in zip(current, dtypes)]
