"""Triton GPU kernel: masked GAE on the ragged flat buffer and its offsets (the
``cu_seqlens``), no padding, one program per chunk of a sample. Runs on CUDA tensors, and on
CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the test suite
checks it.

Formulation. Call ``Q_t`` what flows back into position ``t`` from the positions after it:
``γ·V' + γλ·A'`` with ``V'``, ``A'`` the value and advantage of the next trainable token of
the sample, or the terminal reward ``z`` when there is none (zero bootstrap). A trainable
token's advantage is then ``A_t = (r_t − V_t) + Q_t``, and ``Q`` obeys the affine
recurrence ``Q_{t-1} = d_t + c_t · Q_t`` with ``(c_t, d_t) = (γλ, γλ·(r_t − V_t) + γ·V_t)``
at a trainable position and ``(1, 0)`` at a masked one, so a masked gap of any length passes
``Q`` through unchanged and costs one γλ; the terminal reward lands on the last trainable
token and a fully masked sample is all zeros.

Chunks. A sample is cut into chunks of ``CHUNK_LENGTH`` positions counted from its first
position. Pass 1 (one program per chunk) composes the affine maps of the chunk by one
``tl.associative_scan``, which gives every position ``Q_t = D_t + C_t · Q_in`` as a function
of the ``Q_in`` that enters the chunk from its right; the last chunk of a sample knows
``Q_in = z`` and writes its outputs at once (a sample of one chunk needs nothing more), the
others store their whole-chunk map. Pass 2 (one program per sample) composes those maps from
the last chunk backward, ``CARRY_BLOCK`` chunks per scan, into every chunk's ``Q_in``.
Pass 3 recomputes each remaining chunk's scan and writes ``A = (r − V) + (D + C · Q_in)``.

Every scan runs forward over positions addressed from the chunk's end backward (a reverse
scan without ``reverse=True``), on blocks laid out from the chunk's (or the sample's) own
start, with exact identity elements ``(1, 0)`` as padding. The arithmetic of a sample
therefore never depends on the other samples of the batch: the result is bitwise batch
invariant. It computes in float64 for float64 input and in float32 otherwise, and rounds
once on output.
"""

from __future__ import annotations

import torch

from gaecli.advantages.kernels.convention import FlatBatch, flat_kernel
from gaecli.errors import KernelUnavailableError

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without the extra
    triton = None

AVAILABLE = triton is not None
INSTALL_HINT = "pip install 'gaecli[gpu]'"

CHUNK_LENGTH = 1024  # positions per chunk (a power of two); fixed, so results never depend on the batch
CARRY_BLOCK = 128  # chunk maps composed per scan in pass 2 (a power of two)
MAX_CHUNKS = 65_535  # chunks per sample: the grid's second axis
# No fused multiply-adds: every product and sum is rounded on its own, as under the
# interpreter the tests run, and whatever Triton's default (which is changing).
COMPILE_OPTIONS = {"enable_fp_fusion": False}


if AVAILABLE:

    @triton.jit
    def _compose(later_c, later_d, c, d):
        """The affine map ``Q ↦ d + c·Q`` after (outside) the composite of the later positions."""
        return later_c * c, d + c * later_d

    @triton.jit
    def _chunk_scan(
        values, rewards, loss_mask, discounts, start, end, chunk, CHUNK: tl.constexpr, ACCUMULATE: tl.constexpr
    ):
        """Load chunk ``chunk`` of the sample ``[start, end)`` from its last position backward
        and scan it: per slot the mask, value, ``r − V``, and ``(C, D)`` with
        ``Q_t = D + C · Q_in`` (slot ``i`` is position ``chunk_start + CHUNK − 1 − i``)."""
        gamma = tl.load(discounts).to(ACCUMULATE)
        decay = tl.load(discounts + 1).to(ACCUMULATE)
        chunk_start = start + chunk * CHUNK
        chunk_end = tl.minimum(chunk_start + CHUNK, end)
        slot = tl.arange(0, CHUNK)
        position = chunk_start + (CHUNK - 1) - slot
        inside = position < chunk_end
        trainable = tl.load(loss_mask + position, mask=inside, other=0) != 0
        value = tl.load(values + position, mask=inside, other=0).to(ACCUMULATE)
        surprise = tl.load(rewards + position, mask=inside, other=0).to(ACCUMULATE) - value
        # The map of the position after each slot's: what flows into the slot's position.
        following = position + 1
        following_inside = following < chunk_end
        following_trainable = tl.load(loss_mask + following, mask=following_inside, other=0) != 0
        following_value = tl.load(values + following, mask=following_inside, other=0).to(ACCUMULATE)
        following_reward = tl.load(rewards + following, mask=following_inside, other=0).to(ACCUMULATE)
        c = tl.where(following_trainable, decay, 1.0)
        d = tl.where(following_trainable, decay * (following_reward - following_value) + gamma * following_value, 0.0)
        scanned_c, scanned_d = tl.associative_scan((c, d), 0, _compose)
        return position, inside, trainable, value, surprise, scanned_c, scanned_d, gamma, decay

    @triton.jit
    def _write(advantages, returns, position, inside, trainable, value, surprise, scanned_c, scanned_d, carry_in):
        """Store ``A = (r − V) + (D + C · Q_in)`` and ``A + V`` at trainable positions, 0 elsewhere."""
        advantage = surprise + (scanned_d + scanned_c * carry_in)
        tl.store(advantages + position, tl.where(trainable, advantage, 0.0), mask=inside)
        tl.store(returns + position, tl.where(trainable, advantage + value, 0.0), mask=inside)

    @triton.jit
    def _local_pass(
        values,
        rewards,
        loss_mask,
        offsets,
        terminal_rewards,
        discounts,
        chunk_base,
        chunk_c,
        chunk_d,
        advantages,
        returns,
        CHUNK: tl.constexpr,
        ACCUMULATE: tl.constexpr,
    ):
        """Pass 1, program (sample, chunk): the last chunk of a sample writes its outputs
        (``Q_in = z``); every chunk but the first stores the map ``Q_in ↦ chunk_d + chunk_c · Q_in``
        of its whole span (what flows out of its first position), for pass 2."""
        sample = tl.program_id(0)
        chunk = tl.program_id(1)
        start = tl.load(offsets + sample)
        end = tl.load(offsets + sample + 1)
        if start + chunk * CHUNK < end:
            position, inside, trainable, value, surprise, scanned_c, scanned_d, gamma, decay = _chunk_scan(
                values, rewards, loss_mask, discounts, start, end, chunk, CHUNK, ACCUMULATE
            )
            if start + (chunk + 1) * CHUNK >= end:
                terminal = tl.load(terminal_rewards + sample).to(ACCUMULATE)
                _write(
                    advantages, returns, position, inside, trainable, value, surprise, scanned_c, scanned_d, terminal
                )
            if chunk > 0:
                # The whole chunk's map: its first position (slot CHUNK - 1) composed with the rest.
                first = tl.arange(0, CHUNK) == CHUNK - 1
                own_c = tl.where(trainable, decay, 1.0)
                own_d = tl.where(trainable, decay * surprise + gamma * value, 0.0)
                whole_c = tl.sum(tl.where(first, own_c * scanned_c, 0.0), axis=0)
                whole_d = tl.sum(tl.where(first, own_d + own_c * scanned_d, 0.0), axis=0)
                index = tl.load(chunk_base + sample) + chunk
                tl.store(chunk_c + index, whole_c)
                tl.store(chunk_d + index, whole_d)

    @triton.jit
    def _carry_pass(
        offsets,
        terminal_rewards,
        chunk_base,
        chunk_c,
        chunk_d,
        carries,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        ACCUMULATE: tl.constexpr,
    ):
        """Pass 2, program (sample): ``carries[k]``, the ``Q_in`` of chunk ``k``, for every chunk
        but the last (whose ``Q_in`` is the terminal reward), composing the chunk maps from the
        sample's end backward ``BLOCK`` at a time."""
        sample = tl.program_id(0)
        start = tl.load(offsets + sample)
        end = tl.load(offsets + sample + 1)
        chunks = (end - start + CHUNK - 1) // CHUNK
        base = tl.load(chunk_base + sample)
        carry = tl.load(terminal_rewards + sample).to(ACCUMULATE)  # Q_in of the last chunk
        slot = tl.arange(0, BLOCK)
        for block in range(0, (chunks - 1 + BLOCK - 1) // BLOCK):
            # Slot i: chunk k = chunks - 2 - (block * BLOCK + i), whose Q_in comes out of chunk k + 1.
            chunk = chunks - 2 - (block * BLOCK + slot)
            present = chunk >= 0
            c = tl.load(chunk_c + base + chunk + 1, mask=present, other=1.0).to(ACCUMULATE)
            d = tl.load(chunk_d + base + chunk + 1, mask=present, other=0.0).to(ACCUMULATE)
            scanned_c, scanned_d = tl.associative_scan((c, d), 0, _compose)
            carried = scanned_d + scanned_c * carry
            tl.store(carries + base + chunk, carried, mask=present)
            carry = tl.sum(tl.where(slot == BLOCK - 1, carried, 0.0), axis=0)

    @triton.jit
    def _finish_pass(
        values,
        rewards,
        loss_mask,
        offsets,
        discounts,
        chunk_base,
        carries,
        advantages,
        returns,
        CHUNK: tl.constexpr,
        ACCUMULATE: tl.constexpr,
    ):
        """Pass 3, program (sample, chunk) for every chunk but a sample's last: the outputs."""
        sample = tl.program_id(0)
        chunk = tl.program_id(1)
        start = tl.load(offsets + sample)
        end = tl.load(offsets + sample + 1)
        if start + (chunk + 1) * CHUNK < end:
            position, inside, trainable, value, surprise, scanned_c, scanned_d, gamma, decay = _chunk_scan(
                values, rewards, loss_mask, discounts, start, end, chunk, CHUNK, ACCUMULATE
            )
            carry = tl.load(carries + tl.load(chunk_base + sample) + chunk)
            _write(advantages, returns, position, inside, trainable, value, surprise, scanned_c, scanned_d, carry)


@flat_kernel
def triton_gae(
    batch: FlatBatch, *, gamma: float, lambd: float, chunk_length: int = CHUNK_LENGTH, carry_block: int = CARRY_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GAE by the chunked Triton kernel (CUDA tensors; CPU tensors under
    ``TRITON_INTERPRET=1``).

    Same signature and semantics as :func:`gaecli.advantages.kernels.reference.reference_gae`: flat
    ``[N]`` inputs, ``offsets`` ``[B + 1]``, ``terminal_rewards`` ``[B]``; masked positions 0,
    fully masked samples all 0 (terminal dropped), empty samples own nothing. The outputs take
    the values' dtype. ``chunk_length`` and ``carry_block`` (powers of two) exist for the
    tests; results are batch invariant for any fixed pair.
    """
    if not AVAILABLE:
        raise KernelUnavailableError(f"kernel 'triton' needs Triton: {INSTALL_HINT}")
    for name, size in (("chunk_length", chunk_length), ("carry_block", carry_block)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two, got {size}")
    values, rewards, loss_mask, offsets, terminal_rewards = batch
    values = values.contiguous()
    advantages = torch.empty_like(values)
    returns = torch.empty_like(values)
    batch = offsets.numel() - 1
    if values.numel() == 0 or batch <= 0:
        return advantages, returns
    accumulate = tl.float64 if values.dtype == torch.float64 else tl.float32
    device = values.device
    rewards = rewards.to(device=device, dtype=values.dtype).contiguous()
    mask = loss_mask.to(device=device, dtype=torch.bool).contiguous().view(torch.uint8)
    offsets = offsets.to(device=device, dtype=torch.int64).contiguous()
    terminal = terminal_rewards.to(device=device, dtype=torch.float64 if accumulate == tl.float64 else torch.float32)
    terminal = terminal.contiguous()
    discounts = torch.tensor([gamma, gamma * lambd], dtype=terminal.dtype, device=device)
    chunks = (offsets[1:] - offsets[:-1] + chunk_length - 1) // chunk_length
    chunk_base = (torch.cumsum(chunks, 0) - chunks).contiguous()
    longest, total = (int(x) for x in torch.stack([chunks.max(), chunks.sum()]).tolist())
    if longest > MAX_CHUNKS:
        raise KernelUnavailableError(
            f"the triton kernel takes samples of at most {MAX_CHUNKS * chunk_length:,} tokens; use kernel 'scan'"
        )
    chunk_c = torch.empty(max(total, 1), dtype=terminal.dtype, device=device)
    chunk_d = torch.empty_like(chunk_c)
    _local_pass[(batch, longest)](
        values,
        rewards,
        mask,
        offsets,
        terminal,
        discounts,
        chunk_base,
        chunk_c,
        chunk_d,
        advantages,
        returns,
        CHUNK=chunk_length,
        ACCUMULATE=accumulate,
        **COMPILE_OPTIONS,
    )
    if longest > 1:
        carries = torch.empty_like(chunk_c)
        _carry_pass[(batch,)](
            offsets,
            terminal,
            chunk_base,
            chunk_c,
            chunk_d,
            carries,
            CHUNK=chunk_length,
            BLOCK=carry_block,
            ACCUMULATE=accumulate,
            **COMPILE_OPTIONS,
        )
        _finish_pass[(batch, longest - 1)](
            values,
            rewards,
            mask,
            offsets,
            discounts,
            chunk_base,
            carries,
            advantages,
            returns,
            CHUNK=chunk_length,
            ACCUMULATE=accumulate,
            **COMPILE_OPTIONS,
        )
    return advantages, returns
