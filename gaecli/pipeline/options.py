"""The options recompute and diff share, checked once: the device, the GAE variants' options
and the estimators' options (the run they describe: :mod:`gaecli.pipeline.description`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gaecli.advantages.contract import ESTIMATOR_INPUTS, TOKEN_INPUTS, TURN_ROW_ESTIMATORS
from gaecli.advantages.spec import INPUT_MEANINGS, SpecWords, check_estimator_values, check_variant_values
from gaecli.errors import InvalidOptionError
from gaecli.options import DEVICE_TYPES, check_choice


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
    ``--turn-rewards-col``, ``--truncated-col`` with ``--bootstrap-col``, ``--lambd-schedule``
    with ``--lambd-q``, ``--turn-ids-col``), checked when
    made (:class:`InvalidOptionError` naming the option)."""

    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    turn_rewards_col: Optional[str] = None
    truncated_col: Optional[str] = None
    bootstrap_col: Optional[str] = None
    lambd_schedule: Optional[str] = None
    lambd_q: Optional[float] = None
    turn_ids_col: Optional[str] = None

    def __post_init__(self) -> None:
        check_variant_values(self.spec_fields(), VARIANT_FLAGS)  # the spec's check, naming the options
        named = self.columns()
        if len(set(named)) != len(named):
            raise InvalidOptionError(
                "--turn-rewards-col, --truncated-col, --bootstrap-col and --turn-ids-col name one column twice"
            )

    def spec_fields(self) -> dict:
        """The :class:`AdvantageSpec` fields of these variants."""
        return {field: getattr(self, attribute) for field, attribute in _SPEC_FIELDS}

    def columns(self) -> list[str]:
        """The per-row columns these variants read."""
        named = (self.turn_rewards_col, self.truncated_col, self.bootstrap_col, self.turn_ids_col)
        return [name for name in named if name is not None]


_SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    ("timestep", "timestep"),
    ("lambd_critic", "lambd_critic"),
    ("lambd_alpha", "lambd_alpha"),
    ("turn_rewards", "turn_rewards_col"),
    ("truncated", "truncated_col"),
    ("bootstrap_values", "bootstrap_col"),
    ("lambd_schedule", "lambd_schedule"),
    ("lambd_q", "lambd_q"),
    ("turn_ids", "turn_ids_col"),
)
"""Each :class:`AdvantageSpec` variant field and the :class:`VariantOptions` attribute of it."""

VARIANT_FLAGS: dict[str, str] = {
    "timestep": "--timestep",
    "lambd_critic": "--lambd-critic",
    "lambd_alpha": "--lambd-alpha",
    "turn_rewards": "--turn-rewards-col",
    "truncated": "--truncated-col",
    "bootstrap_values": "--bootstrap-col",
    "lambd_schedule": "--lambd-schedule",
    "lambd_q": "--lambd-q",
    "turn_ids": "--turn-ids-col",
}
"""The option of each GAE variant field, as ``gae recompute`` and ``gae diff`` name it."""


DEFAULT_SUM_PI_SQUARED = "sum_pi_squared"
DEFAULT_LOG_PROBS = "log_probs"
"""The column ``--sum-pi-squared-col`` names when not given (optimal-token-baseline's Σπ²)."""


@dataclass(frozen=True)
class EstimatorInputs:
    """The estimators' own per-row columns (docs/estimators.md), as ``gae recompute`` and
    ``gae diff`` take them: remax's baseline reward (``--baseline-reward-col``), gdpo's reward
    components (``--reward-cols``) and their weights (``--reward-weights``); checked with the
    estimators (:func:`check_estimators`)."""

    baseline_reward_col: Optional[str] = None
    reward_cols: Optional[tuple[str, ...]] = None
    reward_weights: Optional[tuple[float, ...]] = None
    sum_pi_squared_col: Optional[str] = None
    episode_col: Optional[str] = None
    turn_col: Optional[str] = None
    state_col: Optional[str] = None
    episode_weight: Optional[float] = None
    step_weight: Optional[float] = None

    def spec_fields(self, columns=None) -> dict:
        """The :class:`AdvantageSpec` fields of these inputs (given to every side's spec,
        which keeps those its estimator reads). ``columns`` (the run's
        :class:`gaecli.io.format.Columns`): optimal-token-baseline's per-token inputs are
        resolved, the log-probs from ``--logprobs-col`` and Σπ² from ``--sum-pi-squared-col``
        or its default; without it they are as typed (what the option check sees)."""
        sum_pi_squared = self.sum_pi_squared_col
        if columns is not None and sum_pi_squared is None:
            sum_pi_squared = DEFAULT_SUM_PI_SQUARED
        return {
            "baseline_rewards": self.baseline_reward_col,
            "reward_components": self.reward_cols,
            "reward_weights": self.reward_weights,
            "log_probs": None if columns is None else columns.log_probs,
            "sum_pi_squared": sum_pi_squared,
            "episode_by": self.episode_col,
            "turn_by": self.turn_col,
            "state_by": self.state_col,
            "episode_weight": self.episode_weight,
            "step_weight": self.step_weight,
        }

    def read_columns(self) -> list[tuple[str, str]]:
        """(option, column) of each column these inputs name."""
        named = [("--baseline-reward-col", self.baseline_reward_col)]
        named += [("--reward-cols", name) for name in self.reward_cols or ()]
        named.append(("--sum-pi-squared-col", self.sum_pi_squared_col))
        named += [("--episode-col", self.episode_col), ("--turn-col", self.turn_col), ("--state-col", self.state_col)]
        return [(flag, name) for flag, name in named if name is not None]


class OptionWords(SpecWords):
    """How the commands word a refusal of :func:`gaecli.advantages.spec.check_estimator_values`:
    by the options typed (``--gamma``, ``--group-col``...)."""

    FLAGS = {
        "gamma": "--gamma",
        "lambd": "--lambd",
        "group_by": "--group-col",
        "step_by": "--step-col",
        "baseline_rewards": "--baseline-reward-col",
        "reward_components": "--reward-cols",
        "reward_weights": "--reward-weights",
        "log_probs": "--logprobs-col",
        "sum_pi_squared": "--sum-pi-squared-col",
        "episode_by": "--episode-col",
        "turn_by": "--turn-col",
        "state_by": "--state-col",
        "episode_weight": "--episode-weight",
        "step_weight": "--step-weight",
    }

    def name(self, field: str) -> str:
        return self.FLAGS[field]

    def unknown(self, estimator: str) -> None:
        from gaecli.advantages.contract import ESTIMATORS

        check_choice("--estimator", estimator, ESTIMATORS, "estimator")

    def needs(self, field: str, estimator: str) -> str:
        if field == "group_by":
            return f"--estimator {estimator} needs --group-col (the prompt-group id column)"
        if field in INPUT_MEANINGS:
            return f"--estimator {estimator} needs {self.name(field)} ({INPUT_MEANINGS[field]})"
        return f"{self.name(field)} is required by --estimator {estimator}"

    def weights(self, components: int, weights: int) -> str:
        return f"--reward-weights gives {weights} weights for {components} --reward-cols; give one per column"

    def unused(self, field: str, estimators: tuple[str, ...]) -> str:
        names = " and ".join(dict.fromkeys(estimators))
        if field == "step_by":
            return (
                f"--step-col is not used by --estimator {names} "
                "(it splits gpg's α and the whitening of reinforce++ and gdpo)"
            )
        return f"{self.name(field)} is not used by --estimator {names}; leave it out"

    def scaling(self, estimator: str) -> str:
        return f"--normalize/--normalize-by: --estimator {estimator} defines its own scaling; leave them out"


def check_estimators(
    estimators: tuple[str, ...],
    gamma: Optional[float],
    lambd: Optional[float],
    group_by: Optional[str],
    step_by: Optional[str],
    normalize: bool,
    inputs: EstimatorInputs = EstimatorInputs(),
    whitening_rule=None,
    turn_rewards: Optional[str] = None,
) -> None:
    """The options of the estimators computed by a command (``estimators``: those of its
    sides, ``gae`` standing for a GAE baseline too), refused with
    :class:`InvalidOptionError` (exit 2) by the spec's own check
    (:func:`gaecli.advantages.spec.check_estimator_values`), naming the options: ``--gamma`` /
    ``--lambd`` missing where an estimator reads them or given where none does,
    ``--group-col`` missing where an estimator groups or given where none does, ``--step-col``
    given where none has a statistic per step, ``--normalize`` / ``--normalize-by`` with a
    critic-free estimator, an estimator's own columns (``inputs``) missing where it needs them
    or given where none reads them (docs/estimators.md); ``whitening_rule``, the first
    estimator's, says whether a score-normalised one reads the step id; ``turn_rewards``
    (``--turn-rewards-col``) is required by the turn-row estimators."""
    values = {"gamma": gamma, "lambd": lambd, "group_by": group_by, "step_by": step_by, **inputs.spec_fields()}
    values["whitening_rule"] = whitening_rule
    if any(field in ESTIMATOR_INPUTS.get(estimator, ()) for estimator in estimators for field in TOKEN_INPUTS):
        # optimal-token-baseline's columns have defaults (--logprobs-col, --sum-pi-squared-col)
        values["log_probs"] = DEFAULT_LOG_PROBS
        values["sum_pi_squared"] = values["sum_pi_squared"] or DEFAULT_SUM_PI_SQUARED
    check_estimator_values(estimators, values, normalize, OptionWords())
    turn_rows = [estimator for estimator in estimators if estimator in TURN_ROW_ESTIMATORS]
    if turn_rows and turn_rewards is None:
        raise InvalidOptionError(
            f"--estimator {turn_rows[0]} needs --turn-rewards-col (a number per turn row: the turn's own reward)"
        )
