"""The options recompute and diff share, checked once: the device, the GAE variants' options,
the estimators' options, and the new side's spec built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaecli.advantages.contract import (
    CRITIC_FREE,
    ESTIMATOR_PARAMETERS,
    GROUPED_ESTIMATORS,
    STEP_ESTIMATORS,
    TIMESTEPS,
)
from gaecli.advantages.spec import AdvantageSpec, estimator_spec
from gaecli.errors import InvalidOptionError
from gaecli.options import DEVICE_TYPES, ON_INVALID_MODES, check_choice, check_number  # noqa: F401 (re-exported)


def check_device(device: str) -> None:
    """Refuse (:class:`InvalidOptionError`) a device that is not cpu or cuda, or CUDA where
    torch cannot use it. ``cpu`` is accepted without importing torch."""
    if device == "cpu":
        return
    import torch

    try:
        device_type = torch.device(device).type
    except (RuntimeError, TypeError) as error:
        raise InvalidOptionError(f"unknown device {device!r}; use cpu or cuda") from error
    if device_type not in DEVICE_TYPES:
        raise InvalidOptionError(f"device {device!r} is not supported; use cpu or cuda")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise InvalidOptionError(f"device {device!r}: CUDA is not available to torch here; use --device cpu")


@dataclass(frozen=True)
class VariantOptions:
    """The GAE variants of the new side (docs/variants.md), as ``gae recompute`` and
    ``gae diff`` take them (``--timestep``, ``--lambd-critic``, ``--lambd-alpha``,
    ``--turn-rewards-col``, ``--truncated-col`` with ``--bootstrap-col``), checked when
    made (:class:`InvalidOptionError` naming the option)."""

    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    turn_rewards_col: Optional[str] = None
    truncated_col: Optional[str] = None
    bootstrap_col: Optional[str] = None

    def __post_init__(self) -> None:
        check_choice("--timestep", self.timestep, TIMESTEPS, "timestep")
        check_number("--lambd-critic", self.lambd_critic, 0.0, 1.0)
        check_number("--lambd-alpha", self.lambd_alpha)
        if self.lambd_alpha is not None and not self.lambd_alpha > 0:
            raise InvalidOptionError(f"--lambd-alpha must be > 0, got {self.lambd_alpha:g}")
        if (self.truncated_col is None) != (self.bootstrap_col is None):
            raise InvalidOptionError("--truncated-col and --bootstrap-col go together: give both or neither")
        named = [name for name in (self.turn_rewards_col, self.truncated_col, self.bootstrap_col) if name is not None]
        if len(set(named)) != len(named):
            raise InvalidOptionError("--turn-rewards-col, --truncated-col and --bootstrap-col name one column twice")

    def spec_fields(self) -> dict:
        """The :class:`AdvantageSpec` fields of these variants."""
        return {
            "timestep": self.timestep,
            "lambd_critic": self.lambd_critic,
            "lambd_alpha": self.lambd_alpha,
            "turn_rewards": self.turn_rewards_col,
            "truncated": self.truncated_col,
            "bootstrap_values": self.bootstrap_col,
        }

    def columns(self) -> list[str]:
        """The per-row columns these variants read."""
        return [name for name in (self.turn_rewards_col, self.truncated_col, self.bootstrap_col) if name is not None]


def check_estimators(
    estimators: tuple[str, ...],
    gamma: Optional[float],
    lambd: Optional[float],
    group_by: Optional[str],
    step_by: Optional[str],
    normalize: bool,
) -> None:
    """The options of the estimators computed by a command (``estimators``: those of its
    sides, ``gae`` standing for a GAE baseline too), refused with
    :class:`InvalidOptionError` (exit 2): ``--gamma`` / ``--lambd`` missing where an
    estimator reads them or given where none does, ``--group-col`` missing where an estimator
    groups or given where none does, ``--step-col`` given where none has a statistic per
    step, ``--normalize`` / ``--normalize-by`` with a critic-free estimator (docs/estimators.md)."""
    from gaecli.advantages.contract import ESTIMATORS
    from gaecli.options import check_choice, check_number

    for estimator in estimators:
        check_choice("--estimator", estimator, ESTIMATORS, "estimator")
    names = " and ".join(dict.fromkeys(estimators))
    for name, value in (("gamma", gamma), ("lambd", lambd)):
        used = [estimator for estimator in estimators if name in ESTIMATOR_PARAMETERS.get(estimator, ())]
        if used and value is None:
            raise InvalidOptionError(f"--{name} is required by --estimator {used[0]}")
        if not used and value is not None:
            raise InvalidOptionError(f"--{name} is not used by --estimator {names}; leave it out")
        check_number(f"--{name}", value, 0.0, 1.0)
    critic_free = [estimator for estimator in estimators if estimator in CRITIC_FREE]
    if critic_free and normalize:
        raise InvalidOptionError(
            f"--normalize/--normalize-by: --estimator {critic_free[0]} defines its own scaling; leave them out"
        )
    grouped = [estimator for estimator in estimators if estimator in GROUPED_ESTIMATORS]
    if grouped and group_by is None:
        raise InvalidOptionError(f"--estimator {grouped[0]} needs --group-col (the prompt-group id column)")
    if not grouped and group_by is not None:
        raise InvalidOptionError(f"--group-col is not used by --estimator {names}; leave it out")
    if step_by is not None and not any(estimator in STEP_ESTIMATORS for estimator in estimators):
        raise InvalidOptionError(
            f"--step-col is not used by --estimator {names} (it splits gpg's α and the reinforce++ whitening)"
        )


def new_side_spec(options) -> AdvantageSpec:
    """The whole spec of the new side of ``options`` (recompute's or diff's): its estimator
    with γ, λ and the group and step ids where it reads them
    (:func:`gaecli.advantages.spec.estimator_spec`), the contract, the whitening and the GAE
    variants (what the output metadata records): the one place options become the new
    side's spec, for recompute and diff."""
    normalize = "by" if options.normalize_by is not None else "all" if options.normalize else "none"
    return estimator_spec(
        options.estimator,
        options.gamma,
        options.lambd,
        options.group_col,
        options.step_by,
        normalize=normalize,
        normalize_by=options.normalize_by,
        **options.variants.spec_fields(),
    )


def normalize_label(options) -> str:
    """How ``options`` (recompute's or diff's) whiten: ``none``, ``all`` or ``by:COLUMN``;
    the value of the ``gaecli.normalize`` metadata key and of the JSON ``normalize``."""
    if options.normalize_by is not None:
        return f"by:{options.normalize_by}"
    return "all" if options.normalize else "none"
