"""A help loads only what it shows: ``gae --help`` and each command's ``--help`` run without
importing numba, torch, numpy or pyarrow (the kernels, the tensors and the data path load
when a command runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gaecli

HEAVY_MODULES = ("numba", "torch", "numpy", "pyarrow")

HELPS = (
    (),
    ("recompute",),
    ("diff",),
    ("validate",),
    ("kernels",),
    ("import",),
    ("import", "miles"),
    ("import", "slime"),
    ("import", "nemo-rl"),
)


def heavy_modules_after(arguments: tuple[str, ...]) -> tuple[str, list[str]]:
    """The help ``gae ARGUMENTS --help`` prints in a fresh interpreter, and which of
    :data:`HEAVY_MODULES` it had imported when it returned."""
    root = str(Path(gaecli.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['gae', *{list(arguments)!r}, '--help']\n"
        "try:\n"
        "    runpy.run_module('gaecli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([name for name in {list(HEAVY_MODULES)!r} if name in sys.modules]), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    return result.stdout, json.loads(result.stderr.strip().splitlines()[-1])


def test_gae_help_loads_no_kernel_tensor_or_data_modules():
    shown, loaded = heavy_modules_after(())
    assert "recompute" in shown and "validate" in shown
    assert loaded == []


@pytest.mark.parametrize("arguments", HELPS[1:], ids=" ".join)
def test_each_command_help_loads_no_kernel_tensor_or_data_modules(arguments):
    shown, loaded = heavy_modules_after(arguments)
    assert "Usage:" in shown
    assert loaded == []
