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

from gaecli.cli import common

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
        ("gamma", common.GammaOption, None),
        ("lambd", common.LambdOption, None),
        ("estimator", common.EstimatorOption, "gae"),
        ("group_col", common.GroupColOption, None),
        ("step_col", common.StepColOption, None),
        ("baseline_reward_col", common.BaselineRewardColOption, None),
        ("reward_cols", common.RewardColsOption, None),
        ("reward_weights", common.RewardWeightsOption, None),
        ("sum_pi_squared_col", common.SumPiSquaredColOption, None),
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
        ("kl_coef", common.KLCoefOption, None),
        ("kl_estimator", common.KLEstimatorOption, "k1"),
        ("logprobs_col", common.LogprobsColOption, "log_probs"),
        ("ref_logprobs_col", common.RefLogprobsColOption, "ref_log_probs"),
        ("opd_coef", common.OPDCoefOption, None),
        ("teacher_logprobs_col", common.TeacherLogprobsColOption, "teacher_log_probs"),
        ("opd_stage", common.OPDStageOption, "before-whiten"),
    )
)
"""The input columns and the KL rewards (:func:`gaecli.cli.common.make_columns`; every command that reads rollouts)."""

ROW_INPUT_OPTIONS = OptionGroup(
    (
        ("turn_rewards_col", common.TurnRewardsColOption, None),
        ("truncated_col", common.TruncatedColOption, None),
        ("bootstrap_col", common.BootstrapColOption, None),
    )
)
"""The per-row columns of the GAE variants (validate checks them; :func:`gaecli.cli.common.make_variants`)."""

VARIANT_OPTIONS = (
    OptionGroup(
        (
            ("timestep", common.TimestepOption, "token"),
            ("lambd_critic", common.LambdCriticOption, None),
            ("lambd_alpha", common.LambdAlphaOption, None),
            ("lambd_schedule", common.LambdScheduleOption, None),
            ("lambd_q", common.LambdQOption, None),
        )
    )
    + ROW_INPUT_OPTIONS
    + OptionGroup((("turn_ids_col", common.TurnIdsColOption, None),))
)
"""The GAE variants of the new side (recompute, diff; :func:`gaecli.cli.common.make_variants`)."""

WHITENING_OPTIONS = OptionGroup(
    (
        ("norm_like", common.NormLikeOption, None),
        ("norm_mean", common.NormMeanOption, None),
        ("norm_std", common.NormStdOption, None),
        ("norm_unbiased", common.NormUnbiasedOption, None),
        ("norm_eps", common.NormEpsOption, None),
        ("norm_eps_in", common.NormEpsInOption, None),
        ("norm_one_token", common.NormOneTokenOption, None),
    )
)
"""How --normalize whitens (recompute, diff; :func:`gaecli.cli.common.make_whitening_rule`)."""

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
        common.comma_list("--reward-cols", values["reward_cols"]),
        common.comma_numbers("--reward-weights", values["reward_weights"]),
        values["sum_pi_squared_col"],
    )
    return {
        "gamma": values["gamma"],
        "lambd": values["lambd"],
        "estimator": values["estimator"],
        group_field: values["group_col"],
        "step_by": values["step_col"],
        "estimator_inputs": inputs,
    }
