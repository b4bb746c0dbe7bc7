"""The token rewards of a SkyRL dump, recovered from its stored returns (and values): SkyRL
pops the rewards from the batch before ``dump_data``, but its gae and reinforce++ returns
are a fixed linear recursion of them, which one shift of the ``[B, R]`` arrays inverts (see
docs/import.md, "Reward recovery")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from gaecli.errors import GAEInputError, InvalidOptionError
from gaecli.io.filesystem import AnyPath
from gaecli.options import check_choice, check_number

ESTIMATORS = ("gae", "reinforce++")
UNRECOVERABLE = ("grpo", "rloo", "maxrl")  # returns = advantages = the normalised score times the mask


@dataclass(frozen=True)
class Recovery:
    """How the token rewards are recovered from a dump's stored returns (and values): as
    SkyRL's ``estimator`` computed the returns with ``gamma`` (and ``lambd``)."""

    estimator: str
    gamma: float
    lambd: Optional[float] = None

    @property
    def needs(self) -> tuple[str, ...]:
        """The ``batch_dict`` keys the recovery reads."""
        return ("returns", "values") if self.estimator == "gae" else ("returns",)

    def rewards(self, returns: np.ndarray, values: Optional[np.ndarray]) -> np.ndarray:
        """The rewards ``[B, R]`` (float64) whose returns are ``returns``, at every column.

        gae (``compute_gae_advantage_return``: plain GAE over all R columns, next value 0
        after column R−1, ``returns = A + V`` before whitening): with ``A = returns − V``,
        ``δ_t = A_t − γλ·A_{t+1}`` and ``r_t = δ_t − γ·V_{t+1} + V_t`` (``A_R = V_R = 0``),
        that is ``r_t = ret_t − γλ·ret_{t+1} − γ(1−λ)·V_{t+1}``. reinforce++
        (``ret_t = r_t + γ·ret_{t+1}``): ``r_t = ret_t − γ·ret_{t+1}``. Each reward reads
        its own column and the next: no loop, no error carried along the response."""
        stored = returns.astype(np.float64)
        following = np.zeros_like(stored)
        following[:, :-1] = stored[:, 1:]
        with np.errstate(invalid="ignore", over="ignore"):
            if self.estimator == "reinforce++":
                return stored - self.gamma * following
            next_values = np.zeros_like(stored)
            next_values[:, :-1] = values[:, 1:]
            return stored - (self.gamma * self.lambd) * following - (self.gamma * (1.0 - self.lambd)) * next_values

    def check(self, path: AnyPath, arrays: dict[str, np.ndarray], response: np.ndarray) -> None:
        """The keys the recovery reads are in the dump (``arrays``: its ``[B, R]`` arrays by
        key), and its returns are not an outcome estimator's (equal to the advantages at
        every ``response`` token); else :class:`GAEInputError` naming the file."""
        for key in self.needs:
            if key not in arrays:
                why = (
                    "a run without a critic: --estimator gae recovers the rewards from the returns and the values; "
                    "a critic-free run used reinforce++ (--estimator reinforce++) or grpo, rloo, maxrl, whose "
                    "rewards cannot be recovered"
                    if key == "values"
                    else f"--estimator {self.estimator} recovers the rewards from the returns"
                )
                raise GAEInputError(f"{path}: batch_dict[{key!r}] is None or absent ({why})")
        if "advantages" in arrays:
            returns, advantages = arrays["returns"][response], arrays["advantages"][response]
            if returns.size and np.array_equal(returns, advantages) and bool(np.any(returns != 0)):
                raise GAEInputError(
                    f"{path}: batch_dict['returns'] equals batch_dict['advantages'] at every response token, as "
                    f"SkyRL's grpo, rloo and maxrl write them (the normalised score times the mask): their token "
                    f"rewards cannot be recovered; import without --estimator"
                )

    def to_dict(self) -> dict:
        return {"estimator": self.estimator, "gamma": self.gamma, "lambd": self.lambd}


def check_recovery(estimator: Optional[str], gamma: Optional[float], lambd: Optional[float]) -> Optional[Recovery]:
    """The :class:`Recovery` the options ask for (None without ``estimator``), checked:
    :class:`InvalidOptionError` for an estimator whose rewards cannot be recovered or that
    gaecli does not know, γ missing or out of [0, 1], λ missing or out of [0, 1] for gae,
    λ given with reinforce++, γ or λ given without an estimator."""
    if estimator is None:
        if gamma is not None or lambd is not None:
            raise InvalidOptionError(
                "--gamma and --lambd say how to recover the rewards: give them with --estimator gae or reinforce++"
            )
        return None
    if estimator in UNRECOVERABLE:
        raise InvalidOptionError(
            f"--estimator {estimator}: SkyRL's {estimator} writes returns = advantages = the normalised score "
            f"times the mask; the token rewards cannot be recovered from them (import without --estimator)"
        )
    check_choice("--estimator", estimator, ESTIMATORS, "estimator to recover the rewards of")
    if gamma is None:
        raise InvalidOptionError(f"--estimator {estimator} needs --gamma (the γ the run trained with)")
    check_number("--gamma", gamma, 0.0, 1.0)
    if estimator == "gae" and lambd is None:
        raise InvalidOptionError("--estimator gae needs --lambd (the λ the run trained with)")
    if estimator != "gae" and lambd is not None:
        raise InvalidOptionError(f"--lambd is GAE's λ: --estimator {estimator} takes --gamma only")
    check_number("--lambd", lambd, 0.0, 1.0)
    return Recovery(estimator, float(gamma), None if lambd is None else float(lambd))
