"""The torch API's inputs beyond values, rewards, mask and terminal rewards, checked (naming
the sample at fault) and converted for the dispatch: the GAE variants' per-row and per-turn
inputs (:func:`check_variant_inputs`) and the estimators' own per-row and per-token numbers
(:func:`estimator_input_numbers`, :func:`estimator_token_numbers`)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from gaecli.advantages.inputs import widened
from gaecli.errors import GAEInputError


class FlatLists(NamedTuple):
    """One list per sample, packed: flat ``values`` and their ``offsets`` ``[B + 1]``."""

    values: object
    offsets: object


def _numbers(name: str, value, dtype=np.float64) -> np.ndarray:
    """A 1-D numpy array of ``value`` (tensor, array or sequence) in ``dtype``."""
    if isinstance(value, torch.Tensor):
        value = widened(value.detach().cpu()).numpy()
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise GAEInputError(f"{name} must be a 1-D sequence of numbers") from None
    if array.ndim != 1:
        raise GAEInputError(f"{name} must be 1-D, got shape {array.shape}")
    return array


def _flatten_lists(name: str, lists) -> tuple[np.ndarray, np.ndarray]:
    """Flat float64 values and int64 offsets ``[B + 1]`` of one sequence of numbers per sample."""
    pieces = []
    for index, item in enumerate(lists):
        if item is None:
            raise GAEInputError(f"sample {index}: {name} is None (give a list, empty for a fully masked sample)")
        pieces.append(_numbers(f"sample {index}: {name}", item))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([piece.size for piece in pieces], out=offsets[1:])
    flat = np.concatenate(pieces) if pieces else np.zeros(0)
    return flat, offsets


def check_variant_inputs(spec, row_inputs: dict, trainable: torch.Tensor, offsets: torch.Tensor) -> dict:
    """The per-row inputs of the GAE variants that ``spec`` reads, checked against the batch
    (bool ``trainable`` ``[N]``, ``offsets`` ``[B + 1]``) and converted for the dispatch
    (:func:`gaecli.advantages.dispatch.compute`): name → numpy ``[B]``, or for the turn
    rewards ``(flat [U], turn offsets [B + 1])``, for the turn ids int64 ``[N]``. A
    turn-rewards input is a sequence of one list per sample or a :class:`FlatLists`; turn
    ids one list per sample or flat ``[N]`` (a tensor or numpy array). Raises
    :class:`GAEInputError` naming the sample: a turn list whose length is not the sample's
    number of turns, a non-finite turn reward, a truncated flag other than 0/1, a non-finite
    bootstrap value on a truncated sample, a length other than B, turn ids not one integer
    per token or, at a trainable token, negative or decreasing."""
    batch = offsets.numel() - 1
    mask = bounds = None
    if spec.turn_ids is not None or spec.turn_rewards is not None:  # the turns read the mask on the host
        mask, bounds = trainable.detach().cpu().numpy(), offsets.detach().cpu().numpy()
    converted = dict(row_inputs)
    flags = ids = None
    if spec.turn_ids is not None:
        ids = converted[spec.turn_ids] = _turn_ids_input(spec.turn_ids, row_inputs[spec.turn_ids], mask, bounds)
    for needed in spec.row_inputs:
        value = row_inputs[needed.name]
        if needed.role == "turn_rewards":
            converted[needed.name] = _turn_rewards_input(needed.name, value, mask, bounds, ids)
        elif needed.role in ("truncated", "bootstrap_values"):
            array = _row_numbers(needed.name, value, trainable.device)
            if array.shape[0] != batch:
                raise GAEInputError(f"{needed.name} must hold one value per sample ({batch}), got {array.shape[0]}")
            if needed.role == "truncated":
                array = flags = _truncated_flags(needed.name, array)
            converted[needed.name] = array
    if flags is not None:
        from gaecli.advantages.faults import truncated_without_bootstrap

        boots = converted[spec.bootstrap_values]
        bad = truncated_without_bootstrap(flags, boots)
        if bad.any():  # on a device, the one scalar read back
            sample = _first(bad)
            raise GAEInputError(
                f"sample {sample}: truncated, but {spec.bootstrap_values} is {boots[sample].item()} (must be finite)"
            )
    return converted


def _row_numbers(name: str, value, device):
    """A per-row input as numbers: on an accelerator, a tensor there stays there (floating, 1-D:
    the device kernels read it, no copy to the host); else a float64 numpy array."""
    if isinstance(value, torch.Tensor) and value.device.type != "cpu" and value.device == device:
        if value.dim() != 1 or value.is_complex():
            raise GAEInputError(f"{name} must be a 1-D sequence of real numbers, got shape {tuple(value.shape)}")
        return widened(value.detach())
    return _numbers(name, value)


def _first(flags) -> int:
    """The first row whose flag is set (numpy or a tensor: read back)."""
    return int(flags.nonzero()[0][0]) if isinstance(flags, np.ndarray) else int(flags.nonzero()[0, 0])


def estimator_input_numbers(spec, row_inputs, rows: int) -> dict[str, np.ndarray]:
    """The estimator's own per-row inputs ``spec`` reads (remax's baseline rewards, gdpo's
    reward components) taken from ``row_inputs`` by name: float64 ``[B]`` each. Raises
    :class:`GAEInputError` naming the input and the sample: a length other than B, a value
    that is not a finite number."""
    numbers = {}
    for needed in spec.row_inputs:
        if needed.role not in ("baseline-reward", "reward-component"):
            continue
        array = _numbers(needed.name, row_inputs[needed.name])
        if array.size != rows:
            raise GAEInputError(f"{needed.name} must hold one value per sample ({rows}), got {array.size}")
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            raise GAEInputError(f"sample {int(bad[0])}: {needed.name} is {array[bad[0]]} (must be finite)")
        numbers[needed.name] = array
    return numbers


def estimator_token_numbers(spec, row_inputs, trainable: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """The estimator's own per-token inputs ``spec`` reads (optimal-token-baseline's log-probs
    and Σπ²) taken from ``row_inputs`` by name: float64 ``[N]`` each, from a flat 1-D tensor,
    array or sequence of ``N`` numbers, or from one sequence per sample (bool ``trainable``
    ``[N]``, ``offsets`` ``[B + 1]``). Raises :class:`GAEInputError` naming the input, the
    sample and the token: a length other than the sample's, a value that is not a finite number
    at a trainable token (masked tokens are not read)."""
    numbers = {}
    for needed in spec.row_inputs:
        if needed.role not in ("log-probs", "sum-pi-squared"):
            continue
        flat = _token_numbers(needed.name, row_inputs[needed.name], offsets)
        bad = np.flatnonzero(~np.isfinite(flat) & trainable)
        if bad.size:
            sample = int(np.searchsorted(offsets, bad[0], side="right") - 1)
            token = int(bad[0] - offsets[sample])
            raise GAEInputError(
                f"sample {sample}: {needed.name} is {flat[bad[0]]} at token {token} "
                "(must be finite at trainable tokens)"
            )
        numbers[needed.name] = flat
    return numbers


def _token_numbers(name: str, value, offsets: np.ndarray) -> np.ndarray:
    """A per-token input as flat float64 ``[N]``: a flat sequence, or one sequence per sample
    whose lengths must be the samples'."""
    per_sample = isinstance(value, (list, tuple)) and len(value) > 0 and np.ndim(value[0]) != 0
    if not per_sample:
        flat = _numbers(name, value)
        if flat.size != offsets[-1]:
            raise GAEInputError(f"{name} must hold one value per token ({int(offsets[-1])}), got {flat.size}")
        return flat
    if len(value) != offsets.size - 1:
        raise GAEInputError(f"{name} has {len(value)} sequences, there are {offsets.size - 1} samples")
    flat, given = _flatten_lists(name, value)
    wrong = np.flatnonzero(np.diff(given) != np.diff(offsets))
    if wrong.size:
        sample = int(wrong[0])
        raise GAEInputError(
            f"sample {sample}: {name} has {int(given[sample + 1] - given[sample])} values, "
            f"the sample has {int(offsets[sample + 1] - offsets[sample])} tokens"
        )
    return flat


def _truncated_flags(name: str, array):
    """Truncated flags ``[B]`` (numpy, or a tensor where it is) as bool; a value other than 0/1
    names its sample (:func:`gaecli.advantages.faults.not_flags`)."""
    from gaecli.advantages.faults import not_flags

    bad = not_flags(array)
    if bad.any():  # on a device, the one scalar read back
        sample = _first(bad)
        raise GAEInputError(f"sample {sample}: {name} is {array[sample].item()!r}, not a flag (0/1, bool)")
    return array != 0


def _turn_offsets(name: str, value) -> tuple[np.ndarray, np.ndarray]:
    """Flat turn rewards and their offsets from a :class:`FlatLists` or one list per sample."""
    if not isinstance(value, FlatLists):
        return _flatten_lists(name, value)
    return _numbers(name, value[0]), _numbers("turn_offsets", value[1], np.int64)


def _turn_ids_input(name: str, value, mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Turn ids checked against the batch (bool ``mask`` ``[N]``, ``bounds`` ``[B + 1]``):
    int64 ``[N]``, from one list per sample or flat ``[N]``."""
    from gaecli.advantages.faults import rows_of_positions, turn_id_faults

    lengths = np.diff(bounds)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        flat = _numbers(name, value)
        if flat.size != bounds[-1]:
            raise GAEInputError(f"{name} must hold one id per token ({bounds[-1]}), got {flat.size}")
    else:
        if len(value) != lengths.size:
            raise GAEInputError(f"{name} has {len(value)} lists, there are {lengths.size} samples")
        flat, id_offsets = _flatten_lists(name, value)
        wrong = np.flatnonzero(np.diff(id_offsets) != lengths)
        if wrong.size:
            sample = int(wrong[0])
            given = int(id_offsets[sample + 1] - id_offsets[sample])
            raise GAEInputError(f"sample {sample}: {name} has {given} ids, the sample has {lengths[sample]} tokens")
    bad = np.flatnonzero(~np.isfinite(flat) | (flat != np.round(flat)))
    if bad.size:
        sample = int(rows_of_positions(bounds, bad[:1])[0])
        raise GAEInputError(
            f"sample {sample}: {name} is {flat[bad[0]]} at token {bad[0] - bounds[sample]} (must be an integer)"
        )
    ids = flat.astype(np.int64)
    faults = turn_id_faults(ids, mask, bounds)
    if faults is not None:
        sample, position = int(faults[0][0]), int(faults[1][0])
        raise GAEInputError(
            f"sample {sample}: {name} is {ids[position]} at trainable token {position - bounds[sample]} "
            f"(turn ids must be >= 0 and non-decreasing at trainable tokens)"
        )
    return ids


def _turn_rewards_input(
    name: str, value, mask: np.ndarray, bounds: np.ndarray, ids: Optional[np.ndarray] = None
) -> tuple[np.ndarray, np.ndarray]:
    """A turn-rewards input checked against the batch's turns (bool ``mask`` ``[N]``,
    ``bounds`` ``[B + 1]``; the turns of ``ids`` ``[N]`` when given): ``(flat [U], turn
    offsets [B + 1])``."""
    from gaecli.advantages.faults import non_finite, turn_counts

    batch = bounds.size - 1
    if not isinstance(value, FlatLists) and len(value) != batch:
        raise GAEInputError(f"{name} has {len(value)} lists, there are {batch} samples")
    flat, turn_offsets = _turn_offsets(name, value)
    if isinstance(value, FlatLists):
        if turn_offsets.size != batch + 1 or turn_offsets[0] != 0 or turn_offsets[-1] != flat.size:
            raise GAEInputError(
                f"turn_offsets must hold B + 1 = {batch + 1} entries from 0 to len(turn_rewards) = "
                f"{flat.size}, got {turn_offsets.size} entries"
            )
        if (np.diff(turn_offsets) < 0).any():
            raise GAEInputError(f"sample {int(np.flatnonzero(np.diff(turn_offsets) < 0)[0])}: turn_offsets decrease")
    turns = turn_counts(mask, bounds, ids)
    given = np.diff(turn_offsets)
    if (given != turns).any():
        sample = int(np.flatnonzero(given != turns)[0])
        raise GAEInputError(f"sample {sample}: {name} has {given[sample]} values, the sample has {turns[sample]} turns")
    faults = non_finite(flat, turn_offsets)
    if faults is not None:
        sample, position = int(faults[0][0]), int(faults[1][0])  # the lowest row's first: the first of all
        raise GAEInputError(
            f"sample {sample}: {name} is {flat[position]} at turn {position - turn_offsets[sample]} (must be finite)"
        )
    return flat, turn_offsets


def turn_row_inputs(spec, row_inputs, rows: int) -> dict:
    """A turn-row estimator's own per-row inputs (docs/episodes.md) taken from ``row_inputs``
    by name: the episode and (gigpo's) state ids as Arrow arrays, the turn indices int64 and
    the turns' rewards float64 (under :data:`TURN_REWARDS`; zeros where the spec names none),
    ``[B]`` each. Raises :class:`GAEInputError` naming the input
    and the sample: a length other than B, a null id, a turn index that is not an integer, a
    turn reward that is not a finite number."""
    from gaecli.advantages.estimators import keys_array

    converted = {spec.episode_by: keys_array(row_inputs[spec.episode_by], rows, f"{spec.episode_by} (the episode id)")}
    if spec.state_by is not None:
        converted[spec.state_by] = keys_array(row_inputs[spec.state_by], rows, f"{spec.state_by} (the state id)")
    turns = _numbers(spec.turn_by, row_inputs[spec.turn_by])
    rewards = np.zeros(rows)
    if spec.turn_rewards is not None:
        rewards = _numbers(spec.turn_rewards, row_inputs[spec.turn_rewards])
    for name, array in ((spec.turn_by, turns), (spec.turn_rewards, rewards)):
        if array.size != rows:
            raise GAEInputError(f"{name} must hold one value per sample ({rows}), got {array.size}")
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            raise GAEInputError(f"sample {int(bad[0])}: {name} is {array[bad[0]]} (must be finite)")
    fractional = np.flatnonzero(turns != np.round(turns))
    if fractional.size:
        sample = int(fractional[0])
        raise GAEInputError(f"sample {sample}: {spec.turn_by} is {turns[sample]} (a turn index is an integer)")
    converted[spec.turn_by] = turns.astype(np.int64)
    converted[TURN_REWARDS] = rewards
    return converted


TURN_REWARDS = "turn rewards"
"""The key of the turn rows' rewards among :func:`turn_row_inputs` (zeros where the spec names none)."""
