"""``gae kernels``: the GAE kernels usable on a device."""

from __future__ import annotations

from typing import Annotated

import typer

from gaecli.cli.common import (
    JsonOption,
    QuietOption,
    app,
    errors_to_exit,
    reports,
    write_json,
)


@app.command()
def kernels(
    device: Annotated[str, typer.Option(help="Device to list kernels for (cpu, cuda).")] = "cpu",
    json_path: JsonOption = None,
    quiet: QuietOption = False,
) -> None:
    """List the GAE kernels usable here; the one `auto` picks is marked."""
    from gaecli.advantages.kernels import KERNELS, available_kernels, resolve_kernel
    from gaecli.io.paths import check_writes
    from gaecli.pipeline import check_device

    with errors_to_exit():
        check_writes((), reports(JSON=json_path))  # no inputs: the rule's other checks still hold
        check_device(device)
        names = available_kernels(device)
        auto = resolve_kernel("auto", device)
    write_json({"device": device, "kernels": names, "auto": auto}, json_path)
    if not quiet and json_path != "-":
        for name in names:
            marker = "*" if name == auto else " "
            typer.echo(f"{marker} {name:<10} {KERNELS[name].description}")
        typer.echo("(* = what --kernel auto uses)")
