"""gaecli's numba threads are a good neighbour to the caller's torch: their OpenMP runtime starts
with the passive wait policy (idle workers sleep at once instead of spinning on the cores the
trainer's next torch op needs), the process environment is left as it was, and a policy the
user set wins. Read back from the runtime itself (``omp_display_env``), in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, json, os, sys
import torch
import gaecli
import numba

values = torch.randn(40_000)
offsets = torch.tensor([0, 20_000, 40_000])
gaecli.masked_gae_packed(values, torch.zeros(40_000), torch.ones(40_000), offsets, torch.ones(2), gamma=1.0, lambd=0.9)
layer = numba.threading_layer()
libraries = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line})
system = [path for path in libraries if "site-packages" not in path]
policy = None
if layer == "omp" and system:
    runtime = ctypes.CDLL(system[0])
    if hasattr(runtime, "omp_display_env"):
        sys.stderr.flush()
        read, write = os.pipe()
        saved = os.dup(2)
        os.dup2(write, 2)
        runtime.omp_display_env(0)
        os.dup2(saved, 2)
        os.close(write)
        shown = os.read(read, 1 << 16).decode()
        policy = next((line.split("=")[1].strip().strip("'") for line in shown.splitlines()
                       if line.strip().startswith("OMP_WAIT_POLICY")), None)
print(json.dumps({"layer": layer, "policy": policy, "environment": os.environ.get("OMP_WAIT_POLICY")}))
"""


def _run(environment: dict) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=600, check=True
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _environment(**changes) -> dict:
    policies = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    environment = {name: value for name, value in os.environ.items() if name not in policies}
    environment.update(changes)
    return environment


def test_numba_threads_start_passive_and_leave_the_environment_as_it_was():
    seen = _run(_environment())
    if seen["policy"] is None:
        pytest.skip(f"numba's threading layer is {seen['layer']!r} or its libgomp cannot show its settings")
    assert seen["policy"] == "PASSIVE"
    assert seen["environment"] is None


def test_a_wait_policy_the_user_set_wins():
    seen = _run(_environment(OMP_WAIT_POLICY="ACTIVE"))
    if seen["policy"] is None:
        pytest.skip(f"numba's threading layer is {seen['layer']!r} or its libgomp cannot show its settings")
    assert seen["policy"] == "ACTIVE"
    assert seen["environment"] == "ACTIVE"
