"""What the help offers a new user beyond the option tables: examples at the end of every
command's ``--help`` (each a line at 80 columns, each option in it one the command has),
``--md`` for ``--markdown``, a ``--baseline`` help that says what ``masked`` is and lists
the profiles, and shell completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from gaecli.advantages.contract import ALIASES, PROFILES
from gaecli.cli import app
from gaecli.cli.examples import EXAMPLES
from tests.rollout_files import random_rollouts, rollout_table, write_table
from tests.test_help import COMMANDS, render_help

ARGVS = sorted({tuple(argv) for argv, _ in COMMANDS} | {("import",)})


def command_at(argv: tuple[str, ...]) -> click.Command:
    command = get_command(app)
    for name in argv:
        command = command.commands[name]
    return command


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_every_command_has_examples_and_no_example_names_another():
    assert {argv[-1] for argv in ARGVS} == set(EXAMPLES)


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_the_help_ends_with_examples_one_a_line(argv):
    shown = [line.strip(" │") for line in render_help(list(argv)).splitlines()]
    start = shown.index("Examples:")
    examples = EXAMPLES[argv[-1]]
    assert shown[start + 1 : start + 1 + len(examples)] == list(examples)
    assert all(len(example) <= 76 for example in examples)


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_each_example_runs_the_command_with_options_it_has(argv):
    command = command_at(argv)
    known = {name for param in command.params for name in getattr(param, "opts", ())}
    for example in EXAMPLES[argv[-1]]:
        words = example.split()
        assert words[: 1 + len(argv)] == ["gae", *argv] or (argv == ("import",) and words[:2] == ["gae", "import"])
        if argv == ("import",):  # the group's examples name a subcommand and use its options
            sub = command.commands[words[2]]
            known_here = {name for param in sub.params for name in getattr(param, "opts", ())}
        else:
            known_here = known
        assert {word for word in words if word.startswith("-") and word != "-"} <= known_here, example


def test_md_is_the_markdown_option(tmp_path):
    path = write_table(rollout_table(random_rollouts(8, seed=5)), tmp_path / "run.parquet")
    runner = CliRunner()
    written = []
    for flag in ("--markdown", "--md"):
        out = tmp_path / f"report{flag}.md"
        result = runner.invoke(app, ["diff", str(path), "--gamma", "1", "--lambd", "0.95", flag, str(out), "-q"])
        assert result.exit_code == 0, result.output
        written.append(out.read_text(encoding="utf-8"))
    assert written[0] == written[1] and "|" in written[0]


@pytest.mark.parametrize("argv", [("diff",), ("recompute",)])
def test_the_baseline_help_says_what_masked_is_and_lists_the_profiles(argv):
    text = one_line(render_help(list(argv)).replace("│", " "))
    assert "masked: the contract itself, gaecli's own" in text
    help_of_baseline = text[text.index("--baseline") :]
    assert all(re.search(rf"\b{re.escape(name)}\b", help_of_baseline) for name in (*PROFILES, *ALIASES))


def test_shell_completion_is_offered():
    top = render_help([])
    assert "--install-completion" in top and "--show-completion" in top
    result = CliRunner().invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0 and "_gae_completion" in result.output, (result.output, result.exception)


def test_completion_completes_commands_and_options():
    gae = Path(sys.executable).with_name("gae")
    if not gae.exists():
        pytest.skip("the gae console script is not installed next to this Python")
    env = {**os.environ, "_GAE_COMPLETE": "complete_bash", "COMP_WORDS": "gae diff --mark", "COMP_CWORD": "2"}
    option = subprocess.run([str(gae)], env=env, capture_output=True, text=True, timeout=120)
    env.update(COMP_WORDS="gae rec", COMP_CWORD="1")
    command = subprocess.run([str(gae)], env=env, capture_output=True, text=True, timeout=120)
    assert (option.stdout.split(), command.stdout.split()) == (["--markdown"], ["recompute"])
