"""The torch API under its former module name: its home is :mod:`gaecli.advantages.api`."""

from gaecli.advantages.api import (
    baseline_gae,
    baseline_gae_packed,
    compute_advantages,
    compute_advantages_packed,
    masked_gae,
    masked_gae_packed,
    unmasked_gae,
)
from gaecli.advantages.contract import BASELINES
from gaecli.advantages.whiten import whiten

__all__ = [
    "BASELINES",
    "baseline_gae",
    "baseline_gae_packed",
    "compute_advantages",
    "compute_advantages_packed",
    "masked_gae",
    "masked_gae_packed",
    "unmasked_gae",
    "whiten",
]
