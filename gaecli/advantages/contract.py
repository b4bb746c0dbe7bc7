"""The contract's constants and names, defined once (what they mean: docs/semantics.md), and
the check of γ and λ. Imports neither torch nor numba."""

from __future__ import annotations

import math

from gaecli.errors import GAEInputError

MASKED = "masked"
"""The contract's own semantics: GAE over each sample's trainable tokens (docs/semantics.md)."""

BASELINES: tuple[str, ...] = ("unmasked", "skip-masked", "zero-masked")
"""What trainers computed instead (docs/semantics.md#the-baselines), in documentation order."""

SEMANTICS: tuple[str, ...] = (MASKED, *BASELINES)

ESTIMATORS: tuple[str, ...] = ("gae",)
"""Advantage estimators implemented (critic-free ones join here)."""

TIMESTEPS: tuple[str, ...] = ("token",)
"""Timestep units implemented (``turn`` joins here)."""

NORMALIZATIONS: tuple[str, ...] = ("none", "all", "by")
"""Whitening of the advantages: none, over every trainable token of the input, or per group
of rows sharing a key."""

WHITEN_EPSILON = 1e-8
"""ε of whitening: ``(A − mean) / sqrt(var + ε)``."""


def check_discount(gamma: float, lambd: float) -> None:
    """Raise :class:`GAEInputError` unless γ and λ are finite numbers in [0, 1]."""
    for name, value in (("gamma", gamma), ("lambd", lambd)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GAEInputError(f"{name} must be a number in [0, 1], got {value!r}")
        if not 0.0 <= value <= 1.0:
            raise GAEInputError(f"{name} must be in [0, 1], got {value}")
