"""Compiled CPU kernel (numba): masked GAE straight on each sample's buffers where they lie,
one backward pass per sample, samples spread over the cores. The CPU fast path.

The kernel takes the address of each sample's values, rewards, mask, advantages and returns:
a flat buffer and its offsets (:func:`native_gae_flat`) and a list of per-sample tensors (the
list API, :func:`native_gae_samples`) are the same input to it, and neither is copied first.

Every sample is computed alone, in float64 whatever the input dtype, with the operations of
:func:`gaecli.advantages.kernels.reference.reference_gae` in the same order (``δ = (r + z) + γ·V' − V``,
``A = δ + γλ·A'``, ``z`` on the last trainable token and ``+ 0.0`` elsewhere), and rounded
once on output. The result is therefore bitwise batch invariant, and bitwise equal to the
reference for float64 inputs (for float32 inputs, to the reference's float64 result rounded
to float32).

Speed. A sample's backward pass is a chain of dependent float64 multiply-adds; a core that
runs one sample at a time waits on that chain. Each thread therefore runs ``LANES`` samples
side by side ("lanes") in one loop, and the core overlaps their independent chains. Samples
are split into one token-balanced group per thread (a batch under ``SERIAL_TOKENS`` tokens is
one group, on the calling thread); inside a group the longest samples go
first and a lane takes the next sample as soon as its own ends, so only the last few
samples of a group run alone; samples under ``SHORT_SAMPLE`` tokens run one by one after
the lanes (lanes do not pay for themselves over a few dozen tokens). Which lane, group or
thread computes a sample changes nothing in its arithmetic.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from gaecli.advantages.kernels.compiled import AVAILABLE, numba, plan_groups, thread_count
from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.advantages.kernels.native_variants import native_variant_flat
from gaecli.advantages.layout import read_tail
from gaecli.advantages.whiten import row_moments

if AVAILABLE:
    from numba.core import types
    from numba.extending import intrinsic

LANES = 4  # samples side by side per thread (_run_group's loop is written out for four)
# Lanes whose positions are a multiple of 4 KiB apart make the core's loads wait on the
# other lanes' stores ("4K aliasing": samples of equal power-of-two length ran 5x slower).
# Before the lanes step together, a lane closer than this many bytes (modulo 4 KiB) to a
# lower lane runs alone for as many bytes.
PAGE_BYTES = 4096
LANE_SEPARATION_BYTES = 512
# The rows of the kernel's ``addresses`` [5, B]: where each sample's buffers start.
VALUES, REWARDS, MASK, ADVANTAGES, RETURNS = range(5)
# Below this many tokens a batch runs on the calling thread: starting the thread pool's
# parallel region costs more than it saves (tens of microseconds idle, milliseconds on a
# busy machine or with a worker process per core), and many-short-rows files are made of
# such batches.
SERIAL_TOKENS = 1 << 15
# Samples shorter than this many tokens run one by one, not in lanes: a lane's setup (its
# turn in the queue, the separation checks, its buffers) costs more than the overlap saves
# over a few dozen tokens (many-short-rows files ran 4x slower in lanes).
SHORT_SAMPLE = 256


def _step(values, rewards, loss_mask, advantages, returns, t, gamma, decay, carry, next_value, terminal, screen):
    """Position ``t`` of a sample's backward pass; returns the new (carry, next value,
    terminal reward still to place, screen).

    ``screen`` is the input screen: the float64 sum of every value and reward read, finite
    while each is finite (a NaN or ±Inf makes it NaN or ±Inf, and stays so) and every mask
    value is 0 or 1 (the mask may be bool, integer or float: trainable is ``mask != 0``),
    NaN otherwise. One add a token (a product with 0 cost two more). A sum that overflows
    (float64 inputs near 1e308) is a false alarm: the caller's checks then run, find nothing
    and keep the result.
    """
    index = np.uint64(t)  # unsigned: no negative-index test on every load and store
    value = np.float64(values[index])
    reward = np.float64(rewards[index])
    mask = loss_mask[index]
    screen += value + reward
    if mask != 0 and mask != 1:
        screen = np.nan
    delta = reward + terminal + gamma * next_value - value
    updated = delta + decay * carry
    if mask != 0:
        advantages[index] = updated
        returns[index] = updated + value
        return updated, value, 0.0, screen
    advantages[index] = 0.0
    returns[index] = 0.0
    return carry, next_value, terminal, screen


def _run_alone(
    values, rewards, loss_mask, advantages, returns, gamma, decay, stop, position, carry, next_value, terminal, screen
):
    """Run one sample alone from ``position - 1`` down to ``stop``; returns the new state."""
    for t in range(position - 1, stop - 1, -1):
        carry, next_value, terminal, screen = _step(
            values, rewards, loss_mask, advantages, returns, t, gamma, decay, carry, next_value, terminal, screen
        )
    return carry, next_value, terminal, screen


def _pointer(typingctx, address, like):
    """The int64 ``address`` as a pointer to ``like``'s dtype (an intrinsic: numba has no cast
    from an integer to a pointer)."""
    signature = types.CPointer(like.dtype)(address, like)

    def codegen(context, builder, signature, arguments):
        return builder.inttoptr(arguments[0], context.get_value_type(signature.return_type))

    return signature, codegen


def _buffers(layout, sample):
    """Sample ``sample``'s five buffers as arrays over its ``lengths[sample]`` tokens, read
    and written in place: values, rewards, mask, advantages, returns (rows of ``addresses``).
    ``layout``: ``(addresses, lengths, value_kind, mask_kind, moments, last, last_reward, tail)``, see
    :func:`_masked_gae_batch`."""
    addresses, lengths, value_kind, mask_kind = layout[0], layout[1], layout[2], layout[3]
    length = lengths[sample]
    return (
        numba.carray(_pointer(addresses[VALUES, sample], value_kind), length),
        numba.carray(_pointer(addresses[REWARDS, sample], value_kind), length),
        numba.carray(_pointer(addresses[MASK, sample], mask_kind), length),
        numba.carray(_pointer(addresses[ADVANTAGES, sample], value_kind), length),
        numba.carray(_pointer(addresses[RETURNS, sample], value_kind), length),
    )


def _too_close(addresses, lane_sample, position, lane, itemsize):
    """Whether lane ``lane``'s next store lies within LANE_SEPARATION_BYTES of a lower lane's,
    modulo 4 KiB."""
    place = addresses[ADVANTAGES, lane_sample[lane]] + position[lane] * itemsize
    for other in range(lane):
        apart = (place - addresses[ADVANTAGES, lane_sample[other]] - position[other] * itemsize) % PAGE_BYTES
        if apart < LANE_SEPARATION_BYTES or apart > PAGE_BYTES - LANE_SEPARATION_BYTES:
            return True
    return False


def _run_group(layout, terminal_rewards, gamma, decay, order, group_bounds, group):
    """Every sample of group ``group`` (``order[group_bounds[group]:group_bounds[group + 1]]``,
    sample indices, longest first): those of SHORT_SAMPLE tokens or more four at a time
    (:func:`_run_lanes`), the shorter ones after them one by one. Returns the group's input
    screen (finite: every input read was valid; see :func:`_step`)."""
    lengths = layout[1]
    members = order[group_bounds[group] : group_bounds[group + 1]]
    queued = members.shape[0]
    laned = queued
    for index in range(queued):
        if lengths[members[index]] < SHORT_SAMPLE:
            laned = index
            break
    total = _run_lanes(layout, terminal_rewards, gamma, decay, members[:laned])
    for index in range(laned, queued):
        sample = members[index]
        if lengths[sample] == 0:
            continue
        v, r, m, a, g = _buffers(layout, sample)
        terminal, begin, skipped = _begin(layout, terminal_rewards, sample)
        total += skipped + _run_alone(v, r, m, a, g, gamma, decay, 0, begin, 0.0, 0.0, terminal, 0.0)[3]
        _record_moments(layout, sample)
    return total


def _begin(layout, terminal_rewards, sample):
    """Where sample ``sample``'s backward pass begins: ``(terminal reward, position, screen)``,
    the pass running from ``position - 1`` down with that terminal reward, ``screen`` the input
    screen (see :func:`_step`) of the tokens it does not run. Where the caller asked for the
    tails (``layout``'s ``last``, ``last_reward`` and ``tail`` ``[B]``, else empty), the
    sample's tail is read first (:func:`gaecli.advantages.layout.read_tail`, the indices in the
    sample's own tokens): the terminal reward is the sum of its rewards (the outcome of a padded
    row), and the tail — the masked tokens after the last trainable one, a padded row's padding
    among them — takes no step of the recursion: its outputs are 0 and its values are screened
    in one pass (:func:`_quiet_tail`; its mask entries are 0 and its rewards are in the sum, so
    the screen adds the sum). Else the terminal reward as given and the whole sample."""
    last, last_reward, tail = layout[5], layout[6], layout[7]
    length = layout[1][sample]
    if last.shape[0] == 0:
        return np.float64(terminal_rewards[sample]), length, 0.0
    values, rewards, mask, advantages, returns = _buffers(layout, sample)
    read_tail(mask, rewards, 0, length, last, last_reward, tail, sample)
    begin = last[sample] + 1
    outcome = np.float64(tail[sample])
    return outcome, begin, outcome + _quiet_tail(values, advantages, returns, begin, length)


def _quiet_tail(values, advantages, returns, begin, end):
    """Outputs 0 on tokens ``begin .. end - 1`` and the screen of their values: 0.0 while every
    one is finite, else NaN (one pass without a branch, which the compiler vectorises)."""
    faults = np.int32(0)
    for t in range(np.uint64(begin), np.uint64(end)):
        value = values[t]
        faults |= np.int32(value - value != 0)  # NaN for ±Inf and NaN
        advantages[t] = 0.0
        returns[t] = 0.0
    return np.nan if faults else 0.0


def _record_moments(layout, sample):
    """Where the caller asked for them (``layout``'s ``moments`` ``[3, B]``, else ``[3, 0]``):
    the finished sample's count, sum and squares of its trainable advantages
    (:func:`gaecli.advantages.whiten.row_moments`), read back while they are in the core's cache."""
    moments = layout[4]
    if sample < 0 or moments.shape[1] == 0:
        return
    _, _, mask, advantages, _ = _buffers(layout, sample)
    count, total, square = row_moments(advantages, mask)
    moments[0, sample], moments[1, sample], moments[2, sample] = count, total, square


def _fill_lanes(layout, order, taken, terminal_rewards, lane_sample, position, state):
    """Give every finished lane the next non-empty sample of the queue ``order`` (of which
    ``taken`` are taken), the finished one's moments recorded; returns the new ``taken``."""
    carry, next_value, terminal, screen = state
    for lane in range(LANES):
        while position[lane] == 0 and taken < order.shape[0]:
            _record_moments(layout, lane_sample[lane])
            sample = order[taken]
            taken += 1
            lane_sample[lane] = sample
            carry[lane] = 0.0
            next_value[lane] = 0.0
            terminal[lane], position[lane], skipped = _begin(layout, terminal_rewards, sample)
            screen[lane] += skipped
    return taken


def _run_lane_alone(layout, gamma, decay, lane, stop, lane_sample, position, state):
    """Run lane ``lane``'s sample alone from its position down to ``stop``, updating the lane
    state (``state``: the arrays carry, next value, terminal, screen)."""
    carry, next_value, terminal, screen = state
    v, r, m, a, g = _buffers(layout, lane_sample[lane])
    carry[lane], next_value[lane], terminal[lane], screen[lane] = _run_alone(
        v, r, m, a, g, gamma, decay, stop, position[lane], carry[lane], next_value[lane], terminal[lane], screen[lane]
    )
    position[lane] = stop


def _separate_lanes(layout, gamma, decay, lane_sample, position, state):
    """Keep the lanes apart modulo 4 KiB (see LANE_SEPARATION_BYTES): a lane too close to a
    lower one runs alone for that many bytes, a few times at most."""
    itemsize = layout[2].itemsize
    for lane in range(1, LANES):
        for _ in range(PAGE_BYTES // LANE_SEPARATION_BYTES):
            if position[lane] == 0 or not _too_close(layout[0], lane_sample, position, lane, itemsize):
                break
            ahead = max(position[lane] - LANE_SEPARATION_BYTES // itemsize, 0)
            _run_lane_alone(layout, gamma, decay, lane, ahead, lane_sample, position, state)


def _run_lanes(layout, terminal_rewards, gamma, decay, order):
    """Every sample of ``order`` (sample indices, longest first), four at a time. Returns
    their input screen (finite: every input read was valid; see :func:`_step`).

    Lane state: the sample ``lane_sample`` whose tokens ``0 .. position - 1`` are still to
    run (none left: the lane is free); ``carry``, ``next_value`` and ``terminal`` are the
    recurrence's state, ``screen`` the lane's screen.
    """
    taken = 0
    lane_sample = np.full(LANES, -1, dtype=np.int64)  # -1: no sample yet
    position = np.zeros(LANES, dtype=np.int64)
    carry = np.zeros(LANES, dtype=np.float64)
    next_value = np.zeros(LANES, dtype=np.float64)
    terminal = np.zeros(LANES, dtype=np.float64)
    screen = np.zeros(LANES, dtype=np.float64)
    state = (carry, next_value, terminal, screen)
    while True:
        taken = _fill_lanes(layout, order, taken, terminal_rewards, lane_sample, position, state)
        if position.min() == 0:
            break
        _separate_lanes(layout, gamma, decay, lane_sample, position, state)
        steps = min(position[0], position[1], position[2], position[3])
        v0, r0, m0, a0, g0 = _buffers(layout, lane_sample[0])
        v1, r1, m1, a1, g1 = _buffers(layout, lane_sample[1])
        v2, r2, m2, a2, g2 = _buffers(layout, lane_sample[2])
        v3, r3, m3, a3, g3 = _buffers(layout, lane_sample[3])
        t0, t1, t2, t3 = position[0], position[1], position[2], position[3]
        c0, c1, c2, c3 = carry[0], carry[1], carry[2], carry[3]
        n0, n1, n2, n3 = next_value[0], next_value[1], next_value[2], next_value[3]
        z0, z1, z2, z3 = terminal[0], terminal[1], terminal[2], terminal[3]
        s0, s1, s2, s3 = screen[0], screen[1], screen[2], screen[3]
        for _ in range(steps):
            t0 -= 1
            t1 -= 1
            t2 -= 1
            t3 -= 1
            c0, n0, z0, s0 = _step(v0, r0, m0, a0, g0, t0, gamma, decay, c0, n0, z0, s0)
            c1, n1, z1, s1 = _step(v1, r1, m1, a1, g1, t1, gamma, decay, c1, n1, z1, s1)
            c2, n2, z2, s2 = _step(v2, r2, m2, a2, g2, t2, gamma, decay, c2, n2, z2, s2)
            c3, n3, z3, s3 = _step(v3, r3, m3, a3, g3, t3, gamma, decay, c3, n3, z3, s3)
        position[0], position[1], position[2], position[3] = t0, t1, t2, t3
        carry[0], carry[1], carry[2], carry[3] = c0, c1, c2, c3
        next_value[0], next_value[1], next_value[2], next_value[3] = n0, n1, n2, n3
        terminal[0], terminal[1], terminal[2], terminal[3] = z0, z1, z2, z3
        screen[0], screen[1], screen[2], screen[3] = s0, s1, s2, s3
    # The queue is empty: finish the samples still in flight one by one.
    total = 0.0
    for lane in range(LANES):
        if position[lane] > 0:
            _run_lane_alone(layout, gamma, decay, lane, 0, lane_sample, position, state)
        _record_moments(layout, lane_sample[lane])
        total += screen[lane]
    return total


def _flat_addresses(values, rewards, loss_mask, advantages, returns, offsets):
    """int64 ``[5, B]``: the address of each sample's first value, reward, mask entry, advantage
    and return in the five flat buffers (rows VALUES, REWARDS, MASK, ADVANTAGES, RETURNS), as
    :func:`native_gae_samples` takes them (one compiled call: a trainer pays it on every call)."""
    samples = offsets.shape[0] - 1
    addresses = np.empty((5, samples), dtype=np.int64)
    buffers = (
        (np.int64(values.ctypes.data), np.int64(values.itemsize)),
        (np.int64(rewards.ctypes.data), np.int64(rewards.itemsize)),
        (np.int64(loss_mask.ctypes.data), np.int64(loss_mask.itemsize)),
        (np.int64(advantages.ctypes.data), np.int64(advantages.itemsize)),
        (np.int64(returns.ctypes.data), np.int64(returns.itemsize)),
    )
    for row in range(5):
        base, size = buffers[row]
        for sample in range(samples):
            addresses[row, sample] = base + offsets[sample] * size
    return addresses


def _masked_gae_batch(layout, terminal_rewards, gamma, lambd, order, group_bounds, screens):
    """Fill every sample's advantages and returns, and ``screens[g]`` with group ``g``'s input
    screen; group ``g`` is the samples ``order[group_bounds[g]:group_bounds[g + 1]]``, and
    the groups run in parallel. ``layout``: ``(addresses, lengths, value_kind, mask_kind,
    moments, last, last_reward, tail)``: int64 ``[5, B]``, where each sample's buffers start
    (rows VALUES, REWARDS, MASK, ADVANTAGES, RETURNS), int64 ``[B]`` their lengths, empty
    arrays of the values' (rewards', outputs') and the mask's dtypes, float64 ``[3, B]`` to fill
    with each sample's moments (:func:`_record_moments`; ``[3, 0]``: none wanted), and the
    tails to read (:func:`_begin`; empty arrays: none, the terminal rewards as given)."""
    decay = gamma * lambd
    for group in numba.prange(group_bounds.shape[0] - 1):
        screens[group] = _run_group(layout, terminal_rewards, gamma, decay, order, group_bounds, group)


def _masked_gae_serial(layout, terminal_rewards, gamma, lambd, order, group_bounds, screens):
    """:func:`_masked_gae_batch` on the calling thread. A function of its own, not the same
    function compiled without ``parallel``: numba's cache keys compiled code by function and
    signature, so the two would load each other's machine code."""
    decay = gamma * lambd
    for group in range(group_bounds.shape[0] - 1):
        screens[group] = _run_group(layout, terminal_rewards, gamma, decay, order, group_bounds, group)


if AVAILABLE:
    _step = numba.njit(nogil=True)(_step)
    _run_alone = numba.njit(nogil=True)(_run_alone)
    _pointer = intrinsic(_pointer)
    _buffers = numba.njit(nogil=True)(_buffers)
    _too_close = numba.njit(nogil=True)(_too_close)
    _fill_lanes = numba.njit(nogil=True)(_fill_lanes)
    _record_moments = numba.njit(nogil=True)(_record_moments)
    _begin = numba.njit(nogil=True)(_begin)
    _quiet_tail = numba.njit(nogil=True)(_quiet_tail)
    _run_lane_alone = numba.njit(nogil=True)(_run_lane_alone)
    _separate_lanes = numba.njit(nogil=True)(_separate_lanes)
    _run_lanes = numba.njit(nogil=True)(_run_lanes)
    _run_group = numba.njit(nogil=True)(_run_group)
    _flat_addresses = numba.njit(cache=True, nogil=True)(_flat_addresses)
    _compiled = numba.njit(parallel=True, cache=True, nogil=True)(_masked_gae_batch)
    _compiled_serial = numba.njit(cache=True, nogil=True)(_masked_gae_serial)
else:  # pragma: no cover
    _compiled = _compiled_serial = None


def native_gae_samples(
    addresses: np.ndarray,
    offsets: np.ndarray,
    terminal_rewards: np.ndarray,
    *,
    value_dtype: np.dtype,
    mask_dtype: np.dtype,
    gamma: float,
    lambd: float,
    moments: Optional[np.ndarray] = None,
    tails: Optional[tuple] = None,
) -> bool:
    """Masked GAE of B samples whose buffers lie anywhere in memory, read and written in place:
    ``addresses`` int64 ``[5, B]``, the address of each sample's first value, reward, mask
    entry, advantage and return (rows VALUES, REWARDS, MASK, ADVANTAGES, RETURNS), each buffer
    contiguous; ``offsets`` int64 ``[B + 1]``, the samples' lengths as offsets; values,
    rewards and outputs of ``value_dtype`` (float32 or float64), the mask of ``mask_dtype``
    (bool, integer or float; trainable: ``!= 0``), ``terminal_rewards`` ``[B]``. The caller
    keeps every buffer alive and of that size: nothing here can check an address.

    Screens the input in the same pass (see :func:`native_gae_screened`) and returns
    ``clean``. The list API's path (no concatenation) and the packed form's alike.
    ``moments``: float64 ``[3, B]``, filled with each sample's count, sum and squares about its
    mean of its trainable advantages (:func:`gaecli.advantages.whiten.row_moments`), read as
    each sample ends (in cache): what whitening needs, without a pass of its own. ``tails``:
    ``(last, last_reward, tail)`` ``[B]`` (int64, int64, the rewards' dtype; filled with -1, -1
    and 0), each sample's tail read by the kernel first, as
    :func:`gaecli.advantages.layout.row_tails` reads it but with indices in the sample's own
    tokens, its terminal reward then the tail's sum (``terminal_rewards`` unread).
    """
    batch = offsets.size - 1
    if batch <= 0:
        return True
    threads = thread_count()
    serial = int(offsets[-1] - offsets[0]) < SERIAL_TOKENS or threads == 1
    groups = 1 if serial else max(1, min(threads, batch))
    order, group_bounds = plan_groups(offsets, groups)
    screens = np.zeros(groups, dtype=np.float64)
    wanted = _NO_MOMENTS if moments is None else moments
    if tails is None:
        tails = (_NO_INDICES, _NO_INDICES, _kind(value_dtype))
    # one flat tuple: a parallel region takes no tuple nested in its arguments
    layout = (addresses, np.diff(offsets), _kind(value_dtype), _kind(mask_dtype), wanted, *tails)
    (_compiled_serial if serial else _compiled)(
        layout, terminal_rewards, float(gamma), float(lambd), order, group_bounds, screens
    )
    return bool(np.isfinite(screens.sum()))


_NO_MOMENTS = np.zeros((3, 0), dtype=np.float64)
_NO_INDICES = np.zeros(0, dtype=np.int64)


@functools.cache
def _kind(dtype) -> np.ndarray:
    """An empty array of ``dtype``: how the compiled kernel is told a buffer's dtype (never
    written; one per dtype, shared)."""
    return np.empty(0, dtype=dtype)


@flat_kernel
def native_gae_flat(batch: FlatBatch, *, gamma: float, lambd: float, **variants) -> tuple[np.ndarray, np.ndarray]:
    """Masked GAE on flat numpy buffers, without torch (the commands' CPU path).

    ``values``, ``rewards``: float ``[N]`` (the same dtype, which the outputs take);
    ``loss_mask``: bool ``[N]``; ``offsets``: int64 ``[B + 1]``; ``terminal_rewards``:
    ``[B]``. Returns flat ``(advantages, returns)`` ``[N]``, 0 at masked positions (so all 0
    for a fully masked sample); empty samples own no position. The keywords of the GAE
    variants (``variants``), when given, go to
    :func:`gaecli.advantages.kernels.native_variants.native_variant_flat`.
    """
    if variants:
        return native_variant_flat(*batch, gamma=gamma, lambd=lambd, **variants)
    advantages, returns, _ = native_gae_screened(*batch, gamma=gamma, lambd=lambd)
    return advantages, returns


@flat_kernel
def native_gae_screened(
    batch: FlatBatch,
    *,
    gamma: float,
    lambd: float,
    out: Optional[tuple[np.ndarray, np.ndarray]] = None,
    moments: Optional[np.ndarray] = None,
    tails: Optional[tuple] = None,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """:func:`native_gae_flat` that also screens its input in the same pass: returns
    ``(advantages, returns, clean)``, ``clean`` False when a value or reward it read was not
    finite (at masked positions too) or a mask value was neither 0 nor 1. ``loss_mask`` may
    then be bool, integer or float (trainable: ``!= 0``). Which sample and token is at fault
    is for the caller to find (an error path: :mod:`gaecli.advantages.inputs`). ``out``: two
    contiguous ``[N]`` arrays of the values' dtype, written and returned (a caller's reused
    buffers: fresh outputs cost a page fault per 4 KiB on first touch). ``moments`` and ``tails``: as
    :func:`native_gae_samples` takes them."""
    values, rewards, loss_mask = (np.ascontiguousarray(array) for array in batch[:3])
    advantages, returns = (np.empty_like(values), np.empty_like(values)) if out is None else out
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    addresses = _flat_addresses(values, rewards, loss_mask, advantages, returns, offsets)
    clean = native_gae_samples(
        addresses,
        offsets,
        batch.terminal_rewards,
        value_dtype=values.dtype,
        mask_dtype=loss_mask.dtype,
        gamma=gamma,
        lambd=lambd,
        moments=moments,
        tails=tails,
    )
    return advantages, returns, clean


@flat_kernel
def native_gae(batch: FlatBatch, *, gamma: float, lambd: float, **variants):
    """Masked GAE by a compiled serial pass per sample (CPU tensors only).

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`
    (the GAE variants' keywords included); the tensors share memory with the numpy buffers
    of :func:`native_gae_flat`.
    """
    import torch

    advantages, returns = native_gae_flat(*(tensor.numpy() for tensor in batch), gamma=gamma, lambd=lambd, **variants)
    return torch.from_numpy(advantages), torch.from_numpy(returns)
