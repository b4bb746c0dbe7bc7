"""Checks and credit metrics to run inside a trainer, every step, on the batch its drop-in takes:
:func:`check` (the validate rules that apply to tensors, raising or returning findings) and
:func:`credit_metrics` (what the trainer's own GAE loses against the masked contract), each a few
passes over the batch (docs/trainers.md#in-training-checks-and-metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from gaecli.advantages.contract import profile_of
from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.rules import RULES, Finding, first_error
from gaecli.trainers.layouts import TrainerBatch, trainer_batch

DELTA_ROWS = 8
"""Rows :func:`credit_metrics` computes both sides on by default (spread evenly over the batch)."""

DROPS_MASKED_REWARDS = ("verl", "areal", "roll", "openrlhf")
"""The profiles that read no reward at a masked token: an outcome on a masked tail is lost."""

EVERY_TOKEN = ("slime", "skyrl")
"""The profiles that run every token as a transition: an outcome on a masked tail decays to the
last trainable token, lost only when the decay γλ is 0."""


HOST_MASKS = ("torch.float32", "torch.float64", "torch.int64", "torch.int32", "torch.int16", "torch.int8",
              "torch.uint8")
"""The mask dtypes whose 0/1 check runs compiled on the host (others: torch)."""


def check(*args, layout: str = "verl", errors: str = "raise", max_findings: int = 10, **kwargs) -> list[Finding]:
    """The validate rules on a trainer's batch, given as its drop-in takes it (``layout``: one
    of :data:`gaecli.trainers.layouts.LAYOUTS`; ``check(r, v, m, gamma, lam, layout="verl")``).

    Errors: ``mask-value`` (a mask entry neither 0 nor 1), ``non-finite`` (NaN or ±Inf in the
    values, the rewards or miles' terminal rewards), and what the drop-in itself refuses (shapes,
    devices, lengths: :class:`GAEInputError` at once). Warnings: ``fully-masked`` (a sample with
    no trainable token) and ``masked-tail`` (a sample whose response ends in masked tokens, its
    outcome after its last trainable one). Each finding names the sample (``row``) and the
    drop-in's argument (``column``); at most ``max_findings`` per rule. ``errors="raise"`` (the
    default): the first error as :class:`GAEInputError`, else the warnings; ``"return"``: every
    finding. On an accelerator the tensors are read there; the findings' few numbers come back."""
    if errors not in ("raise", "return"):
        raise InvalidOptionError(f"errors={errors!r}: choose raise or return")
    kwargs.pop("semantics", None)
    batch = trainer_batch(layout, args, kwargs)
    screen = _screen(batch)
    rows = _rows_of(batch, None if screen is None else screen[3:])
    findings = _error_findings(batch, max_findings, screen) + _tail_findings(batch, rows, max_findings)
    error = first_error(findings)
    if errors == "raise" and error is not None:
        raise GAEInputError(error.line())
    return findings


@dataclass(frozen=True)
class CreditMetrics:
    """What :func:`credit_metrics` measures on one batch (tensors on the batch's device).

    ``lost``: bool ``[B]``, the samples whose outcome reward the trainer's GAE (``profile``)
    brings to no trainable token; ``lost_reward``: Σ |outcome| over them; ``masked_tail``:
    int64 ``[B]``, the masked tokens after each sample's last trainable one (0: none);
    ``mean_abs_delta``: mean |A_profile − A_masked| over the trainable tokens both sides were
    computed on (the responses' ends of ``rows_compared`` rows; GAE before any whitening)."""

    layout: str
    profile: str
    lost: Any
    lost_reward: Any
    masked_tail: Any
    mean_abs_delta: Any
    rows_compared: int

    def as_dict(self, prefix: str = "gaecli/") -> dict[str, float]:
        """The figures as numbers for a trainer's logger (this reads them back to the host)."""
        samples = int(self.lost.numel())
        tails = self.masked_tail > 0
        tail_count = int(tails.sum())
        return {
            f"{prefix}lost_terminal_samples": float(self.lost.sum()),
            f"{prefix}lost_terminal_share": float(self.lost.sum()) / samples if samples else 0.0,
            f"{prefix}lost_terminal_reward": float(self.lost_reward),
            f"{prefix}masked_tail_samples": float(tail_count),
            f"{prefix}masked_tail_tokens_mean": float(self.masked_tail[tails].double().mean()) if tail_count else 0.0,
            f"{prefix}mean_abs_delta": float(self.mean_abs_delta),
        }


def credit_metrics(
    *args,
    layout: str = "verl",
    profile: Optional[str] = None,
    delta_rows: Optional[int] = DELTA_ROWS,
    delta_tokens: Optional[int] = None,
    **kwargs,
) -> CreditMetrics:
    """Per batch, what the trainer's own GAE (``profile``: a gaecli profile, by default the
    layout's trainer's, :data:`gaecli.trainers.layouts.LAYOUTS`) does against the masked
    contract, on the arguments of ``layout``'s drop-in: the samples whose outcome it loses, the
    masked tails, and the mean |Δ advantage| (GAE before any whitening): for verl, AReaL and
    NeMo-RL over every trainable token from each row's figures; for the other profiles over
    ``delta_rows`` rows spread evenly over the batch (None: every row), on the last
    ``delta_tokens`` tokens of their responses shared among them (None: a 64th of the batch's
    tokens, at least 4,096; at least one a row), both sides computed there only
    (:func:`gaecli.trainers.credit_delta.mean_abs_delta`), which keeps the metrics cheap enough for
    every step. :class:`CreditMetrics`; nothing is read back to the host until
    :meth:`CreditMetrics.as_dict`."""
    from gaecli.trainers.credit_delta import mean_abs_delta

    kwargs.pop("semantics", None)
    batch = trainer_batch(layout, args, kwargs, profile)
    rows = _rows_of(batch)
    lost = _lost(batch, rows)
    lost_reward = (abs(rows["outcome"]) * lost).sum()
    delta, compared = mean_abs_delta(batch, rows, lost, delta_rows, delta_tokens)
    figures = (_tensor(figure) for figure in (lost, lost_reward, rows["tail"], delta))
    return CreditMetrics(layout, batch.profile, *figures, compared)


def _tensor(figure):
    """A figure as a tensor (numpy's, computed on the host, shared)."""
    import torch

    return torch.from_numpy(np.asarray(figure)) if isinstance(figure, (np.ndarray, np.generic)) else figure


def _on_host(batch: TrainerBatch) -> bool:
    """Whether the batch's figures are read in numpy: values and rewards of one dtype, float32 or
    float64, and a real mask, all on the CPU (else in torch, where the tensors are)."""
    import torch

    values, rewards, mask = batch.values, batch.rewards, batch.mask
    if values.device.type != "cpu" or rewards.device.type != "cpu" or mask.device.type != "cpu":
        return False
    if values.dtype not in (torch.float32, torch.float64) or rewards.dtype != values.dtype:
        return False
    return not mask.dtype.is_complex and mask.dtype not in (torch.float16, torch.bfloat16)


def _screen(batch: TrainerBatch) -> Optional[tuple]:
    """On the host, :func:`gaecli.advantages.faults.screen_rows` of the batch (numpy: the rows'
    error flags, then their tails as :func:`_rows_of` reads them), or what the drop-in's
    compiled pass saw of this very batch (:func:`gaecli.trainers.host.seen_tails`: clean, and
    its tails); else None."""
    import torch

    from gaecli.advantages.faults import screen_rows
    from gaecli.trainers.host import seen_tails

    seen = seen_tails(batch.values, batch.rewards, batch.mask, batch.rows)
    if seen is not None:  # the drop-in's kernel screened this batch clean a moment ago
        clean = np.zeros(len(seen[0]), dtype=np.bool_)
        return (clean, clean, clean, *seen)
    if not _on_host(batch) or (str(batch.mask.dtype) not in HOST_MASKS and batch.mask.dtype != torch.bool):
        return None
    return screen_rows(*(tensor.numpy() for tensor in (batch.mask, batch.values, batch.rewards)), batch.offsets.numpy())


def _rows_of(batch: TrainerBatch, tails: Optional[tuple] = None) -> dict:
    """Per sample ``[B]`` (numpy on the host, :func:`_on_host`; else tensors on the batch's
    device): the flat index of its last trainable token (``last``, -1: none), one past its
    response (``ends``: a list's end; a padded row's past its last trainable token, last reward
    after it or last response-mask token, NeMo-RL's every row whole), whether it has a response
    (``nonempty``), its masked tail (``tail``) and its outcome (``outcome``: the rewards after
    its last trainable token, or the reward given apart). ``tails``: the screen's
    (:func:`_screen`), else read here."""
    import torch

    from gaecli.advantages.layout import last_trainable_index, row_tails

    host = _on_host(batch)
    xp = np if host else torch
    offsets = batch.offsets.numpy() if host else batch.offsets
    if tails is None and host:
        from gaecli.trainers.host import seen_tails

        tails = seen_tails(batch.values, batch.rewards, batch.mask, batch.rows)
        if tails is None:
            tails = row_tails(batch.mask.numpy(), batch.rewards.numpy(), offsets)
    elif tails is None:
        tails = row_tails(batch.mask, batch.rewards, offsets)
    last, last_reward, tail_sum = tails
    starts = offsets[:-1]
    if batch.rows is None:
        ends = offsets[1:]
    else:
        ends = xp.maximum(last, last_reward) + 1
        if batch.extent is not None:
            extent = batch.extent.numpy() if host else batch.extent != 0
            ends = xp.maximum(ends, last_trainable_index(extent, offsets) + 1)
        ends = xp.maximum(ends, starts)
        if batch.outcome is not None:
            ends = xp.where(ends > starts, ends, starts + batch.rows[1])
    given = batch.terminal if batch.terminal is not None else batch.outcome
    outcome = tail_sum if given is None else given.numpy() if host else given
    tail = xp.where(last >= 0, ends - 1 - last, ends - starts)
    tail = np.maximum(tail, 0) if host else tail.clamp(min=0)
    return {"last": last, "ends": ends, "nonempty": ends > starts, "tail": tail, "outcome": outcome}


def _lost(batch: TrainerBatch, rows: dict):
    """Bool ``[B]``, as :func:`_rows_of`'s figures: the samples whose outcome the profile brings
    to no trainable token (docs/semantics.md#what-each-profile-loses, read on the trainer's
    layout)."""
    from gaecli.advantages.baselines import lost_terminal_samples

    host = isinstance(rows["last"], np.ndarray)
    if batch.terminal is not None:  # the outcome where the profile puts it, as gae diff reads it
        trainable, offsets, terminal = batch.trainable, batch.offsets, batch.terminal
        if host:
            trainable, offsets, terminal = trainable.numpy(), offsets.numpy(), terminal.numpy()
        return lost_terminal_samples(batch.profile, trainable, offsets, terminal, gamma=batch.gamma,
                                     lambd=float(batch.lambd))  # fmt: skip
    profile = profile_of(batch.profile)
    nothing_trainable = rows["nonempty"] & (rows["last"] < 0)
    on_tail = rows["nonempty"] & (rows["tail"] > 0)
    if profile in DROPS_MASKED_REWARDS:
        lost = nothing_trainable | on_tail
    elif profile in EVERY_TOKEN:
        lost = nothing_trainable | (on_tail & _no_decay(batch, host))
    else:
        lost = nothing_trainable
    return lost | (~rows["nonempty"] & (rows["outcome"] != 0))


def _no_decay(batch: TrainerBatch, host: bool):
    """Whether γλ is 0 (a bool, or bool ``[B]`` for a λ per row: numpy when ``host``)."""
    if hasattr(batch.lambd, "numel"):
        flags = (batch.gamma * batch.lambd.reshape(-1)) == 0
        return flags.cpu().numpy() if host else flags
    return batch.gamma * float(batch.lambd) == 0


def _error_findings(batch: TrainerBatch, limit: int, screen: Optional[tuple] = None) -> list[Finding]:
    """``mask-value`` and ``non-finite`` findings, at most ``limit`` per rule; ``screen``
    (:func:`_screen`): the rows' flags, the tokens at fault looked for only where one is set."""
    import torch

    from gaecli.advantages.faults import all_binary

    found = []
    mask = batch.mask
    if screen is not None:
        binary = not bool(screen[0].any())
    else:
        binary = all_binary(mask.numpy()) if mask.device.type == "cpu" and str(mask.dtype) in HOST_MASKS else None
    if mask.dtype != torch.bool and not binary:
        bad = (mask != 0) & (mask != 1)
        found += _findings(batch, "mask-value", batch.names["mask"], bad, limit, "is {value}, not 0 or 1", mask)
    for flag, role in ((1, "values"), (2, "rewards")):
        tensor = getattr(batch, role)
        if not (_finite(tensor) if screen is None else not bool(screen[flag].any())):
            bad = ~torch.isfinite(tensor)
            found += _findings(batch, "non-finite", batch.names[role], bad, limit, "is {value}", tensor)
    if batch.terminal is not None and not bool(torch.isfinite(batch.terminal.sum())):
        rows = (~torch.isfinite(batch.terminal)).nonzero().flatten()[:limit].tolist()
        found += [_finding(batch, "non-finite", "terminal_rewards", row, f"terminal_rewards[{row}] is not finite")
                  for row in rows]  # fmt: skip
    return found


def _finite(tensor) -> bool:
    """Whether a tensor holds no NaN or ±Inf: one reduction (numpy's, single-threaded, on the
    host: torch's two-thread reduction waits on a busy core), the exact check only when it is not."""
    import torch

    from gaecli.advantages.faults import all_finite

    if tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64):
        return all_finite(tensor.reshape(-1).numpy())
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def _findings(batch: TrainerBatch, code: str, name: str, bad, limit: int, wording: str, tensor) -> list[Finding]:
    """One finding per sample with a ``bad`` flat position (its first), at most ``limit``."""
    import torch

    if not bool(bad.any()):
        return []
    positions = bad.nonzero().flatten()
    samples = torch.searchsorted(batch.offsets, positions, right=True) - 1
    first = torch.ones_like(samples, dtype=torch.bool)
    first[1:] = samples[1:] != samples[:-1]
    positions, samples = positions[first][:limit], samples[first][:limit]
    values = tensor[positions].tolist()
    found = []
    for position, sample, value in zip(positions.tolist(), samples.tolist(), values):
        where = _where(batch, name, sample, position)
        found.append(_finding(batch, code, name, sample, f"{where} {wording.format(value=value)}"))
    return found


def _where(batch: TrainerBatch, name: str, sample: int, position: int) -> str:
    """``name[i, t]`` of a padded batch, ``name[i][t]`` of lists."""
    token = position - int(batch.offsets[sample])
    return f"{name}[{sample}, {token}]" if batch.rows is not None else f"{name}[{sample}][{token}]"


def _tail_findings(batch: TrainerBatch, rows: dict, limit: int) -> list[Finding]:
    """``fully-masked`` and ``masked-tail`` warnings, at most ``limit`` per rule."""
    name = batch.names["mask"]
    found = []
    fully = _first_rows(rows["nonempty"] & (rows["last"] < 0), limit)
    found += [_finding(batch, "fully-masked", name, row, f"sample {row}: {RULES['fully-masked'].summary}")
              for row in fully]  # fmt: skip
    picked = _first_rows(rows["nonempty"] & (rows["last"] >= 0) & (rows["tail"] > 0), limit)
    for row, length in zip(picked, rows["tail"][picked].tolist()):
        message = f"sample {row}: the response ends in {length} masked tokens after its last trainable one"
        found.append(_finding(batch, "masked-tail", name, row, message))
    return found


def _first_rows(flags, limit: int) -> list[int]:
    """The first ``limit`` rows whose flag is set (``flags``: bool ``[B]``, numpy or a tensor)."""
    rows = np.flatnonzero(flags) if isinstance(flags, np.ndarray) else flags.nonzero().flatten()
    return rows[:limit].tolist()


def _finding(batch: TrainerBatch, code: str, column: str, row: int, message: str) -> Finding:
    return Finding(f"{batch.layout} batch", row, column, code, message)
