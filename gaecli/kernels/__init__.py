"""The masked-GAE kernels and the one table that maps their names to functions.

Every kernel has the signature of :func:`gaecli.kernels.reference.reference_gae`:
``kernel(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma, lambd)`` on flat
1-D tensors (bool ``loss_mask``, int64 ``offsets`` of B + 1 entries) and returns flat
``(advantages, returns)`` with the masked-GAE semantics of DESIGN.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from gaecli.errors import KernelUnavailableError


@dataclass(frozen=True)
class Kernel:
    """A kernel: where its function lives (loaded on first use, so that naming or resolving
    a kernel imports neither torch nor numba), whether it runs on CUDA, and a one-line
    description for ``gae kernels``."""

    module: str
    attribute: str
    cuda: bool
    description: str

    @property
    def function(self) -> Callable[..., tuple[Any, Any]]:
        return getattr(importlib.import_module(self.module), self.attribute)

    @cached_property
    def usable(self) -> bool:
        """Whether it can run here: the compiled kernel needs numba, the Triton kernel Triton."""
        if self.module.endswith(".native"):
            return importlib.import_module(self.module).AVAILABLE
        if self.module.endswith(".triton"):
            return importlib.util.find_spec("triton") is not None  # found, not imported: cheap
        return True

    def usable_on(self, kind: str) -> bool:
        """Whether it can run on devices of type ``kind`` here. Triton kernels run on CPU
        tensors only under Triton's interpreter (``TRITON_INTERPRET=1``), which is for tests."""
        if not self.usable or (kind != "cpu" and not self.cuda):
            return False
        return kind != "cpu" or not self.module.endswith(".triton") or _triton_interpreted()


def _triton_interpreted() -> bool:
    """Whether ``TRITON_INTERPRET`` is set to a true value (as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


KERNELS: dict[str, Kernel] = {
    "reference": Kernel("gaecli.kernels.reference", "reference_gae", True, "float64 serial loop per sample (the oracle)"),
    "vanilla": Kernel("gaecli.kernels.vanilla", "vanilla_gae", True, "padded [B, T] batched serial scan (trainers' way)"),
    "chunked": Kernel("gaecli.kernels.chunked", "chunked_gae", True, "padded [B, T] FLA-style chunked scan (trainers' way)"),
    "scan": Kernel("gaecli.kernels.scan", "scan_gae", True, "ragged log-step segmented scan, no padding (torch)"),
    "native": Kernel("gaecli.kernels.native", "native_gae", False, "ragged compiled pass per sample, no padding (numba, CPU)"),
    "triton": Kernel("gaecli.kernels.triton", "triton_gae", True, "ragged chunked scan per sample, no padding (Triton, CUDA)"),
}

# Fastest batch-invariant kernel first, per device type. On CUDA the kernels' speeds are not
# measured yet (scripts/bench_gpu.py), so ``auto`` keeps ``scan`` there.
AUTO_ORDER = {"cpu": ("native", "scan"), "cuda": ("scan",)}


def device_type(device) -> str:
    """``cpu``, ``cuda``... of a device name (``"cuda:1"``) or a ``torch.device``."""
    return device.type if hasattr(device, "type") else str(device).split(":", 1)[0]


def available_kernels(device="cpu") -> list[str]:
    """Names of the concrete kernels usable on ``device`` (a name or a ``torch.device``)
    here (``auto`` excluded)."""
    kind = device_type(device)
    return [name for name, kernel in KERNELS.items() if kernel.usable_on(kind)]


def resolve_kernel(name: str, device="cpu") -> str:
    """The concrete kernel name ``name`` stands for on ``device`` (``auto`` resolved).

    Raises :class:`KernelUnavailableError` for an unknown name or one that cannot run there.
    """
    kind = device_type(device)
    usable = available_kernels(device)
    if name == "auto":
        for candidate in AUTO_ORDER.get(kind, ("scan",)):
            if candidate in usable:
                return candidate
        return "vanilla"
    if name not in KERNELS:
        raise KernelUnavailableError(f"unknown kernel {name!r}; choose one of: auto, {', '.join(KERNELS)}")
    if name not in usable:
        if name == "triton" and not KERNELS[name].usable:
            from gaecli.kernels.triton import INSTALL_HINT

            raise KernelUnavailableError(f"kernel 'triton' needs Triton, which is not installed: {INSTALL_HINT}")
        where = " (it runs on CUDA, and on CPU only under TRITON_INTERPRET=1)" if name == "triton" else ""
        raise KernelUnavailableError(
            f"kernel {name!r} cannot run on {kind} here{where}; usable: {', '.join(usable)}"
        )
    return name


def get_kernel(name: str, device="cpu") -> Callable[..., tuple[Any, Any]]:
    """The kernel function for ``name`` (``auto`` resolved for ``device``)."""
    return KERNELS[resolve_kernel(name, device)].function


__all__ = ["KERNELS", "Kernel", "available_kernels", "device_type", "get_kernel", "resolve_kernel"]
