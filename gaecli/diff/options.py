"""The options of ``gae diff`` (the CLI options, one to one), checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gaecli.advantages.contract import CRITIC_FREE, expand_baselines
from gaecli.advantages.normalization import WhiteningRule
from gaecli.advantages.spec import AdvantageSpec
from gaecli.comparison.token_sample import SCATTER_SAMPLE
from gaecli.errors import InvalidOptionError
from gaecli.io.format import Columns
from gaecli.options import ON_INVALID_MODES, check_choice, check_count
from gaecli.pipeline.description import ComparisonSide, RunOptions
from gaecli.pipeline.options import EstimatorInputs, VariantOptions, check_estimators

DEFAULT_TOP = 10
DEFAULT_BASELINE = "unmasked"


@dataclass(frozen=True)
class DiffOptions(RunOptions):
    """Everything that shapes a diff (the CLI options, one to one).

    New advantages: :attr:`new_spec`. Old advantages (:attr:`sides`): ``old_estimator``
    (another estimator recomputed, alone), or ``against``, the stored column (and
    ``against_returns`` the stored returns), and ``baseline``, a comma list of trainer
    profiles (or aliases, or ``all``) each recomputed from the same data, either or both
    (both: the stored column first, then every baseline; neither: ``unmasked``).
    ``normalize`` / ``normalize_by`` whiten new and every old side the same way, each with
    its own statistics. ``groups_out``: a Parquet file to write every ``group_by`` group's
    figures to (every comparison's, with a ``comparison`` column). ``overwrite``: replace
    an existing ``per_sample`` or ``groups_out`` file (refused otherwise, as data outputs are).
    ``report_paths``: files the caller will write reports to, paths or (role, path) pairs
    (refused when one is an input or another output). ``variants``: the GAE variants of
    the new side only (docs/variants.md); the old sides stay the baselines and the stored column.
    ``estimator``: the new side's estimator (``gae``, masked GAE, or a critic-free one of
    docs/estimators.md); ``old_estimator``: another estimator recomputed on the same rows as
    the old side (exclusive with ``against`` and ``baseline``); a critic-free new side needs
    one of ``old_estimator`` and ``against``, and takes no ``baseline`` (the profiles are
    GAE). ``group_by_id`` / ``step_by``: the prompt-group and step id columns the estimators
    read; ``gamma`` / ``lambd`` are given exactly where a side reads them (GAE, a GAE
    baseline, ``reinforce++``). ``on_invalid``: ``"stop"`` (the first invalid row stops the
    diff) or ``"skip"`` (invalid rows are left out of every comparison, counted and named in the
    report, and written whole with their reason to ``rejects``, a Parquet file, when given).
    Every value is checked when the options are made (:meth:`check`).
    """

    gamma: Optional[float] = None
    lambd: Optional[float] = None
    baseline: Optional[str] = None
    against: Optional[str] = None
    against_returns: Optional[str] = None
    normalize: bool = False
    normalize_by: Optional[str] = None
    group_by: Optional[str] = None
    id_col: Optional[str] = None
    top: int = DEFAULT_TOP
    tolerance: float = 1e-6
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: Optional[int] = None
    columns: Columns = field(default_factory=Columns)
    per_sample: Optional[str] = None
    variants: VariantOptions = field(default_factory=VariantOptions)
    groups_out: Optional[str] = None
    overwrite: bool = False
    report_paths: tuple = ()
    scatter_sample: int = SCATTER_SAMPLE
    estimator: str = "gae"
    old_estimator: Optional[str] = None
    group_by_id: Optional[str] = None
    step_by: Optional[str] = None
    estimator_inputs: EstimatorInputs = field(default_factory=EstimatorInputs)
    whitening_rule: Optional[WhiteningRule] = None
    advantage_clip: Optional[float] = None
    on_invalid: str = "stop"
    rejects: Optional[str] = None

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) a value out of range or not one of its
        choices, a kernel or device not usable here, and contradicting options."""
        self._check_old_side_options()
        if self.groups_out is not None and self.group_by is None:
            raise InvalidOptionError("--groups-out needs --group-by (the column whose groups it lists)")
        check_estimators(
            self.side_estimators,
            self.gamma,
            self.lambd,
            self.group_by_id,
            self.step_by,
            self.whitening,
            self.estimator_inputs,
            self.whitening_rule,
            self.variants.turn_rewards_col,
        )
        if self.against_returns is not None and self.against is None:
            raise InvalidOptionError("--against-returns needs --against (the stored advantages to compare)")
        self.sides  # noqa: B018 - the baseline list checked (unknown names, duplicates)
        check_count("--top", self.top, 0)
        check_choice("--on-invalid", self.on_invalid, ON_INVALID_MODES, "mode")
        if self.rejects is not None and self.on_invalid != "skip":
            raise InvalidOptionError("--rejects needs --on-invalid skip (the rows it holds are the rows skipped)")
        self.check_run()

    def _check_old_side_options(self) -> None:
        """Refuse ``old_estimator`` with ``against`` (each chooses the old advantages;
        ``against`` and ``baseline`` go together, and ``old_estimator`` with ``baseline`` is
        that estimator under those trainers' profiles), a critic-free new side with no old
        side, and a stored column named like a baseline compared with it (the comparisons are
        told apart by name)."""
        if self.old_estimator is not None and self.against is not None:
            raise InvalidOptionError(
                "--old-estimator and --against each choose the old advantages (--old-estimator: another "
                "estimator, with --baseline under trainer profiles; --against: stored in a column): give one of them"
            )
        if self.estimator in CRITIC_FREE and self.old_estimator is None and self.against is None:
            if self.baseline is None:
                from gaecli.advantages.estimator_profiles import profile_names

                profiles = ", --baseline PROFILE (its trainer profiles)" if profile_names(self.estimator) else ""
                raise InvalidOptionError(
                    f"--estimator {self.estimator}: give --old-estimator NAME{profiles} or --against COLUMN as the "
                    "old side"
                )
        if self.against is not None and self.baseline is not None:
            if self.against in expand_baselines(self.baseline, estimator=self.baseline_estimator):
                raise InvalidOptionError(
                    f"--against column {self.against!r} has the name of a baseline of --baseline "
                    f"{self.baseline!r}: the comparisons are told apart by name; rename the column or leave that "
                    "baseline out"
                )

    @property
    def baseline_estimator(self) -> str:
        """The estimator the ``baseline`` profiles compute: ``old_estimator`` when given, else
        the new side's (GAE's profiles for ``gae``)."""
        return self.old_estimator or self.estimator

    @property
    def new_spec(self) -> AdvantageSpec:
        """The new side: what is computed and compared with every old side (its estimator, the
        masked contract with γ and λ or a critic-free estimator, its GAE variants, whitened as
        ``normalize`` / ``normalize_by`` say): that of :attr:`computation`."""
        return self.computation.new_spec

    @property
    def old_sides(self) -> tuple[ComparisonSide, ...]:
        """:attr:`sides`, as :func:`gaecli.pipeline.description.describe_run` reads them."""
        return self.sides

    @property
    def group_col(self) -> Optional[str]:
        """The prompt-group id column of the estimators (``--group-col``)."""
        return self.group_by_id

    @property
    def side_estimators(self) -> tuple[str, ...]:
        """The estimators computed: the new side's, then the old sides' when recomputed
        (``gae`` for a GAE baseline)."""
        if self.against is not None and self.baseline is None:
            return (self.estimator,)
        return (self.estimator, self.baseline_estimator if self.baseline is not None else self.old_estimator or "gae")

    @property
    def sides(self) -> tuple[ComparisonSide, ...]:
        """The old sides, in the order given: another estimator (``old_estimator``), or the
        stored columns of ``against`` first, then each name of the ``baseline`` list (``all``
        expanded) recomputed (``unmasked`` alone when neither is given)."""
        if self.old_estimator is not None and self.baseline is None:
            return (ComparisonSide.from_estimator(self.old_estimator),)
        stored = () if self.against is None else (ComparisonSide.stored(self.against, self.against_returns),)
        baseline = self.baseline if self.baseline is not None or stored else DEFAULT_BASELINE
        estimator = self.baseline_estimator
        baselines = () if baseline is None else expand_baselines(baseline, estimator=estimator)
        profiled = None if estimator == "gae" else estimator
        return (*stored, *(ComparisonSide.baseline(name, profiled) for name in baselines))
