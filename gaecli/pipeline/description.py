"""What a run computes, as one immutable object: :class:`Computation` (the new side's spec,
the old sides, each a spec or stored columns, the columns, kernel, device, batch size and what
invalid rows do), built by one function, :func:`describe_run`, from the options of any
command (recompute's, diff's, and so the table functions'), checked where the options are.
Picklable: the engines send it to every work unit."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Optional

from gaecli.advantages.contract import (
    CARRIED,
    CRITIC_FREE,
    GROUPED_ESTIMATORS,
    TURN_ROW_ESTIMATORS,
    WHITENED_ESTIMATORS,
    profile_variants,
)
from gaecli.advantages.spec import AdvantageSpec, check_advantage_clip, check_whitening_rule, estimator_spec
from gaecli.errors import InvalidOptionError
from gaecli.io.format import Columns
from gaecli.options import check_count, check_number
from gaecli.pipeline.options import VariantOptions, check_device

WHITENING_FLAGS = {"normalize": "--normalize", "rule": "--norm-like/--norm-*", "estimator": "--estimator"}
"""How the commands name the whitening and its rule in a refusal."""

BASELINE = "baseline"
"""A side recomputed from the same values, rewards and mask under a trainer profile."""

STORED = "stored"
"""A side read from columns stored in the file (``--against``)."""

ESTIMATOR = "estimator"
"""A side recomputed from the same data by another estimator (``--old-estimator``,
docs/estimators.md) under the masked contract."""


@dataclass(frozen=True)
class ComparisonSide:
    """One old side (hashable, picklable): its ``kind`` (:data:`BASELINE`, :data:`STORED` or
    :data:`ESTIMATOR`), its ``name`` in the reports (the profile or alias as given, the stored
    advantages column, or the estimator), the ``semantics`` recomputed (baselines only), the
    stored columns (stored sides only; ``returns_column`` may be None) and the ``estimator``
    (estimator sides only). What recomputes it: :func:`old_side_spec`."""

    kind: str
    name: str
    semantics: Optional[str] = None
    advantages_column: Optional[str] = None
    returns_column: Optional[str] = None
    estimator: Optional[str] = None

    @classmethod
    def baseline(cls, semantics: str, estimator: Optional[str] = None) -> "ComparisonSide":
        """A trainer profile (or an alias of one) recomputed, named as given: of GAE, or with
        ``estimator`` that critic-free estimator's profile (docs/estimators.md#trainer-profiles-of-the-estimators)."""
        return cls(BASELINE, semantics, semantics=semantics, estimator=estimator)

    @classmethod
    def stored(cls, advantages_column: str, returns_column: Optional[str] = None) -> "ComparisonSide":
        """Advantages (and returns, optional) stored in the file, named by the advantages column."""
        return cls(STORED, advantages_column, advantages_column=advantages_column, returns_column=returns_column)

    @classmethod
    def from_estimator(cls, estimator: str) -> "ComparisonSide":
        """Another estimator recomputed on the same rows, named by the estimator."""
        return cls(ESTIMATOR, estimator, estimator=estimator)

    @property
    def gae_semantics(self) -> Optional[str]:
        """The GAE profile this side recomputes (the terminal-credit and lost-reward figures
        read it), None for a stored side, an estimator or an estimator's trainer profile."""
        return self.semantics if self.estimator is None else None

    @property
    def recomputed(self) -> bool:
        return self.kind != STORED

    @property
    def output_columns(self) -> tuple[str, str]:
        """``advantages_<name>``, ``returns_<name>`` (``-`` turned into ``_``, ``+`` into ``p``): the columns a
        recomputed side is written to (``gae recompute --keep-baseline``) and named by in
        messages."""
        suffix = self.name.replace("-", "_").replace("+", "p").replace("@", "_")
        return f"advantages_{suffix}", f"returns_{suffix}"

    def to_dict(self) -> dict:
        """The ``old`` object of the JSON reports: ``source``, ``baseline``,
        ``advantages_column``, ``returns_column``, and for an estimator side ``estimator``."""
        record = {
            "source": self.kind,
            "baseline": self.semantics,
            "advantages_column": self.advantages_column,
            "returns_column": self.returns_column,
        }
        if self.estimator is not None:
            record["estimator"] = self.estimator
        return record


def reads_turns(side: ComparisonSide) -> bool:
    """Whether an old side is a turn estimator, which reads ``--turn-rewards-col`` as the new
    side's GAE variants do (:data:`gaecli.advantages.contract.TURN_ESTIMATORS`)."""
    from gaecli.advantages.contract import TURN_ESTIMATORS, TURN_ROW_ESTIMATORS

    return side.kind == ESTIMATOR and side.estimator in (*TURN_ESTIMATORS, *TURN_ROW_ESTIMATORS)


def old_side_spec(
    side: ComparisonSide, gamma: float | None, lambd: float | None, *ids, variants=None, **inputs
) -> AdvantageSpec | None:
    """What recomputes ``side`` (None for a stored side): GAE with γ, λ under its semantics,
    with those of the GAE ``variants`` (spec fields, the new side's) its profile takes
    (:func:`gaecli.advantages.contract.profile_variants`: ``areal``'s truncation bootstrap), or
    its estimator with the parameters, per-row ids (``ids``: the group and step id columns,
    each optional) and estimator inputs (``inputs``: spec fields) that estimator reads
    (:func:`gaecli.advantages.spec.estimator_spec`: one set of options serves every side)."""
    if side.kind == ESTIMATOR:
        return estimator_spec(side.estimator, gamma, lambd, *ids, **inputs)
    if side.kind == BASELINE and side.estimator is not None:  # a trainer's profile of a critic-free estimator
        return estimator_spec(side.estimator, gamma, lambd, *ids, semantics=side.semantics, **inputs)
    if not side.recomputed:
        return None
    taken = {name: (variants or {}).get(name) for name in profile_variants(side.semantics)}
    return AdvantageSpec(gamma, lambd, side.semantics, **taken)


@dataclass(frozen=True)
class TurnColumns:
    """The columns of turn rows (docs/episodes.md): the episode id, the turn index, the turn's
    own reward (None in ``gae validate`` where not given), the episode group id and (gigpo's)
    the anchor-state id (None where not read)."""

    episode: str
    turn: str
    turn_rewards: Optional[str]
    group: Optional[str]
    state: Optional[str] = None

    def names(self) -> tuple[str, ...]:
        """The columns named, each once."""
        named = (self.episode, self.turn, self.turn_rewards, self.group, self.state)
        return tuple(dict.fromkeys(name for name in named if name is not None))


@dataclass(frozen=True)
class Computation:
    """What a run computes (picklable; the kernel resolved): made by :func:`describe_run`.

    ``new_spec``: the new side (its estimator, the masked contract with γ, λ and its GAE
    variants, or a critic-free estimator; its whitening, applied around the kernel, included:
    what the output metadata records); ``old_sides``: the old sides of the comparison, each
    with its spec in ``old_specs`` (None for stored columns), empty when nothing is compared
    (a critic-free recompute); ``columns``: the columns read (no values column when no side
    reads values); ``on_invalid``: ``"stop"`` raises on the first invalid row, ``"skip"``
    computes the valid rows only."""

    new_spec: AdvantageSpec
    old_sides: tuple[ComparisonSide, ...]
    old_specs: tuple[Optional[AdvantageSpec], ...]
    columns: Columns
    kernel: str
    device: str = "cpu"
    batch_rows: Optional[int] = None
    on_invalid: str = "stop"

    @property
    def normalize_by(self) -> Optional[str]:
        """The ``--normalize-by`` column (None: whitened over the whole input, or not at all)."""
        return self.new_spec.normalize_by

    @property
    def whitening(self) -> bool:
        """Whether ``--normalize`` / ``--normalize-by`` whiten every side."""
        return self.new_spec.normalize != "none"

    @cached_property
    def variants(self) -> VariantOptions:
        """The GAE variants of the new side, as the commands name their columns."""
        spec = self.new_spec
        return VariantOptions(
            spec.timestep,
            spec.lambd_critic,
            spec.lambd_alpha,
            None if spec.over_episodes else spec.turn_rewards,  # a turn row's: a number
            spec.truncated,
            spec.bootstrap_values,
            lambd_schedule=spec.lambd_schedule,
            lambd_q=spec.lambd_q,
            turn_ids_col=spec.turn_ids,
        )

    @property
    def specs(self) -> tuple[AdvantageSpec, ...]:
        """The specs computed here: the new one, then that of every recomputed old side."""
        return (self.new_spec, *(spec for spec in self.old_specs if spec is not None))

    @property
    def group_by(self) -> Optional[str]:
        """The prompt-group id column a side reads (``--group-col``; None: none does)."""
        return next((spec.group_by for spec in self.specs if spec.group_by is not None), None)

    @property
    def step_by(self) -> Optional[str]:
        """The step id column a side reads (``--step-col``; None: none does)."""
        return next((spec.step_by for spec in self.specs if spec.step_by is not None), None)

    @property
    def stored_columns(self) -> tuple[str, ...]:
        """The stored columns the old sides read (``--against``, ``--against-returns``)."""
        names = [name for side in self.old_sides for name in (side.advantages_column, side.returns_column)]
        return tuple(name for name in names if name is not None)

    @property
    def critic_free(self) -> bool:
        """Whether a side computed here is a critic-free estimator (docs/estimators.md)."""
        return any(spec.critic_free for spec in self.specs)

    @property
    def needs_scores(self) -> bool:
        """Whether a side needs the score statistics of every file first (a grouped estimator,
        or turn rows)."""
        return any(spec.estimator in GROUPED_ESTIMATORS or spec.over_episodes for spec in self.specs)

    @property
    def episode_carried(self) -> Optional[AdvantageSpec]:
        """The spec whose recursion runs over episodes (masked GAE or reinforce++ with
        ``episode_by``: :data:`gaecli.advantages.contract.CARRIED`), where a side computes one
        (None: none does; :func:`describe_run` refuses two)."""
        return next((spec for spec in self.specs if spec.over_episodes and spec.estimator in CARRIED), None)

    @property
    def n_sides(self) -> int:
        """The old sides the statistics passes keep moments of (at least one: with no old
        side, the new side stands in for it)."""
        return max(1, len(self.old_sides))

    @property
    def estimator_whitened(self) -> tuple[bool, ...]:
        """Which sides (the new one first, then each old side) a ``reinforce++`` estimator
        whitens over the input (``--normalize`` whitens every side, and is refused with them)."""
        specs = (self.new_spec, *self.old_specs)
        whitened = tuple(spec is not None and spec.estimator in WHITENED_ESTIMATORS for spec in specs)
        return whitened + (whitened[0],) * (1 + self.n_sides - len(whitened))

    @property
    def whiten_key(self) -> Optional[str]:
        """The column whose values split the whitening statistics: ``--normalize-by``, or the
        step id of the ``reinforce++`` estimators (None: the whole input)."""
        return self.normalize_by if self.normalize_by is not None else self.step_by

    @property
    def spans_inputs(self) -> bool:
        """Whether a statistics pass runs over every input first (``--normalize``, the
        grouped estimators' scores, ``reinforce++`` whitening): each output then depends on
        every input."""
        return self.whitening or self.needs_scores or any(self.estimator_whitened)

    @property
    def distillation_stage(self) -> Optional[str]:
        """Where the on-policy distillation term (``--opd-coef``) joins the new side's
        advantages (:meth:`side_distillation`)."""
        return self.side_distillation(0)[0]

    def side_distillation(self, index: int) -> tuple[Optional[str], Optional[float]]:
        """Where the on-policy distillation term joins the advantages of side ``index`` (0 the
        new side, ``k`` the ``k``-th old side) and its coefficient: ``--opd-coef`` on the new
        side, ``--old-opd-coef`` on a recomputed old side; at ``before-whiten`` (when
        computed: also when nothing whitens the side) or ``after-whiten`` (after
        ``--normalize`` or the side's estimator's whitening); (None, None) without a term."""
        columns = self.columns
        coef = columns.opd_coef if index == 0 else columns.old_opd_coef
        if coef is None or (index > 0 and self.old_specs[index - 1] is None):
            return None, None
        whitened = self.whitening or self.estimator_whitened[index]
        return (columns.opd_stage if whitened else "before-whiten"), coef

    def estimator_input_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column) of the estimators' own per-row numbers a side reads (remax's
        baseline reward, gdpo's reward components): a null or non-finite value is invalid data."""
        named = []
        for spec in self.specs:
            if spec.baseline_rewards is not None:
                named.append(("--baseline-reward-col", spec.baseline_rewards))
            named += [("--reward-cols", name) for name in spec.reward_components or ()]
        if self.turn_rows is not None and self.turn_rows.turn_rewards is not None:
            named.append(("--turn-rewards-col", self.turn_rows.turn_rewards))
        return tuple(dict.fromkeys(named))

    @cached_property
    def turn_rows(self) -> Optional["TurnColumns"]:
        """The columns of the turn rows a side reads (a turn-row estimator's, or those of masked
        GAE over episodes: one set of options serves every side; None: no side reads turn rows)."""
        turn_rows = [spec for spec in self.specs if spec.over_episodes]
        spec = next((spec for spec in turn_rows if spec.estimator in TURN_ROW_ESTIMATORS), None) or next(
            iter(turn_rows), None
        )
        if spec is None:
            return None
        return TurnColumns(spec.episode_by, spec.turn_by, spec.turn_rewards, spec.group_by, spec.state_by)

    def estimator_token_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column) of the estimators' own per-token numbers a side reads
        (optimal-token-baseline's log-probs and Σπ²): a null list, a length other than the
        mask's, or a null or non-finite value at a trainable token is invalid data."""
        named = []
        for spec in self.specs:
            named += [("--logprobs-col", spec.log_probs), ("--sum-pi-squared-col", spec.sum_pi_squared)]
        return tuple(dict.fromkeys((flag, name) for flag, name in named if name is not None))

    @property
    def token_inputs(self) -> Optional[tuple[str, str]]:
        """The (log-probs, Σπ²) columns of the optimal-token-baseline sides (one set of options
        serves every side; None: no such side)."""
        return next(((spec.log_probs, spec.sum_pi_squared) for spec in self.specs if spec.log_probs), None)

    def id_columns(self) -> tuple[tuple[str, str], ...]:
        """(option, column) of the per-row ids a side reads (group, step): a null id is
        invalid data."""
        named = (("--group-col", self.group_by), ("--step-col", self.step_by))
        turns = self.turn_rows
        if turns is not None:
            named += (("--episode-col", turns.episode), ("--turn-col", turns.turn), ("--state-col", turns.state))
        return tuple((flag, name) for flag, name in named if name is not None)


def columns_read(columns: Columns, estimators) -> Columns:
    """``columns`` as a run of ``estimators`` (the names of its sides' estimators) reads them:
    no values where every one is critic-free, the teacher's log-probs where one is the pure
    ``opd`` (:attr:`Columns.opd_kl`); what ``gae validate --estimator`` checks too."""
    if all(estimator in CRITIC_FREE for estimator in estimators):
        columns = replace(columns, values=None)
    return replace(columns, opd_kl=True) if "opd" in estimators else columns


def describe_run(options) -> Computation:
    """The one place options become a :class:`Computation`: those of ``gae recompute`` or
    ``gae diff`` (:class:`gaecli.RecomputeOptions`, :class:`gaecli.DiffOptions`, whose values
    are checked when made), which name the estimator with γ, λ, the group and step ids, the
    whitening, the GAE variants, the old sides (``options.old_sides``), the columns, kernel,
    device, batch size and ``on_invalid``. The kernel is resolved here for the new side's
    spec (:class:`gaecli.advantages.kernels.KernelUnavailableError` where it cannot run it)."""
    from gaecli.advantages.kernels import resolve_kernel

    normalize = "by" if options.normalize_by is not None else "all" if options.normalize else "none"
    ids = (options.group_col, options.step_by)
    inputs = options.estimator_inputs.spec_fields(options.columns)
    new_spec = estimator_spec(
        options.estimator,
        options.gamma,
        options.lambd,
        *ids,
        **inputs,
        normalize=normalize,
        normalize_by=options.normalize_by,
        whitening_rule=options.whitening_rule,
        advantage_clip=options.advantage_clip,
        **options.variants.spec_fields(),
    )
    old_sides = tuple(options.old_sides)
    turns = {"turn_rewards": options.variants.turn_rewards_col}  # what a turn estimator reads on an old side
    variants = options.variants.spec_fields()  # a profile takes those its trainer computes (areal: truncation)
    old_specs = tuple(
        old_side_spec(
            side, options.gamma, options.lambd, *ids, variants=variants, **inputs,
            **(turns if reads_turns(side) else {}),
        )  # fmt: skip
        for side in old_sides
    )
    columns = columns_read(options.columns, [spec.estimator for spec in (new_spec, *old_specs) if spec is not None])
    if columns.opd_coef is not None and new_spec.estimator == "opd":
        raise InvalidOptionError(
            "--opd-coef adds the distillation term to another estimator; --estimator opd is the pure form "
            "(its advantage is minus the KL from the teacher): leave --opd-coef out"
        )
    if columns.old_opd_coef is not None and not any(spec is not None for spec in old_specs):
        raise InvalidOptionError(
            "--old-opd-coef adds the distillation term to a recomputed old side (--old-estimator, --baseline); "
            "the stored advantages of --against are compared as they are"
        )
    carried = [spec for spec in (new_spec, *old_specs) if spec is not None and spec.over_episodes
               and spec.estimator in CARRIED]  # fmt: skip
    if len(carried) > 1:
        raise InvalidOptionError(
            f"--episode-col: one side may run its recursion over the episodes ({' and '.join(CARRIED)}); "
            f"compare {carried[0].estimator} over episodes with another estimator or a baseline"
        )
    return Computation(
        new_spec=new_spec,
        old_sides=old_sides,
        old_specs=old_specs,
        columns=columns,
        kernel=resolve_kernel(options.kernel, options.device, new_spec),
        device=options.device,
        batch_rows=options.batch_rows,
        on_invalid=options.on_invalid,
    )


class RunOptions:
    """What the options of every computing command share (recompute's and diff's frozen
    dataclasses): checked when made (:meth:`check`), and the run they describe
    (:attr:`computation`), built once."""

    def __post_init__(self) -> None:
        if self.normalize_by is not None and not self.normalize:  # --normalize-by implies --normalize
            object.__setattr__(self, "normalize", True)
        self.check()

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) a value out of range or not one of its
        choices, a kernel or device not usable here, and contradicting options."""
        raise NotImplementedError

    def check_run(self) -> None:
        """The checks every run's options end with: the batch size, the tolerance, the device,
        then the specs built and the kernel resolved for them (:attr:`computation`)."""
        check_count("--batch-rows", self.batch_rows, 1)
        check_number("--tol", self.tolerance, 0.0)
        check_device(self.device)
        mode = "by" if self.normalize_by is not None else "all" if self.normalize else "none"
        check_whitening_rule(self.whitening_rule, mode, WHITENING_FLAGS, self.estimator)
        check_advantage_clip(self.advantage_clip, "--advantage-clip")
        self.computation  # noqa: B018 - the specs built, the kernel resolved for them

    @property
    def whitening(self) -> bool:
        """Whether ``--normalize`` / ``--normalize-by`` whiten every side."""
        return self.normalize or self.normalize_by is not None

    @cached_property
    def computation(self) -> Computation:
        """What the run computes (:func:`describe_run`), built once with the options."""
        return describe_run(self)
