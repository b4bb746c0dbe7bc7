"""``gae recompute``: options → :func:`gaecli.recompute.recompute_files` → the summary."""

from __future__ import annotations

from typing import Annotated

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import BatchRowsOption, DebugOption, JsonOption, QuietOption, app, write_path_option
from gaecli.cli.progress import make_progress, print_closing


@app.command(epilog=common.EXIT_CODES_HELP)
@option_groups.with_groups
def recompute(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    output: Annotated[str, write_path_option("--output", "-o", help="Output file (one input file) or directory.")],
    estimator_options: dict = option_groups.ESTIMATOR_OPTIONS,
    kernel_options: dict = option_groups.KERNEL_OPTIONS,
    batch_rows: BatchRowsOption = None,
    normalize: Annotated[
        bool, typer.Option("--normalize", help="Whiten advantages over all trainable tokens of all inputs.")
    ] = False,
    normalize_by: computation_options.NormalizeByOption = None,
    whitening_options: dict = option_groups.WHITENING_OPTIONS,
    advantage_clip: computation_options.AdvantageClipOption = None,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    variant_options: dict = option_groups.VARIANT_OPTIONS,
    advantages_col: Annotated[
        str, typer.Option(help="Name of the advantages column written.", rich_help_panel="Columns")
    ] = "advantages",
    returns_col: Annotated[
        str, typer.Option(help="Name of the returns column written.", rich_help_panel="Columns")
    ] = "returns",
    replace: Annotated[bool, typer.Option("--replace", help="Replace output columns that exist already.")] = False,
    baseline: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="What the summary compares against (and --keep-baseline writes): a trainer profile, verl, openrlhf, "
            "slime, roll, areal, nemo-rl or skyrl, or an alias: unmasked (= slime), zero-masked (= openrlhf), "
            "skip-masked (= verl); masked: the contract itself, gaecli's own plain masked GAE (what the "
            "GAE variants are compared against); with a critic-free --estimator, one of its trainer profiles "
            "(gae diff --list-baselines), else none.",
        ),
    ] = "unmasked",
    keep_baseline: Annotated[
        bool,
        typer.Option(
            "--keep-baseline",
            help="Also write the baseline's advantages_NAME and returns_NAME ('-' and '@' in NAME become '_').",
        ),
    ] = False,
    on_invalid: common.OnInvalidOption = "stop",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.")] = False,
    skip_existing: Annotated[
        bool, typer.Option("--skip-existing", help="Leave outputs that exist and are whole alone (resume a run).")
    ] = False,
    tol: Annotated[float, typer.Option(help="A sample changed when some |Δ advantage| > tol · (1 + |A|).")] = 1e-6,
    engine_options: dict = option_groups.ENGINE_OPTIONS,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Recompute advantages and returns with masked GAE; write the files back with them added."""
    progress = make_progress(quiet)
    with common.errors_to_exit(debug, json_path=json_path):
        from gaecli.recompute import RecomputeOptions, recompute_files
        from gaecli.report.recompute import render_recompute

        options = RecomputeOptions(
            **option_groups.estimator_fields(estimator_options),
            **kernel_options,
            batch_rows=batch_rows,
            columns=common.make_columns(**column_options, advantages=advantages_col, returns=returns_col),
            normalize=normalize,
            normalize_by=normalize_by,
            whitening_rule=computation_options.make_whitening_rule(estimator_options["estimator"], **whitening_options),
            advantage_clip=advantage_clip,
            replace=replace,
            keep_baseline=keep_baseline,
            baseline=baseline,
            on_invalid=on_invalid,
            overwrite=overwrite,
            tolerance=tol,
            skip_existing=skip_existing,
            variants=computation_options.make_variants(**variant_options),
            report_paths=common.reports(JSON=json_path),
        )
        engine = common.make_engine(**engine_options)
        report = recompute_files(inputs, output, options, progress, engine).to_dict()
    common.write_json(report, json_path)
    if not quiet:
        console = common.stderr_console()
        render_recompute(report, console)
        print_closing(progress, console)
