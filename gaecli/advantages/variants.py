"""The GAE variants' per-sample quantities, written once for the kernels that compute them
(definitions: docs/variants.md): the length-adaptive and relative-position λ, the λ of
advantages and returns of every sample, the value after each sample's last timestep, and
the turn table (of the mask's runs or of explicit turn ids). numpy only; no torch, no numba."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np

from gaecli.advantages.layout import id_turn_table, trainable_counts, turn_table


def adaptive_lambd(alpha: float, lengths: np.ndarray) -> np.ndarray:
    """VAPO's length-adaptive λ of samples with ``lengths`` timesteps (trainable tokens, or
    turns under ``timestep="turn"``): ``clamp(1 − 1 / max(α·L, 1), 0, 1)``; 0 for L = 0.
    float64 ``[B]``. An α·L beyond float64 is +inf, whose λ is the limit 1 (no warning)."""
    with np.errstate(over="ignore"):
        scaled = np.float64(alpha) * lengths.astype(np.float64)
    return np.clip(1.0 - 1.0 / np.maximum(scaled, 1.0), 0.0, 1.0)


def relative_position_lambd(q: float, lengths: np.ndarray) -> np.ndarray:
    """AReaL's relative-position λ of samples with ``lengths`` timesteps (trainable tokens,
    or turns under ``timestep="turn"``): ``q^(1/(L − 1))`` for L ≥ 2 (the first timestep keeps
    the fraction q of a terminal reward at γ = 1, the last all of it), 1 for L = 1, 0 for
    L = 0. float64 ``[B]``."""
    counts = lengths.astype(np.float64)
    steps = np.maximum(counts - 1.0, 1.0)
    lambdas = np.power(np.float64(q), 1.0 / steps)
    return np.where(counts > 1, lambdas, np.where(counts == 1, 1.0, 0.0))


def sample_lambd(lambd: float, lengths: np.ndarray, **variants) -> np.ndarray:
    """The λ of the advantages of samples with ``lengths`` timesteps (float64 ``[B]``):
    ``lambd``, or the per-sample λ of ``lambd_alpha`` or of ``lambd_schedule`` (with
    ``lambd_q``) among ``variants`` (the keywords of :class:`VariantArguments`)."""
    arguments = VariantArguments(**variants)
    if arguments.lambd_alpha is not None:
        return adaptive_lambd(arguments.lambd_alpha, lengths)
    if arguments.lambd_schedule is not None:
        return relative_position_lambd(arguments.lambd_q, lengths)
    return np.full(lengths.shape, float(lambd), dtype=np.float64)


def per_sample_lambd(**variants) -> bool:
    """Whether ``variants`` give the advantages a λ of their own per sample (so the returns
    run their own recursion)."""
    arguments = VariantArguments(**variants)
    return arguments.lambd_alpha is not None or arguments.lambd_schedule is not None


def as_numpy(array) -> Optional[np.ndarray]:
    """A numpy array of a numpy array, a tensor (any device) or a sequence; None stays None."""
    if array is None or isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach"):
        return array.detach().cpu().numpy()
    return np.asarray(array)


@dataclass(frozen=True)
class VariantPlan:
    """What a variant kernel needs besides the batch, per sample and per turn.

    ``advantage_lambd``, ``return_lambd``: float64 ``[B]``; ``split``: whether the returns
    run their own recursion (``lambd_critic``, ``lambd_alpha`` or ``lambd_schedule`` set) instead of being the
    advantages plus the values; ``bootstrap``: float64 ``[B]``, the value after the last
    timestep (0 unless truncated); ``turn_starts``, ``turn_ends`` ``[U]`` and
    ``turn_offsets`` ``[B + 1]``: :func:`gaecli.advantages.layout.turn_table` (empty, and
    zeros, when neither the turn mode nor turn rewards read it);
    ``turn_rewards``: float64 ``[U]`` (zeros when none were given; ``has_turn_rewards``
    says)."""

    advantage_lambd: np.ndarray
    return_lambd: np.ndarray
    split: bool
    bootstrap: np.ndarray
    turn_starts: np.ndarray
    turn_ends: np.ndarray
    turn_offsets: np.ndarray
    turn_rewards: np.ndarray
    has_turn_rewards: bool
    turn_mode: bool


class VariantArguments(NamedTuple):
    """The keyword arguments of the GAE variants a kernel takes besides γ and λ (written once:
    the kernels that run the variants read them through this). ``turn_rewards`` are flat
    ``[U]`` in the turn order of the batch (``turn_offsets``, when given, must be the batch's
    own, which the callers check); ``truncated`` bool ``[B]`` and ``bootstrap_values`` ``[B]``
    (read only where truncated); ``lambd_schedule`` with ``lambd_q``: the relative-position λ;
    ``turn_ids``: int ``[N]``, the turn of each token under ``timestep="turn"`` (checked by
    the callers; :func:`gaecli.advantages.layout.id_turn_table`).
    Per-row inputs as numpy arrays, tensors or sequences."""

    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    turn_rewards: Any = None
    turn_offsets: Any = None
    truncated: Any = None
    bootstrap_values: Any = None
    lambd_schedule: Optional[str] = None
    lambd_q: Optional[float] = None
    turn_ids: Any = None


def row_bootstraps(truncated, bootstrap_values, like=None):
    """The value after each row's last trainable token under the truncation bootstrap, ``[B]``:
    a truncated row's bootstrap value, 0 for the others (theirs is not read: it may be NaN).
    numpy float64; with ``like`` (a tensor), a tensor of its dtype on its device (the flags and
    values stay there)."""
    if like is None:
        flags = as_numpy(truncated).astype(bool, copy=False)
        return np.where(flags, as_numpy(bootstrap_values).astype(np.float64, copy=False), 0.0)
    import torch

    flags = torch.as_tensor(truncated, device=like.device).to(torch.bool)
    given = torch.as_tensor(bootstrap_values, device=like.device).to(like.dtype)
    return torch.where(flags, given, torch.zeros((), dtype=like.dtype, device=like.device))


def plan_variants(trainable: np.ndarray, offsets: np.ndarray, *, lambd: float, **variants) -> VariantPlan:
    """The :class:`VariantPlan` of one batch (bool ``trainable`` ``[N]``, int64 ``offsets``
    ``[B + 1]``), vectorised; ``variants``: the keywords of :class:`VariantArguments`."""
    arguments = VariantArguments(**variants)
    timestep, lambd_critic, _, turn_rewards, _, truncated, bootstrap_values, *_ = arguments
    batch = offsets.size - 1
    turn_mode = timestep == "turn"
    if turn_mode and arguments.turn_ids is not None:
        starts, ends, table_offsets = id_turn_table(trainable, offsets, as_numpy(arguments.turn_ids))
    elif turn_mode or turn_rewards is not None:
        starts, ends, table_offsets = turn_table(trainable, offsets)
    else:  # no turn is read: an empty table (the kernel's token pass needs none)
        starts = ends = np.zeros(0, dtype=np.int64)
        table_offsets = np.zeros(batch + 1, dtype=np.int64)
    if per_sample_lambd(**variants):
        lengths = np.diff(table_offsets) if turn_mode else trainable_counts(trainable, offsets)
        advantage_lambd = sample_lambd(lambd, lengths, **variants)
    else:
        advantage_lambd = np.full(batch, float(lambd), dtype=np.float64)
    returns_lambd = float(lambd) if lambd_critic is None else float(lambd_critic)
    bootstrap = np.zeros(batch, dtype=np.float64) if truncated is None else row_bootstraps(truncated, bootstrap_values)
    has_turn_rewards = turn_rewards is not None
    flat_turn_rewards = (
        as_numpy(turn_rewards).astype(np.float64, copy=False) if has_turn_rewards else np.zeros(starts.size)
    )
    return VariantPlan(
        advantage_lambd=advantage_lambd,
        return_lambd=np.full(batch, returns_lambd, dtype=np.float64),
        split=lambd_critic is not None or per_sample_lambd(**variants),
        bootstrap=bootstrap,
        turn_starts=starts.astype(np.int64, copy=False),
        turn_ends=ends.astype(np.int64, copy=False),
        turn_offsets=table_offsets,
        turn_rewards=np.ascontiguousarray(flat_turn_rewards),
        has_turn_rewards=has_turn_rewards,
        turn_mode=turn_mode,
    )
