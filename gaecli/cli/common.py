"""What every ``gae`` command shares: the typer app, the exit codes, the one-line error and
its exit code (:class:`errors_to_exit`), the JSON writer, and the options several commands
take (columns, KL rewards, engines; grouped in :mod:`gaecli.cli.option_groups`). Heavy
modules are imported inside the functions so that ``gae --help`` starts fast."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from gaecli.cli.examples import with_examples
from gaecli.errors import EXIT_INTERRUPTED, EXIT_USAGE, exit_code

EXIT_CODES_HELP = (
    "Exit codes: 0 success · 1 the input data is invalid (rows that break the format) · "
    "2 usage error, unreadable or unwritable file, refused operation."
)

# ----------------------------------------------------------------------------- help


def option_choices() -> dict[str, tuple[str, ...]]:
    """The values of every option that takes one of a closed set, by option name, from the
    library's constants (imported when a help is shown, not when a command runs). An option
    of a closed set joins here; its help then lists them."""
    from gaecli.advantages.contract import BASELINES, MASKED, TIMESTEPS
    from gaecli.advantages.kernels import AUTO, KERNELS
    from gaecli.advantages.kl import KL_ESTIMATORS
    from gaecli.engines import ENGINES
    from gaecli.options import DEVICE_TYPES, ON_INVALID_MODES

    return {
        "--kernel": (AUTO, *KERNELS),
        "--device": DEVICE_TYPES,
        "--on-invalid": ON_INVALID_MODES,
        "--baseline": (MASKED, *BASELINES),
        "--timestep": TIMESTEPS,
        "--kl-estimator": tuple(KL_ESTIMATORS),
        "--engine": ENGINES,
    }


CHOICES_METAVAR_WIDTH = 10
"""Choices up to this many characters joined (``stop|skip``) are the option's metavar; longer
sets show ``NAME`` and list the choices after the help."""

TYPE_METAVARS = {int: "N", float: "NUMBER", str: "TEXT"}
"""The metavar of an option without one, by the type of its value; a ``…-col`` option's is ``COLUMN``."""


def _literal(text: Optional[str]) -> Optional[str]:
    """``text`` as shown: its square brackets kept literally in rich markup (``gaecli[ray]``),
    the line breaks within a paragraph of a docstring made spaces (typer keeps them in a
    command list)."""
    if text is None:
        return None
    import inspect

    from rich.markup import escape

    paragraphs = inspect.cleandoc(text).split("\n\n")
    return escape("\n\n".join(" ".join(paragraph.split("\n")) for paragraph in paragraphs))


class _ReadableHelp:
    """What the commands' help shows beyond typer's defaults: help texts literal (no rich
    markup eats ``[ray]``), readable metavars (``N``, ``COLUMN``, nothing for a flag) instead
    of ``<int>`` or ``<bool>``, the choices of every option of :func:`option_choices`, and a
    usage line ``[OPTIONS] INPUT...``."""

    def _literal_texts(self) -> None:
        for attribute in ("help", "epilog", "short_help"):
            setattr(self, attribute, _literal(getattr(self, attribute)))
        for param in self.params:
            if getattr(param, "help", None):
                param.help = _literal(param.help)

    def _readable_params(self, ctx) -> None:
        if getattr(self, "_readable", False):
            return
        self._readable = True
        choices = option_choices()
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                param.display_type_rich = _no_type  # the name column shows the argument's metavar
                continue
            long_name = next((name for name in param.opts if name.startswith("--")), None)
            extra = []
            if long_name in choices:
                names = choices[long_name]
                joined = "|".join(names)
                param.metavar = joined if len(joined) <= CHOICES_METAVAR_WIDTH else "NAME"
                if param.metavar == "NAME":
                    extra.append(f"[choices: {', '.join(names)}]")
            elif param.metavar is None:
                value_type = param.type_descriptor.annotation
                if param.is_flag:
                    param.metavar = ""
                elif value_type is str and param.name.endswith("_col"):
                    param.metavar = "COLUMN"
                else:
                    param.metavar = TYPE_METAVARS.get(value_type, "VALUE")
            number_range = param._get_number_range_help_str()
            if number_range:
                extra.append(f"[range: {number_range}]")
                param._get_number_range_help_str = _no_type
            if extra:
                param.help = " ".join([param.help or "", *(_literal(text) for text in extra)]).strip()

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or param.name.upper() + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx, formatter) -> None:
        self._readable_params(ctx)
        super().format_help(ctx, formatter)


def _no_type(*args, **kwargs) -> None:
    """An argument's type in the help: none shown (its metavar says it)."""
    return None


class GaeCommand(_ReadableHelp, TyperCommand):
    """A ``gae`` command: typer's, with :class:`_ReadableHelp` and its examples (:mod:`gaecli.cli.examples`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._literal_texts()
        self.epilog = with_examples(self.name, self.epilog)


class GaeGroup(_ReadableHelp, TyperGroup):
    """A ``gae`` command group: typer's, with :class:`_ReadableHelp` and its examples."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._literal_texts()
        self.epilog = with_examples(self.name, self.epilog)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return TyperGroup.collect_usage_pieces(self, ctx)


class GaeTyper(typer.Typer):
    """A typer app whose commands and groups are :class:`GaeCommand` and :class:`GaeGroup`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("cls", GaeGroup)
        super().__init__(*args, **kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", GaeCommand)
        return super().command(*args, **kwargs)


app = GaeTyper(
    name="gae",
    help="Recompute PPO advantages (GAE) from rollout dumps with the masked semantics, "
    "see how far the old ones were off, and validate the dumps.\n\n" + EXIT_CODES_HELP,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,  # gae --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)

WRITE_PATH_OPTIONS = ("--output", "--json", "--markdown", "--html", "--per-sample", "--groups-out", "--rejects")
"""Every option that names a path a command writes. Each is declared with
:func:`write_path_option` (metavar ``PATH``, which no other option has) and reaches
:func:`gaecli.io.paths.check_writes` before any work; tests/test_paths.py runs every such
option of every command onto an input and onto an existing file."""


def write_path_option(flag: str, *short: str, help: str, **kwargs):
    """The ``typer.Option`` of a path a command writes (``flag`` one of :data:`WRITE_PATH_OPTIONS`)."""
    if flag not in WRITE_PATH_OPTIONS:
        raise ValueError(f"{flag}: a path written is one of WRITE_PATH_OPTIONS (and checked: tests/test_paths.py)")
    return typer.Option(flag, *short, metavar="PATH", help=help, **kwargs)


JsonOption = Annotated[
    Optional[str], write_path_option("--json", help="Write the result as JSON to PATH ('-' for stdout).")
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No human summary and no progress bar on stderr.")]


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    """Print one line to stderr and exit with ``code`` (``message`` as
    :func:`gaecli.errors.displayed_message` shows it, the lines of a list kept)."""
    from rich.markup import escape

    from gaecli.errors import displayed_message

    stderr_console().print(f"[bold red]error:[/] {escape(displayed_message(message, lines=True))}", soft_wrap=True)
    raise typer.Exit(code)


def write_json(document: Any, path: str | None) -> None:
    """Write ``document`` as JSON to ``path`` ('-' = stdout); nothing when path is None."""
    if path is None:
        return
    from gaecli.report import json_text

    text = json_text(document)
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
ResponseMaskColOption = Annotated[
    Optional[str],
    typer.Option(
        "--response-mask-col",
        metavar="COLUMN",
        show_default=False,
        help="Column of a 0/1 response mask (SkyRL's response_mask; default: every token): the tokens whitening "
        "over the response counts (--norm-tokens response, --norm-like skyrl; reinforce++ --baseline skyrl). "
        "Checked like the loss mask, which it must hold.",
        rich_help_panel="Columns",
    ),
]
TerminalColOption = Annotated[
    str, typer.Option("--terminal-col", help="Column of the scalar terminal reward.", rich_help_panel="Columns")
]
BatchRowsOption = Annotated[
    Optional[int],
    typer.Option(
        metavar="N",
        show_default=False,
        help="Rows per streamed batch. [default: rows for about a million tokens from the file's footer, at least 256]",
    ),
]
OnInvalidOption = Annotated[
    str,
    typer.Option(
        "--on-invalid",
        help="stop: the first invalid row stops the run (exit 1); skip: invalid rows are left out, counted and "
        "named in the report (recompute writes them to OUTPUT.rejected.parquet, diff to --rejects PATH).",
    ),
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
    opd_coef: Optional[float] = None,
    teacher_logprobs_col: str = "teacher_log_probs",
    opd_stage: str = "before-whiten",
    old_opd_coef: Optional[float] = None,
    response_mask_col: Optional[str] = None,
    **outputs,
):
    """The Columns of the shared column and KL options. ``rewards_col`` None: ``rewards``,
    or no rewards column when ``kl_coef`` is given; 'none': no rewards column.
    ``response_mask_col``: ``--response-mask-col`` (None: none, every token)."""
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
        teacher_log_probs=teacher_logprobs_col,
        opd_coef=opd_coef,
        opd_stage=opd_stage,
        old_opd_coef=old_opd_coef,
        response_mask=response_mask_col,
        **outputs,
    )


def error_document(error: Optional[BaseException], message: str, code: int) -> dict:
    """The JSON document of a run that failed (what ``--json -`` prints instead of the
    report): ``{"error": {"exit_code", "code", "message", "file", "row", "column"}}``, the
    rule's code and where it broke from the finding of invalid data, None where not known."""
    from gaecli import __version__

    finding = getattr(error, "finding", None)
    where = {key: getattr(finding, key, None) for key in ("code", "file", "row", "column")}
    return {"version": __version__, "error": {"exit_code": code, "message": message, **where}}


class errors_to_exit:
    """Map library errors to one line on stderr and the documented exit code; with
    ``json_path`` '-' (``--json -``), a JSON error document (:func:`error_document`) on
    stdout too, so that a reader of stdout always gets a document."""

    def __init__(self, debug: bool = False, json_path: Optional[str] = None) -> None:
        self.debug = debug
        self.json_path = json_path

    def _fail(self, error: Optional[BaseException], message: str, code: int) -> NoReturn:
        if self.json_path == "-":
            from gaecli.errors import displayed_message
            from gaecli.report import json_text

            document = error_document(error, displayed_message(message, lines=True), code)
            try:
                typer.echo(json_text(document), nl=False)
            except OSError:  # stdout gone or full: the line on stderr and the exit code still say it
                pass
        fail(message, code)

    def __enter__(self) -> None:
        import signal

        from gaecli.stop import clear_stop, interruptible, quiet_swallowed_interrupts, request_stop

        clear_stop()
        quiet_swallowed_interrupts()
        interrupted = []

        def interrupt(signum, frame):  # SIGTERM cleans up like Ctrl-C; a repeat cannot cut the clean-up short
            if not interrupted:
                interrupted.append(signum)
                request_stop()  # outlives a KeyboardInterrupt that third-party code swallows
                if interruptible(frame):  # else the run stops at its next check
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
            self._fail(exc, f"interrupted; {done}", EXIT_INTERRUPTED)
        if (
            exc_type is None
            or issubclass(exc_type, typer.Exit)
            or self.debug
            and not issubclass(exc_type, KeyboardInterrupt)
        ):
            return False
        from gaecli.errors import RunInterrupted

        if isinstance(exc, RunInterrupted) and exc.written + exc.not_written:
            self._fail(exc, str(exc), EXIT_INTERRUPTED)  # lists the outputs written and not written
        if issubclass(exc_type, KeyboardInterrupt):
            message = "interrupted; no partial output was left (outputs finished before are whole)"
            self._fail(exc, message, EXIT_INTERRUPTED)
        code = exit_code(exc)
        if code is not None:
            self._fail(exc, str(exc), code)
        return False
