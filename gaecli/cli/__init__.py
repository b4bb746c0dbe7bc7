"""The ``gae`` command line: one thin function per command (a module each in this package)
that parses options, calls one library function and renders its result."""

from __future__ import annotations

import importlib
from typing import Annotated, Optional

import typer

from gaecli._version import __version__
from gaecli.cli.common import app
from gaecli.cli.environment import check_environment
from gaecli.cli.memory import reuse_freed_memory
from gaecli.cli.streams import run_guarded

# The modules that register the commands, in the order `gae --help` lists them.
COMMAND_MODULES = ("recompute", "diff", "identify", "inspect", "validate", "imports", "kernels", "view")
for _module in COMMAND_MODULES:
    importlib.import_module(f"gaecli.cli.{_module}")


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"gae {__version__}")
        raise typer.Exit()


@app.callback()
def callback(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", callback=_version_callback, is_eager=True, help="Show the version and exit."),
    ] = None,
) -> None:
    """Recompute PPO advantages (GAE) from rollout dumps with the masked semantics."""


def main() -> None:
    """Console-script entry point."""
    check_environment()
    reuse_freed_memory()
    run_guarded(app)
