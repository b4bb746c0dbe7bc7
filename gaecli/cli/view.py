"""``gae view``: the computation options of ``gae diff`` → :func:`gaecli.view.serve_run` → the
URL, the inputs that cannot be shown and a warning off the loopback address, on stderr."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gaecli.cli import common, computation_options, option_groups
from gaecli.cli.common import BatchRowsOption, DebugOption, QuietOption, app

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _announce(host: str, quiet: bool, open_browser: bool):
    """What the server calls once it listens: the URL (always: it is what the user came
    for), each input that cannot be shown, and a warning when ``host`` is reachable from
    elsewhere; then the browser opened with ``--open``."""

    def ready(url: str, errors: list[str]) -> None:
        from rich.markup import escape

        console = common.stderr_console()
        if host not in LOOPBACK_HOSTS:
            console.print(
                f"[bold yellow]warning:[/] serving on {escape(host)}: anyone who can reach this machine can read "
                "the run (the default, 127.0.0.1, serves this machine only)",
                soft_wrap=True,
            )
        if not quiet:
            for error in errors:
                console.print(f"[bold red]cannot show:[/] {escape(error)}", soft_wrap=True)
        console.print(f"gae view: {url}  (Ctrl-C stops it)", soft_wrap=True, highlight=False)
        if open_browser:
            import webbrowser

            webbrowser.open(url)

    return ready


@app.command(epilog=common.EXIT_CODES_HELP + " · 130 stopped (Ctrl-C).")
@option_groups.with_groups
def view(
    inputs: Annotated[
        list[str],
        typer.Argument(metavar="INPUT...", help="Parquet files (the run's steps, in this order), directories, globs."),
    ],
    estimator_options: dict = option_groups.ESTIMATOR_OPTIONS,
    baseline: Annotated[
        Optional[str],
        typer.Option(
            metavar="LIST",
            show_default=False,
            help="Old advantages recomputed as trainers compute them, as in gae diff (default unmasked); the page "
            "can switch a sample to any other profile, stored column or estimator.",
        ),
    ] = None,
    old_estimator: Annotated[
        Optional[str],
        typer.Option("--old-estimator", metavar="NAME", show_default=False, help="Old side: another estimator."),
    ] = None,
    against: Annotated[
        Optional[str], typer.Option(metavar="COLUMN", help="Old side: advantages stored in COLUMN.")
    ] = None,
    against_returns: Annotated[
        Optional[str], typer.Option(metavar="COLUMN", help="With --against: the stored returns.")
    ] = None,
    normalize: Annotated[
        bool, typer.Option("--normalize", help="Whiten new and old advantages over the whole run.")
    ] = False,
    normalize_by: computation_options.NormalizeByOption = None,
    whitening_options: dict = option_groups.WHITENING_OPTIONS,
    advantage_clip: computation_options.AdvantageClipOption = None,
    group_by: Annotated[
        Optional[str],
        typer.Option(metavar="COLUMN", help="The groups of the step and sample pages (default: --group-col)."),
    ] = None,
    id_col: Annotated[Optional[str], typer.Option(metavar="COLUMN", help="Column that identifies a sample.")] = None,
    tol: Annotated[float, typer.Option(help="A sample changed when some |Δ advantage| > tol · (1 + |A|).")] = 1e-6,
    kernel_options: dict = option_groups.KERNEL_OPTIONS,
    batch_rows: BatchRowsOption = None,
    column_options: dict = option_groups.RESPONSE_COLUMN_OPTIONS,
    old_opd_coef: computation_options.OldOPDCoefOption = None,
    variant_options: dict = option_groups.VARIANT_OPTIONS,
    tokenizer: Annotated[
        Optional[str],
        typer.Option(
            metavar="TOKENIZER",
            help="Decode the token-id column with a local tokenizer.json (the tokenizers library) or tokenizer "
            "directory (transformers, where installed).",
        ),
    ] = None,
    tokens_col: Annotated[
        Optional[str],
        typer.Option(
            "--tokens-col",
            metavar="COLUMN",
            help="The token ids (or token strings) of each response (default: the first of response_tokens, "
            "response_token_ids, response_ids, token_ids, tokens that the file has).",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; anything but 127.0.0.1 warns.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on; 0 takes a free one.")] = 8765,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the run page in the browser.")] = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """See a run in the browser: per-step trends, each step's samples, each sample's tokens
    with old and new credit. Read-only, serves only INPUT, on 127.0.0.1 by default (the
    view extra)."""
    with common.errors_to_exit(debug):
        from gaecli.cli.diff import comparison_fields
        from gaecli.diff import DiffOptions
        from gaecli.view import require_view, serve_run

        require_view()
        options = DiffOptions(
            **comparison_fields(
                estimator_options, whitening_options, kernel_options, column_options, variant_options,
                baseline=baseline, against=against, against_returns=against_returns, normalize=normalize,
                normalize_by=normalize_by, advantage_clip=advantage_clip, group_by=group_by, id_col=id_col,
                tolerance=tol, batch_rows=batch_rows, old_opd_coef=old_opd_coef, old_estimator=old_estimator,
            )
        )
        serve_run(inputs, options, host, port, tokenizer, tokens_col, _announce(host, quiet, open_browser))
