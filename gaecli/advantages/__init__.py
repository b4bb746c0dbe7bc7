"""The numbers: advantages and returns from values, rewards, a loss mask and terminal rewards.

One package, in the shape of FLA's ``fla/ops``: the contract's constants (:mod:`.contract`),
what is computed (:mod:`.spec`, :class:`AdvantageSpec`), the ragged layout helpers written
once for numpy and torch (:mod:`.layout`), the baselines around any kernel
(:mod:`.baselines`), the kernels and their table (:mod:`.kernels`), whitening
(:mod:`.whiten`), keyed statistics over many files (:mod:`.keyed`, :mod:`.statistics`), the
critic-free estimators (:mod:`.estimators`), the one dispatch (:mod:`.dispatch`) and the
torch API over it (:mod:`.api`). The map: docs/architecture.md.

Importing this package loads neither torch nor numba; the torch API loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from gaecli.advantages.contract import BASELINES, MASKED, WHITEN_EPSILON
from gaecli.advantages.spec import AdvantageSpec, RowInput

_LAZY = {
    "compute": "gaecli.advantages.dispatch",
    "gae_flat": "gaecli.advantages.dispatch",
    "compute_advantages": "gaecli.advantages.api",
    "compute_advantages_packed": "gaecli.advantages.api",
    "masked_gae": "gaecli.advantages.api",
    "masked_gae_packed": "gaecli.advantages.api",
    "baseline_gae": "gaecli.advantages.api",
    "baseline_gae_packed": "gaecli.advantages.api",
    "unmasked_gae": "gaecli.advantages.api",
    "whiten": "gaecli.advantages.whiten",
}

__all__ = ["AdvantageSpec", "BASELINES", "MASKED", "RowInput", "WHITEN_EPSILON", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gaecli.advantages' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
