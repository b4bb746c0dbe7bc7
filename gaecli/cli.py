"""The ``gae`` command line: one thin function per command that parses options, calls one
library function and renders its result. Heavy modules are imported inside the commands so
that ``gae --help`` starts fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

from gaecli._version import __version__

EXIT_CODES_HELP = (
    "Exit codes: 0 success · 1 the input data is invalid (rows that break the format) · "
    "2 usage error, unreadable or unwritable file, refused operation."
)

app = typer.Typer(
    name="gae",
    help="Recompute PPO advantages (GAE) from rollout dumps with the masked semantics, "
    "see how far the old ones were off, and validate the dumps.\n\n" + EXIT_CODES_HELP,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_INVALID_DATA = 1
EXIT_USAGE = 2

JsonOption = Annotated[
    Optional[str], typer.Option("--json", metavar="PATH", help="Write the result as JSON to PATH ('-' for stdout).")
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No human summary and no progress bar on stderr.")]


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with ``code``."""
    _stderr().print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code)


def write_json(document: Any, path: str | None) -> None:
    """Write ``document`` as JSON to ``path`` ('-' = stdout); nothing when path is None."""
    if path is None:
        return
    text = json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text)
    except OSError as error:
        fail(f"cannot write JSON to {path}: {error.strerror or error}", EXIT_USAGE)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"gae {__version__}")
        raise typer.Exit()


@app.callback()
def callback(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version and exit."),
    ] = None,
) -> None:
    """Recompute PPO advantages (GAE) from rollout dumps with the masked semantics."""


@app.command()
def kernels(
    device: Annotated[str, typer.Option(help="Device to list kernels for (cpu, cuda).")] = "cpu",
    json_path: JsonOption = None,
    quiet: QuietOption = False,
) -> None:
    """List the GAE kernels usable here; the one `auto` picks is marked."""
    from gaecli.errors import KernelUnavailableError
    from gaecli.kernels import KERNELS, available_kernels, resolve_kernel

    try:
        names = available_kernels(device)
        auto = resolve_kernel("auto", device)
    except (RuntimeError, KernelUnavailableError) as error:
        fail(str(error), EXIT_USAGE)
    write_json({"device": device, "kernels": names, "auto": auto}, json_path)
    if not quiet and json_path != "-":
        for name in names:
            marker = "*" if name == auto else " "
            typer.echo(f"{marker} {name:<10} {KERNELS[name].description}")
        typer.echo("(* = what --kernel auto uses)")


def main() -> None:
    """Console-script entry point."""
    app()
