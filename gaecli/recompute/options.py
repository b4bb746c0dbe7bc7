"""The options and the report of a recompute run (the library side of ``gae recompute``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gaecli._version import __version__
from gaecli.advantages.contract import CRITIC_FREE, expand_baselines
from gaecli.advantages.normalization import WhiteningRule
from gaecli.errors import (
    InvalidOptionError,
)
from gaecli.io.format import Columns
from gaecli.options import ON_INVALID_MODES, check_choice
from gaecli.pipeline.description import ComparisonSide, RunOptions
from gaecli.pipeline.options import EstimatorInputs, VariantOptions, check_estimators

REJECTS_SUFFIX = ".rejected"
METADATA_PREFIX = "gaecli."


@dataclass(frozen=True)
class RecomputeOptions(RunOptions):
    """Everything that shapes a recompute run (the CLI options, one to one).

    ``normalize``: whiten the advantages over all trainable tokens of all inputs;
    ``normalize_by``: whiten within groups of rows sharing this column's value (implies
    normalize: ``normalize`` is then True). ``on_invalid``: ``"stop"`` (first invalid row
    stops the run) or ``"skip"`` (invalid rows go whole to ``<output>.rejected.parquet`` with
    a ``reason`` column).
    Every value is checked when the options are made (:meth:`check`).
    ``report_paths``: files the caller will write reports to (e.g. ``--json``), refused
    before any work when one is an input or an output (:func:`gaecli.io.paths.check_writes`).
    ``variants``: the GAE variants of the new advantages (docs/variants.md).
    ``estimator``: ``gae`` or a critic-free estimator (docs/estimators.md), with ``group_by``
    (the prompt-group id column) and ``step_by`` (the step id column) where it reads them;
    ``gamma`` / ``lambd`` are given exactly where the estimator reads them. A critic-free run
    computes no baseline (its summary compares the new advantages with themselves) unless
    ``baseline`` names one of the estimator's trainer profiles, which ``keep_baseline`` then
    writes too.
    """

    gamma: Optional[float] = None
    lambd: Optional[float] = None
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: Optional[int] = None
    columns: Columns = field(default_factory=Columns)
    normalize: bool = False
    normalize_by: Optional[str] = None
    replace: bool = False
    keep_baseline: bool = False
    baseline: str = "unmasked"
    on_invalid: str = "stop"
    overwrite: bool = False
    tolerance: float = 1e-6
    skip_existing: bool = False
    variants: VariantOptions = field(default_factory=VariantOptions)
    report_paths: tuple = ()  # paths (or (role, path) pairs) the caller writes reports to: checked, never written here
    estimator: str = "gae"
    group_by: Optional[str] = None
    step_by: Optional[str] = None
    estimator_inputs: EstimatorInputs = field(default_factory=EstimatorInputs)
    whitening_rule: Optional[WhiteningRule] = None
    advantage_clip: Optional[float] = None

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) a value out of range or not one of its
        choices, a kernel or device not usable here, and contradicting options."""
        check_estimators(
            (self.estimator,),
            self.gamma,
            self.lambd,
            self.group_by,
            self.step_by,
            self.whitening,
            self.estimator_inputs,
            self.whitening_rule,
            self.variants.turn_rewards_col,
        )
        if self.critic_free and self.keep_baseline and not self.profiled:
            from gaecli.advantages.estimator_profiles import profile_names

            profiles = profile_names(self.estimator)
            if not profiles:
                raise InvalidOptionError(
                    f"--keep-baseline: --estimator {self.estimator} has no trainer profile to keep"
                )
            raise InvalidOptionError(
                f"--keep-baseline: give --baseline PROFILE, the trainer profile of {self.estimator} to keep: "
                f"one of {', '.join(profiles)}"
            )
        estimator = self.estimator if self.profiled else "gae"
        if len(expand_baselines(self.baseline, "baseline", estimator=estimator)) != 1:
            raise InvalidOptionError(f"baseline: {self.baseline!r} names several baselines; recompute takes one")
        check_choice("--on-invalid", self.on_invalid, ON_INVALID_MODES, "mode")
        self.check_run()
        if self.skip_existing and self.overwrite:
            raise InvalidOptionError(
                "--skip-existing keeps existing outputs and --overwrite replaces them: give one of them"
            )
        check_written_columns(self.written_columns, self.read_columns)

    @property
    def group_col(self) -> Optional[str]:
        """The prompt-group id column of the estimators (``--group-col``)."""
        return self.group_by

    @property
    def profiled(self) -> bool:
        """Whether ``baseline`` names a trainer profile of the critic-free estimator
        (docs/estimators.md#trainer-profiles-of-the-estimators): the old side is then that."""
        if not self.critic_free:
            return False
        from gaecli.advantages.estimator_profiles import profile_names

        return self.baseline in profile_names(self.estimator)

    @property
    def old_sides(self) -> tuple[ComparisonSide, ...]:
        """The old side the summary compares with: the ``baseline`` recomputed — a GAE profile,
        or for a critic-free estimator its trainer profile (none when ``baseline`` names none of
        its profiles, as the default does)."""
        if self.profiled:
            return (ComparisonSide.baseline(self.baseline, self.estimator),)
        return () if self.critic_free else (ComparisonSide.baseline(self.baseline),)

    @property
    def critic_free(self) -> bool:
        """Whether the estimator reads no values (and no baseline is computed)."""
        return self.estimator in CRITIC_FREE

    @property
    def written_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column name) of every column a run adds to its outputs, in order."""
        columns = self.columns
        written = [("--advantages-col", columns.advantages), ("--returns-col", columns.returns)]
        if self.keep_baseline:
            written += [("--keep-baseline", name) for name in self.baseline_columns]
        return tuple(written)

    @property
    def read_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column name) of every column a run reads by name (the token columns,
        the terminal reward, the grouping, step and normalization columns, the variants')."""
        columns, variants = self.columns, self.variants
        named = [
            ("--values-col", columns.values),
            ("--rewards-col", columns.rewards),
            ("--mask-col", columns.loss_mask),
            ("--terminal-col", columns.terminal_reward),
            ("--normalize-by", self.normalize_by),
            ("--group-col", self.group_by),
            ("--step-col", self.step_by),
            ("--turn-rewards-col", variants.turn_rewards_col),
            ("--truncated-col", variants.truncated_col),
            ("--bootstrap-col", variants.bootstrap_col),
            ("--turn-ids-col", variants.turn_ids_col),
            *self.estimator_inputs.read_columns(),
        ]
        if columns.kl_coef is not None or columns.reads_teacher or self.estimator == "optimal-token-baseline":
            named.append(("--logprobs-col", columns.log_probs))
        if columns.kl_coef is not None:
            named.append(("--ref-logprobs-col", columns.ref_log_probs))
        if columns.reads_teacher:
            named.append(("--teacher-logprobs-col", columns.teacher_log_probs))
        return tuple((flag, name) for flag, name in named if name is not None)

    @property
    def baseline_columns(self) -> tuple[str, str]:
        """``advantages_<baseline>``, ``returns_<baseline>`` (``-`` turned into ``_``)."""
        return ComparisonSide.baseline(self.baseline).output_columns


def check_written_columns(written: tuple[tuple[str, str], ...], read: tuple[tuple[str, str], ...]) -> None:
    """Refuse (:class:`InvalidOptionError`, naming both options) a written column without a
    name, two written columns of one name, and a written column that the run reads (even
    with ``--replace``, which lets a written column replace a column the run does not read:
    the check against each input's columns is :func:`gaecli.recompute.output.check_job`)."""
    seen: dict[str, str] = {}
    for flag, name in written:
        if not name.strip():
            raise InvalidOptionError(f"{flag} {name!r}: a column needs a name")
        if name in seen:
            raise InvalidOptionError(
                f"{seen[name]} and {flag} both name the output column {name!r}; give each its own name"
            )
        seen[name] = flag
    for flag, name in read:
        if name in seen:
            raise InvalidOptionError(
                f"{seen[name]} names the output column {name!r}, which {flag} reads; choose another name"
            )


@dataclass
class FileOutcome:
    """What became of one input file (``file``: the input, named so in every command's JSON).
    ``recomputed``: why ``--skip-existing`` recomputed an output that was in place (computed
    from another input, or an input changed since); None otherwise."""

    file: str
    output: str
    rows: int = 0
    tokens: int = 0
    rejected_rows: int = 0
    rejects_file: Optional[str] = None
    skipped: bool = False
    recomputed: Optional[str] = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RecomputeReport:
    """The result of a run: files written, kernel used, and the comparison summary."""

    files: list[FileOutcome]
    kernel: str
    options: RecomputeOptions
    summary: dict

    @property
    def rejected_rows(self) -> int:
        return sum(f.rejected_rows for f in self.files)

    def to_dict(self) -> dict:
        return {
            "version": __version__,
            "gamma": self.options.gamma,
            "lambd": self.options.lambd,
            "estimator": self.options.estimator,
            "group_col": self.options.group_by,
            "step_col": self.options.step_by,
            "kernel": self.kernel,
            "normalize": self.options.computation.new_spec.normalize_label,
            "files": [f.to_dict() for f in self.files],
            "rows": sum(f.rows for f in self.files),
            "rejected_rows": self.rejected_rows,
            "summary": self.summary,
        }
