"""A trainer's batch as its drop-in takes it, read into one form: the arguments of a drop-in
(bound by its own signature) as flat ``[N]`` values, rewards and mask with offsets, the outcome,
γ and λ and the trainer's profile. What :func:`gaecli.trainers.check` and
:func:`gaecli.trainers.credit_metrics` read (docs/trainers.md#in-training-checks-and-metrics)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from gaecli.advantages.contract import MASKED, profile_variants
from gaecli.errors import InvalidOptionError
from gaecli.trainers.padded import as_trainable, check_batch, row_offsets


@dataclass(frozen=True)
class TrainerBatch:
    """One batch of a trainer's layout. ``values``, ``rewards`` (as the trainer lays them out,
    the outcome on the response's last token unless ``terminal`` holds it apart): flat ``[N]``,
    a padded ``[B, T]`` batch as its rows one after the other (views); ``mask``: the trainer's
    0/1 mask as given, flat; ``offsets`` ``[B + 1]``; ``truncation``: the truncation bootstrap
    the trainer's profile takes, ``(truncated, bootstrap values)`` ``[B]`` each (AReaL's: its
    no-EOS rows and ``values[:, T − 1]``; else None); ``terminal``: miles' separate terminal
    rewards ``[B]`` (else None); ``outcome``: the reward of each sample
    given apart from its tokens (NeMo-RL's ``[B]``; else None); ``extent``: a padded batch's
    response mask, flat (SkyRL's; else None); ``rows``: ``(B, T)`` of a padded batch, else
    None; ``names``: the drop-in's argument of each role (``values``, ``rewards``, ``mask``)."""

    layout: str
    values: Any
    rewards: Any
    mask: Any
    offsets: Any
    terminal: Any
    gamma: float
    lambd: Any
    profile: str
    names: dict
    rows: Optional[tuple[int, int]] = None
    extent: Any = None
    outcome: Any = None
    truncation: Any = None

    @property
    def trainable(self):
        return as_trainable(self.mask)


def _padded(layout, values, rewards, mask, gamma, lambd, profile, names, truncation=None, **more):
    """A padded ``[B, T]`` batch as a :class:`TrainerBatch` (flat views, no copy); ``more``:
    ``extent`` (``[B, T]``), ``outcome`` (``[B]``)."""
    check_batch(layout, rewards, values, mask)
    rewards = rewards.to(values.dtype)
    batch, length = values.shape
    flat = {key: tensor.reshape(-1) if tensor.dim() == 2 else tensor for key, tensor in more.items()}
    flat["truncation"] = truncation
    return TrainerBatch(
        layout, values.reshape(-1), rewards.reshape(-1), mask.reshape(-1), row_offsets(batch, length, values.device),
        terminal=None, gamma=float(gamma), lambd=lambd, profile=profile, names=names, rows=(batch, length), **flat,
    )  # fmt: skip


def _lists(layout, response_lengths, values_list, rewards_list, loss_masks, terminal_rewards, gamma, lambd, profile):
    """Per-sample lists (slime's and miles' layouts) as a :class:`TrainerBatch` (one copy)."""
    from gaecli.trainers.slime import _check_counts, packed_lists

    what = "get_advantages_and_returns_batch"
    lengths = [int(length) for length in response_lengths]
    _check_counts(what, len(lengths), values_list=values_list, rewards_list=rewards_list, loss_masks=loss_masks)
    if not lengths:
        raise InvalidOptionError(f"{layout}: the batch has no sample")
    values, rewards, mask, offsets, terminal = packed_lists(
        what, lengths, values_list, rewards_list, loss_masks, terminal_rewards
    )
    names = {"values": "values_list", "rewards": "rewards_list", "mask": "loss_masks"}
    return TrainerBatch(layout, values, rewards, mask, offsets, terminal, float(gamma), float(lambd), profile,
                        names)  # fmt: skip


def _verl(a, profile):
    names = {"values": "values", "rewards": "token_level_rewards", "mask": "response_mask"}
    return _padded("verl", a["values"], a["token_level_rewards"], a["response_mask"], a["gamma"], a["lam"], profile,
                   names)  # fmt: skip


def _openrlhf(a, profile):
    import torch

    mask = a["action_mask"]
    mask = torch.ones_like(a["rewards"], dtype=torch.bool) if mask is None else mask
    names = {"values": "values", "rewards": "rewards", "mask": "action_mask"}
    return _padded("openrlhf", a["values"], a["rewards"], mask, a["gamma"], a["lambd"], profile, names)


def _roll(a, profile):
    import torch

    mask = a["response_mask"]
    mask = torch.ones_like(a["values"], dtype=torch.bool) if mask is None else mask
    names = {"values": "values", "rewards": "token_level_rewards", "mask": "response_mask"}
    return _padded("roll", a["values"], a["token_level_rewards"], mask, a["gamma"], a["lambd"], profile, names)


def _skyrl(a, profile):
    mask = a["response_mask"] if a["loss_mask"] is None else a["loss_mask"]
    names = {"values": "values", "rewards": "token_level_rewards", "mask": "loss_mask"}
    return _padded("skyrl", a["values"], a["token_level_rewards"], mask, a["gamma"], a["lambd"], profile, names,
                   extent=a["response_mask"])  # fmt: skip


def _areal(a, profile):
    from gaecli.trainers.areal import _steps, _truncation

    check_batch("compute_token_level_gae", a["rewards"], a["values"], a["loss_mask"])
    values, steps, rewards = _steps(a["values"], a["loss_mask"], a["rewards"])
    truncation = _truncation(values, a["seq_no_eos_mask"]) if "truncated" in profile_variants(profile) else None
    names = {"values": "values", "rewards": "rewards", "mask": "loss_mask"}
    return _padded("areal", values, rewards, steps, a["discount"], a["gae_lambda"], profile, names,
                   truncation=truncation)  # fmt: skip


def _nemo_rl(a, profile):
    estimator, mask = a["self"], a["mask"]
    check_batch("compute_advantage", a["values"], mask)
    rewards = estimator._token_level_rewards(a["rewards"], mask, a["logprobs"], a["reference_logprobs"])
    names = {"values": "values", "rewards": "rewards", "mask": "mask"}
    return _padded("nemo-rl", a["values"], rewards, mask, estimator.gae_gamma, estimator._policy_lambda(mask),
                   profile, names, outcome=a["rewards"].to(a["values"].dtype))  # fmt: skip


def _slime(a, profile):
    return _lists("slime", a["response_lengths"], a["values_list"], a["rewards_list"], a["loss_masks"],
                  a["terminal_rewards"], a["gamma"], a["lambd"], profile)  # fmt: skip


def _miles(a, profile):
    return _lists("miles", a["response_lengths"], a["values_list"], a["rewards_list"], a["loss_masks"],
                  a["terminal_rewards"], a["gamma"], a["lambd"], profile)  # fmt: skip


@functools.cache
def _signature(layout: str) -> inspect.Signature:
    """The signature of a layout's drop-in, read once (reading it costs more than a check)."""
    return inspect.signature(_drop_in(layout))


@functools.cache
def _parameters(layout: str) -> tuple[tuple[str, ...], frozenset, dict]:
    """A layout's drop-in's parameters, read once from its signature: the names that may be
    given by position (in order), the names that may be given by keyword, and the defaults."""
    parameters = _signature(layout).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    by_keyword = frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    return positional, by_keyword, defaults


def _bound(layout: str, args: tuple, kwargs: dict) -> dict:
    """The drop-in's arguments by name, defaults applied: a plain call (its positional and named
    parameters, each once) matched directly, anything else through the signature's ``bind``
    (:class:`InvalidOptionError` with its message where the drop-in would not take them)."""
    positional, by_keyword, defaults = _parameters(layout)
    if len(args) <= len(positional) and by_keyword.issuperset(kwargs) and not kwargs.keys() & positional[: len(args)]:
        arguments = dict(defaults)
        arguments.update(zip(positional, args))
        arguments.update(kwargs)
        if len(arguments) == len(by_keyword):
            return arguments
    try:
        bound = _signature(layout).bind(*args, **kwargs)
    except TypeError as error:
        raise InvalidOptionError(f"layout={layout!r}: {error} (pass the arguments of its drop-in)") from None
    bound.apply_defaults()
    return bound.arguments


def _drop_in(layout: str) -> Callable:
    """The drop-in whose signature a layout's arguments follow."""
    from gaecli.trainers import areal, miles, nemo_rl, openrlhf, roll, skyrl, slime, verl

    return {
        "verl": verl.compute_gae_advantage_return,
        "openrlhf": openrlhf.get_advantages_and_returns,
        "roll": roll.compute_gae_advantage_return,
        "skyrl": skyrl.compute_gae_advantage_return,
        "areal": areal.compute_token_level_gae,
        "nemo-rl": nemo_rl.GeneralizedAdvantageEstimator.compute_advantage,
        "slime": slime.get_advantages_and_returns_batch,
        "miles": miles.get_advantages_and_returns_batch,
    }[layout]


LAYOUTS: dict[str, tuple[Callable, str]] = {
    "verl": (_verl, "verl"),
    "openrlhf": (_openrlhf, "openrlhf"),
    "roll": (_roll, "roll"),
    "skyrl": (_skyrl, "skyrl"),
    "areal": (_areal, "areal"),
    "nemo-rl": (_nemo_rl, "nemo-rl"),
    "slime": (_slime, "slime"),
    "miles": (_miles, MASKED),
}
"""layout: (its reader, the profile of the trainer's own GAE; miles' own is the contract)."""


def trainer_batch(layout: str, args: tuple, kwargs: dict, profile: Optional[str] = None) -> TrainerBatch:
    """The drop-in's arguments of ``layout`` (positional and keyword, as that drop-in takes
    them; ``semantics`` ignored) as a :class:`TrainerBatch`; ``profile`` None: the trainer's
    own (:data:`LAYOUTS`). :class:`InvalidOptionError` for an unknown layout or arguments the
    drop-in would not take, :class:`gaecli.GAEInputError` for tensors it would refuse."""
    from gaecli.trainers.padded import check_semantics

    if layout not in LAYOUTS:
        raise InvalidOptionError(f"layout={layout!r}: choose one of {', '.join(LAYOUTS)}")
    reader, own = LAYOUTS[layout]
    return reader(_bound(layout, args, kwargs), check_semantics(own if profile is None else profile))
