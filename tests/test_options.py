"""Bad option values: one class (InvalidOptionError, also a GAEInputError and a
GAEUsageError) from the library, and from every command exit 2 with one line on stderr,
no traceback and nothing written."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaecli import __version__
from gaecli.diff import DiffOptions
from gaecli.engines import EngineOptions
from gaecli.errors import GAEInputError, GAEUsageError, InvalidOptionError, KernelUnavailableError
from gaecli.io.format import Columns
from gaecli.recompute import RecomputeOptions
from gaecli.validate import validate_files

from rollout_files import files_under, gae, random_rollouts, rollout_table, sha256, write_table

RECOMPUTE, DIFF, IDENTIFY, VALIDATE = "recompute", "diff", "identify", "validate"
ALL = (RECOMPUTE, DIFF, IDENTIFY, VALIDATE)
ON_ENGINES = (RECOMPUTE, DIFF, VALIDATE)  # the commands with --workers, --engine and the KL rewards
WITH_DISCOUNT = (RECOMPUTE, DIFF)

# (what, the options given, the commands that have them, a word the message must hold)
MISTAKES = [
    ("gamma above 1", ["--gamma", "1.5"], WITH_DISCOUNT, "--gamma"),
    ("gamma nan", ["--gamma", "nan"], WITH_DISCOUNT, "--gamma"),
    ("lambd below 0", ["--lambd", "-0.1"], WITH_DISCOUNT, "--lambd"),
    ("lambd inf", ["--lambd", "inf"], WITH_DISCOUNT, "--lambd"),
    ("batch rows 0", ["--batch-rows", "0"], ALL, "--batch-rows"),
    ("unknown kernel", ["--kernel", "fastest"], WITH_DISCOUNT, "fastest"),
    ("unknown device", ["--device", "tpu"], WITH_DISCOUNT, "tpu"),
    ("unknown baseline", ["--baseline", "sometimes-masked"], (DIFF,), "--baseline"),
    ("unknown KL estimator", ["--kl-estimator", "k4"], ALL, "--kl-estimator"),
    ("KL coefficient nan", ["--kl-coef", "nan"], ON_ENGINES, "--kl-coef"),
    ("KL coefficient inf", ["--kl-coef", "inf"], ON_ENGINES, "--kl-coef"),
    ("workers 0", ["--workers", "0"], ON_ENGINES, "--workers"),
    ("unknown engine", ["--engine", "spark"], ON_ENGINES, "--engine"),
    ("tolerance inf", ["--tol", "inf"], (*WITH_DISCOUNT, IDENTIFY), "--tol"),
    ("tolerance below 0", ["--tol", "-1"], (*WITH_DISCOUNT, IDENTIFY), "--tol"),
    ("unknown on-invalid", ["--on-invalid", "ignore"], (RECOMPUTE,), "--on-invalid"),
    ("skip-existing with overwrite", ["--skip-existing", "--overwrite"], (RECOMPUTE,), "--skip-existing"),
    ("top below 0", ["--top", "-1"], (DIFF, IDENTIFY), "--top"),
    ("KL rewards to identify", ["--kl-coef", "0.1"], (IDENTIFY,), "--kl-coef"),
    ("sample rows below 0", ["--sample-rows", "-1"], (IDENTIFY,), "--sample-rows"),
    ("against with old estimator", ["--against", "values", "--old-estimator", "gae"], (DIFF,), "--old-estimator"),
    ("max findings below 0", ["--max-findings", "-1"], (VALIDATE,), "--max-findings"),
    ("empty id column", ["--id-col", "a,,b"], (VALIDATE,), "--id-col"),
]
CASES = [
    pytest.param(command, args, word, id=f"{command}: {what}")
    for what, args, commands, word in MISTAKES
    for command in commands
]


def test_every_command_is_in_the_table():
    assert {command for _, _, commands, _ in MISTAKES for command in commands} == set(ALL)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_table(rollout_table(random_rollouts(12, seed=3)), tmp_path_factory.mktemp("in") / "f.parquet")


def command_line(command: str, source, out, args: list[str]) -> list:
    """``command`` on ``source`` writing every output it has into ``out``, with ``args``
    after the defaults (a later --gamma replaces the default one)."""
    json_report = ["--json", out / "report.json"]
    if command == RECOMPUTE:
        return [RECOMPUTE, source, "-o", out / "f.parquet", "--gamma", 1, "--lambd", 0.9, *json_report, *args]
    if command == DIFF:
        return [
            DIFF,
            source,
            "--gamma",
            1,
            "--lambd",
            0.9,
            *json_report,
            "--markdown",
            out / "report.md",
            "--per-sample",
            out / "samples.parquet",
            *args,
        ]
    if command == IDENTIFY:
        return [IDENTIFY, source, "--against", "values", *json_report, *args]
    return [VALIDATE, source, *json_report, *args]


@pytest.mark.parametrize("command, args, word", CASES)
def test_bad_option_exits_2_with_one_line_and_writes_nothing(tmp_path, source, command, args, word):
    out = tmp_path / "out"
    out.mkdir()
    before = sha256(source)
    result = gae(*command_line(command, source, out, args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert files_under(out) == []
    assert sha256(source) == before


@pytest.mark.parametrize("command", ALL)
def test_the_table_options_are_fine_when_valid(tmp_path, source, command):
    """The same command lines with good values succeed (so the table's exits come from the
    bad values, not from the command line around them)."""
    out = tmp_path / "out"
    out.mkdir()
    workers = ["--workers", "1"] if command in ON_ENGINES else []
    result = gae(*command_line(command, source, out, ["--batch-rows", "5", *workers, "--quiet"]))
    assert result.exit_code == 0, result.output  # (validate: the data has warnings, no errors)
    assert (out / "report.json").exists()


# ----------------------------------------------------------------------------- the library


LIBRARY_MISTAKES = {
    "gamma": lambda: RecomputeOptions(gamma=1.5, lambd=0.9),
    "lambd nan": lambda: DiffOptions(gamma=1.0, lambd=math.nan),
    "batch rows": lambda: RecomputeOptions(gamma=1.0, lambd=0.9, batch_rows=0),
    "diff batch rows": lambda: DiffOptions(gamma=1.0, lambd=0.9, batch_rows=0),
    "tolerance inf": lambda: RecomputeOptions(gamma=1.0, lambd=0.9, tolerance=math.inf),
    "recompute baseline": lambda: RecomputeOptions(gamma=1.0, lambd=0.9, keep_baseline=True, baseline="half-masked"),
    "diff baseline": lambda: DiffOptions(gamma=1.0, lambd=0.9, baseline="half-masked"),
    "on invalid": lambda: RecomputeOptions(gamma=1.0, lambd=0.9, on_invalid="ignore"),
    "kernel": lambda: RecomputeOptions(gamma=1.0, lambd=0.9, kernel="fastest"),
    "device": lambda: DiffOptions(gamma=1.0, lambd=0.9, device="tpu"),
    "KL estimator": lambda: Columns(kl_estimator="k4"),
    "KL coefficient": lambda: Columns(kl_coef=math.nan),
    "workers": lambda: EngineOptions(workers=0),
    "engine": lambda: EngineOptions(engine="spark"),
    "top": lambda: DiffOptions(gamma=1.0, lambd=0.9, top=-1),
    "against with old estimator": lambda: DiffOptions(gamma=1.0, lambd=0.9, against="trained", old_estimator="gae"),
    "validate batch rows": lambda: validate_files([], batch_rows=0),
    "validate max findings": lambda: validate_files([], max_findings=-1),
}


@pytest.mark.parametrize("make", LIBRARY_MISTAKES.values(), ids=LIBRARY_MISTAKES.keys())
def test_library_raises_invalid_option_error_caught_as_input_error(make):
    with pytest.raises(InvalidOptionError):
        make()
    try:
        make()
    except GAEInputError as error:  # what library callers catch keeps catching it
        assert isinstance(error, GAEUsageError) and len(str(error).splitlines()) == 1
    else:
        pytest.fail("no error")


def test_the_error_classes():
    assert issubclass(InvalidOptionError, GAEUsageError) and issubclass(InvalidOptionError, GAEInputError)
    assert issubclass(KernelUnavailableError, InvalidOptionError) and issubclass(KernelUnavailableError, ValueError)


def test_good_options_are_accepted():
    assert RecomputeOptions(gamma=0.0, lambd=1.0, tolerance=0.0, batch_rows=1).gamma == 0.0
    assert DiffOptions(gamma=1, lambd=0, top=0, baseline="zero-masked").baseline == "zero-masked"
    assert Columns(kl_coef=0.0, kl_estimator="low_var_kl").kl_coef == 0.0
    assert EngineOptions("ray", 1, "auto").workers == 1


# ----------------------------------------------------------------------------- gae kernels, gae -V


def test_kernels_refuses_a_device_recompute_refuses():
    result = gae("kernels", "--device", "tpu")
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "tpu" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_kernels_refuses_cuda_without_cuda():
    result = gae("kernels", "--device", "cuda")
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "CUDA is not available" in result.stderr


def test_short_version_flag():
    for flag in ("-V", "--version"):
        result = gae(flag)
        assert result.exit_code == 0 and result.stdout == f"gae {__version__}\n"


# ----------------------------------------------------------------------------- every whole-number option

# The smallest value of each option that takes a whole number; every such option of every
# command must have a row (test_every_integer_option_is_in_the_table), so a new one is tried too.
SERVING = ("view",)
"""Commands that serve until stopped: their whole-number options (``--port``, bounded by the
port range) are tried in tests/test_view.py, where the server is stopped."""

INTEGER_MINIMUMS = {
    "--batch-rows": 1,
    "--workers": 1,
    "--top": 0,
    "--max-findings": 0,
    "--sample-rows": 0,
    "--sample-tokens": 1,
}


def integer_options() -> list[tuple[str, str]]:
    """(command, option) of every option of every ``gae`` command whose value is an int."""
    import typer

    from gaecli.cli import app

    found = []

    def walk(command, names: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*names, name])
        if names and names[0] in SERVING:
            return
        for param in getattr(command, "params", []):
            if param.param_type_name == "option" and param.type_descriptor.annotation is int:
                found.append((" ".join(names), next(o for o in param.opts if o.startswith("--"))))

    walk(typer.main.get_command(app), [])
    return sorted(found)


def test_every_integer_option_is_in_the_table():
    options = integer_options()
    assert {command for command, _ in options} <= set(ALL)  # command_line() can run each
    assert {option for _, option in options} == set(INTEGER_MINIMUMS)


INTEGER_CASES = [
    pytest.param(command, option, value, id=f"{command} {option} {value}")
    for command, option in integer_options()
    for value in (10**20, 2**63, INTEGER_MINIMUMS[option] - 1, -(10**20))
]


@pytest.mark.parametrize("command, option, value", INTEGER_CASES)
def test_a_whole_number_out_of_range_exits_2_with_one_line(tmp_path, source, command, option, value):
    """Beyond the largest 64-bit integer (what Arrow and numpy hold a count in) or below the
    option's least value: one line naming the option, before any work — never an
    OverflowError deep in the run."""
    out = tmp_path / "out"
    out.mkdir()
    result = gae(*command_line(command, source, out, [option, value]))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} must be at "), result.stderr
    assert files_under(out) == []


@pytest.mark.parametrize("command, option", integer_options())
def test_the_largest_whole_number_is_accepted(tmp_path, source, command, option):
    out = tmp_path / "out"
    out.mkdir()
    result = gae(*command_line(command, source, out, [option, 2**63 - 1, "--quiet"]))
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------------------- the environment


def gae_process(environment: dict, *args) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` (the console script's ``main``, which reads the environment
    first) in a child process with ``environment`` added."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **environment}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_user_allocator_setting_is_left_to_glibc(monkeypatch):
    """Only gaecli's own values go to mallopt; the user's setting stays in the environment
    for glibc (which read it at start) and the workers."""
    from gaecli.cli import memory

    calls = []

    class Libc:
        def mallopt(self, parameter, value):
            calls.append((parameter, value))

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "99999999999999999999999")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    memory.reuse_freed_memory()
    assert calls == [(memory.M_TRIM_THRESHOLD, memory.TRIM_THRESHOLD)]
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "99999999999999999999999"
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == str(memory.TRIM_THRESHOLD)


ALLOCATOR_SETTINGS = [
    (RECOMPUTE, "MALLOC_MMAP_THRESHOLD_", "99999999999999999999999"),
    (DIFF, "MALLOC_MMAP_THRESHOLD_", "99999999999999999999999"),
    (VALIDATE, "MALLOC_MMAP_THRESHOLD_", "99999999999999999999999"),
    (VALIDATE, "MALLOC_TRIM_THRESHOLD_", "-99999999999999999999999"),
    (VALIDATE, "MALLOC_MMAP_THRESHOLD_", "many"),
]


@pytest.mark.parametrize("command, variable, value", ALLOCATOR_SETTINGS)
def test_a_malformed_allocator_setting_never_crashes_a_command(tmp_path, source, command, variable, value):
    out = tmp_path / "out"
    out.mkdir()
    result = gae_process({variable: value}, *command_line(command, source, out, ["--workers", 2, "--quiet"]))
    assert result.returncode == 0 and result.stderr == "", result.stderr  # (validate: warnings only)
    assert (out / "report.json").exists()


@pytest.mark.parametrize("value", ["0", "-3", "four", ""])
def test_a_malformed_numba_thread_count_is_refused_in_one_line(tmp_path, source, value):
    """numba raises at import on a count below 1 and prints a traceback as a warning for
    one that is no number: refused before any command runs."""
    result = gae_process({"NUMBA_NUM_THREADS": value}, *command_line(VALIDATE, source, tmp_path, []))
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: NUMBA_NUM_THREADS=") and "at least 1" in lines[0]
    assert not (tmp_path / "report.json").exists()
