"""``gae diff``: options → :func:`gaecli.diff.diff_files` → the terminal, JSON, Markdown and HTML reports."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import BatchRowsOption, DebugOption, JsonOption, QuietOption, app, write_path_option
from gaecli.cli.progress import make_progress, print_closing


def _list_baselines(value: Optional[bool]) -> None:
    """``--list-baselines``: every name of a list of baselines, one a line with what it names,
    on stdout; then exit 0 (eager: before INPUT is looked for)."""
    if not value:
        return
    from gaecli.advantages.contract import baseline_names
    from gaecli.advantages.estimator_profiles import profile_listing

    names = baseline_names()
    width = max(len(name) for name, _ in names)
    for name, description in names:
        typer.echo(f"{name:<{width}}  {description}")
    for line in ("", *profile_listing()):
        typer.echo(line)
    raise typer.Exit()


@app.command(epilog=common.EXIT_CODES_HELP)
@option_groups.with_groups
def diff(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    estimator_options: dict = option_groups.ESTIMATOR_OPTIONS,
    baseline: Annotated[
        Optional[str],
        typer.Option(
            metavar="LIST",
            show_default=False,
            help="Old advantages recomputed as a trainer computes them, a comma list compared side by side in one "
            "pass: the profiles verl, openrlhf, slime, roll, areal, nemo-rl, skyrl, or all (the seven); aliases "
            "unmasked (= slime, the default), zero-masked (= openrlhf), skip-masked (= verl); masked: the contract "
            "itself, gaecli's own masked GAE (the old side of a diff of the GAE variants). With --against: "
            "compared beside the stored column (after it). --list-baselines says what each computes.",
        ),
    ] = None,
    list_baselines: Annotated[
        Optional[bool],
        typer.Option(
            "--list-baselines",
            callback=_list_baselines,
            is_eager=True,
            help="Print every name --baseline takes (of GAE, then of the estimators with trainer profiles), "
            "with what it computes, and exit (no INPUT needed).",
        ),
    ] = None,
    old_estimator: Annotated[
        Optional[str],
        typer.Option(
            "--old-estimator",
            metavar="NAME",
            show_default=False,
            help="Old advantages: another estimator (gae or a critic-free one) on the same rows, with the same "
            "options; exclusive with --baseline and --against.",
        ),
    ] = None,
    against: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN",
            help="Compare with advantages stored in COLUMN (e.g. what the trainer used); with --baseline LIST, "
            "beside those baselines (the stored column first), else alone.",
        ),
    ] = None,
    against_returns: Annotated[
        Optional[str], typer.Option(metavar="COLUMN", help="With --against: the stored returns to compare.")
    ] = None,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize", help="Whiten new and old advantages over all trainable tokens, each with its own statistics."
        ),
    ] = False,
    normalize_by: computation_options.NormalizeByOption = None,
    whitening_options: dict = option_groups.WHITENING_OPTIONS,
    advantage_clip: computation_options.AdvantageClipOption = None,
    group_by: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN",
            help="Add the main figures per value of COLUMN (e.g. rollout_id: which steps were hit hardest).",
        ),
    ] = None,
    id_col: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN",
            help="Column that identifies a sample (shown for the top samples, written with --per-sample).",
        ),
    ] = None,
    top: Annotated[int, typer.Option(metavar="K", help="List the K samples with the largest max |Δ advantage|.")] = 10,
    tol: Annotated[float, typer.Option(help="A sample changed when some |Δ advantage| > tol · (1 + |A|).")] = 1e-6,
    kernel_options: dict = option_groups.KERNEL_OPTIONS,
    batch_rows: BatchRowsOption = None,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    old_opd_coef: computation_options.OldOPDCoefOption = None,
    variant_options: dict = option_groups.VARIANT_OPTIONS,
    json_path: JsonOption = None,
    markdown: Annotated[
        Optional[str],
        write_path_option("--markdown", "--md", help="Write the report as Markdown tables to PATH ('-' for stdout)."),
    ] = None,
    html: Annotated[
        Optional[str],
        write_path_option(
            "--html", help="Write one self-contained HTML file with plots to PATH (needs the plot extra)."
        ),
    ] = None,
    per_sample: Annotated[
        Optional[str],
        write_path_option("--per-sample", help="Write one Parquet row per sample with its figures to PATH."),
    ] = None,
    groups_out: Annotated[
        Optional[str],
        write_path_option(
            "--groups-out",
            help="With --group-by: write one Parquet row per group with its figures to PATH (the reports list the "
            "20 groups hit hardest).",
        ),
    ] = None,
    on_invalid: common.OnInvalidOption = "stop",
    rejects: Annotated[
        Optional[str],
        write_path_option(
            "--rejects",
            help="With --on-invalid skip: write the rows skipped to PATH (Parquet: source_file, source_row, the "
            "row's columns, reason).",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace existing --per-sample, --groups-out and --rejects files.")
    ] = False,
    engine_options: dict = option_groups.ENGINE_OPTIONS,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """How far were the old advantages off? Masked GAE against stored advantages and trainer
    profiles, side by side, over trainable tokens."""
    if json_path == "-" and markdown == "-":
        common.fail("--json and --markdown cannot both write to stdout ('-')", common.EXIT_USAGE)
    progress = make_progress(quiet)
    with common.errors_to_exit(debug, json_path=json_path):
        from gaecli.diff import DiffOptions, diff_files
        from gaecli.report import write_text
        from gaecli.report.markdown import render_markdown
        from gaecli.report.terminal import render_diff

        if html is not None:
            from gaecli.report.html import require_matplotlib

            require_matplotlib()
        options = DiffOptions(
            **comparison_fields(
                estimator_options, whitening_options, kernel_options, column_options, variant_options,
                baseline=baseline, against=against, against_returns=against_returns, normalize=normalize,
                normalize_by=normalize_by, advantage_clip=advantage_clip, group_by=group_by, id_col=id_col,
                tolerance=tol, batch_rows=batch_rows, old_opd_coef=old_opd_coef, old_estimator=old_estimator,
            ),
            top=top,
            per_sample=per_sample,
            groups_out=groups_out,
            overwrite=overwrite,
            report_paths=common.reports(JSON=json_path, Markdown=markdown, HTML=html),
            on_invalid=on_invalid,
            rejects=rejects,
        )
        report = diff_files(inputs, options, progress, common.make_engine(**engine_options))
        document = report.to_dict()
        common.write_json(document, json_path)
        if markdown is not None:
            write_text(markdown, render_markdown(document))
        if html is not None:
            from gaecli.report.html import render_html

            write_text(html, render_html(report))
    if not quiet:
        console = common.stderr_console()
        render_diff(document, console)
        print_closing(progress, console)


def comparison_fields(
    estimator_options: dict,
    whitening_options: dict,
    kernel_options: dict,
    column_options: dict,
    variant_options: dict,
    *,
    old_opd_coef,
    **fields,
) -> dict:
    """The fields of :class:`gaecli.diff.DiffOptions` that say what is compared (the two sides'
    computation, the columns, the groups), from the options ``gae diff`` and ``gae view``
    share; ``fields`` are passed on as they are."""
    return {
        **option_groups.estimator_fields(estimator_options, group_field="group_by_id"),
        "whitening_rule": computation_options.make_whitening_rule(estimator_options["estimator"], **whitening_options),
        **kernel_options,
        "columns": common.make_columns(**column_options, old_opd_coef=old_opd_coef),
        "variants": computation_options.make_variants(**variant_options),
        **fields,
    }
