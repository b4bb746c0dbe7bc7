"""The contract's constants and names, defined once (what they mean: docs/semantics.md), and
the check of γ and λ. Imports neither torch nor numba."""

from __future__ import annotations

from gaecli.options import check_number

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


def check_discount(gamma: float, lambd: float, names: tuple[str, str] = ("gamma", "lambd")) -> None:
    """Raise :class:`gaecli.errors.InvalidOptionError` unless γ and λ are finite numbers in
    [0, 1]; the message calls them ``names``."""
    check_number(names[0], gamma, 0.0, 1.0)
    check_number(names[1], lambd, 0.0, 1.0)
