"""The kernels' one calling convention, written once: every GAE kernel is called as
``kernel(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma, lambd, **options)``
and its body receives the five buffers as one :class:`FlatBatch`."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, TypeVar

Result = TypeVar("Result")


class FlatBatch(NamedTuple):
    """One batch in the flat layout: ``values``, ``rewards`` float ``[N]`` and ``loss_mask``
    ``[N]`` (trainable: true or non-zero), ``offsets`` int64 ``[B + 1]`` (sample ``b`` owns
    positions ``offsets[b]:offsets[b + 1]``), ``terminal_rewards`` ``[B]``; tensors or numpy
    arrays, as the kernel reads them."""

    values: Any
    rewards: Any
    loss_mask: Any
    offsets: Any
    terminal_rewards: Any


def flat_kernel(body: Callable[..., Result]) -> Callable[..., Result]:
    """The kernel of ``body(batch, *, gamma, lambd, **options)``: called with the five buffers
    positionally (the convention above), it passes them on as one :class:`FlatBatch`."""

    @functools.wraps(body)
    def kernel(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma: float, lambd: float, **options):
        return body(
            FlatBatch(values, rewards, loss_mask, offsets, terminal_rewards), gamma=gamma, lambd=lambd, **options
        )

    return kernel
