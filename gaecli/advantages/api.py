"""The Python API on torch tensors: masked GAE (the simple case), the baselines, and
:func:`compute_advantages`, which takes a spec. Every function checks its arguments
(:mod:`gaecli.advantages.inputs`) and calls the one dispatch
(:func:`gaecli.advantages.dispatch.compute`). What they compute: docs/semantics.md; how to
call them: docs/python-api.md.

Two forms of every function:
- packed: flat 1-D tensors ``values``, ``rewards``, ``loss_mask`` of N tokens plus
  ``offsets`` (B + 1 entries, as an Arrow list column's offsets) and ``terminal_rewards``
  (B entries); returns flat ``[N]`` tensors;
- list: one 1-D tensor per sample; on CPU tensors the kernel reads each sample where it
  lies (no concatenation) and writes one flat result, split into per-sample pieces; other
  input (CUDA, mixed dtypes, bad data) goes through a thin wrapper that concatenates, calls
  the packed form and splits the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional, Union

import torch

from gaecli.advantages.dispatch import (
    SCREENED_MASKS,
    SCREENED_VALUES,
    compute,
    compute_screened,
    compute_screened_samples,
    samples_kernel,
)
from gaecli.advantages.inputs import (
    as_sample_tensor,
    check_contents,
    check_packed,
    check_terminal,
    checked_outputs,
    checked_response_mask,
    flat_outputs,
    half_precision,
    narrowed,
    pack_lists,
    packed_response_mask,
    prepare_packed,
    sample_buffers,
    split,
    widened,
    written_into,
)
from gaecli.advantages.normalization import clipped
from gaecli.advantages.row_inputs import FlatLists, check_variant_inputs
from gaecli.advantages.spec import AdvantageSpec
from gaecli.advantages.whiten import whiten, whiten_by_group
from gaecli.errors import GAEInputError

Semantics = Literal["masked", "unmasked", "skip-masked", "zero-masked"]
TerminalRewards = Union[Sequence[float], torch.Tensor]


# ----------------------------------------------------------------------------- with a spec


def compute_advantages_packed(
    values: Optional[torch.Tensor],
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: TerminalRewards,
    *,
    spec: AdvantageSpec,
    kernel: str = "auto",
    row_inputs: Optional[Mapping[str, Any]] = None,
    validate: bool = True,
    turn_rewards=None,
    turn_offsets=None,
    truncated=None,
    bootstrap_values=None,
    turn_ids=None,
    response_mask=None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of ``spec`` on packed input: flat ``[N]`` ``values``,
    ``rewards``, ``loss_mask`` (bool, integer or float 0/1), ``offsets`` ``[B + 1]``,
    ``terminal_rewards`` ``[B]``. Returns flat ``[N]`` tensors in the values' dtype and
    device; the advantages whitened as ``spec.normalize`` says (returns never).

    ``row_inputs`` maps the name of each per-row input the spec reads
    (``spec.row_inputs``: the ``normalize_by`` key, the ``group_by`` and ``step_by`` ids of a
    critic-free estimator, the variants' inputs) to its values: ``[B]`` (a tensor, a numpy or
    Arrow array, or a sequence) for a scalar input, one list per sample for the turn rewards;
    a null group or step id is refused. A critic-free estimator (docs/estimators.md) reads no
    values: ``values`` may be None (the outputs then take the rewards' dtype), and its
    statistics cover this call's samples.

    The GAE variants (docs/variants.md): ``spec.timestep``, ``spec.lambd_critic`` and
    ``spec.lambd_alpha`` are fields of the spec; their per-row data come as keywords:
    ``turn_rewards`` (flat ``[U]``, one reward per turn, sample after sample) with
    ``turn_offsets`` ``[B + 1]``, ``truncated`` (bool ``[B]``) with ``bootstrap_values``
    ``[B]``, and with ``timestep="turn"`` ``turn_ids`` (flat ``[N]``, one integer per token,
    or one list per sample). A keyword given for an input the spec does not name makes the spec read it
    under the keyword's name. ``kernel``: ``auto`` (a capable kernel) or a name that
    supports the spec (else :class:`gaecli.KernelUnavailableError`). Raises
    :class:`gaecli.GAEInputError` naming the sample for bad data (a turn list whose length
    is not the sample's number of turns, a non-finite turn reward or bootstrap value of a
    truncated sample...), for a missing per-row input, and for complex values or rewards
    and ``meta`` tensors (naming the argument). float16 and bfloat16 input is computed in
    float32 and returned in its dtype.

    ``response_mask``: SkyRL's response mask, flat ``[N]`` (bool, integer or float 0/1; None:
    every token of each sample), holding every trainable token: the tokens the whitening counts
    under a rule whose ``tokens`` are ``response`` (``NORM_LIKE["skyrl"]``), and what the
    ``reinforce++`` profile ``skyrl`` reads (its recursion, statistics and writing,
    docs/estimators.md#trainer-profiles-of-the-estimators); checked whenever given (its length,
    its values, no trainable token outside it: :class:`gaecli.GAEInputError` naming the sample).

    ``out``: ``(advantages, returns)``, two distinct ``[N]`` tensors of the outputs' dtype on
    their device, written and returned (a trainer's reused buffers: on the host's masked fast
    path the kernel writes into them, elsewhere the result is copied in; after an error their
    contents are undefined).
    """
    out = checked_outputs(out, values if values is not None else rewards, rewards.numel())
    advantages, returns = _packed_outputs(
        values, rewards, loss_mask, offsets, terminal_rewards, spec, kernel, row_inputs, validate, turn_rewards,
        turn_offsets, truncated, bootstrap_values, turn_ids, response_mask, out,
    )  # fmt: skip
    return written_into(out, advantages, returns)


def _packed_outputs(
    values, rewards, loss_mask, offsets, terminal_rewards, spec, kernel, row_inputs, validate, turn_rewards,
    turn_offsets, truncated, bootstrap_values, turn_ids, response_mask, out,
):  # fmt: skip
    """:func:`compute_advantages_packed`'s computation; ``out`` is given to the kernel where it
    writes into buffers (the host's screened path), else left to the caller."""
    narrow = half_precision(values if values is not None else rewards)
    values, rewards = widened(values), widened(rewards)
    if not isinstance(spec, AdvantageSpec):
        raise GAEInputError(f"spec must be a gaecli.AdvantageSpec, got {type(spec).__name__}")
    if turn_offsets is not None and turn_rewards is None:
        raise GAEInputError("turn_offsets goes with turn_rewards (flat values, one per turn)")
    if turn_rewards is not None and turn_offsets is None:
        raise GAEInputError("turn_rewards of the packed form are flat: pass turn_offsets [B + 1] too")
    packed_turns = None if turn_rewards is None else FlatLists(turn_rewards, turn_offsets)
    spec, row_inputs = _with_variant_keywords(spec, row_inputs, packed_turns, truncated, bootstrap_values, turn_ids)
    missing = [needed.name for needed in spec.row_inputs if needed.name not in row_inputs]
    if missing:
        raise GAEInputError(f"spec reads per-row input {missing[0]!r}: pass row_inputs={{{missing[0]!r}: ...}}")
    if spec.critic_free:
        advantages, returns = _critic_free_packed(
            spec, values, rewards, loss_mask, offsets, terminal_rewards, kernel, row_inputs, validate, response_mask
        )
        return narrowed((clipped(advantages, spec.advantage_clip), returns), narrow)
    values, rewards, loss_mask, offsets, terminal = check_packed(values, rewards, loss_mask, offsets, terminal_rewards)
    spec, terminal = _over_episodes(spec, values, rewards, loss_mask, offsets, terminal, kernel, row_inputs, validate)
    kernel_out = out if out is not None and narrow is None and _kernel_writes(out, values) else None
    screened = compute_screened(spec, values, rewards, loss_mask, offsets, terminal, kernel=kernel, out=kernel_out)
    if screened is None:
        mask = check_contents(values, rewards, loss_mask, offsets, terminal, validate)
        if spec.variants:
            row_inputs = check_variant_inputs(spec, row_inputs, mask, offsets)
        advantages, returns = compute(
            spec, values, rewards, mask, offsets, terminal, kernel=kernel, row_inputs=row_inputs
        )
    else:
        # The kernel screened every token as it read it; only when it saw a bad one do the
        # checks run again, to name the first offending sample and token (or, with
        # validate=False, to let non-finite numbers through while mask values stay checked).
        advantages, returns, clean = screened
        if not clean:
            check_contents(values, rewards, loss_mask, offsets, terminal, validate)
        elif validate:
            check_terminal(terminal)
        mask = loss_mask if loss_mask.dtype == torch.bool or spec.normalize == "none" else loss_mask != 0
    advantages = _whitened(spec, advantages, mask, offsets, row_inputs, response_mask)
    return narrowed((clipped(advantages, spec.advantage_clip), returns), narrow)


def _kernel_writes(out, values) -> bool:
    """Whether the kernel may write into ``out``: contiguous, of the values' dtype and device."""
    return all(o.is_contiguous() and o.dtype == values.dtype and o.device == values.device for o in out)


def _whitened(spec, advantages, mask, offsets, row_inputs, response_mask):
    """The advantages whitened as ``spec.normalize`` says (``mask``: the loss mask, bool where
    they are whitened), over the checked ``response_mask`` where the rule counts its tokens; the
    response mask is checked whenever given."""
    if response_mask is not None:
        response_mask = checked_response_mask(response_mask, mask if mask.dtype == torch.bool else mask != 0, offsets)
    if spec.normalize == "all":
        return whiten(advantages, mask, spec.whitening_rule, response_mask=response_mask)
    if spec.normalize == "by":
        keys, rule = row_inputs[spec.normalize_by], spec.whitening_rule
        return whiten_by_group(advantages, mask, offsets, keys, rule, response_mask=response_mask)
    return advantages


def _over_episodes(spec, values, rewards, loss_mask, offsets, terminal, kernel, row_inputs, validate):
    """The spec each row is computed by and its terminal rewards: for masked GAE over episodes
    (docs/episodes.md) each row's own spec and, as its terminal reward, its turn reward and the
    carry from its episode's later rows (the rows' own masked GAE with their turn rewards gives
    their carry figures, the episodes settle them:
    :func:`gaecli.advantages.episodes.batch_turn_row_advantages`); any other spec as it is."""
    if not spec.over_episodes:
        return spec, terminal
    from gaecli.advantages.episodes import batch_turn_row_advantages, carry_figures, row_spec
    from gaecli.advantages.row_inputs import TURN_REWARDS, turn_row_inputs

    mask = check_contents(values, rewards, loss_mask, offsets, terminal, validate)
    rows = offsets.numel() - 1
    inputs = turn_row_inputs(spec, row_inputs, rows)
    own = torch.from_numpy(inputs[TURN_REWARDS]).to(device=terminal.device, dtype=terminal.dtype)
    advantages, _ = compute(row_spec(spec), values, rewards, mask, offsets, own, kernel=kernel)
    arrays = [tensor.detach().cpu().numpy() for tensor in (advantages, values, mask, offsets, terminal)]
    carries = carry_figures(*arrays[:4])
    ids = {"episode": inputs[spec.episode_by]}
    settled = batch_turn_row_advantages(spec, arrays[4], ids, inputs[spec.turn_by], inputs[TURN_REWARDS], carries)
    return row_spec(spec), torch.from_numpy(settled).to(device=terminal.device, dtype=terminal.dtype)


def _zeros_like_rewards(sample) -> torch.Tensor:
    tensor = as_sample_tensor(sample)
    dtype = tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()
    return torch.zeros(tensor.shape, dtype=dtype, device=tensor.device)


def _critic_free_packed(
    spec, values, rewards, loss_mask, offsets, terminal_rewards, kernel, row_inputs, validate, response_mask=None
):
    from gaecli.advantages.estimators import critic_free_batch, keys_array
    from gaecli.advantages.row_inputs import estimator_input_numbers, estimator_token_numbers, turn_row_inputs

    if spec.estimator == "opd":
        raise GAEInputError(
            "estimator 'opd' reads the student's and the teacher's log-probs, not rewards: "
            "use gaecli.distillation_advantages(log_probs, teacher_log_probs, loss_mask)"
        )

    if values is None:  # not read: zeros give the checks their shape, dtype and device
        if not isinstance(rewards, torch.Tensor):
            raise GAEInputError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
        values = _zeros_like_rewards(rewards)
    values, rewards, mask, offsets, terminal = prepare_packed(
        values, rewards, loss_mask, offsets, terminal_rewards, validate
    )
    rows = offsets.numel() - 1
    ids = {
        name: None if name is None else keys_array(row_inputs[name], rows, what)
        for name, what in ((spec.group_by, "group id"), (spec.step_by, "step id"))
    }
    inputs = estimator_input_numbers(spec, row_inputs, rows)
    if spec.over_episodes:
        inputs.update(turn_row_inputs(spec, row_inputs, rows))
    elif spec.turn_rewards is not None:  # a turn estimator's turn rewards, checked against the turns
        inputs[spec.turn_rewards] = check_variant_inputs(spec, row_inputs, mask, offsets)[spec.turn_rewards]
    arrays = [tensor.detach().cpu().numpy() for tensor in (rewards, mask, offsets, terminal)]
    inputs.update(estimator_token_numbers(spec, row_inputs, arrays[1], arrays[2]))
    response = checked_response_mask(response_mask, mask, offsets)
    advantages, returns = critic_free_batch(
        spec, *arrays, ids.get(spec.group_by), ids.get(spec.step_by), kernel=kernel, device=values.device,
        inputs=inputs, response=None if response is None else response.detach().cpu().numpy(),
    )  # fmt: skip
    same = returns is advantages
    advantages = torch.from_numpy(advantages).to(values.device)
    return advantages, advantages if same else torch.from_numpy(returns).to(values.device)


def compute_advantages(
    values: Optional[Sequence[torch.Tensor]],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    spec: AdvantageSpec,
    kernel: str = "auto",
    row_inputs: Optional[Mapping[str, Any]] = None,
    turn_rewards=None,
    truncated=None,
    bootstrap_values=None,
    turn_ids=None,
    response_mask=None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """List form of :func:`compute_advantages_packed`: one 1-D tensor of length R_i per
    sample for values, rewards and loss_mask, one terminal reward per sample (and one value
    per sample in each ``row_inputs`` entry); ``turn_rewards``: one list per sample (one
    reward per turn, empty for a sample without a trainable token); ``turn_ids``: one list
    per sample (one id per token); ``response_mask``: one list per sample (one 0/1 per token).
    Returns lists of ``[R_i]`` tensors. ``values`` may be None for a critic-free estimator."""
    spec, row_inputs = _with_variant_keywords(spec, row_inputs, turn_rewards, truncated, bootstrap_values, turn_ids)
    if (
        isinstance(spec, AdvantageSpec)
        and spec.estimator == "gae"
        and spec.semantics == "masked"
        and spec.normalize == "none"
        and not spec.variants
        and not spec.over_episodes
        and values is not None
        and response_mask is None
    ):
        in_place = _in_place(spec, values, rewards, loss_mask, terminal_rewards, kernel)
        if in_place is not None:
            return in_place
    if values is None:
        values = [_zeros_like_rewards(sample) for sample in rewards]
    packed = pack_lists(values, rewards, loss_mask, terminal_rewards)
    flat_values, flat_rewards, flat_mask, offsets, terminal, lengths = packed
    advantages, returns = compute_advantages_packed(
        flat_values, flat_rewards, flat_mask, offsets, terminal, spec=spec, kernel=kernel, row_inputs=row_inputs,
        response_mask=packed_response_mask(response_mask, lengths),
    )  # fmt: skip
    return split(advantages, lengths), split(returns, lengths)


def _in_place(spec, values, rewards, loss_mask, terminal_rewards, kernel):
    """The list form's fast path: a kernel that reads each sample where it lies and screens
    it in the same pass (no concatenation), writing into per-sample pieces of one flat result
    (taken before the kernel runs, so that nothing but the return follows it). None when the
    input does not fit that path or is not clean: the general path (pack, then the packed
    form) then computes it or names the first offending sample and token."""
    samples = samples_kernel(spec, kernel)
    if samples is None:
        return None
    buffers = sample_buffers(values, rewards, loss_mask, terminal_rewards, SCREENED_VALUES, SCREENED_MASKS)
    if buffers is None:
        return None
    advantages, returns = flat_outputs(int(buffers.offsets[-1]), buffers.dtype)
    pieces = split(advantages, buffers.lengths), split(returns, buffers.lengths)
    if not compute_screened_samples(spec, buffers, advantages, returns, samples=samples):
        return None
    return pieces


def _with_variant_keywords(spec, row_inputs, turn_rewards, truncated, bootstrap_values, turn_ids=None):
    """The spec and the row inputs with the variants' keyword data added: each given
    keyword's data under the name the spec reads it by, the spec made to read it under the
    keyword's name when it names none."""
    row_inputs = dict(row_inputs or {})
    given = {"turn_rewards": turn_rewards, "truncated": truncated, "bootstrap_values": bootstrap_values}
    given["turn_ids"] = turn_ids
    names = {}
    for role, data in given.items():
        if data is None:
            continue
        name = getattr(spec, role) or role
        names[role] = name
        row_inputs[name] = data
    if names and isinstance(spec, AdvantageSpec):
        spec = dataclasses.replace(spec, **names)
    return spec, row_inputs


# ----------------------------------------------------------------------------- masked GAE


def masked_gae_packed(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
    validate: bool = True,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE (the contract of docs/semantics.md) on packed ragged input.

    Shapes: ``values``, ``rewards``, ``loss_mask`` flat ``[N]`` (mask bool, integer or float
    0/1); ``offsets`` ``[B + 1]`` with ``offsets[0] = 0`` and ``offsets[-1] = N``;
    ``terminal_rewards`` ``[B]`` (ints or floats). Returns flat ``[N]`` ``(advantages,
    returns)`` in the values' dtype and device: 0 at masked positions, a fully masked sample
    all 0, an empty sample owns no position.

    ``validate=False`` skips the finiteness scan (for callers that checked already); mask
    values are always checked. Raises :class:`gaecli.GAEInputError` naming the sample.
    ``out``: two ``[N]`` tensors to write the outputs into, as :func:`compute_advantages_packed`.
    """
    return baseline_gae_packed(
        values,
        rewards,
        loss_mask,
        offsets,
        terminal_rewards,
        gamma=gamma,
        lambd=lambd,
        semantics="masked",
        kernel=kernel,
        validate=validate,
        out=out,
    )


def masked_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Masked GAE on a list of samples: one 1-D tensor of length R_i per sample for values,
    rewards and loss_mask, one terminal reward per sample. Returns ``(advantages, returns)``
    as lists of ``[R_i]`` tensors in the values' dtype and device (R = 0 → empty tensor,
    empty batch → empty lists); otherwise as :func:`masked_gae_packed`."""
    return baseline_gae(
        values, rewards, loss_mask, terminal_rewards, gamma=gamma, lambd=lambd, semantics="masked", kernel=kernel
    )


# ----------------------------------------------------------------------------- baselines


def baseline_gae_packed(
    values: torch.Tensor,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    offsets: torch.Tensor,
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    semantics: Semantics = "unmasked",
    kernel: str = "auto",
    validate: bool = True,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    truncated=None,
    bootstrap_values=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE under ``semantics``, packed form (shapes as :func:`masked_gae_packed`):
    ``masked`` (the contract) or one of the trainers' profiles (``verl``, ``areal``...; the
    aliases ``unmasked``, ``skip-masked``, ``zero-masked``), defined in
    docs/semantics.md#the-trainer-profiles. Returns what that semantics computes at every
    position (non-zero at masked positions where it makes them so). ``out``: as
    :func:`compute_advantages_packed`.

    ``truncated`` (bool ``[B]``) with ``bootstrap_values`` ``[B]``: the truncation bootstrap
    (docs/variants.md), taken by ``masked`` and ``areal`` (AReaL's no-EOS bootstrap: the value
    after a truncated sample's last trainable token is its bootstrap value); another profile
    refuses them (:class:`gaecli.InvalidOptionError`)."""
    spec = AdvantageSpec(gamma, lambd, semantics)
    return compute_advantages_packed(
        values, rewards, loss_mask, offsets, terminal_rewards, spec=spec, kernel=kernel, validate=validate, out=out,
        truncated=truncated, bootstrap_values=bootstrap_values,
    )  # fmt: skip


def baseline_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    semantics: Semantics = "unmasked",
    kernel: str = "auto",
    truncated=None,
    bootstrap_values=None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """List form of :func:`baseline_gae_packed` (arguments as :func:`masked_gae`; ``truncated``
    and ``bootstrap_values`` one per sample, as there)."""
    spec = AdvantageSpec(gamma, lambd, semantics)
    return compute_advantages(
        values, rewards, loss_mask, terminal_rewards, spec=spec, kernel=kernel, truncated=truncated,
        bootstrap_values=bootstrap_values,
    )  # fmt: skip


def unmasked_gae(
    values: Sequence[torch.Tensor],
    rewards: Sequence[torch.Tensor],
    loss_mask: Sequence[torch.Tensor],
    terminal_rewards: TerminalRewards,
    *,
    gamma: float,
    lambd: float,
    kernel: str = "auto",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The old behaviour: ``baseline_gae(..., semantics="unmasked")`` (docs/semantics.md)."""
    return baseline_gae(
        values, rewards, loss_mask, terminal_rewards, gamma=gamma, lambd=lambd, semantics="unmasked", kernel=kernel
    )
