"""Every command's ``--help`` at 80 columns shows every word of its source help texts (rich
markup eats none: ``gaecli[ray]``), the choices of every closed set, readable metavars (no
typer ``<bool>``, ``<str>``, ``<list[str]>``), no word cut with ``…``, and a plain usage line."""

from __future__ import annotations

import inspect
import re
import typing

import pytest
import typer
from typer.models import ArgumentInfo, OptionInfo
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.cli.common import option_choices
from gaecli.cli.imports import import_app

BOX = str.maketrans({character: " " for character in "│╭╮╰╯─"})


def source_commands() -> list[tuple[list[str], typer.models.CommandInfo]]:
    """(argv prefix, CommandInfo) of every command as registered, the import subcommands included."""
    commands = [([info.name or info.callback.__name__], info) for info in app.registered_commands]
    commands += [(["import", info.name], info) for info in import_app.registered_commands]
    return commands


def source_texts(info) -> list[str]:
    """The help texts written in the source for a command: its docstring, its epilog and the
    help of each parameter (read from the annotations, not from the built command)."""
    texts = [inspect.getdoc(info.callback) or "", info.epilog or ""]
    hints = typing.get_type_hints(info.callback, include_extras=True)
    for hint in hints.values():
        for metadata in getattr(hint, "__metadata__", ()):
            if isinstance(metadata, (OptionInfo, ArgumentInfo)) and metadata.help:
                texts.append(metadata.help)
    return [text for text in texts if text]


def option_names(info) -> set[str]:
    hints = typing.get_type_hints(info.callback, include_extras=True)
    names = set()
    for name, hint in hints.items():
        for metadata in getattr(hint, "__metadata__", ()):
            if isinstance(metadata, OptionInfo):
                declared = [decl for decl in (metadata.param_decls or ()) if decl.startswith("--")]
                names.update(declared or ["--" + name.replace("_", "-")])
    return names


def render_help(argv: list[str]) -> str:
    result = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}, color=False)
    assert result.exit_code == 0, result.output
    return result.output


COMMANDS = source_commands()


def test_every_command_is_covered():
    assert {" ".join(argv) for argv, _ in COMMANDS} == {
        "recompute",
        "diff",
        "identify",
        "inspect",
        "validate",
        "kernels",
        "view",
        "import miles",
        "import slime",
        "import nemo-rl",
        "import skyrl",
    }


@pytest.mark.parametrize("argv, info", COMMANDS, ids=[" ".join(argv) for argv, _ in COMMANDS])
def test_help_shows_every_word_at_80_columns(argv, info):
    text = render_help(argv)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = set(text.translate(BOX).split())
    for source in source_texts(info):
        missing = [word for word in source.split() if word not in words]
        assert missing == [], f"{' '.join(argv)}: {source!r} loses {missing}"
    assert "…" not in text
    assert re.search(r"<[a-z][a-z_\[\]| ]*>", text) is None, "typer's <type> metavars"
    usage = next(line for line in lines if "Usage:" in line)
    assert "{" not in usage and "}" not in usage
    assert usage.split()[-1] in ("[OPTIONS]", "INPUT...", "[INPUT...]", "DUMP...", "JSONL...")


@pytest.mark.parametrize("argv, info", COMMANDS, ids=[" ".join(argv) for argv, _ in COMMANDS])
def test_help_lists_the_choices_of_closed_sets(argv, info):
    text = render_help(argv)
    tokens = set(re.split(r"[\s|,\[\]]+", text.translate(BOX)))
    closed = option_names(info) & set(option_choices())
    for option in closed:
        assert set(option_choices()[option]) <= tokens, option
    expected = {
        "recompute": {"--kernel", "--device", "--on-invalid", "--kl-estimator", "--engine", "--baseline", "--timestep"},
        "diff": {"--kernel", "--device", "--baseline", "--kl-estimator", "--engine", "--timestep"},
        "validate": {"--kl-estimator", "--engine"},
        "kernels": {"--device"},
    }
    assert expected.get(" ".join(argv), set()) <= closed


def test_choices_come_from_the_library():
    from gaecli.advantages.contract import BASELINES, TIMESTEPS
    from gaecli.advantages.kernels import KERNELS
    from gaecli.advantages.kl import KL_ESTIMATORS

    choices = option_choices()
    assert choices["--baseline"] == ("masked", *BASELINES) and "unmasked" in BASELINES
    assert choices["--timestep"] == TIMESTEPS == ("token", "turn")
    assert choices["--kernel"] == ("auto", *KERNELS) and "native" in KERNELS
    assert choices["--kl-estimator"] == tuple(KL_ESTIMATORS) == ("k1", "k2", "k3", "low_var_kl")
    assert choices["--on-invalid"] == ("stop", "skip")


def test_bracketed_words_survive():
    text = render_help(["recompute"])
    assert "gaecli[ray])." in text.translate(BOX).split()
    assert "--engine" in text and "local|ray" in text


def test_usage_line():
    def usage(text: str) -> str:
        return next(line.strip() for line in text.splitlines() if "Usage:" in line)

    assert usage(render_help(["recompute"])) == "Usage: gae recompute [OPTIONS] INPUT..."
    assert usage(render_help(["validate"])) == "Usage: gae validate [OPTIONS] [INPUT...]"
    missing = CliRunner().invoke(app, ["recompute"], env={"COLUMNS": "80"})
    assert missing.exit_code == 2 and usage(missing.output) == "Usage: gae recompute [OPTIONS] INPUT..."


def test_flags_show_no_type_and_values_a_readable_metavar():
    rows = {}
    for line in render_help(["recompute"]).splitlines():
        cells = [cell for cell in line.translate(BOX).split() if cell != "*"]
        if cells and cells[0].startswith("--"):
            rows[cells[0]] = cells
    assert rows["--normalize"][1] == "Whiten"  # a flag: no metavar between its name and its help
    assert rows["--batch-rows"][1] == "N"
    assert rows["--gamma"][1] == "NUMBER"
    assert rows["--mask-col"][1] == "COLUMN"
    assert rows["--output"][1:3] == ["-o", "PATH"]
    assert rows["--on-invalid"][1] == "stop|skip"
    assert rows["--kernel"][1] == "NAME"


GROUP_TEXTS = {
    "gae": [app.info.help, "Show the version and exit."],
    "gae import": [info.help for info in app.registered_groups if info.name == "import"],
}


@pytest.mark.parametrize("name", sorted(GROUP_TEXTS))
def test_group_help_shows_every_word_and_no_type_metavars(name):
    text = render_help(name.split()[1:])
    words = set(text.translate(BOX).split())
    assert all(GROUP_TEXTS[name])
    for source in GROUP_TEXTS[name]:
        missing = [word for word in source.split() if word not in words]
        assert missing == [], f"{source!r} loses {missing}"
    assert re.search(r"<[a-z][a-z_\[\]| ]*>", text) is None and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
