"""The options several ``gae`` commands take together, each group written once
(:class:`OptionGroup`): a command names a group as one parameter's default and
:func:`with_groups` puts the group's options in its place."""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from gaecli.cli import common, computation_options

KernelOption = Annotated[str, typer.Option(help="GAE kernel (see `gae kernels`).")]
DeviceOption = Annotated[str, typer.Option(help="torch device: cpu or cuda.")]


@dataclass(frozen=True)
class OptionGroup:
    """Options several commands take together, written once: each ``(parameter, annotation,
    default)``. A command names a group as the default of one parameter; :func:`with_groups`
    puts the group's options in its place (so ``--help`` lists them there) and hands the
    command their values as one dict under that parameter's name."""

    options: tuple[tuple[str, Any, Any], ...]

    def __add__(self, other: "OptionGroup") -> "OptionGroup":
        return OptionGroup(self.options + other.options)


ESTIMATOR_OPTIONS = OptionGroup(
    (
        ("gamma", computation_options.GammaOption, None),
        ("lambd", computation_options.LambdOption, None),
        ("estimator", computation_options.EstimatorOption, "gae"),
        ("group_col", computation_options.GroupColOption, None),
        ("step_col", computation_options.StepColOption, None),
        ("baseline_reward_col", computation_options.BaselineRewardColOption, None),
        ("reward_cols", computation_options.RewardColsOption, None),
        ("reward_weights", computation_options.RewardWeightsOption, None),
        ("sum_pi_squared_col", computation_options.SumPiSquaredColOption, None),
        ("episode_col", computation_options.EpisodeColOption, None),
        ("turn_col", computation_options.TurnColOption, None),
        ("state_col", computation_options.StateColOption, None),
        ("episode_weight", computation_options.EpisodeWeightOption, None),
        ("step_weight", computation_options.StepWeightOption, None),
    )
)
"""γ, λ, the estimator, its group and step id columns and its own columns (recompute, diff)."""

KERNEL_OPTIONS = OptionGroup((("kernel", KernelOption, "auto"), ("device", DeviceOption, "cpu")))
"""The kernel and the device it runs on (recompute, diff)."""

COLUMN_OPTIONS = OptionGroup(
    (
        ("values_col", common.ValuesColOption, "values"),
        ("rewards_col", common.RewardsColOption, None),
        ("mask_col", common.MaskColOption, "loss_mask"),
        ("terminal_col", common.TerminalColOption, "terminal_reward"),
        ("kl_coef", computation_options.KLCoefOption, None),
        ("kl_estimator", computation_options.KLEstimatorOption, "k1"),
        ("logprobs_col", computation_options.LogprobsColOption, "log_probs"),
        ("ref_logprobs_col", computation_options.RefLogprobsColOption, "ref_log_probs"),
        ("opd_coef", computation_options.OPDCoefOption, None),
        ("teacher_logprobs_col", computation_options.TeacherLogprobsColOption, "teacher_log_probs"),
        ("opd_stage", computation_options.OPDStageOption, "before-whiten"),
    )
)
"""The input columns and the KL rewards (:func:`gaecli.cli.common.make_columns`); every command
that reads rollouts takes them with ``--response-mask-col``, as :data:`RESPONSE_COLUMN_OPTIONS`."""

RESPONSE_COLUMN_OPTIONS = COLUMN_OPTIONS + OptionGroup(
    (("response_mask_col", common.ResponseMaskColOption, None),)
)
"""The input columns with ``--response-mask-col`` (every command that reads rollouts: recompute,
diff, validate, identify, inspect and view; each checks it like the loss mask and hands it to
the computations that read it, docs/semantics.md#the-response-mask)."""

ROW_INPUT_OPTIONS = OptionGroup(
    (
        ("turn_rewards_col", computation_options.TurnRewardsColOption, None),
        ("truncated_col", computation_options.TruncatedColOption, None),
        ("bootstrap_col", computation_options.BootstrapColOption, None),
        ("turn_ids_col", computation_options.TurnIdsColOption, None),
    )
)
"""The per-row columns of the GAE variants (validate checks them;
:func:`gaecli.cli.computation_options.make_variants`)."""

VARIANT_OPTIONS = (
    OptionGroup(
        (
            ("timestep", computation_options.TimestepOption, "token"),
            ("lambd_critic", computation_options.LambdCriticOption, None),
            ("lambd_alpha", computation_options.LambdAlphaOption, None),
            ("lambd_schedule", computation_options.LambdScheduleOption, None),
            ("lambd_q", computation_options.LambdQOption, None),
        )
    )
    + ROW_INPUT_OPTIONS
)
"""The GAE variants of the new side (recompute, diff; :func:`gaecli.cli.computation_options.make_variants`)."""

WHITENING_OPTIONS = OptionGroup(
    (
        ("norm_like", computation_options.NormLikeOption, None),
        ("norm_mean", computation_options.NormMeanOption, None),
        ("norm_std", computation_options.NormStdOption, None),
        ("norm_unbiased", computation_options.NormUnbiasedOption, None),
        ("norm_eps", computation_options.NormEpsOption, None),
        ("norm_eps_in", computation_options.NormEpsInOption, None),
        ("norm_count_eps", computation_options.NormCountEpsOption, None),
        ("norm_one_token", computation_options.NormOneTokenOption, None),
        ("norm_leave_one_out", computation_options.NormLeaveOneOutOption, None),
        ("norm_std_of_others", computation_options.NormStdOfOthersOption, None),
        ("norm_std_floor", computation_options.NormStdFloorOption, None),
        ("norm_below_floor", computation_options.NormBelowFloorOption, None),
        ("norm_tokens", computation_options.NormTokensOption, None),
    )
)
"""How --normalize whitens and grpo's scores are normalised (recompute, diff;
:func:`gaecli.cli.computation_options.make_whitening_rule`)."""

ENGINE_OPTIONS = OptionGroup(
    (
        ("engine", common.EngineOption, "local"),
        ("workers", common.WorkersOption, None),
        ("ray_address", common.RayAddressOption, None),
    )
)
"""Where the files are processed (:func:`gaecli.cli.common.make_engine`)."""


def with_groups(command):
    """``command`` with each parameter whose default is an :class:`OptionGroup` replaced by
    the group's options, in its place; the command gets their values as a dict under that
    parameter's name."""
    signature = inspect.signature(command)
    hints = typing.get_type_hints(command, include_extras=True)
    parameters, groups = [], {}
    for parameter in signature.parameters.values():
        if isinstance(parameter.default, OptionGroup):
            groups[parameter.name] = parameter.default
            parameters += [
                inspect.Parameter(name, parameter.kind, default=default, annotation=annotation)
                for name, annotation, default in parameter.default.options
            ]
        else:
            parameters.append(parameter.replace(annotation=hints.get(parameter.name, parameter.annotation)))

    @functools.wraps(command)
    def grouped(**values):
        for name, group in groups.items():
            values[name] = {option: values.pop(option) for option, _, _ in group.options}
        return command(**values)

    grouped.__signature__ = signature.replace(parameters=parameters)
    grouped.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return grouped


def estimator_fields(values: dict, group_field: str = "group_by") -> dict:
    """The options' fields of :data:`ESTIMATOR_OPTIONS`' values (``--group-col`` is the
    field ``group_field``: ``group_by`` in recompute's options, ``group_by_id`` in diff's)."""
    from gaecli.pipeline.options import EstimatorInputs

    inputs = EstimatorInputs(
        values["baseline_reward_col"],
        computation_options.comma_list("--reward-cols", values["reward_cols"]),
        computation_options.comma_numbers("--reward-weights", values["reward_weights"]),
        values["sum_pi_squared_col"],
        values["episode_col"],
        values["turn_col"],
        values["state_col"],
        values["episode_weight"],
        values["step_weight"],
    )
    return {
        "gamma": values["gamma"],
        "lambd": values["lambd"],
        "estimator": values["estimator"],
        group_field: values["group_col"],
        "step_by": values["step_col"],
        "estimator_inputs": inputs,
    }
