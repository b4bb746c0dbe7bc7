"""``gae identify``: options → :func:`gaecli.identify.identify_files` → the terminal and JSON reports."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import BatchRowsOption, DebugOption, JsonOption, QuietOption, app
from gaecli.cli.progress import make_progress, print_closing
from gaecli.identify.defaults import DEFAULT_SAMPLE_ROWS, DEFAULT_SAMPLE_TOKENS, DEFAULT_TOLERANCE

_TRUNCATION = "The areal profile's truncation bootstrap"
TruncatedColOption = computation_options.in_panel(computation_options.TruncatedColOption, _TRUNCATION)
BootstrapColOption = computation_options.in_panel(computation_options.BootstrapColOption, _TRUNCATION)


@app.command(epilog=common.EXIT_CODES_HELP)
@option_groups.with_groups
def identify(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    against: Annotated[
        str, typer.Option(metavar="COLUMN", help="The stored per-token advantages to explain.")
    ] = "advantages",
    against_returns: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN", show_default=False, help="The stored returns, compared where a candidate has returns."
        ),
    ] = None,
    group_col: Annotated[
        Optional[str],
        typer.Option(
            "--group-col",
            metavar="COLUMN",
            show_default=False,
            help="The prompt-group id: the grouped estimators and per-group whitening are tried with it.",
        ),
    ] = None,
    tol: Annotated[
        float, typer.Option(help="A sample is reproduced when every trainable |Δ| ≤ tol · (1 + |stored|).")
    ] = DEFAULT_TOLERANCE,
    sample_rows: Annotated[
        int, typer.Option(metavar="N", help="Read the first N rows of the input (0: every row).")
    ] = DEFAULT_SAMPLE_ROWS,
    sample_tokens: Annotated[
        int, typer.Option(metavar="N", help="Read at most N tokens (the row that reaches N ends the sample).")
    ] = DEFAULT_SAMPLE_TOKENS,
    top: Annotated[
        int,
        typer.Option(
            metavar="K",
            help="List at most K candidates (every explanation, and the closest when none explains).",
        ),
    ] = 20,
    batch_rows: BatchRowsOption = None,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    truncated_col: TruncatedColOption = None,
    bootstrap_col: BootstrapColOption = None,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Which computation produced these advantages? Every trainer profile, masked GAE and the
    critic-free estimators fitted to a stored column (γ, λ, whitening) and ranked. Exits 0
    whether or not one explains it."""
    progress = make_progress(quiet)
    with common.errors_to_exit(debug, json_path=json_path):
        from gaecli.identify import IdentifyOptions, identify_files
        from gaecli.report.identify import render_identify

        options = IdentifyOptions(
            against=against,
            against_returns=against_returns,
            group_col=group_col,
            columns=common.make_columns(**column_options),
            truncated_col=truncated_col,
            bootstrap_col=bootstrap_col,
            tolerance=tol,
            sample_rows=sample_rows,
            sample_tokens=sample_tokens,
            batch_rows=batch_rows,
            top=top,
            report_paths=common.reports(JSON=json_path),
        )
        report = identify_files(inputs, options, progress)
        document = report.to_dict()
        common.write_json(document, json_path)
    if not quiet:
        console = common.stderr_console()
        render_identify(document, console)
        print_closing(progress, console)
