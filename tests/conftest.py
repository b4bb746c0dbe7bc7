"""Shared pytest configuration: one hypothesis profile that keeps the property tests fast
(a few dozen examples each, no per-example deadline) and reproducible in CI, one local
Ray instance for the whole session, and Triton's interpreter on machines without CUDA (set
before any test module imports a Triton kernel, so that the triton kernel joins the CPU
kernel grid)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from triton_interpreter import interpret_triton_unless_cuda, use_log_step_scan

interpret_triton_unless_cuda()
if os.environ.get("TRITON_INTERPRET") == "1":
    use_log_step_scan()

settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# More examples on demand: HYPOTHESIS_PROFILE=thorough pytest tests/
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray of 2 CPUs, started on first use and kept for the session (Ray's start-up
    costs seconds); None when Ray is not installed."""
    try:
        import ray
    except ImportError:
        yield None
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
