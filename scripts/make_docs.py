"""Regenerates the marked regions of README.md and docs/*.md from the commands themselves, so
that no example of a command's output and no options table can drift from the code.

Two kinds of region, each between an opening and a closing HTML comment (invisible on GitHub):

- ``<!-- gae-output: gae diff sample_data/agentic ... -->`` … ``<!-- /gae-output -->``: a
  fenced block (``json`` when the output is a JSON document) holding what the command
  prints (stdout, then stderr), run in this process from the repository root on
  ``sample_data/``, at :data:`WIDTH` columns, on the CPU, with what depends on the machine
  normalised (:func:`normalised`: the elapsed time and the throughput of the closing line,
  the repository's absolute path, progress lines, trailing spaces).
- ``<!-- gae-options: diff -->`` … ``<!-- /gae-options -->`` (``import skyrl`` for a
  subcommand): the command's arguments and options as a Markdown table, read from the
  Typer command's parameters, the texts its ``--help`` shows (:func:`options_table`).

Nothing outside the regions is touched. ``python scripts/make_docs.py`` rewrites the pages;
``--check`` changes nothing and exits 1 naming every region that differs from what the
command gives today (``tests/test_docs_generated.py`` runs the check, so ``make test``
fails on drift).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
"""The terminal width the outputs are rendered at."""

REGION = re.compile(
    r"(?P<open><!-- gae-(?P<kind>output|options): (?P<command>[^\n]+?) -->\n)"
    r"(?P<body>.*?)(?P<close><!-- /gae-(?P=kind) -->)",
    re.DOTALL,
)
ENVIRONMENT = {
    "COLUMNS": str(WIDTH),
    "TERMINAL_WIDTH": str(WIDTH),
    "CUDA_VISIBLE_DEVICES": "",  # the kernel `auto` picks on a CPU, whatever machine runs this
    "GAE_PROGRESS_SECONDS": "1000000",  # no progress line however slow the machine
    "NO_COLOR": "1",
}
CLOSING = re.compile(r"^took \S+ \([0-9.]+ s\)(?: · [^\n]*)?$", re.MULTILINE)
HELP_EXTRAS = re.compile(r"(.*?)((?:\s+\[(?:default|required|env var)[^\]]*\])*)$", re.DOTALL)
"""A help text and what typer appends to it (``  [default: gae]``, ``  [required]``)."""
PROGRESS = re.compile(r"^[a-z-]+: [0-9,]+/[0-9,]+ rows[^\n]*\n", re.MULTILINE)


def pages() -> list[Path]:
    """The pages that may hold regions: README.md and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def normalised(text: str) -> str:
    """``text`` without what depends on the machine: progress lines gone, the closing line's
    time and throughput as ``took … · … tokens/s``, the repository's path as ``.``; no line
    ends in spaces (an editor would strip them)."""
    text = PROGRESS.sub("", text)
    text = CLOSING.sub("took … · … tokens/s", text)
    text = text.replace(str(ROOT) + os.sep, "").replace(str(ROOT), ".")
    return "\n".join(line.rstrip() for line in text.split("\n"))  # rich pads wrapped lines


def command_output(command: str) -> str:
    """What ``command`` (``gae …``) prints, stdout then stderr, :func:`normalised`; a command
    that fails is an error (a region shows a run that works)."""
    from typer.testing import CliRunner

    from gaecli.cli import app

    argv = shlex.split(command)
    if argv[:1] != ["gae"]:
        raise ValueError(f"a gae-output region runs a gae command, not {command!r}")
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        result = CliRunner().invoke(app, argv[1:], env=ENVIRONMENT, color=False)
    finally:
        os.chdir(cwd)
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} exited {result.exit_code}:\n{result.output}")
    return normalised(result.stdout + result.stderr)


def command_of(path: str):
    """The click command of ``path`` (``diff``, ``import skyrl``), as Typer builds it."""
    import typer

    from gaecli.cli import app

    command = typer.main.get_command(app)
    for name in path.split():
        command = command.commands[name]
    return command


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def options_table(path: str) -> str:
    """The Markdown table of command ``path``'s arguments and options (hidden ones left out),
    each as ``--help`` shows it (the command's own readable metavars, choices, ranges and
    defaults), in the order ``--help`` lists them."""
    from rich.text import Text

    command = command_of(path)
    context = command.context_class(command, info_name=path.split()[-1])
    command._readable_params(context)  # what --help shows: gaecli.cli.common._ReadableHelp
    lines = ["| option | meaning |", "|---|---|"]
    for parameter in command.get_params(context):
        record = parameter.get_help_record(context)
        if record is None or parameter.name == "help":
            continue
        names, meaning = record
        if parameter.param_type_name == "argument":
            names = parameter.metavar or parameter.name.upper()
        text, extras = HELP_EXTRAS.match(meaning).groups()  # typer's own [default: …] are not markup
        meaning = Text.from_markup(text).plain + extras  # the help texts are rich markup, brackets escaped
        lines.append(f"| `{_cell(names)}` | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def region_body(kind: str, command: str) -> str:
    """What a region holds: the command's output in a fenced block, or its options table."""
    if kind == "options":
        return options_table(command)
    output = command_output(command).rstrip("\n")
    return ("```json\n" if output.startswith("{") else "```\n") + output + "\n```\n"


def regenerated(text: str) -> tuple[str, list[str]]:
    """``text`` with every region regenerated, and the commands of the regions that changed."""
    changed: list[str] = []

    def replace(match: re.Match) -> str:
        body = region_body(match["kind"], match["command"])
        if body != match["body"]:
            changed.append(f"gae-{match['kind']}: {match['command']}")
        return match["open"] + body + match["close"]

    return REGION.sub(replace, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a region has drifted")
    arguments = parser.parse_args(argv)
    drifted = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new, changed = regenerated(text)
        drifted += [f"{page.relative_to(ROOT)}: {what}" for what in changed]
        if changed and not arguments.check:
            page.write_text(new, encoding="utf-8")
    for line in drifted:
        print(("drifted " if arguments.check else "regenerated ") + line)
    return 1 if arguments.check and drifted else 0


if __name__ == "__main__":
    sys.exit(main())
