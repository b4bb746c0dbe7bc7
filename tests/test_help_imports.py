"""A command loads only what it uses: ``gae --help`` and each command's ``--help`` run without
importing numba, torch, numpy or pyarrow (the kernels, the tensors and the data path load
when a command runs), and the commands on a rollout file run without torch or pandas (the
CPU path is numpy and numba; Arrow's own numpy conversions would import pandas)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gaecli
from tests.rollout_files import random_rollouts, rollout_table, write_table

HEAVY_MODULES = ("numba", "torch", "numpy", "pyarrow")

HELPS = (
    (),
    ("recompute",),
    ("diff",),
    ("identify",),
    ("inspect",),
    ("validate",),
    ("kernels",),
    ("view",),
    ("import",),
    ("import", "miles"),
    ("import", "slime"),
    ("import", "nemo-rl"),
    ("import", "skyrl"),
)


def heavy_modules_after(arguments: tuple[str, ...]) -> tuple[str, list[str]]:
    """The help ``gae ARGUMENTS --help`` prints in a fresh interpreter, and which of
    :data:`HEAVY_MODULES` it had imported when it returned."""
    return modules_after((*arguments, "--help"), HEAVY_MODULES)


def modules_after(arguments: tuple[str, ...], watched: tuple[str, ...]) -> tuple[str, list[str]]:
    """What ``gae ARGUMENTS`` prints in a fresh interpreter, and which of ``watched`` it had
    imported when it returned."""
    root = str(Path(gaecli.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['gae', *{list(arguments)!r}]\n"
        "try:\n"
        "    runpy.run_module('gaecli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([name for name in {list(watched)!r} if name in sys.modules]), file=sys.stderr)\n"
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


RUN_ONLY_MODULES = ("torch", "pandas")


@pytest.mark.parametrize(
    "command",
    (
        ("recompute", "{input}", "-o", "{output}", "--gamma", "1", "--lambd", "0.95"),
        ("diff", "{input}", "--gamma", "1", "--lambd", "0.95"),
        ("diff", "{input}", "--gamma", "1", "--lambd", "0.95", "--baseline", "all"),
        ("validate", "{input}"),
    ),
    ids=lambda command: " ".join(part for part in command if not part.startswith("{")),
)
def test_commands_on_a_rollout_load_neither_torch_nor_pandas(tmp_path, command):
    source = write_table(rollout_table(random_rollouts(30, seed=5)), tmp_path / "rollouts.parquet")
    arguments = tuple(part.format(input=source, output=tmp_path / "out.parquet") for part in command)
    shown, loaded = modules_after((*arguments, "--quiet"), RUN_ONLY_MODULES)
    assert loaded == []
    if command[0] == "recompute":
        assert (tmp_path / "out.parquet").is_file()
