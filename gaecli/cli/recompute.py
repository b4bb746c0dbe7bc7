"""``gae recompute``: options → :func:`gaecli.recompute.recompute_files` → the summary."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli.common import (
    EXIT_CODES_HELP,
    BatchRowsOption,
    BootstrapColOption,
    DebugOption,
    EngineOption,
    EstimatorOption,
    GammaOption,
    GroupColOption,
    JsonOption,
    KLCoefOption,
    KLEstimatorOption,
    LambdAlphaOption,
    LambdCriticOption,
    LambdOption,
    LogprobsColOption,
    MaskColOption,
    QuietOption,
    RayAddressOption,
    RefLogprobsColOption,
    RewardsColOption,
    StepColOption,
    TerminalColOption,
    TimestepOption,
    TruncatedColOption,
    TurnRewardsColOption,
    ValuesColOption,
    WorkersOption,
    app,
    errors_to_exit,
    make_columns,
    make_engine,
    make_variants,
    reports,
    stderr_console,
    write_json,
    write_path_option,
)
from gaecli.cli.progress import make_progress, print_closing


@app.command(epilog=EXIT_CODES_HELP)
def recompute(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    output: Annotated[str, write_path_option("--output", "-o", help="Output file (one input file) or directory.")],
    gamma: GammaOption = None,
    lambd: LambdOption = None,
    estimator: EstimatorOption = "gae",
    group_col: GroupColOption = None,
    step_col: StepColOption = None,
    kernel: Annotated[str, typer.Option(help="GAE kernel (see `gae kernels`).")] = "auto",
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    batch_rows: BatchRowsOption = None,
    normalize: Annotated[
        bool, typer.Option("--normalize", help="Whiten advantages over all trainable tokens of all inputs.")
    ] = False,
    normalize_by: Annotated[
        Optional[str], typer.Option(metavar="COLUMN", help="Whiten within groups of rows sharing COLUMN's value.")
    ] = None,
    values_col: ValuesColOption = "values",
    rewards_col: RewardsColOption = None,
    mask_col: MaskColOption = "loss_mask",
    terminal_col: TerminalColOption = "terminal_reward",
    kl_coef: KLCoefOption = None,
    kl_estimator: KLEstimatorOption = "k1",
    logprobs_col: LogprobsColOption = "log_probs",
    ref_logprobs_col: RefLogprobsColOption = "ref_log_probs",
    timestep: TimestepOption = "token",
    lambd_critic: LambdCriticOption = None,
    lambd_alpha: LambdAlphaOption = None,
    turn_rewards_col: TurnRewardsColOption = None,
    truncated_col: TruncatedColOption = None,
    bootstrap_col: BootstrapColOption = None,
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
            "slime, roll, areal or nemo-rl, or an alias: unmasked (= slime), zero-masked (= openrlhf), skip-masked "
            "(= verl).",
        ),
    ] = "unmasked",
    keep_baseline: Annotated[
        bool,
        typer.Option(
            "--keep-baseline",
            help="Also write the baseline's advantages_NAME and returns_NAME ('-' in NAME becomes '_').",
        ),
    ] = False,
    on_invalid: Annotated[
        str,
        typer.Option(
            help="stop: the first invalid row stops the run (exit 1); skip: invalid rows go to OUTPUT.rejected.parquet."
        ),
    ] = "stop",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.")] = False,
    skip_existing: Annotated[
        bool, typer.Option("--skip-existing", help="Leave outputs that exist and are whole alone (resume a run).")
    ] = False,
    tol: Annotated[float, typer.Option(help="A sample changed when some |Δ advantage| > tol · (1 + |A|).")] = 1e-6,
    engine: EngineOption = "local",
    workers: WorkersOption = None,
    ray_address: RayAddressOption = None,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Recompute advantages and returns with masked GAE; write the files back with them added."""
    progress = make_progress(quiet)
    with errors_to_exit(debug):
        from gaecli.recompute import RecomputeOptions, recompute_files
        from gaecli.report.recompute import render_recompute

        options = RecomputeOptions(
            gamma=gamma,
            lambd=lambd,
            kernel=kernel,
            device=device,
            batch_rows=batch_rows,
            columns=make_columns(
                values_col,
                rewards_col,
                mask_col,
                terminal_col,
                kl_coef=kl_coef,
                kl_estimator=kl_estimator,
                logprobs_col=logprobs_col,
                ref_logprobs_col=ref_logprobs_col,
                advantages=advantages_col,
                returns=returns_col,
            ),
            normalize=normalize,
            normalize_by=normalize_by,
            replace=replace,
            keep_baseline=keep_baseline,
            baseline=baseline,
            on_invalid=on_invalid,
            overwrite=overwrite,
            tolerance=tol,
            skip_existing=skip_existing,
            variants=make_variants(timestep, lambd_critic, lambd_alpha, turn_rewards_col, truncated_col, bootstrap_col),
            report_paths=reports(JSON=json_path),
            estimator=estimator,
            group_by=group_col,
            step_by=step_col,
        )
        report = recompute_files(inputs, output, options, progress, make_engine(engine, workers, ray_address)).to_dict()
    write_json(report, json_path)
    if not quiet:
        console = stderr_console()
        render_recompute(report, console)
        print_closing(progress, console)
