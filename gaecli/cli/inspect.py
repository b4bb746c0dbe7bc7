"""``gae inspect``: options → :func:`gaecli.inspection.inspect_files` → each file's schema, the
columns read and what can be computed, from the footers alone."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import DebugOption, JsonOption, QuietOption, app

INSPECT_ESTIMATOR_OPTIONS = option_groups.OptionGroup(
    tuple(option for option in option_groups.ESTIMATOR_OPTIONS.options if option[0] not in ("gamma", "lambd"))
)
"""The estimator options of recompute and diff without γ and λ, which change no column read."""


@app.command(
    epilog="Exit codes: 0 every file was read (whatever it can compute) · 2 a file could not be read or the "
    "command was misused (the readable files are still inspected)."
)
@option_groups.with_groups
def inspect(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    estimator_options: dict = INSPECT_ESTIMATOR_OPTIONS,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    row_input_options: dict = option_groups.ROW_INPUT_OPTIONS,
    against: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN",
            show_default=False,
            help="The stored per-token advantages a diff would compare (default: 'advantages', else every "
            "list-of-floats column whose name holds 'advantage').",
        ),
    ] = None,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """What a rollout file holds and what gae can compute from it, from the Parquet footer alone: the
    schema, rows and tokens, the columns read for the options given (those of recompute), which
    estimators and variants the file allows and whether a diff against stored advantages is possible."""
    with common.errors_to_exit(debug):
        from gaecli.inspection import InspectOptions, inspect_files
        from gaecli.report.inspect import render_inspect

        fields = option_groups.estimator_fields({**estimator_options, "gamma": None, "lambd": None})
        del fields["gamma"], fields["lambd"]
        options = InspectOptions(
            **fields,
            columns=common.make_columns(**column_options),
            variants=computation_options.validated_row_inputs(**row_input_options),
            against=against,
            report_paths=common.reports(JSON=json_path),
        )
        report = inspect_files(inputs, options)
        document = report.to_dict()
    common.write_json(document, json_path)
    if not quiet:
        render_inspect(document, common.stderr_console())
    raise typer.Exit(report.exit_code())
