"""The options that say what a run computes, written once for every command that takes them
(through :mod:`gaecli.cli.option_groups`): γ, λ, the estimator and its own columns, the
KL rewards, on-policy distillation, the whitening rule and the GAE variants, and the
functions that turn their values into the library's objects."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from gaecli.errors import InvalidOptionError

GammaOption = Annotated[
    Optional[float],
    typer.Option(
        show_default=False,
        help="Discount γ in [0, 1]: required by --estimator gae (the trainers' defaults differ), reinforce++, "
        "agentic-reinforce, gigpo and step-reinforce (per turn), refused by the other estimators.",
    ),
]
LambdOption = Annotated[
    Optional[float],
    typer.Option(show_default=False, help="GAE λ in [0, 1]: required by --estimator gae, refused by the others."),
]
EstimatorOption = Annotated[
    str,
    typer.Option(
        "--estimator",
        metavar="NAME",
        rich_help_panel="Estimator",
        help="gae (masked GAE), or a critic-free estimator: grpo, dr-grpo, rloo, opo, gpg, reinforce++, "
        "reinforce++-baseline, maxrl, grpo-passk, remax, gdpo, optimal-token-baseline, opd, agentic-reinforce, "
        "and on turn rows gigpo, step-reinforce (docs/estimators.md, docs/episodes.md; they read no values).",
    ),
]
GroupColOption = Annotated[
    Optional[str],
    typer.Option(
        "--group-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel="Estimator",
        help="The prompt-group id column of the grouped estimators: rows with equal values across all inputs are "
        "one group; a null id is invalid data.",
    ),
]
StepColOption = Annotated[
    Optional[str],
    typer.Option(
        "--step-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel="Estimator",
        help="The step id column: gpg's α and the reinforce++ whitening are taken per value (default: over the "
        "whole input).",
    ),
]


BaselineRewardColOption = Annotated[
    Optional[str],
    typer.Option(
        "--baseline-reward-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel="Estimator",
        help="remax's baseline: a number per row, the reward of the greedy rollout of the same prompt.",
    ),
]
RewardColsOption = Annotated[
    Optional[str],
    typer.Option(
        "--reward-cols",
        metavar="A,B,...",
        show_default=False,
        rich_help_panel="Estimator",
        help="gdpo's reward components: columns of a number per row, each normalised in its group before they "
        "are summed.",
    ),
]
RewardWeightsOption = Annotated[
    Optional[str],
    typer.Option(
        "--reward-weights",
        metavar="W1,W2,...",
        show_default=False,
        rich_help_panel="Estimator",
        help="gdpo: the weight of each --reward-cols column, in order (default: 1 each).",
    ),
]
SumPiSquaredColOption = Annotated[
    Optional[str],
    typer.Option(
        "--sum-pi-squared-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel="Estimator",
        help="optimal-token-baseline: a list column of Σπ² over the vocabulary at each token "
        "(default: sum_pi_squared); the log-probs are --logprobs-col's.",
    ),
]

_TURN_ROWS = "Turn rows (docs/episodes.md)"
EpisodeColOption = Annotated[
    Optional[str],
    typer.Option(
        "--episode-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_TURN_ROWS,
        help="The episode id of each row: rows with equal ids, in any files, are the turns of one episode "
        "(gae, grpo, dr-grpo, rloo, opo, gpg, reinforce++, reinforce++-baseline, gigpo, step-reinforce).",
    ),
]
TurnColOption = Annotated[
    Optional[str],
    typer.Option(
        "--turn-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_TURN_ROWS,
        help="The turn index of each row: an integer, unique within its episode, whose order is the turns' "
        "order (gaps allowed).",
    ),
]
StateColOption = Annotated[
    Optional[str],
    typer.Option(
        "--state-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_TURN_ROWS,
        help="gigpo: the anchor-state id of each turn row; the turns of one group with equal ids are a state "
        "group.",
    ),
]
EpisodeWeightOption = Annotated[
    Optional[float],
    typer.Option(
        "--episode-weight",
        metavar="W",
        show_default=False,
        rich_help_panel=_TURN_ROWS,
        help="gigpo: the weight of the episode-level advantage (default 1).",
    ),
]
StepWeightOption = Annotated[
    Optional[float],
    typer.Option(
        "--step-weight",
        metavar="W",
        show_default=False,
        rich_help_panel=_TURN_ROWS,
        help="gigpo: the weight of the step-level advantage (default 1).",
    ),
]


def comma_list(flag: str, text: Optional[str]) -> Optional[tuple[str, ...]]:
    """The names of a comma list option (None when not given); an empty name is refused."""
    if text is None:
        return None
    names = tuple(item.strip() for item in text.split(","))
    if not all(names):
        raise InvalidOptionError(f"{flag}: empty name in {text!r}; give names separated by commas")
    return names


def comma_numbers(flag: str, text: Optional[str]) -> Optional[tuple[float, ...]]:
    """The numbers of a comma list option (None when not given); a word that is not a finite
    number is refused."""
    numbers = []
    for item in comma_list(flag, text) or ():
        try:
            number = float(item)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise InvalidOptionError(f"{flag}: {item!r} is not a finite number")
        numbers.append(number)
    return None if text is None else tuple(numbers)



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
        rich_help_panel="KL rewards",
        help="KL estimator of log-ratio x = log_probs − ref_log_probs: k1 = x, k2 = x²/2, k3 = exp(−x) − 1 + x, "
        "low_var_kl = k3 clamped (see docs/format.md).",
    ),
]
LogprobsColOption = Annotated[
    str,
    typer.Option(
        "--logprobs-col",
        help="Column of the policy's per-token log-probs (read with --kl-coef, --opd-coef and --estimator opd).",
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

OldOPDCoefOption = Annotated[
    Optional[float],
    typer.Option(
        "--old-opd-coef",
        metavar="C",
        show_default=False,
        rich_help_panel="On-policy distillation",
        help="The same term with coefficient C on the recomputed old side (--old-estimator, --baseline), at "
        "the same --opd-stage.",
    ),
]
OPDCoefOption = Annotated[
    Optional[float],
    typer.Option(
        "--opd-coef",
        metavar="C",
        show_default=False,
        rich_help_panel="On-policy distillation",
        help="The new side's advantages less C · KL(log_probs ‖ teacher log-probs) at trainable tokens "
        "(the KL by --kl-estimator).",
    ),
]
TeacherLogprobsColOption = Annotated[
    str,
    typer.Option(
        "--teacher-logprobs-col",
        help="Column of the teacher's per-token log-probs (read with --opd-coef and --estimator opd).",
        rich_help_panel="On-policy distillation",
    ),
]
OPDStageOption = Annotated[
    str,
    typer.Option(
        "--opd-stage",
        metavar="STAGE",
        help="before-whiten (as slime, miles and ROLL: the term is whitened with the advantages) or after-whiten.",
        rich_help_panel="On-policy distillation",
    ),
]

_WHITENING = "Normalisation rule (--normalize; grpo's and dr-grpo's scores; gigpo's and step-reinforce's)"
NormLikeOption = Annotated[
    Optional[str],
    typer.Option(
        "--norm-like",
        metavar="TRAINER",
        show_default=False,
        rich_help_panel=_WHITENING,
        help="Normalise as a trainer does: verl, roll, areal, nemo-rl, openrlhf, slime or skyrl, for the use at hand "
        "(--normalize's whitening, grpo's scores, or gigpo's and step-reinforce's turn rows, whose default is roll; "
        "docs/semantics.md); the --norm-* options below override it.",
    ),
]
NormMeanOption = Annotated[
    Optional[str],
    typer.Option("--norm-mean", metavar="LEVEL", show_default=False, rich_help_panel=_WHITENING,
                 help="The centre: group (the whitening's groups, or --group-col's for scores; default), batch (the "
                      "whole input, or each --step-col value for scores) or none."),
]  # fmt: skip
NormStdOption = Annotated[
    Optional[str],
    typer.Option("--norm-std", metavar="LEVEL", show_default=False, rich_help_panel=_WHITENING,
                 help="The divisor: group (default), batch or none."),
]  # fmt: skip
NormUnbiasedOption = Annotated[
    Optional[bool],
    typer.Option("--norm-std-unbiased/--norm-std-biased", show_default=False, rich_help_panel=_WHITENING,
                 help="The Bessel (default) or the biased variance."),
]  # fmt: skip
NormEpsOption = Annotated[
    Optional[float],
    typer.Option("--norm-eps", metavar="E", show_default=False, rich_help_panel=_WHITENING,
                 help="ε (default 1e-8 whitening, 1e-6 scores)."),
]  # fmt: skip
NormEpsInOption = Annotated[
    Optional[str],
    typer.Option("--norm-eps-in", metavar="PLACE", show_default=False, rich_help_panel=_WHITENING,
                 help="Where ε goes: sqrt (sqrt(var + ε), default whitening), std (std + ε, default scores) or floor "
                      "(sqrt(max(var, ε)))."),
]  # fmt: skip
NormCountEpsOption = Annotated[
    Optional[float],
    typer.Option("--norm-count-eps", metavar="E", show_default=False, rich_help_panel=_WHITENING,
                 help="ε added to the count n where the mean and the variance divide by it, Σ/(n + ε) (NeMo-RL's "
                      "masked_mean: 1e-8; default 0)."),
]  # fmt: skip
NormOneTokenOption = Annotated[
    Optional[str],
    typer.Option("--norm-one-token", metavar="CHOICE", show_default=False, rich_help_panel=_WHITENING,
                 help="A group of at most one unit (token; row for scores): zero (normalised, default whitening), "
                      "keep (left as it is) or unit (mean 0, std 1: verl's, default scores)."),
]  # fmt: skip
NormLeaveOneOutOption = Annotated[
    Optional[bool],
    typer.Option("--norm-leave-one-out", show_default=False, rich_help_panel=_WHITENING,
                 help="Centre each unit on its group's others' mean, the std about those centres (AReaL's)."),
]  # fmt: skip
NormStdOfOthersOption = Annotated[
    Optional[bool],
    typer.Option("--norm-std-of-others", show_default=False, rich_help_panel=_WHITENING,
                 help="With --norm-leave-one-out, scores only: the std of each row's others (NeMo-RL's)."),
]  # fmt: skip
NormStdFloorOption = Annotated[
    Optional[float],
    typer.Option("--norm-std-floor", metavar="S", show_default=False, rich_help_panel=_WHITENING,
                 help="A std at or below S gives what --norm-below-floor says (ROLL's threshold; default none)."),
]  # fmt: skip
NormBelowFloorOption = Annotated[
    Optional[str],
    typer.Option("--norm-below-floor", metavar="CHOICE", show_default=False, rich_help_panel=_WHITENING,
                 help="Below the std floor: zero (ROLL's, default) or undivided (the centred value: NeMo-RL's)."),
]  # fmt: skip

NormTokensOption = Annotated[
    Optional[str],
    typer.Option("--norm-tokens", metavar="TOKENS", show_default=False, rich_help_panel=_WHITENING,
                 help="The tokens --normalize's statistics are taken over: trainable (default) or response (every "
                      "token, loss-masked ones included: SkyRL's); the advantages are written at trainable tokens."),
]  # fmt: skip


def make_whitening_rule(estimator="gae", norm_like=None, norm_mean=None, norm_std=None, norm_unbiased=None,
                        norm_eps=None, norm_eps_in=None, norm_count_eps=None, norm_one_token=None,
                        norm_leave_one_out=None, norm_std_of_others=None, norm_std_floor=None,
                        norm_below_floor=None, norm_tokens=None):  # fmt: skip
    """The WhiteningRule of the shared normalisation options for ``estimator`` (its scores' rule
    for a score-normalised one, the whitening's otherwise; None when no option is given)."""
    from gaecli.advantages.normalization import rule_use, whitening_rule

    return whitening_rule(
        norm_like, rule_use(estimator), mean=norm_mean, std=norm_std, unbiased=norm_unbiased, eps=norm_eps,
        eps_in=norm_eps_in, count_eps=norm_count_eps, one_token=norm_one_token, leave_one_out=norm_leave_one_out,
        std_of_others=norm_std_of_others, std_floor=norm_std_floor, below_floor=norm_below_floor, tokens=norm_tokens,
    )  # fmt: skip


NormalizeByOption = Annotated[
    Optional[str], typer.Option(metavar="COLUMN", help="Whiten within groups of rows sharing COLUMN's value.")
]
"""``--normalize-by``, as recompute, diff and view take it."""

AdvantageClipOption = Annotated[
    Optional[float],
    typer.Option("--advantage-clip", metavar="C", show_default=False, rich_help_panel=_WHITENING,
                 help="Clip the new advantages to [-C, C] after every normalisation, as ROLL's advantage_clip "
                      "(the returns are not clipped)."),
]  # fmt: skip


_VARIANTS = "GAE variants (new side)"
TimestepOption = Annotated[
    str,
    typer.Option(
        "--timestep",
        metavar="token|turn",
        rich_help_panel=_VARIANTS,
        help="token: every trainable token is a timestep; turn: every maximal run of trainable tokens is one "
        "(AReaL's turn-level GAE; docs/variants.md).",
    ),
]
LambdCriticOption = Annotated[
    Optional[float],
    typer.Option(
        "--lambd-critic",
        metavar="LC",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="Decoupled GAE: the returns use λ = LC in [0, 1]; the advantages keep --lambd.",
    ),
]
LambdAlphaOption = Annotated[
    Optional[float],
    typer.Option(
        "--lambd-alpha",
        metavar="A",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="Length-adaptive λ of the advantages: λ_i = clamp(1 − 1/max(A·L_i, 1), 0, 1), L_i the sample's "
        "trainable tokens (turns with --timestep turn); A > 0.",
    ),
]
LambdScheduleOption = Annotated[
    Optional[str],
    typer.Option(
        "--lambd-schedule",
        metavar="relative-position",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="Per-sample λ of the advantages: relative-position (AReaL): λ_i = Q^(1/(L_i − 1)) with --lambd-q Q, "
        "1 for L_i = 1; L_i the sample's trainable tokens (turns with --timestep turn). Not with --lambd-alpha.",
    ),
]
LambdQOption = Annotated[
    Optional[float],
    typer.Option(
        "--lambd-q",
        metavar="Q",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="With --lambd-schedule relative-position: the fraction in (0, 1] the first timestep keeps.",
    ),
]
TurnIdsColOption = Annotated[
    Optional[str],
    typer.Option(
        "--turn-ids-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="With --timestep turn: list column of one turn id per token (-1 at masked tokens; non-decreasing at "
        "trainable ones); the turns are these ids instead of the maximal runs of trainable tokens.",
    ),
]
TurnRewardsColOption = Annotated[
    Optional[str],
    typer.Option(
        "--turn-rewards-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="List column of one reward per turn (maximal run of trainable tokens), added on the turn's last "
        "trainable token (to the turn's reward with --timestep turn and --estimator agentic-reinforce); on turn "
        "rows (gigpo, step-reinforce) a number per row, the turn's own reward.",
    ),
]
def in_panel(option, panel: str):
    """``option`` (an ``Annotated[type, typer.Option(...)]`` of this module) listed under another
    ``--help`` panel, for a command where its own panel's name does not fit."""
    import copy
    import typing

    kind, info = typing.get_args(option)[:2]
    moved = copy.copy(info)
    moved.rich_help_panel = panel
    return Annotated[kind, moved]


TruncatedColOption = Annotated[
    Optional[str],
    typer.Option(
        "--truncated-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="Bool column: the row was truncated (no EOS); its value after the last trainable token is then "
        "--bootstrap-col's instead of 0.",
    ),
]
BootstrapColOption = Annotated[
    Optional[str],
    typer.Option(
        "--bootstrap-col",
        metavar="COLUMN",
        show_default=False,
        rich_help_panel=_VARIANTS,
        help="With --truncated-col: the column of the bootstrap value of each truncated row.",
    ),
]


def make_variants(
    timestep: str = "token",
    lambd_critic: Optional[float] = None,
    lambd_alpha: Optional[float] = None,
    turn_rewards_col: Optional[str] = None,
    truncated_col: Optional[str] = None,
    bootstrap_col: Optional[str] = None,
    lambd_schedule: Optional[str] = None,
    lambd_q: Optional[float] = None,
    turn_ids_col: Optional[str] = None,
):
    """The VariantOptions of the shared GAE-variant options."""
    from gaecli.pipeline import VariantOptions

    return VariantOptions(
        timestep,
        lambd_critic,
        lambd_alpha,
        turn_rewards_col,
        truncated_col,
        bootstrap_col,
        lambd_schedule=lambd_schedule,
        lambd_q=lambd_q,
        turn_ids_col=turn_ids_col,
    )


def validated_turn_rows(episode_col, turn_col, group_col, state_col, turn_rewards_col):
    """The turn-row columns ``gae validate`` checks (a :class:`gaecli.pipeline.description.TurnColumns`;
    None without ``--episode-col``): ``--turn-col`` goes with ``--episode-col``, and the group,
    state and turn-reward columns are then read as the turn rows' (exit 2 otherwise)."""
    from gaecli.errors import InvalidOptionError
    from gaecli.pipeline.description import TurnColumns

    if episode_col is None:
        others = [flag for flag, name in (("--turn-col", turn_col), ("--state-col", state_col),
                                          ("--group-col", group_col)) if name is not None]  # fmt: skip
        if others:
            raise InvalidOptionError(f"{others[0]} names a column of turn rows: give --episode-col too")
        return None
    if turn_col is None:
        raise InvalidOptionError("--episode-col: give --turn-col too (each turn row's index in its episode)")
    return TurnColumns(episode_col, turn_col, turn_rewards_col, group_col, state_col)


def validated_row_inputs(**row_input_options):
    """The VariantOptions whose per-row columns ``gae validate`` checks: turn ids are checked
    as the turns of ``--timestep turn``, the one timestep that reads them."""
    timestep = "turn" if row_input_options.get("turn_ids_col") is not None else "token"
    return make_variants(timestep, **row_input_options)
