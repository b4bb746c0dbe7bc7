"""gaecli: recompute PPO advantages (GAE) from rollout dumps with the masked semantics.

The public API is imported lazily so that ``gae --help`` starts without loading torch.
"""

from __future__ import annotations

from gaecli._version import __version__
from gaecli.advantages import TORCH_API
from gaecli.advantages.kernels.cache import use_user_cache
from gaecli.errors import GAEError, GAEInputError, InvalidOptionError, KernelUnavailableError
from gaecli.lazy import lazy_exports

use_user_cache()  # before any module of gaecli imports numba: kernels compile once per user, not once per run

__getattr__, _LAZY = lazy_exports(
    __name__,
    {
        "gaecli.advantages.api": TORCH_API,
        "gaecli.advantages.spec": ("AdvantageSpec",),
        "gaecli.advantages.normalization": ("WhiteningRule",),
        "gaecli.advantages.whiten": ("whiten",),  # the function, not the module of that name
        "gaecli.advantages.contract": ("BASELINES",),
        "gaecli.recompute": ("recompute_file", "recompute_files", "RecomputeOptions"),
        "gaecli.validate": ("validate_file", "validate_files"),
        "gaecli.io.format": ("Columns",),
        "gaecli.importers.miles": ("import_miles",),
        "gaecli.importers.slime": ("import_slime",),
        "gaecli.importers.nemo_rl": ("import_nemo_rl",),
        "gaecli.importers.skyrl": ("import_skyrl",),
        "gaecli.diff": ("diff_file", "diff_files", "DiffOptions"),
        "gaecli.identify": ("identify_files", "identify_table", "IdentifyOptions"),
        "gaecli.recompute.table": ("recompute_table",),
        "gaecli.diff.table": ("diff_table",),
        "gaecli.advantages.kl": ("kl_rewards",),
        "gaecli.advantages.distillation": ("add_distillation", "distillation_advantages"),
        "gaecli.advantages.kernels": ("available_kernels", "resolve_kernel"),
    },
)

__all__ = ["__version__", "GAEError", "GAEInputError", "InvalidOptionError", "KernelUnavailableError", *_LAZY]


def __dir__() -> list[str]:
    return sorted(__all__)
