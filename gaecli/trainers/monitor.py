"""Checks and credit metrics to run inside a trainer, every step, on the batch its drop-in takes:
:func:`check` (the validate rules that apply to tensors, raising or returning findings) and
:func:`credit_metrics` (what the trainer's own GAE loses against the masked contract), each a few
passes over the batch (docs/trainers.md#in-training-checks-and-metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numba
import numpy as np

from gaecli.advantages.contract import MASKED, profile_of
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


INERT_AFTER_THE_END = ("verl", "areal", "openrlhf")
"""The profiles to which the masked positions after a response's end (no reward there) add
exactly nothing (verl and AReaL skip them; OpenRLHF zeroes their values and rewards): the Δ
window stops at the end. The others read the values there (ROLL, slime, SkyRL run every
position as a transition), so their window runs to the row's end."""

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
    masked tails, and the mean |Δ advantage| (GAE before any whitening) over ``delta_rows``
    rows spread evenly over the batch (None: every row), on the last ``delta_tokens`` tokens
    of their responses shared among them (None: a 64th of the batch's tokens, at least 4,096; at
    least one a row),
    both sides computed there only, which keeps the metrics cheap enough for every step.
    :class:`CreditMetrics`; nothing is read back to the host until :meth:`CreditMetrics.as_dict`."""
    kwargs.pop("semantics", None)
    batch = trainer_batch(layout, args, kwargs, profile)
    rows = _rows_of(batch)
    lost = _lost(batch, rows)
    lost_reward = rows["outcome"].abs().mul(lost).sum()
    delta, compared = _mean_abs_delta(batch, rows, delta_rows, delta_tokens)
    return CreditMetrics(layout, batch.profile, lost, lost_reward, rows["tail"], delta, compared)


def _screen(batch: TrainerBatch) -> Optional[tuple]:
    """On the host, :func:`gaecli.advantages.faults.screen_rows` of the batch as torch tensors
    (the rows' error flags, then their tails as :func:`_rows_of` reads them), or what the
    drop-in's compiled pass saw of this very batch (:func:`gaecli.trainers.host.seen_tails`:
    clean, and its tails); else None."""
    import torch

    from gaecli.advantages.faults import screen_rows
    from gaecli.trainers.host import seen_tails

    seen = seen_tails(batch.values, batch.rewards, batch.mask, batch.rows)
    if seen is not None:  # the drop-in's kernel screened this batch clean a moment ago
        clean = torch.zeros(len(seen[0]), dtype=torch.bool)
        return (clean, clean, clean, *(torch.from_numpy(array) for array in seen))
    tensors = (batch.mask, batch.values, batch.rewards)
    if any(tensor.device.type != "cpu" for tensor in tensors) or (
        str(batch.mask.dtype) not in HOST_MASKS and batch.mask.dtype != torch.bool
    ):
        return None
    if any(tensor.dtype not in (torch.float32, torch.float64) for tensor in tensors[1:]):
        return None
    found = screen_rows(*(tensor.numpy() for tensor in tensors), batch.offsets.numpy())
    return tuple(torch.from_numpy(array) for array in found)


def _rows_of(batch: TrainerBatch, tails: Optional[tuple] = None) -> dict:
    """Per sample ``[B]``: the flat index of its last trainable token (``last``, -1: none), one
    past its response (``ends``: a list's end; a padded row's past its last trainable token,
    last reward after it or last response-mask token, NeMo-RL's every row whole), whether it
    has a response (``nonempty``), its masked tail (``tail``) and its outcome (``outcome``:
    the rewards after its last trainable token, or the reward given apart)."""
    import torch

    from gaecli.advantages.layout import last_trainable_index, row_tails

    on_host = batch.mask.device.type == "cpu" and batch.rewards.dtype in (torch.float32, torch.float64)
    if tails is not None:  # the screen's (:func:`_screen`)
        last, last_reward, tail_sum = tails
    elif on_host:
        from gaecli.trainers.host import seen_tails

        found = seen_tails(batch.values, batch.rewards, batch.mask, batch.rows)
        if found is None:
            found = row_tails(batch.mask.numpy(), batch.rewards.numpy(), batch.offsets.numpy())
        last, last_reward, tail_sum = (torch.from_numpy(array) for array in found)
    else:
        last, last_reward, tail_sum = row_tails(batch.mask, batch.rewards, batch.offsets)
    starts = batch.offsets[:-1]
    if batch.rows is None:
        ends = batch.offsets[1:]
    else:
        ends = torch.maximum(last, last_reward) + 1
        if batch.extent is not None:
            extent = batch.extent.numpy() if on_host else batch.extent != 0
            extent_last = last_trainable_index(extent, batch.offsets.numpy() if on_host else batch.offsets)
            ends = torch.maximum(ends, torch.as_tensor(extent_last, device=ends.device) + 1)
        ends = torch.maximum(ends, starts)
        if batch.outcome is not None:
            ends = torch.where(ends > starts, ends, starts + batch.rows[1])
    outcome = batch.terminal if batch.terminal is not None else batch.outcome if batch.outcome is not None else tail_sum
    tail = torch.where(last >= 0, ends - 1 - last, ends - starts).clamp(min=0)
    return {"last": last, "ends": ends, "nonempty": ends > starts, "tail": tail, "outcome": outcome}


def _lost(batch: TrainerBatch, rows: dict):
    """Bool ``[B]``: the samples whose outcome the profile brings to no trainable token
    (docs/semantics.md#what-each-profile-loses, read on the trainer's layout)."""
    from gaecli.advantages.baselines import lost_terminal_samples

    if batch.terminal is not None:  # the outcome where the profile puts it, as gae diff reads it
        return lost_terminal_samples(batch.profile, batch.trainable, batch.offsets, batch.terminal,
                                     gamma=batch.gamma, lambd=float(batch.lambd))  # fmt: skip
    profile = profile_of(batch.profile)
    nothing_trainable = rows["nonempty"] & (rows["last"] < 0)
    on_tail = rows["nonempty"] & (rows["tail"] > 0)
    if profile in DROPS_MASKED_REWARDS:
        lost = nothing_trainable | on_tail
    elif profile in EVERY_TOKEN:
        lost = nothing_trainable | (on_tail & _no_decay(batch))
    else:
        lost = nothing_trainable
    return lost | (~rows["nonempty"] & (rows["outcome"] != 0))


def _no_decay(batch: TrainerBatch):
    """Whether γλ is 0 (a bool, or bool ``[B]`` for a λ per row)."""
    if hasattr(batch.lambd, "numel"):
        return (batch.gamma * batch.lambd.reshape(-1)) == 0
    return batch.gamma * float(batch.lambd) == 0


def _mean_abs_delta(batch: TrainerBatch, rows: dict, delta_rows: Optional[int], delta_tokens: Optional[int]):
    """(mean |A_profile − A_masked| over the trainable tokens compared, the rows compared): on
    ``delta_rows`` rows spread evenly over the batch, the last ``delta_tokens / rows`` tokens of
    each response (a suffix's advantages are exact: every semantics runs backwards from the
    response's end, so each token's depends only on the tokens after it)."""
    import torch

    count = rows["ends"].numel()
    for name, number in (("delta_rows", delta_rows), ("delta_tokens", delta_tokens)):
        if number is not None and number < 0:
            raise InvalidOptionError(f"{name}={number}: give a number ≥ 0, or None")
    chosen = count if delta_rows is None else min(int(delta_rows), count)
    zero = torch.zeros((), dtype=torch.float64, device=batch.values.device)
    if chosen == 0 or profile_of(batch.profile) == MASKED:
        return zero, 0
    budget = max(4096, batch.values.numel() // 64) if delta_tokens is None else int(delta_tokens)
    picked = torch.linspace(0, count - 1, chosen, device=batch.values.device).round().long().unique()
    window = max(1, budget // picked.numel())
    masked, old, trainable = _window_sides(batch, rows, picked, window)
    differences = (old - masked).abs().double()
    tokens = trainable.sum()
    mean = torch.where(tokens > 0, differences.mul(trainable).sum() / tokens.clamp(min=1), zero)
    return mean, int(picked.numel())


def _window_sides(batch: TrainerBatch, rows: dict, picked, window: int):
    """Both sides' advantages ``[k, W]`` on the ``picked`` rows from ``window`` tokens before
    each response's end to the row's end (a padded row's padding included: some profiles read
    its values; for :data:`INERT_AFTER_THE_END` to the response's end), right-aligned, a
    shorter row preceded by masked zeros; and their trainable
    tokens. A terminal reward given apart is read on the response's last token."""
    import torch

    starts, row_ends, ends = batch.offsets[:-1][picked], batch.offsets[1:][picked], rows["ends"][picked]
    if profile_of(batch.profile) in INERT_AFTER_THE_END:
        row_ends = ends
    begins = torch.maximum(starts, ends - window)
    width = max(1, int((row_ends - begins).max()))
    lambd = batch.lambd
    if hasattr(lambd, "numel") and lambd.numel() == rows["ends"].numel() > 1:
        lambd = lambd.reshape(-1)[picked]
    truncation = None if batch.truncation is None else tuple(part[picked] for part in batch.truncation)
    gathered = _gathered_on_host(batch, begins, row_ends, width)
    if gathered is not None:
        values, rewards, trainable = gathered
        if batch.terminal is not None:
            column = (ends - 1 - (row_ends - width)).numpy()  # the response's last token, read as its outcome's
            inside = (ends - 1 >= begins).numpy()
            outcome = batch.terminal[picked].numpy().astype(rewards.numpy().dtype)
            rewards.numpy()[np.flatnonzero(inside), column[inside]] += outcome[inside]
        masked, old = _both_sides(batch, values, rewards, trainable, lambd, truncation)
        return masked, old, trainable
    positions = row_ends.unsqueeze(1) - width + torch.arange(width, device=ends.device)
    inside = positions >= begins.unsqueeze(1)
    positions = torch.where(inside, positions, 0)
    zero = torch.zeros((), dtype=batch.values.dtype, device=batch.values.device)
    # torch.take, not flat[positions]: a 2-D index costs 80x as much on the host
    take = lambda flat: torch.where(inside, torch.take(flat, positions), zero)  # noqa: E731
    values, rewards = take(batch.values), take(batch.rewards)
    if batch.terminal is not None:
        last = positions == (ends - 1).unsqueeze(1)
        rewards = rewards + torch.where(last & inside, batch.terminal[picked].unsqueeze(1).to(values.dtype), zero)
    trainable = (torch.take(batch.mask, positions) != 0) & inside
    masked, old = _both_sides(batch, values, rewards, trainable, lambd, truncation)
    return masked, old, trainable


def _gathered_on_host(batch: TrainerBatch, begins, row_ends, width: int):
    """On the host, the windows of :func:`_window_sides` gathered by one compiled pass (a few
    thousand tokens: the torch ops cost more than the copy): ``(values, rewards, trainable)``
    ``[k, width]``, each window ending at its row's ``row_ends``, the
    tokens before ``begins`` 0 (not trainable); None where the batch is not on the host in
    float32 or float64 (one dtype), its mask bool or real."""
    import torch

    tensors = (batch.values, batch.rewards)
    if any(t.device.type != "cpu" or t.dtype != batch.values.dtype for t in tensors) or batch.mask.device.type != "cpu":
        return None
    if batch.values.dtype not in (torch.float32, torch.float64) or batch.mask.dtype.is_complex:
        return None
    if batch.mask.dtype in (torch.float16, torch.bfloat16):
        return None
    flat = [t.reshape(-1).numpy() for t in (*tensors, batch.mask)]
    count = begins.numel()
    out = [np.zeros((count, width), dtype=flat[0].dtype) for _ in range(2)] + [np.zeros((count, width), np.bool_)]
    _gather_windows(*flat, begins.numpy(), row_ends.numpy(), width, *out)
    return tuple(torch.from_numpy(array) for array in out)


@numba.njit(cache=True, nogil=True)
def _gather_windows(values, rewards, mask, begins, row_ends, width, out_values, out_rewards, out_trainable):
    for k in range(begins.shape[0]):
        first = row_ends[k] - width
        for j in range(max(begins[k] - first, 0), width):
            position = first + j
            out_values[k, j] = values[position]
            out_rewards[k, j] = rewards[position]
            out_trainable[k, j] = mask[position] != 0


def _both_sides(batch: TrainerBatch, values, rewards, trainable, lambd, truncation=None):
    """The advantages ``[k, W]`` of the masked contract and of the batch's profile (with its
    ``truncation`` bootstrap, ``(truncated, bootstrap values)`` ``[k]`` each, where it takes one:
    AReaL's). On the host with one λ: the compiled kernel with the profiles' one definition
    around it, on numpy (a few thousand tokens: the torch API's checks and dispatch would cost
    more than the scans); else the drop-ins' padded GAE."""
    import torch

    from gaecli.trainers.padded import outcome_split
    from gaecli.trainers.row_lambda import padded_lambda_gae

    if values.device.type != "cpu" or hasattr(lambd, "numel") or values.dtype not in (torch.float32, torch.float64):
        masked, _ = padded_lambda_gae(values, rewards, trainable, batch.gamma, lambd, MASKED)
        old, _ = padded_lambda_gae(values, rewards, trainable, batch.gamma, lambd, batch.profile, truncation)
        return masked, old
    from gaecli.advantages.baselines import apply_semantics
    from gaecli.advantages.kernels.native import native_gae_flat

    count, width = values.shape
    offsets = np.arange(count + 1, dtype=np.int64) * width
    options = {"gamma": batch.gamma, "lambd": float(lambd)}
    variants = {} if truncation is None else dict(zip(("truncated", "bootstrap_values"), map(_numpy, truncation)))

    def run(values, rewards, trainable, terminal, **variants):
        return native_gae_flat(values, rewards, trainable, offsets, terminal, **options, **variants)

    kept, outcome = outcome_split(rewards, trainable)
    flat = lambda tensor: tensor.reshape(-1).numpy()  # noqa: E731
    masked, _ = run(flat(values), flat(kept), flat(trainable), outcome.numpy())
    zeros = np.zeros(count, dtype=masked.dtype)
    profile_run = lambda *arrays: run(*arrays, **variants)  # noqa: E731
    old, _ = apply_semantics(profile_run, flat(values), flat(rewards), flat(trainable), offsets, zeros,
                             semantics=batch.profile, **options)  # fmt: skip
    return torch.from_numpy(masked).reshape(count, width), torch.from_numpy(old).reshape(count, width)


def _numpy(tensor) -> np.ndarray:
    """A host tensor's numbers as numpy (bool stays bool, a float is taken as float64)."""
    array = tensor.detach().cpu().numpy()
    return array if array.dtype == np.bool_ else array.astype(np.float64)


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
    fully = (rows["nonempty"] & (rows["last"] < 0)).nonzero().flatten()[:limit].tolist()
    found += [_finding(batch, "fully-masked", name, row, f"sample {row}: {RULES['fully-masked'].summary}")
              for row in fully]  # fmt: skip
    tails = rows["nonempty"] & (rows["last"] >= 0) & (rows["tail"] > 0)
    picked = tails.nonzero().flatten()[:limit]
    for row, length in zip(picked.tolist(), rows["tail"][picked].tolist()):
        message = f"sample {row}: the response ends in {length} masked tokens after its last trainable one"
        found.append(_finding(batch, "masked-tail", name, row, message))
    return found


def _finding(batch: TrainerBatch, code: str, column: str, row: int, message: str) -> Finding:
    return Finding(f"{batch.layout} batch", row, column, code, message)
