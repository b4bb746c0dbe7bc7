"""The numbers: advantages and returns from values, rewards, a loss mask and terminal rewards.

One package, in the shape of FLA's ``fla/ops``: the contract's constants (:mod:`.contract`),
what is computed (:mod:`.spec`, :class:`AdvantageSpec`), the ragged layout helpers written
once for numpy and torch (:mod:`.layout`), the baselines around any kernel
(:mod:`.baselines`), the kernels and their table (:mod:`.kernels`), whitening
(:mod:`.whiten`), the KL estimators (:mod:`.kl`) and on-policy distillation
(:mod:`.distillation`), keyed statistics over many
files (:mod:`.keyed`, :mod:`.statistics`), the critic-free estimators (:mod:`.estimators`),
the one dispatch (:mod:`.dispatch`) and the torch API over it (:mod:`.api`). The map: docs/architecture.md.

Importing this package loads neither torch nor numba; the torch API loads on first use.
"""

from __future__ import annotations

from gaecli.advantages.contract import BASELINES, MASKED, WHITEN_EPSILON
from gaecli.lazy import lazy_exports

TORCH_API = (
    "compute_advantages",
    "compute_advantages_packed",
    "masked_gae",
    "masked_gae_packed",
    "baseline_gae",
    "baseline_gae_packed",
    "unmasked_gae",
)
"""The Python API on tensors (:mod:`.api`), loaded on first use."""

__getattr__, _LAZY = lazy_exports(
    __name__,
    {
        "gaecli.advantages.spec": ("AdvantageSpec", "RowInput"),
        "gaecli.advantages.dispatch": ("compute", "gae_flat"),
        "gaecli.advantages.api": TORCH_API,
        "gaecli.advantages.whiten": ("whiten",),
        "gaecli.advantages.distillation": ("add_distillation", "distillation_advantages"),
    },
)

__all__ = ["BASELINES", "MASKED", "WHITEN_EPSILON", *_LAZY]


def __dir__() -> list[str]:
    return sorted(__all__)
