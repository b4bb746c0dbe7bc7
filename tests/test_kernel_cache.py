"""numba's cache of gaecli's compiled kernels lives where the user can write: under
``$XDG_CACHE_HOME/gaecli/numba`` or ``~/.cache/gaecli/numba`` (a ``NUMBA_CACHE_DIR`` the user set
wins), never in the package's own directory; and a command run on a cold cache says that it
compiles, once. Each case runs fresh interpreters with HOME pointed at a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gaecli
from tests.rollout_files import random_rollouts, rollout_table, write_table

PACKAGE = Path(gaecli.__file__).resolve().parent
COMPILE_ONE_KERNEL = (
    "import numpy as np; from gaecli.advantages.kernels.compiled import plan_groups; "
    "plan_groups(np.array([0, 2, 5, 9]), 2)"
)
NOTICE = "compiling kernels, first run only"


def environment(home: Path, **variables: str) -> dict[str, str]:
    """This environment with HOME at ``home``, no cache setting but ``variables``, and a
    plain progress line per report (so that a short run shows its progress, and a notice)."""
    env = {name: value for name, value in os.environ.items() if name not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    return {**env, "HOME": str(home), "GAE_PROGRESS_SECONDS": "0", **variables}


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def indexes(directory: Path) -> list[Path]:
    """numba's index files under ``directory`` (one per compiled function)."""
    return sorted(directory.rglob("*.nbi"))


def test_the_kernels_compile_into_the_home_cache_directory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shown = python("import os, gaecli; print(os.environ['NUMBA_CACHE_DIR'])", environment(home))
    assert shown.stdout.strip() == str(home / ".cache" / "gaecli" / "numba")
    python(COMPILE_ONE_KERNEL, environment(home))
    written = indexes(home / ".cache" / "gaecli" / "numba")
    assert [path.name.split("-")[0] for path in written] == ["compiled._plan_groups_loop"]
    assert written[0].parent.name.startswith("kernels_")  # numba's directory for gaecli/advantages/kernels


def test_xdg_cache_home_is_followed(tmp_path):
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    python(COMPILE_ONE_KERNEL, environment(home, XDG_CACHE_HOME=str(xdg)))
    assert len(indexes(xdg / "gaecli" / "numba")) == 1 and not (home / ".cache").exists()


def test_a_numba_cache_dir_the_user_set_wins(tmp_path):
    home, chosen = tmp_path / "home", tmp_path / "mine"
    home.mkdir()
    python(COMPILE_ONE_KERNEL, environment(home, NUMBA_CACHE_DIR=str(chosen), XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert len(indexes(chosen)) == 1
    assert not (home / ".cache").exists() and not (tmp_path / "xdg").exists()


def test_the_cache_is_warm_once_compiled_and_cold_again_when_older_than_the_source(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ask = "from gaecli.advantages.kernels.cache import kernels_cached; print(kernels_cached())"
    assert python(ask, environment(home)).stdout.strip() == "False"
    python(COMPILE_ONE_KERNEL, environment(home))
    assert python(ask, environment(home)).stdout.strip() == "True"
    (index,) = indexes(home / ".cache" / "gaecli" / "numba")
    source = PACKAGE / "advantages" / "kernels" / "compiled.py"
    before = source.stat().st_mtime - 1
    os.utime(index, (before, before))  # as if gaecli had changed since it compiled
    assert python(ask, environment(home)).stdout.strip() == "False"


def test_a_command_says_it_compiles_on_a_cold_cache_and_not_on_a_warm_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = write_table(rollout_table(random_rollouts(6, seed=3)), tmp_path / "rollouts.parquet")
    command = [sys.executable, "-m", "gaecli", "validate", str(path)]
    runs = [
        subprocess.run(command, env=environment(home), capture_output=True, text=True, timeout=300) for _ in range(2)
    ]
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    assert runs[0].stderr.splitlines()[0] == NOTICE and runs[0].stderr.count(NOTICE) == 1
    assert NOTICE not in runs[1].stderr and "validate: " in runs[1].stderr  # its progress, without the notice
    assert indexes(home / ".cache" / "gaecli" / "numba")


def test_a_package_whose_directories_cannot_be_listed_is_taken_as_cached(monkeypatch):
    """A user who may import the package but not list its directories (a private install
    read through a group, a dropped privilege): no crash at a command's start, and no
    message (nothing is known)."""
    from gaecli.advantages.kernels import cache

    class Unlistable(type(cache.PACKAGE)):
        def rglob(self, pattern):
            raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(cache, "PACKAGE", Unlistable(cache.PACKAGE))
    assert cache.kernels_cached() is True
