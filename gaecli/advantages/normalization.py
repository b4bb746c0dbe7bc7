"""How whitening normalises (docs/semantics.md#whitening-rules): the choices the trainers use,
as one small object (:class:`WhiteningRule`, the spec's ``norm_*`` fields), the trainers' own
(:data:`NORM_LIKE`, ``--norm-like``), and its formula written once for numpy and torch
(:func:`rule_center_scale`: each group's centre and divisor from its count, mean and Bessel
variance). Unset, every field keeps today's rule: ``(A − mean) / sqrt(var + 1e-8)``, the
Bessel variance, a group of one token whitened to 0."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

from gaecli.advantages.contract import WHITEN_EPSILON
from gaecli.errors import InvalidOptionError
from gaecli.options import check_choice, check_number

LEVELS: tuple[str, ...] = ("group", "batch", "none")
"""Where a whitening statistic is taken: over the whitening's groups (``--normalize-by``'s,
or the whole input under ``--normalize``), over the whole input, or not at all (no centring;
no scaling)."""

EPSILON_PLACES: tuple[str, ...] = ("sqrt", "std", "floor")
"""Where ε goes: ``sqrt(var + ε)`` (gaecli's, verl's ``masked_whiten``, slime's), ``std + ε``
(AReaL's ``Normalization``), ``sqrt(max(var, ε))`` (OpenRLHF's)."""

ONE_TOKEN: tuple[str, ...] = ("zero", "keep")
"""A group with at most one trainable token: whitened as any other (its variance 0: the token
whitens to 0 when centred), or left as it is (ROLL's ``masked_whiten`` turns whitening off)."""


@dataclass(frozen=True)
class WhiteningRule:
    """The whitening choices (hashable): the centre's and the divisor's level
    (:data:`LEVELS`), the Bessel (``unbiased``) or biased variance, ε and its place
    (:data:`EPSILON_PLACES`), and a group of at most one token (:data:`ONE_TOKEN`). The
    default is today's rule. Checked on construction (:class:`InvalidOptionError`, naming the
    option)."""

    mean: str = "group"
    std: str = "group"
    unbiased: bool = True
    eps: float = WHITEN_EPSILON
    eps_in: str = "sqrt"
    one_token: str = "zero"

    def __post_init__(self) -> None:
        check_choice("--norm-mean", self.mean, LEVELS, "level")
        check_choice("--norm-std", self.std, LEVELS, "level")
        check_choice("--norm-eps-in", self.eps_in, EPSILON_PLACES, "place")
        check_choice("--norm-one-token", self.one_token, ONE_TOKEN, "choice")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)):
            raise InvalidOptionError(f"--norm-eps must be a number, got {self.eps!r}")
        check_number("--norm-eps", self.eps, 0.0)

    @property
    def is_default(self) -> bool:
        """Whether this is today's rule (whose bits the default path keeps)."""
        return self == WhiteningRule()

    def levels_used(self) -> tuple[str, ...]:
        """The levels whose statistics the rule reads (centre, divisor), each once."""
        return tuple(dict.fromkeys(level for level in (self.mean, self.std) if level != "none"))


NORM_LIKE: dict[str, WhiteningRule] = {
    "verl": WhiteningRule(),
    "slime": WhiteningRule(),
    "nemo-rl": WhiteningRule(),
    "roll": WhiteningRule(one_token="keep"),
    "areal": WhiteningRule(eps=1e-5, eps_in="std"),
    "openrlhf": WhiteningRule(unbiased=False, eps=1e-8, eps_in="floor"),
}
"""Each trainer's whitening of the advantages (``--norm-like``; docs/semantics.md#whitening-rules):
verl ``verl/utils/torch_functional.py`` ``masked_whiten``, slime ``slime/utils/distributed_utils.py``
``distributed_masked_whiten``, NeMo-RL's GAE whitening and ROLL's ``masked_whiten`` are all
``(A − mean) · rsqrt(var + 1e-8)`` with the Bessel variance, ROLL leaving a batch of at most one
token as it is; AReaL's ``Normalization`` (``NormConfig`` defaults) divides by ``std + 1e-5``;
OpenRLHF's experience maker by ``rsqrt(max(var, 1e-8))`` of the biased variance."""


def whitening_rule(like: Optional[str] = None, **explicit) -> Optional[WhiteningRule]:
    """The rule of ``--norm-like`` (a key of :data:`NORM_LIKE`) with the explicit choices
    (``explicit``: the :class:`WhiteningRule` fields given, None for those not) over it; None
    when nothing is given (today's rule)."""
    given = {name: value for name, value in explicit.items() if value is not None}
    if like is None and not given:
        return None
    if like is not None:
        check_choice("--norm-like", like, NORM_LIKE, "trainer")
    base = NORM_LIKE[like] if like is not None else WhiteningRule()
    unknown = set(given) - {field.name for field in fields(WhiteningRule)}
    if unknown:
        raise InvalidOptionError(f"unknown whitening choice {sorted(unknown)[0]!r}")
    return replace(base, **given)


def rule_center_scale(rule: WhiteningRule, counts, means, variances, xp):
    """Each group's centre and divisor under ``rule`` from its trainable count ``n``, mean and
    Bessel variance (0 for one token), all of one shape, in the array library ``xp`` (numpy
    or torch, float64): the centre is the mean (0 at level ``none``); the variance is taken
    about the centre (about 0: ``var + n·mean²/(n − 1)``), biased when asked (×(n − 1)/n);
    the divisor is ``sqrt(var + ε)``, ``sqrt(var) + ε`` or ``sqrt(max(var, ε))`` (1 at level
    ``none``); a group of at most one token under ``keep`` gets centre 0 and divisor 1."""
    several = counts > 1
    spare = xp.where(several, counts - 1, 1) * 1.0
    centers = means if rule.mean != "none" else means * 0.0
    spread = variances if rule.mean != "none" else variances + xp.where(several, counts * means * means / spare, 0.0)
    if not rule.unbiased:
        spread = xp.where(several, spread * spare / counts, 0.0)
    if rule.std == "none":
        scales = spread * 0.0 + 1.0
    elif rule.eps_in == "sqrt":
        scales = xp.sqrt(spread + rule.eps)
    elif rule.eps_in == "std":
        scales = xp.sqrt(spread) + rule.eps
    else:
        scales = xp.sqrt(xp.maximum(spread, spread * 0.0 + rule.eps))
    if rule.one_token == "keep":
        centers = xp.where(several, centers, 0.0)
        scales = xp.where(several, scales, 1.0)
    return centers, scales
