"""The ``gae`` command line: one thin function per command that parses options, calls one
library function and renders its result. Heavy modules are imported inside the commands so
that ``gae --help`` starts fast."""

from __future__ import annotations

import sys
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
    from rich.markup import escape

    _stderr().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def write_json(document: Any, path: str | None) -> None:
    """Write ``document`` as JSON to ``path`` ('-' = stdout); nothing when path is None."""
    if path is None:
        return
    from gaecli.report import json_text

    text = json_text(document)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from gaecli.errors import GAEUsageError
    from gaecli.report import write_text

    try:
        write_text(path, text)
    except GAEUsageError as error:
        fail(f"{error} (the JSON report)", EXIT_USAGE)


def reports(**paths: Optional[str]) -> tuple[tuple[str, str], ...]:
    """(role, path) pairs of the report options given, for the library's path check:
    ``reports(JSON=…)`` → (("JSON report", …),)."""
    return tuple((f"{kind} report", path) for kind, path in paths.items() if path is not None)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"gae {__version__}")
        raise typer.Exit()


@app.callback()
def callback(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", callback=_version_callback, is_eager=True, help="Show the version and exit."),
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
    from gaecli.advantages.kernels import KERNELS, available_kernels, resolve_kernel
    from gaecli.pipeline import check_device

    with errors_to_exit():
        check_device(device)
        names = available_kernels(device)
        auto = resolve_kernel("auto", device)
    write_json({"device": device, "kernels": names, "auto": auto}, json_path)
    if not quiet and json_path != "-":
        for name in names:
            marker = "*" if name == auto else " "
            typer.echo(f"{marker} {name:<10} {KERNELS[name].description}")
        typer.echo("(* = what --kernel auto uses)")


# ----------------------------------------------------------------------------- shared


ValuesColOption = Annotated[
    str,
    typer.Option(
        "--values-col", help="Column of per-token critic values; 'none' takes them as 0.", rich_help_panel="Columns"
    ),
]
RewardsColOption = Annotated[
    Optional[str],
    typer.Option(
        "--rewards-col",
        show_default=False,
        rich_help_panel="Columns",
        help="Column of per-token rewards; 'none' takes them as 0. Default: rewards, or none with --kl-coef (a "
        "column named here is added to the KL rewards).",
    ),
]
MaskColOption = Annotated[
    str, typer.Option("--mask-col", help="Column of the 0/1 loss mask.", rich_help_panel="Columns")
]
TerminalColOption = Annotated[
    str, typer.Option("--terminal-col", help="Column of the scalar terminal reward.", rich_help_panel="Columns")
]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.", hidden=False)]
EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        metavar="local|ray",
        rich_help_panel="Scale out",
        help="local: files in parallel worker processes on this machine; ray: Ray tasks (needs gaecli[ray]). "
        "Results are bitwise the same.",
    ),
]
WorkersOption = Annotated[
    Optional[int],
    typer.Option(
        "--workers",
        metavar="N",
        show_default=False,
        rich_help_panel="Scale out",
        help="Files processed at once: worker processes (local) or CPUs of the Ray started here. Default: the "
        "number of cores; local: at most one per 256 MB of input (a worker costs ~1 s to start).",
    ),
]
RayAddressOption = Annotated[
    Optional[str],
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        show_default=False,
        rich_help_panel="Scale out",
        help="With --engine ray: the Ray cluster to join (e.g. auto or ray://head:10001); default: start Ray on "
        "this machine.",
    ),
]


def make_engine(engine: str, workers: Optional[int], ray_address: Optional[str]):
    """The EngineOptions of the shared engine options."""
    from gaecli.engines import EngineOptions

    return EngineOptions(engine=engine, workers=workers, ray_address=ray_address)


KLCoefOption = Annotated[
    Optional[float],
    typer.Option(
        "--kl-coef",
        metavar="C",
        show_default=False,
        rich_help_panel="KL rewards",
        help="Per-token rewards = −C · KL(log_probs ‖ ref_log_probs), added to --rewards-col if one is named "
        "(the default rewards column is then not read).",
    ),
]
KLEstimatorOption = Annotated[
    str,
    typer.Option(
        "--kl-estimator",
        metavar="k1|k2|k3|low_var_kl",
        rich_help_panel="KL rewards",
        help="KL estimator of log-ratio x = log_probs − ref_log_probs: k1 = x, k2 = x²/2, k3 = exp(−x) − 1 + x, "
        "low_var_kl = k3 clamped (see docs/format.md).",
    ),
]
LogprobsColOption = Annotated[
    str,
    typer.Option(
        "--logprobs-col",
        help="Column of the policy's per-token log-probs (read with --kl-coef).",
        rich_help_panel="KL rewards",
    ),
]
RefLogprobsColOption = Annotated[
    str,
    typer.Option(
        "--ref-logprobs-col",
        help="Column of the reference model's per-token log-probs (read with --kl-coef).",
        rich_help_panel="KL rewards",
    ),
]


def make_columns(
    values_col: str,
    rewards_col: Optional[str],
    mask_col: str,
    terminal_col: str,
    *,
    kl_coef: Optional[float] = None,
    kl_estimator: str = "k1",
    logprobs_col: str = "log_probs",
    ref_logprobs_col: str = "ref_log_probs",
    **outputs,
):
    """The Columns of the shared column and KL options. ``rewards_col`` None: ``rewards``,
    or no rewards column when ``kl_coef`` is given; 'none': no rewards column."""
    from gaecli.io.format import Columns

    none = lambda name: None if name.lower() == "none" else name  # noqa: E731
    rewards = ("rewards" if kl_coef is None else None) if rewards_col is None else none(rewards_col)
    return Columns(
        values=none(values_col),
        rewards=rewards,
        loss_mask=mask_col,
        terminal_reward=terminal_col,
        log_probs=logprobs_col,
        ref_log_probs=ref_logprobs_col,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
        **outputs,
    )


class _RichProgress:
    """A rich progress bar on stderr with rows and tokens per second (the library's
    Progress protocol)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rows · {task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=_stderr(),
            transient=True,
        )
        self._task = None
        self._tokens = 0

    def start(self, phase: str, total_rows: int) -> None:
        import time

        self._bar.start()
        self._tokens = 0
        self._started = time.perf_counter()
        self._task = self._bar.add_task(phase, total=total_rows, rate="")

    def advance(self, rows: int, tokens: int) -> None:
        import time

        self._tokens += tokens
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        done = self._bar.tasks[-1].completed + rows
        rate = f"{done / elapsed:,.0f} rows/s · {self._tokens / elapsed / 1e6:,.1f} M tokens/s"
        self._bar.update(self._task, advance=rows, rate=rate)

    def finish(self) -> None:
        self._bar.stop()


def make_progress(quiet: bool):
    """A progress bar when stderr is a terminal and not ``quiet``, else nothing."""
    if quiet or not sys.stderr.isatty():
        return None
    return _RichProgress()


class errors_to_exit:
    """Map library errors to one line on stderr and the documented exit code."""

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug

    def __enter__(self) -> None:
        import signal

        from gaecli.stop import clear_stop, request_stop

        clear_stop()
        interrupted = []

        def interrupt(signum, frame):  # SIGTERM cleans up like Ctrl-C; a repeat cannot cut the clean-up short
            if not interrupted:
                interrupted.append(signum)
                request_stop()  # outlives a KeyboardInterrupt that third-party code swallows
                raise KeyboardInterrupt

        self._previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, exc_type, exc, tb) -> bool:
        import signal

        from gaecli.stop import clear_stop, stop_requested

        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        interrupted = stop_requested()
        clear_stop()
        if interrupted and (exc_type is None or not issubclass(exc_type, (KeyboardInterrupt, typer.Exit))):
            # the signal's KeyboardInterrupt was swallowed, or turned into another error, by
            # third-party code: the run stopped at the next batch or unit, or had finished
            done = "every output was written whole" if exc_type is None else "no partial output was left"
            fail(f"interrupted; {done}", 130)
        if (
            exc_type is None
            or issubclass(exc_type, typer.Exit)
            or self.debug
            and not issubclass(exc_type, KeyboardInterrupt)
        ):
            return False
        from gaecli.errors import GAEInputError, GAEUsageError, RunInterrupted

        if isinstance(exc, RunInterrupted) and exc.written + exc.not_written:
            fail(str(exc), 130)  # lists the outputs written and not written
        if issubclass(exc_type, KeyboardInterrupt):
            fail("interrupted; no partial output was left (outputs finished before are whole)", 130)
        if issubclass(exc_type, GAEUsageError):  # before GAEInputError: an InvalidOptionError is both
            fail(str(exc), EXIT_USAGE)
        if issubclass(exc_type, GAEInputError):
            fail(str(exc), EXIT_INVALID_DATA)
        return False


# ----------------------------------------------------------------------------- recompute


@app.command(epilog=EXIT_CODES_HELP)
def recompute(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="Output file (one input file) or directory.")],
    gamma: Annotated[float, typer.Option(help="Discount γ in [0, 1] (required: the trainers' defaults differ).")],
    lambd: Annotated[float, typer.Option(help="GAE λ in [0, 1].")],
    kernel: Annotated[str, typer.Option(help="GAE kernel (see `gae kernels`).")] = "auto",
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    batch_rows: Annotated[int, typer.Option(help="Rows per streamed batch.")] = 256,
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
    advantages_col: Annotated[
        str, typer.Option(help="Name of the advantages column written.", rich_help_panel="Columns")
    ] = "advantages",
    returns_col: Annotated[
        str, typer.Option(help="Name of the returns column written.", rich_help_panel="Columns")
    ] = "returns",
    replace: Annotated[bool, typer.Option("--replace", help="Replace output columns that exist already.")] = False,
    keep_baseline: Annotated[
        bool, typer.Option("--keep-baseline", help="Also write advantages_unmasked and returns_unmasked.")
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
            on_invalid=on_invalid,
            overwrite=overwrite,
            tolerance=tol,
            skip_existing=skip_existing,
            report_paths=reports(JSON=json_path),
        )
        report = recompute_files(
            inputs, output, options, make_progress(quiet), make_engine(engine, workers, ray_address)
        ).to_dict()
    write_json(report, json_path)
    if not quiet:
        render_recompute(report, _stderr())


# ----------------------------------------------------------------------------- validate


@app.command(
    epilog="Exit codes: 0 no errors (warnings allowed unless --strict) · 1 errors (or warnings under --strict) · "
    "2 a file could not be read or the command was misused (wins over 1; the readable files are still checked)."
)
def validate(
    inputs: Annotated[
        Optional[list[str]],
        typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.", show_default=False),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail (exit 1) on warnings too.")] = False,
    max_findings: Annotated[
        int, typer.Option("--max-findings", metavar="N", help="List at most N findings; the counts stay exact.")
    ] = 1000,
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
    batch_rows: Annotated[int, typer.Option(help="Rows per streamed batch.")] = 1024,
    values_col: ValuesColOption = "values",
    rewards_col: RewardsColOption = None,
    mask_col: MaskColOption = "loss_mask",
    terminal_col: TerminalColOption = "terminal_reward",
    kl_coef: KLCoefOption = None,
    kl_estimator: KLEstimatorOption = "k1",
    logprobs_col: LogprobsColOption = "log_probs",
    ref_logprobs_col: RefLogprobsColOption = "ref_log_probs",
    engine: EngineOption = "local",
    workers: WorkersOption = None,
    ray_address: RayAddressOption = None,
    json_path: JsonOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Check rollout files for the faults that make GAE silently wrong; findings grouped by rule on stderr."""
    from gaecli.report.validate import render_rules, render_validate
    from gaecli.validate import rules_document, validate_files

    if list_rules:
        write_json(rules_document(), json_path)
        if not quiet and json_path != "-":
            from rich.console import Console

            render_rules(Console(highlight=False))
        return
    if not inputs:
        fail("give at least one INPUT (or --list-rules)", EXIT_USAGE)
    with errors_to_exit(debug):
        id_columns = [name.strip() for name in id_col.split(",")] if id_col is not None else None
        columns = make_columns(
            values_col,
            rewards_col,
            mask_col,
            terminal_col,
            kl_coef=kl_coef,
            kl_estimator=kl_estimator,
            logprobs_col=logprobs_col,
            ref_logprobs_col=ref_logprobs_col,
        )
        report = validate_files(
            inputs,
            columns,
            id_columns=id_columns,
            max_findings=max_findings,
            batch_rows=batch_rows,
            progress=make_progress(quiet),
            engine=make_engine(engine, workers, ray_address),
            report_paths=reports(JSON=json_path),
        )
    document = report.to_dict()
    write_json(document, json_path)
    if not quiet:
        render_validate(document, _stderr(), strict=strict)
    raise typer.Exit(report.exit_code(strict))


# ----------------------------------------------------------------------------- import

import_app = typer.Typer(
    help="Import trainers' dumps into the rollout Parquet format.",
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
)
app.add_typer(
    import_app, name="import", help="Import trainers' dumps (miles, slime, NeMo-RL) into the rollout Parquet format."
)


ImportOutputOption = Annotated[str, typer.Option("--output", "-o", help="The Parquet file (path or URI) to write.")]
ImportOverwriteOption = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output file.")]


def _run_import(
    import_function, inputs: list[str], output: str, overwrite: bool, json_path: Optional[str], quiet: bool, debug: bool
) -> None:
    """What every ``gae import FORMAT`` does: call the importer, write the JSON, print the summary."""
    with errors_to_exit(debug):
        report = import_function(
            inputs, output, overwrite=overwrite, progress=make_progress(quiet), report_paths=reports(JSON=json_path)
        )
    write_json(report.to_dict(), json_path)
    if not quiet:
        from rich.markup import escape

        console = _stderr()
        for line in report.summary_lines():
            console.print(escape(line), soft_wrap=True)


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
    "Import NeMo-RL's train_data_step{N}.jsonl (streamed) into one rollout file; no values column: recompute with "
    "--values-col none.",
)


# ----------------------------------------------------------------------------- diff


@app.command(epilog=EXIT_CODES_HELP)
def diff(
    inputs: Annotated[
        list[str], typer.Argument(metavar="INPUT...", help="Parquet files, directories (recursive) or globs.")
    ],
    gamma: Annotated[float, typer.Option(help="Discount γ in [0, 1] (required: the trainers' defaults differ).")],
    lambd: Annotated[float, typer.Option(help="GAE λ in [0, 1].")],
    baseline: Annotated[
        Optional[str],
        typer.Option(
            metavar="NAME",
            show_default=False,
            help="Old advantages recomputed with: unmasked (default), skip-masked (verl / AReaL) or zero-masked "
            "(OpenRLHF).",
        ),
    ] = None,
    against: Annotated[
        Optional[str],
        typer.Option(
            metavar="COLUMN",
            help="Compare with advantages stored in COLUMN (e.g. what the trainer used) instead of a baseline.",
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
    normalize_by: Annotated[
        Optional[str], typer.Option(metavar="COLUMN", help="Whiten within groups of rows sharing COLUMN's value.")
    ] = None,
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
    kernel: Annotated[str, typer.Option(help="GAE kernel (see `gae kernels`).")] = "auto",
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    batch_rows: Annotated[int, typer.Option(help="Rows per streamed batch.")] = 256,
    values_col: ValuesColOption = "values",
    rewards_col: RewardsColOption = None,
    mask_col: MaskColOption = "loss_mask",
    terminal_col: TerminalColOption = "terminal_reward",
    kl_coef: KLCoefOption = None,
    kl_estimator: KLEstimatorOption = "k1",
    logprobs_col: LogprobsColOption = "log_probs",
    ref_logprobs_col: RefLogprobsColOption = "ref_log_probs",
    json_path: JsonOption = None,
    markdown: Annotated[
        Optional[str],
        typer.Option(
            "--markdown", metavar="PATH", help="Write the report as Markdown tables to PATH ('-' for stdout)."
        ),
    ] = None,
    html: Annotated[
        Optional[str],
        typer.Option(
            "--html",
            metavar="PATH",
            help="Write one self-contained HTML file with plots to PATH (needs the plot extra).",
        ),
    ] = None,
    per_sample: Annotated[
        Optional[str],
        typer.Option("--per-sample", metavar="PATH", help="Write one Parquet row per sample with its figures to PATH."),
    ] = None,
    engine: EngineOption = "local",
    workers: WorkersOption = None,
    ray_address: RayAddressOption = None,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """How far were the old advantages off? Masked GAE against a baseline or stored advantages,
    over trainable tokens."""
    if json_path == "-" and markdown == "-":
        fail("--json and --markdown cannot both write to stdout ('-')", EXIT_USAGE)
    with errors_to_exit(debug):
        from gaecli.diff import DiffOptions, diff_files
        from gaecli.report import write_text
        from gaecli.report.markdown import render_markdown
        from gaecli.report.terminal import render_diff

        if html is not None:
            from gaecli.report.html import require_matplotlib

            require_matplotlib()
        options = DiffOptions(
            gamma=gamma,
            lambd=lambd,
            baseline=baseline,
            against=against,
            against_returns=against_returns,
            normalize=normalize,
            normalize_by=normalize_by,
            group_by=group_by,
            id_col=id_col,
            top=top,
            tolerance=tol,
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
            ),
            per_sample=per_sample,
            report_paths=reports(JSON=json_path, Markdown=markdown, HTML=html),
        )
        report = diff_files(inputs, options, make_progress(quiet), make_engine(engine, workers, ray_address))
        document = report.to_dict()
        write_json(document, json_path)
        if markdown is not None:
            write_text(markdown, render_markdown(document))
        if html is not None:
            from gaecli.report.html import render_html

            write_text(html, render_html(report))
    if not quiet:
        render_diff(document, _stderr())


def main() -> None:
    """Console-script entry point."""
    app()
