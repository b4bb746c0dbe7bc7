"""The advantage kernels and the one table that maps their names to functions and says what
each can run.

Every GAE kernel has the signature of :func:`gaecli.advantages.kernels.reference.reference_gae`:
``kernel(values, rewards, loss_mask, offsets, terminal_rewards, *, gamma, lambd)`` on flat
1-D tensors (bool ``loss_mask``, int64 ``offsets`` of B + 1 entries) and returns flat
``(advantages, returns)`` under the masked contract (docs/semantics.md); the convention is
written once (:func:`gaecli.advantages.kernels.convention.flat_kernel`). A kernel that
supports the GAE variants (:data:`GAE_VARIANT_FEATURES`) also takes their keywords
(docs/variants.md); the dispatch passes them only for a spec that sets one. A kernel with a
numpy form (``flat_attribute``) also runs on numpy buffers without torch. Adding a kernel: one
module here, one entry in :data:`KERNELS`, its tests (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Optional

from gaecli.errors import KernelUnavailableError

if TYPE_CHECKING:
    from gaecli.advantages.spec import AdvantageSpec

GAE_FEATURES = frozenset({"estimator:gae", "timestep:token"})
"""The features of :attr:`gaecli.advantages.spec.AdvantageSpec.features` every GAE kernel supports."""

GAE_VARIANT_FEATURES = GAE_FEATURES | frozenset(
    {
        "timestep:turn",
        "lambd_critic",
        "lambd_alpha",
        "lambd_schedule",
        "lambd_q",
        "turn_rewards",
        "truncated",
        "bootstrap_values",
        "turn_ids",
    }
)
"""Plain GAE and every GAE variant (docs/variants.md): a kernel that supports them takes the
keywords of :class:`gaecli.advantages.variants.VariantArguments`."""

TRUNCATION_FEATURES = frozenset({"truncated", "bootstrap_values"})
"""The truncation bootstrap alone (docs/variants.md): a kernel that supports it takes the keywords
of :class:`gaecli.advantages.variants.VariantArguments` and reads ``truncated`` and
``bootstrap_values`` (``scan``, the fast path on CUDA, and so of the ``areal`` profile there)."""


@dataclass(frozen=True)
class Kernel:
    """A kernel: where its function lives (loaded on first use, so that naming or resolving
    a kernel imports neither torch nor numba), whether it runs on CUDA, a one-line
    description for ``gae kernels``, the spec features it supports, its numpy form (a
    function of the same module on numpy buffers, or None), its screened numpy form (the
    numpy form that also screens its input in the same pass and says whether it was clean:
    ``(advantages, returns, clean)``; or None), its screened form over samples where they lie
    (each sample's buffers by address, read and written in place: the list API's path without
    concatenation; or None), and the module it needs to be importable to run (None: torch
    only)."""

    module: str
    attribute: str
    cuda: bool
    description: str
    supports: frozenset[str] = GAE_FEATURES
    flat_attribute: Optional[str] = None
    needs: Optional[str] = None
    screened_attribute: Optional[str] = None
    samples_attribute: Optional[str] = None

    @property
    def function(self) -> Callable[..., tuple[Any, Any]]:
        """The torch form."""
        return self._load(self.attribute)

    @property
    def flat_function(self) -> Optional[Callable[..., tuple[Any, Any]]]:
        """The numpy form (no torch), or None."""
        return self._load(self.flat_attribute)

    @property
    def screened_function(self) -> Optional[Callable[..., tuple[Any, Any, bool]]]:
        """The screened numpy form, or None."""
        return self._load(self.screened_attribute)

    @property
    def samples_function(self) -> Optional[Callable[..., bool]]:
        """The screened form over samples where they lie, or None."""
        return self._load(self.samples_attribute)

    def _load(self, attribute: Optional[str]) -> Optional[Callable]:
        """The kernel module's ``attribute`` (the module imported on first use), or None."""
        return None if attribute is None else getattr(importlib.import_module(self.module), attribute)

    @cached_property
    def usable(self) -> bool:
        """Whether it can run here: the module it needs (numba for ``native``, triton for
        ``triton``) is installed (found, not imported: cheap)."""
        return self.needs is None or importlib.util.find_spec(self.needs) is not None

    def usable_on(self, kind: str) -> bool:
        """Whether it can run on devices of type ``kind`` here. A Triton kernel runs on CPU
        tensors only under Triton's interpreter (``TRITON_INTERPRET=1``), which is for tests."""
        if not self.usable or (kind != "cpu" and not self.cuda):
            return False
        return kind != "cpu" or self.needs != "triton" or _triton_interpreted()

    def missing(self, spec: Optional["AdvantageSpec"]) -> frozenset[str]:
        """The features of ``spec`` this kernel does not support (empty: it can run it)."""
        return frozenset() if spec is None else spec.features - self.supports


def _triton_interpreted() -> bool:
    """Whether ``TRITON_INTERPRET`` is set to a true value (as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


_PACKAGE = "gaecli.advantages.kernels"
KERNELS: dict[str, Kernel] = {
    "reference": Kernel(
        f"{_PACKAGE}.reference",
        "reference_gae",
        True,
        "float64 serial loop per sample (the oracle)",
        supports=GAE_VARIANT_FEATURES,
    ),
    "vanilla": Kernel(f"{_PACKAGE}.vanilla", "vanilla_gae", True, "padded [B, T] batched serial scan (trainers' way)"),
    "chunked": Kernel(
        f"{_PACKAGE}.chunked", "chunked_gae", True, "padded [B, T] FLA-style chunked scan (trainers' way)"
    ),
    "scan": Kernel(
        f"{_PACKAGE}.scan",
        "scan_gae",
        True,
        "ragged log-step segmented scan, no padding (torch)",
        supports=GAE_FEATURES | TRUNCATION_FEATURES,
    ),
    "native": Kernel(
        f"{_PACKAGE}.native",
        "native_gae",
        False,
        "ragged compiled pass per sample, no padding (numba, CPU)",
        supports=GAE_VARIANT_FEATURES,
        flat_attribute="native_gae_flat",
        needs="numba",
        screened_attribute="native_gae_screened",
        samples_attribute="native_gae_samples",
    ),
    "triton": Kernel(
        f"{_PACKAGE}.triton",
        "triton_gae",
        True,
        "ragged chunked scan per sample, no padding (Triton, CUDA)",
        needs="triton",
    ),
}

# Fastest batch-invariant kernel first, per device type; then any other capable one. On CUDA
# the kernels' speeds are not measured yet (scripts/bench_gpu.py), so ``auto`` keeps ``scan``.
AUTO = "auto"
"""The kernel name that picks the fastest usable kernel (:data:`AUTO_ORDER`)."""
AUTO_ORDER = {"cpu": ("native", "scan"), "cuda": ("scan",)}
AUTO_FALLBACK = "vanilla"


def device_type(device) -> str:
    """``cpu``, ``cuda``... of a device name (``"cuda:1"``) or a ``torch.device``."""
    return device.type if hasattr(device, "type") else str(device).split(":", 1)[0]


def available_kernels(device="cpu") -> list[str]:
    """Names of the concrete kernels usable on ``device`` (a name or a ``torch.device``)
    here (``auto`` excluded)."""
    kind = device_type(device)
    return [name for name, kernel in KERNELS.items() if kernel.usable_on(kind)]


def resolve_kernel(name: str, device="cpu", spec: Optional["AdvantageSpec"] = None) -> str:
    """The concrete kernel ``name`` stands for on ``device`` (``auto`` resolved to the first
    usable kernel there that supports ``spec``).

    Raises :class:`KernelUnavailableError` for an unknown name, one that cannot run there,
    or one that cannot compute ``spec`` (a usage error).
    """
    kind = device_type(device)
    if name == AUTO:
        # The preferred kernels one by one before all of them: the first usable and capable
        # one is what a trainer's every call resolves to.
        for candidate in (*AUTO_ORDER.get(kind, ("scan",)), AUTO_FALLBACK, *KERNELS):
            kernel = KERNELS.get(candidate)
            if kernel is not None and kernel.usable_on(kind) and not kernel.missing(spec):
                return candidate
        raise KernelUnavailableError(f"no kernel usable on {kind} here computes {_describe(spec)}")
    usable = available_kernels(device)
    if name not in KERNELS:
        raise KernelUnavailableError(f"unknown kernel {name!r}; choose one of: auto, {', '.join(KERNELS)}")
    if name not in usable:
        if name == "triton" and not KERNELS[name].usable:
            from gaecli.advantages.kernels.triton import INSTALL_HINT

            raise KernelUnavailableError(f"kernel 'triton' needs Triton, which is not installed: {INSTALL_HINT}")
        where = " (it runs on CUDA, and on CPU only under TRITON_INTERPRET=1)" if name == "triton" else ""
        raise KernelUnavailableError(f"kernel {name!r} cannot run on {kind} here{where}; usable: {', '.join(usable)}")
    missing = KERNELS[name].missing(spec)
    if missing:
        capable = [candidate for candidate in usable if not KERNELS[candidate].missing(spec)]
        raise KernelUnavailableError(
            f"kernel {name!r} does not support {', '.join(sorted(missing))}; "
            f"kernels that do: auto, {', '.join(capable) or 'none here'}"
        )
    return name


def _describe(spec: Optional["AdvantageSpec"]) -> str:
    return "anything" if spec is None else ", ".join(sorted(spec.features))


__all__ = ["KERNELS", "Kernel", "available_kernels", "device_type", "resolve_kernel"]
