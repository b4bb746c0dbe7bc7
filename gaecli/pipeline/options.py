"""The options recompute and diff share, checked once: the device, the GAE variants' options
and the estimators' options (the run they describe: :mod:`gaecli.pipeline.description`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaecli.advantages.contract import (
    CRITIC_FREE,
    ESTIMATOR_PARAMETERS,
    GROUPED_ESTIMATORS,
    STEP_ESTIMATORS,
)
from gaecli.advantages.spec import check_variant_values
from gaecli.errors import InvalidOptionError
from gaecli.options import check_choice, check_number

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
"""The torch device types the kernels run on (``cuda:N`` names one GPU)."""


ON_INVALID_MODES: tuple[str, ...] = ("stop", "skip")
"""What an invalid row does: stop the run, or go to the rejects file while the run goes on."""


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
        check_variant_values(self.spec_fields(), VARIANT_FLAGS)  # the spec's check, naming the options
        named = self.columns()
        if len(set(named)) != len(named):
            raise InvalidOptionError("--turn-rewards-col, --truncated-col and --bootstrap-col name one column twice")

    def spec_fields(self) -> dict:
        """The :class:`AdvantageSpec` fields of these variants."""
        return {field: getattr(self, attribute) for field, attribute in _SPEC_FIELDS}

    def columns(self) -> list[str]:
        """The per-row columns these variants read."""
        return [name for name in (self.turn_rewards_col, self.truncated_col, self.bootstrap_col) if name is not None]


_SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    ("timestep", "timestep"),
    ("lambd_critic", "lambd_critic"),
    ("lambd_alpha", "lambd_alpha"),
    ("turn_rewards", "turn_rewards_col"),
    ("truncated", "truncated_col"),
    ("bootstrap_values", "bootstrap_col"),
)
"""Each :class:`AdvantageSpec` variant field and the :class:`VariantOptions` attribute of it."""

VARIANT_FLAGS: dict[str, str] = {
    "timestep": "--timestep",
    "lambd_critic": "--lambd-critic",
    "lambd_alpha": "--lambd-alpha",
    "turn_rewards": "--turn-rewards-col",
    "truncated": "--truncated-col",
    "bootstrap_values": "--bootstrap-col",
}
"""The option of each GAE variant field, as ``gae recompute`` and ``gae diff`` name it."""


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
