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
    ESTIMATORS,
    MASKED,
    NORMALIZATIONS,
    SEMANTICS,
    TIMESTEPS,
    check_discount,
)
from gaecli.errors import InvalidOptionError


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

    - ``gamma``, ``lambd``: γ and λ, numbers in [0, 1].
    - ``semantics``: ``"masked"`` (the contract) or a name of
      :data:`gaecli.advantages.contract.BASELINES` (what a trainer computed): a trainer
      profile (``verl``, ``openrlhf``, ``slime``, ``roll``, ``areal``, ``nemo-rl``) or an
      alias of one (``unmasked``, ``skip-masked``, ``zero-masked``), kept as given.
    - ``normalize``: ``"none"``, ``"all"`` (whiten over every trainable token of the input) or
      ``"by"`` (per group of rows with equal ``normalize_by`` key; ``normalize_by`` names that
      per-row input).
    - ``estimator`` (``"gae"``), ``timestep`` (``"token"``), ``lambd_critic`` and
      ``lambd_alpha`` (``None``): the fields of the GAE variants and critic-free estimators
      to come. Today they accept only these values; any other is refused with a message
      saying so.
    """

    gamma: float
    lambd: float
    semantics: str = MASKED
    normalize: str = "none"
    normalize_by: Optional[str] = None
    estimator: str = "gae"
    timestep: str = "token"
    lambd_critic: Optional[float] = None
    lambd_alpha: Optional[float] = None

    def __post_init__(self) -> None:
        check_discount(self.gamma, self.lambd)
        if self.semantics not in SEMANTICS:
            refuse(f"unknown semantics {self.semantics!r}; choose one of: {MASKED}, {', '.join(BASELINES)}")
        if self.normalize not in NORMALIZATIONS:
            refuse(f"unknown normalize {self.normalize!r}; choose one of: {', '.join(NORMALIZATIONS)}")
        if (self.normalize == "by") != (self.normalize_by is not None):
            refuse("normalize='by' needs normalize_by (the per-row group key), and normalize_by needs normalize='by'")
        if self.estimator not in ESTIMATORS:
            refuse(f"unknown estimator {self.estimator!r}; implemented: {', '.join(ESTIMATORS)}")
        if self.timestep not in TIMESTEPS:
            refuse(f"unknown timestep {self.timestep!r}; implemented: {', '.join(TIMESTEPS)}")
        for name in ("lambd_critic", "lambd_alpha"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    refuse(f"{name} must be a finite number or None, got {value!r}")
                refuse(f"{name} is not implemented yet; leave it None")

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
        """The extra per-row inputs this spec reads (today only the ``normalize_by`` key)."""
        if self.normalize_by is not None:
            return (RowInput(self.normalize_by, "normalize-key", "scalar"),)
        return ()

    @property
    def normalize_label(self) -> str:
        """``none``, ``all`` or ``by:KEY``: the ``gaecli.normalize`` metadata value."""
        return f"by:{self.normalize_by}" if self.normalize == "by" else self.normalize

    def to_dict(self) -> dict:
        """Every field by name (for metadata and JSON reports)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}
