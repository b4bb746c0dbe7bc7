"""Shared pytest configuration: one hypothesis profile that keeps the property tests fast
(a few dozen examples each, no per-example deadline) and reproducible in CI."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# More examples on demand: HYPOTHESIS_PROFILE=thorough pytest tests/
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
