"""The commands stand alone: importing the library module of one command (recompute,
diff, validate, import) loads none of the other commands' modules; what they share lives
below them (``gaecli.comparison``, ``gaecli.pipeline``, ``gaecli.io``, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gaecli

COMMAND_MODULES = {
    "recompute": "gaecli.recompute",
    "diff": "gaecli.diff",
    "validate": "gaecli.validate",
    "inspect": "gaecli.inspection",
    "import": "gaecli.importers",
}


def modules_loaded_by(module: str) -> list[str]:
    """Every module in ``sys.modules`` after a fresh interpreter imports ``module``."""
    root = str(Path(gaecli.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_a_command_module_loads_no_other_command(command):
    module = COMMAND_MODULES[command]
    loaded = modules_loaded_by(module)
    assert module in loaded
    others = [other for name, other in COMMAND_MODULES.items() if name != command]
    assert [name for name in loaded if any(within(name, other) for other in others)] == []


def test_recompute_and_diff_share_one_accumulator():
    from gaecli.comparison.figures import DiffAccumulator
    from gaecli.diff.run import DiffAccumulator as used_by_diff
    from gaecli.recompute.run import DiffAccumulator as used_by_recompute

    assert used_by_recompute is DiffAccumulator and used_by_diff is DiffAccumulator
