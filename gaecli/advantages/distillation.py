"""On-policy distillation (docs/estimators.md#on-policy-distillation): the term a run adds to a
side's advantages, ``A − C · KL(student ‖ teacher)`` at trainable tokens (:func:`with_distillation`,
the one numpy form the commands and the API share), and the API's two functions on tensors: the
term added to advantages (:func:`add_distillation`) and the pure estimator ``opd``, whose
advantage is minus the KL (:func:`distillation_advantages`). The KL is one of
:mod:`gaecli.advantages.kl`'s estimators of ``log π_student − log π_teacher``."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gaecli.errors import GAEInputError


def with_distillation(advantages: np.ndarray, teacher_kl: np.ndarray, trainable: np.ndarray, coef: float) -> np.ndarray:
    """``A − coef · KL`` at trainable tokens (``teacher_kl``: the per-token KL of the student
    from the teacher, float64 ``[N]``), masked positions as they were, in the advantages'
    dtype."""
    shifted = advantages.astype(np.float64) - float(coef) * teacher_kl
    with np.errstate(over="ignore"):  # beyond the float type: the computed outputs are checked
        return np.where(trainable, shifted, advantages).astype(advantages.dtype, copy=False)


def _flat(named: dict[str, Sequence], loss_mask: Sequence):
    """Per-sample lists (``named``: name → one sequence per sample) and the mask as flat
    numpy arrays (float64 by name; bool trainable) and the sample lengths, checked: as many
    samples and tokens in each as in the mask, finite numbers, a mask of 0/1 (a fault names
    its sample and token)."""
    import torch

    from gaecli.advantages.inputs import as_sample_tensor

    samples = len(loss_mask)
    lists = {"loss_mask": loss_mask, **named}
    flat, lengths = {}, None
    for name, sequence in lists.items():
        if len(sequence) != samples:
            raise GAEInputError(f"{name} has {len(sequence)} samples, loss_mask has {samples}")
        pieces = [as_sample_tensor(sample).detach().cpu().reshape(-1).to(torch.float64).numpy() for sample in sequence]
        sizes = [piece.size for piece in pieces]
        if lengths is not None and sizes != lengths:
            sample = next(index for index, (a, b) in enumerate(zip(sizes, lengths)) if a != b)
            raise GAEInputError(f"sample {sample}: {name} has {sizes[sample]} tokens, loss_mask {lengths[sample]}")
        lengths = sizes
        flat[name] = np.concatenate(pieces) if pieces else np.zeros(0)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for name, numbers in flat.items():
        bad = ~((numbers == 0) | (numbers == 1)) if name == "loss_mask" else ~np.isfinite(numbers)
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            sample = int(np.searchsorted(offsets, position, side="right") - 1)
            rule = "must be 0 or 1" if name == "loss_mask" else "must be finite"
            raise GAEInputError(
                f"sample {sample}: {name} is {numbers[position]} at token {position - offsets[sample]} ({rule})"
            )
    trainable = flat.pop("loss_mask") == 1
    return flat, trainable, lengths


def _pieces(flat: np.ndarray, lengths: list[int], like: Sequence) -> list:
    """``flat`` cut per sample, as tensors of each sample's dtype and device."""
    import torch

    from gaecli.advantages.inputs import as_sample_tensor

    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    pieces = []
    for sample, reference in enumerate(like):
        tensor = as_sample_tensor(reference)
        dtype = tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()
        piece = torch.from_numpy(np.ascontiguousarray(flat[starts[sample] : starts[sample + 1]]))
        pieces.append(piece.to(device=tensor.device, dtype=dtype))
    return pieces


def add_distillation(
    advantages: Sequence,
    log_probs: Sequence,
    teacher_log_probs: Sequence,
    loss_mask: Sequence,
    *,
    coef: float,
    kl_estimator: str = "k1",
) -> list:
    """Each sample's advantages less ``coef · KL(student ‖ teacher)`` at its trainable tokens
    (masked positions as given), the KL by ``kl_estimator`` (:data:`gaecli.advantages.kl.KL_ESTIMATORS`)
    from the student's and the teacher's per-token log-probs: what ``--opd-coef`` adds in the
    commands. One tensor per sample in the advantages' dtype and device; the inputs are
    checked (a fault names its sample) and not modified."""
    from gaecli.advantages.kl import kl_estimate
    from gaecli.options import check_number

    if coef is None:
        raise GAEInputError("coef must be a finite number, got None")
    check_number("coef", coef)
    named = {"advantages": advantages, "log_probs": log_probs, "teacher_log_probs": teacher_log_probs}
    flat, trainable, lengths = _flat(named, loss_mask)
    teacher_kl = kl_estimate(flat["log_probs"], flat["teacher_log_probs"], kl_estimator)
    return _pieces(with_distillation(flat["advantages"], teacher_kl, trainable, coef), lengths, advantages)


def distillation_advantages(
    log_probs: Sequence, teacher_log_probs: Sequence, loss_mask: Sequence, *, kl_estimator: str = "k1"
) -> list:
    """The pure on-policy distillation estimator (``--estimator opd``): ``−KL(student ‖ teacher)``
    at trainable tokens, 0 at masked ones (its returns are the same), one tensor per sample in
    the student's log-probs' dtype and device."""
    from gaecli.advantages.kl import kl_estimate

    flat, trainable, lengths = _flat({"log_probs": log_probs, "teacher_log_probs": teacher_log_probs}, loss_mask)
    teacher_kl = kl_estimate(flat["log_probs"], flat["teacher_log_probs"], kl_estimator)
    advantages = np.where(trainable, 0.0 - teacher_kl, 0.0)
    return _pieces(advantages, lengths, log_probs)
