"""``gae validate``: options → :func:`gaecli.validate.validate_files` → findings by rule."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import EXIT_USAGE, BatchRowsOption, DebugOption, JsonOption, QuietOption, app, fail
from gaecli.cli.progress import make_progress, print_closing

_STORED = "Stored advantages"
AgainstOption = Annotated[
    Optional[str],
    typer.Option(
        "--against",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_STORED,
        help="The stored per-token advantages column the rules on stored advantages read (whitened-over-masked, "
        "nonzero-at-masked; with --group-col normalised-twice, group-mean-batch-std, equal-rewards-nonzero): "
        "default 'advantages' where a file has it; a named column every file must have; 'none' runs none.",
    ),
]
GroupColOption = Annotated[
    Optional[str],
    typer.Option(
        "--group-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_STORED,
        help="The prompt-group id column: with --episode-col the turn rows' group; without it the groups of the "
        "rules on stored advantages, rows compared within each file (a null id is invalid data).",
    ),
]


@app.command(
    epilog="Exit codes: 0 no errors (warnings allowed unless --strict) · 1 errors (or warnings under --strict) · "
    "2 a file could not be read or the command was misused (wins over 1; the readable files are still checked)."
)
@option_groups.with_groups
def validate(
    inputs: Annotated[
        Optional[list[str]],
        typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.", show_default=False),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail (exit 1) on warnings too.")] = False,
    max_findings: Annotated[
        Optional[int],
        typer.Option(
            "--max-findings",
            metavar="N",
            show_default=False,
            help="List at most N findings of each rule in the JSON (default 1000) and on the terminal (default 3); "
            "the counts stay exact.",
        ),
    ] = None,
    id_col: Annotated[
        Optional[str],
        typer.Option(
            "--id-col",
            metavar="COL[,COL]",
            help="Column(s) that identify a sample: label findings, warn on duplicates within a file.",
        ),
    ] = None,
    list_rules: Annotated[
        bool, typer.Option("--list-rules", help="Print every rule (code, severity, what it finds, fix) and exit.")
    ] = False,
    batch_rows: BatchRowsOption = None,
    estimator: computation_options.EstimatorOption = "gae",
    episode_col: computation_options.EpisodeColOption = None,
    turn_col: computation_options.TurnColOption = None,
    state_col: computation_options.StateColOption = None,
    group_col: GroupColOption = None,
    against: AgainstOption = None,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    row_input_options: dict = option_groups.ROW_INPUT_OPTIONS,
    engine_options: dict = option_groups.ENGINE_OPTIONS,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Check rollout files for the faults that make GAE silently wrong; findings grouped by rule on stderr."""
    from gaecli.report.validate import render_rules, render_validate
    from gaecli.rules import rules_document
    from gaecli.validate import DEFAULT_MAX_FINDINGS, validate_files

    if list_rules:
        from gaecli.io.paths import check_writes

        with common.errors_to_exit(debug):
            check_writes((), common.reports(JSON=json_path))  # no inputs: the rule's other checks still hold
        common.write_json(rules_document(), json_path)
        if not quiet and json_path != "-":
            from rich.console import Console

            render_rules(Console(highlight=False))
        return
    if not inputs:
        fail("give at least one INPUT (or --list-rules)", EXIT_USAGE)
    progress = make_progress(quiet)
    with common.errors_to_exit(debug):
        id_columns = [name.strip() for name in id_col.split(",")] if id_col is not None else None
        turn_rows = computation_options.validated_turn_rows(
            episode_col, turn_col, group_col if episode_col is not None else None, state_col,
            row_input_options["turn_rewards_col"],
        )  # fmt: skip
        if turn_rows is not None:  # on turn rows the turn reward is a number per row, not a list
            row_input_options = {**row_input_options, "turn_rewards_col": None}
        report = validate_files(
            inputs,
            common.make_columns(**column_options),
            id_columns=id_columns,
            max_findings=DEFAULT_MAX_FINDINGS if max_findings is None else max_findings,
            batch_rows=batch_rows,
            progress=progress,
            engine=common.make_engine(**engine_options),
            report_paths=common.reports(JSON=json_path),
            variants=computation_options.validated_row_inputs(**row_input_options),
            turn_rows=turn_rows,
            against=against,
            group_col=group_col if episode_col is None else None,
            estimator=estimator,
        )
    document = report.to_dict()
    common.write_json(document, json_path)
    if not quiet:
        console = common.stderr_console()
        render_validate(document, console, strict=strict, rows_per_rule=max_findings)
        print_closing(progress, console)
    raise typer.Exit(report.exit_code(strict))
