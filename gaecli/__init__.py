"""gaecli: recompute PPO advantages (GAE) from rollout dumps with the masked semantics.

The public API is imported lazily so that ``gae --help`` starts without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from gaecli._version import __version__
from gaecli.errors import GAEError, GAEInputError, InvalidOptionError, KernelUnavailableError

_LAZY = {
    "masked_gae": "gaecli.advantages.api",
    "masked_gae_packed": "gaecli.advantages.api",
    "unmasked_gae": "gaecli.advantages.api",
    "baseline_gae": "gaecli.advantages.api",
    "baseline_gae_packed": "gaecli.advantages.api",
    "compute_advantages": "gaecli.advantages.api",
    "compute_advantages_packed": "gaecli.advantages.api",
    "AdvantageSpec": "gaecli.advantages.spec",
    "whiten": "gaecli.advantages.whiten",
    "BASELINES": "gaecli.advantages.contract",
    "recompute_file": "gaecli.recompute",
    "recompute_files": "gaecli.recompute",
    "RecomputeOptions": "gaecli.recompute",
    "validate_file": "gaecli.validate",
    "validate_files": "gaecli.validate",
    "Columns": "gaecli.io.format",
    "import_miles": "gaecli.importers.miles",
    "import_slime": "gaecli.importers.slime",
    "import_nemo_rl": "gaecli.importers.nemo_rl",
    "diff_file": "gaecli.diff",
    "diff_files": "gaecli.diff",
    "DiffOptions": "gaecli.diff",
    "recompute_table": "gaecli.tables",
    "diff_table": "gaecli.tables",
    "kl_rewards": "gaecli.kl",
    "available_kernels": "gaecli.advantages.kernels",
    "resolve_kernel": "gaecli.advantages.kernels",
}

__all__ = ["__version__", "GAEError", "GAEInputError", "InvalidOptionError", "KernelUnavailableError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gaecli' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
