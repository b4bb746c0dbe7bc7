"""The masked-GAE kernels and the one table that maps their names to functions.

Every kernel has the signature of :func:`gaecli.kernels.reference.reference_gae`:
``kernel(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma, lambd)`` on flat
1-D tensors (bool ``loss_mask``, int64 ``offsets`` of B + 1 entries) and returns flat
``(advantages, returns)`` with the masked-GAE semantics of DESIGN.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gaecli.errors import KernelUnavailableError
from gaecli.kernels import native
from gaecli.kernels.chunked import chunked_gae
from gaecli.kernels.native import native_gae
from gaecli.kernels.reference import reference_gae
from gaecli.kernels.scan import scan_gae
from gaecli.kernels.vanilla import vanilla_gae


@dataclass(frozen=True)
class Kernel:
    """A kernel: its function, whether it runs on CUDA, whether it is usable here, and a
    one-line description for ``gae kernels``."""

    function: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    cuda: bool
    usable: bool
    description: str


KERNELS: dict[str, Kernel] = {
    "reference": Kernel(reference_gae, True, True, "float64 serial loop per sample (the oracle)"),
    "vanilla": Kernel(vanilla_gae, True, True, "padded [B, T] batched serial scan (trainers' way)"),
    "chunked": Kernel(chunked_gae, True, True, "padded [B, T] FLA-style chunked scan (trainers' way)"),
    "scan": Kernel(scan_gae, True, True, "ragged log-step segmented scan, no padding (torch)"),
    "native": Kernel(native_gae, False, native.AVAILABLE, "ragged compiled pass per sample, no padding (numba, CPU)"),
}

# Fastest batch-invariant kernel first, per device type.
AUTO_ORDER = {"cpu": ("native", "scan"), "cuda": ("scan",)}


def available_kernels(device: str | torch.device = "cpu") -> list[str]:
    """Names of the concrete kernels usable on ``device`` here (``auto`` excluded)."""
    device_type = torch.device(device).type
    return [
        name
        for name, kernel in KERNELS.items()
        if kernel.usable and (device_type == "cpu" or kernel.cuda)
    ]


def resolve_kernel(name: str, device: str | torch.device = "cpu") -> str:
    """The concrete kernel name ``name`` stands for on ``device`` (``auto`` resolved).

    Raises :class:`KernelUnavailableError` for an unknown name or one that cannot run there.
    """
    device_type = torch.device(device).type
    usable = available_kernels(device)
    if name == "auto":
        for candidate in AUTO_ORDER.get(device_type, ("scan",)):
            if candidate in usable:
                return candidate
        return "vanilla"
    if name not in KERNELS:
        raise KernelUnavailableError(f"unknown kernel {name!r}; choose one of: auto, {', '.join(KERNELS)}")
    if name not in usable:
        raise KernelUnavailableError(
            f"kernel {name!r} cannot run on {device_type} here; usable: {', '.join(usable)}"
        )
    return name


def get_kernel(name: str, device: str | torch.device = "cpu") -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The kernel function for ``name`` (``auto`` resolved for ``device``)."""
    return KERNELS[resolve_kernel(name, device)].function


__all__ = ["KERNELS", "Kernel", "available_kernels", "get_kernel", "resolve_kernel"]
