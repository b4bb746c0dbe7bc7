"""``gae import FORMAT``: one subcommand per trainer dump format, each calling its importer."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli.common import (
    EXIT_CODES_HELP,
    DebugOption,
    GaeTyper,
    JsonOption,
    QuietOption,
    app,
    errors_to_exit,
    reports,
    stderr_console,
    write_json,
    write_path_option,
)
from gaecli.cli.progress import make_progress, print_closing

import_app = GaeTyper(
    help="Import trainers' dumps into the rollout Parquet format.",
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
)
app.add_typer(
    import_app,
    name="import",
    help="Import trainers' dumps (miles, slime, NeMo-RL, SkyRL) into the rollout Parquet format.",
)


ImportOutputOption = Annotated[
    str, write_path_option("--output", "-o", help="The Parquet file (path or URI) to write.")
]
ImportOverwriteOption = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output file.")]


def _run_import(
    import_function, inputs: list[str], output: str, overwrite: bool, json_path: Optional[str], quiet: bool, debug: bool
) -> None:
    """What every ``gae import FORMAT`` does: call the importer, write the JSON, print the summary."""
    progress = make_progress(quiet, compiles=False)  # an import runs no compiled kernel
    with errors_to_exit(debug):
        report = import_function(
            inputs, output, overwrite=overwrite, progress=progress, report_paths=reports(JSON=json_path)
        )
    write_json(report.to_dict(), json_path)
    if not quiet:
        from rich.markup import escape

        from gaecli.display import display

        console = stderr_console()
        for line in report.summary_lines():
            console.print(escape(display(line)), soft_wrap=True)
        print_closing(progress, console)


def _import_command(name: str, importer: str, metavar: str, inputs_help: str, summary: str) -> None:
    """Register ``gae import NAME``: the options every format shares, calling
    ``gaecli.importers.<importer>``."""

    def command(
        inputs: list[str],
        output: ImportOutputOption,
        overwrite: ImportOverwriteOption = False,
        json_path: JsonOption = None,
        quiet: QuietOption = False,
        debug: DebugOption = False,
    ) -> None:
        import gaecli.importers

        _run_import(getattr(gaecli.importers, importer), inputs, output, overwrite, json_path, quiet, debug)

    # the one annotation that differs per format, as an object (annotations are strings here)
    command.__annotations__["inputs"] = Annotated[list[str], typer.Argument(metavar=metavar, help=inputs_help)]
    command.__doc__ = summary
    command.__name__ = command.__qualname__ = f"{importer}_command"
    import_app.command(name, epilog=EXIT_CODES_HELP)(command)


DUMP_HELP = "torch.save dumps, directories (recursive: *.pt, *.pth), globs or URIs."
_import_command(
    "miles",
    "import_miles",
    "DUMP...",
    DUMP_HELP,
    "Import miles --save-debug-train-data dumps (one per rank and rollout; context-parallel shares reassembled) "
    "into one rollout file; loaded with weights_only, never unpickled blindly.",
)
_import_command(
    "slime",
    "import_slime",
    "DUMP...",
    DUMP_HELP,
    "Import slime --save-debug-train-data dumps (format 2: one per rollout, gathered) into one rollout file; "
    "loaded with weights_only, never unpickled blindly.",
)
_import_command(
    "nemo-rl",
    "import_nemo_rl",
    "JSONL...",
    "train_data_step{N}.jsonl files, directories (recursive), globs or URIs.",
    "Import NeMo-RL's train_data_step{N}.jsonl (streamed) into one rollout file, with the prompt groups from the "
    "token ids (prompt_group: --estimator grpo --group-col prompt_group); no values column: gae takes "
    "--values-col none.",
)


RecoverEstimatorOption = Annotated[
    Optional[str],
    typer.Option(
        "--estimator",
        metavar="NAME",
        show_default=False,
        help="Recover the token rewards SkyRL drops from the stored returns, as this estimator computed them: gae "
        "(with --gamma and --lambd; needs the values) or reinforce++ (with --gamma). grpo, rloo and maxrl "
        "rewards cannot be recovered.",
    ),
]
RecoverGammaOption = Annotated[
    Optional[float],
    typer.Option(show_default=False, help="The run's discount γ in [0, 1]: required by --estimator."),
]
RecoverLambdOption = Annotated[
    Optional[float],
    typer.Option(show_default=False, help="The run's GAE λ in [0, 1]: required by --estimator gae."),
]


@import_app.command("skyrl", epilog=EXIT_CODES_HELP)
def import_skyrl_command(
    inputs: Annotated[
        list[str],
        typer.Argument(
            metavar="DUMP...",
            help="global_step_{N}_training_input.pkl files, directories (recursive), globs or URIs.",
        ),
    ],
    output: ImportOutputOption,
    estimator: RecoverEstimatorOption = None,
    gamma: RecoverGammaOption = None,
    lambd: RecoverLambdOption = None,
    overwrite: ImportOverwriteOption = False,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Import SkyRL's trainer.dump_data_batch dumps (global_step_{N}_training_input.pkl) into one rollout file;
    read by a restricted unpickler, never unpickled blindly; --estimator recovers the rewards."""

    def import_function(*args, **options):
        from gaecli.importers import import_skyrl

        return import_skyrl(*args, estimator=estimator, gamma=gamma, lambd=lambd, **options)

    _run_import(import_function, inputs, output, overwrite, json_path, quiet, debug)
