"""What is computed, as one small immutable object: :class:`AdvantageSpec`. The dispatch
(:mod:`gaecli.advantages.dispatch`) runs a spec on a batch; kernels declare which of its
features they support. Definitions: docs/semantics.md; how later estimators and variants
extend it: docs/architecture.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

from gaecli.advantages.contract import (
    BASELINES,
    CRITIC_FREE,
    ESTIMATOR_PARAMETERS,
    ESTIMATORS,
    GROUPED_ESTIMATORS,
    MASKED,
    NORMALIZATIONS,
    SEMANTICS,
    STEP_ESTIMATORS,
    TIMESTEPS,
)
from gaecli.errors import InvalidOptionError
from gaecli.options import check_number


def refuse(message: str) -> None:
    """Raise the error of a spec value that cannot be computed (one place to change its class)."""
    raise InvalidOptionError(message)


@dataclass(frozen=True)
class RowInput:
    """An extra per-row input a spec reads besides values, rewards, mask and terminal reward:
    ``name`` (the column in the commands, the key of ``row_inputs`` in Python), what it is
    for (``role``) and its ``kind`` (``scalar``: one value per row; ``list``: a list per row)."""

    name: str
    role: str
    kind: str


@dataclass(frozen=True)
class AdvantageSpec:
    """What is computed (hashable, picklable; checked on construction).

    - ``gamma``, ``lambd``: γ and λ, numbers in [0, 1]: both required by ``gae``, γ alone by
      ``reinforce++``, and refused (left None) by the other estimators, which read neither.
    - ``semantics``: ``"masked"`` (the contract) or a name of
      :data:`gaecli.advantages.contract.BASELINES` (what a trainer computed): a trainer
      profile (``verl``, ``openrlhf``, ``slime``, ``roll``, ``areal``, ``nemo-rl``) or an
      alias of one (``unmasked``, ``skip-masked``, ``zero-masked``), kept as given.
    - ``normalize``: ``"none"``, ``"all"`` (whiten over every trainable token of the input) or
      ``"by"`` (per group of rows with equal ``normalize_by`` key; ``normalize_by`` names that
      per-row input).
    - ``estimator``: ``"gae"`` or a critic-free estimator of
      :data:`gaecli.advantages.contract.CRITIC_FREE` (docs/estimators.md), which needs the
      masked semantics and no ``normalize``. ``group_by`` names the per-row prompt-group id
      (required by the estimators of :data:`~gaecli.advantages.contract.GROUPED_ESTIMATORS`,
      refused by the others); ``step_by`` the per-row step id that splits gpg's α and the
      whitening of the ``reinforce++`` estimators (None: the whole input; refused where unused).
    - ``timestep`` (``"token"``), ``lambd_critic`` and ``lambd_alpha`` (``None``): the fields
      of the GAE variants to come. Today they accept only these values; any other is refused
      with a message saying so.
    """

    gamma: Optional[float] = None
    lambd: Optional[float] = None
    semantics: str = MASKED
    normalize: str = "none"
    normalize_by: Optional[str] = None
    estimator: str = "gae"
    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None
    group_by: Optional[str] = None
    step_by: Optional[str] = None

    def __post_init__(self) -> None:
        self._check_estimator()
        if self.semantics not in SEMANTICS:
            refuse(f"unknown semantics {self.semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")
        if self.normalize not in NORMALIZATIONS:
            refuse(f"unknown normalize {self.normalize!r}; choose one of: {', '.join(NORMALIZATIONS)}")
        if (self.normalize == "by") != (self.normalize_by is not None):
            refuse("normalize='by' needs normalize_by (the per-row group key), and normalize_by needs normalize='by'")
        if self.timestep not in TIMESTEPS:
            refuse(f"unknown timestep {self.timestep!r}; implemented: {', '.join(TIMESTEPS)}")
        for name in ("lambd_critic", "lambd_alpha"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    refuse(f"{name} must be a finite number or None, got {value!r}")
                refuse(f"{name} is not implemented yet; leave it None")

    def _check_estimator(self) -> None:
        """The estimator, the discount parameters it reads and its per-row inputs."""
        estimator = self.estimator
        if estimator not in ESTIMATORS:
            refuse(f"unknown estimator {estimator!r}; implemented: {', '.join(ESTIMATORS)}")
        used = ESTIMATOR_PARAMETERS.get(estimator, ())
        for name in ("gamma", "lambd"):
            value = getattr(self, name)
            if name in used and value is None:
                refuse(f"estimator {estimator!r} needs {name}")
            if name not in used and value is not None:
                refuse(f"estimator {estimator!r} does not use {name}; leave it None")
            check_number(name, value, 0.0, 1.0)
        if estimator not in CRITIC_FREE:
            for name in ("group_by", "step_by"):
                if getattr(self, name) is not None:
                    refuse(f"{name} is for the critic-free estimators; estimator 'gae' does not use it")
            return
        if self.semantics != MASKED:
            refuse(f"estimator {estimator!r} runs under the masked contract only (semantics {self.semantics!r})")
        if self.normalize != "none":
            refuse(f"estimator {estimator!r} defines its own scaling; normalize must be 'none'")
        if estimator in GROUPED_ESTIMATORS and self.group_by is None:
            refuse(f"estimator {estimator!r} needs group_by (the per-row prompt-group id)")
        if estimator not in GROUPED_ESTIMATORS and self.group_by is not None:
            refuse(f"estimator {estimator!r} has no groups; leave group_by None")
        if estimator not in STEP_ESTIMATORS and self.step_by is not None:
            refuse(f"estimator {estimator!r} has no statistic per step; leave step_by None")

    @property
    def critic_free(self) -> bool:
        """Whether the estimator reads no values (docs/estimators.md)."""
        return self.estimator in CRITIC_FREE

    @property
    def features(self) -> frozenset[str]:
        """What a kernel must support to run this spec (``estimator:…``, ``timestep:…``, and
        one name per variant field set). Semantics and normalisation run around the kernel,
        so every kernel of the estimator supports them."""
        required = {f"estimator:{self.estimator}", f"timestep:{self.timestep}"}
        required |= {name for name in ("lambd_critic", "lambd_alpha") if getattr(self, name) is not None}
        return frozenset(required)

    @property
    def row_inputs(self) -> tuple[RowInput, ...]:
        """The extra per-row inputs this spec reads: the ``normalize_by`` key, the group and
        step ids of the critic-free estimators."""
        named = (("normalize-key", self.normalize_by), ("group-id", self.group_by), ("step-id", self.step_by))
        return tuple(RowInput(name, role, "scalar") for role, name in named if name is not None)

    @property
    def normalize_label(self) -> str:
        """``none``, ``all`` or ``by:KEY``: the ``gaecli.normalize`` metadata value."""
        return f"by:{self.normalize_by}" if self.normalize == "by" else self.normalize

    def to_dict(self) -> dict:
        """Every field by name (for metadata and JSON reports)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}
