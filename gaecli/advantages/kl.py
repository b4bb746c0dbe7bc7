"""KL-shaped per-token rewards from log-probs: the four estimators the trainers use, as
vectorised float64 numpy functions on flat arrays, and ``rewards = −C · KL``.

Every estimator takes the log-ratio ``log_probs − ref_log_probs`` (policy minus reference,
flat ``[N]``) and returns the per-token KL estimate ``[N]`` (float64):

- ``k1``: ``log_ratio``
- ``k2``: ``log_ratio² / 2``
- ``k3``: ``exp(−log_ratio) − 1 + log_ratio``
- ``low_var_kl``: ``k3`` with ``−log_ratio`` first clamped to [−20, 20] (NaN → 0) and the
  result clamped to [−10, 10] (verl's ``low_var_kl``)

Masked positions get a KL reward like any other: masked GAE never reads it, the baselines
(which treat every token as a transition, as the trainers did) do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from gaecli.options import check_choice, check_number

if TYPE_CHECKING:  # numpy is imported where a function runs: the help lists the estimators without it
    import numpy as np

LOW_VAR_LOG_RATIO_BOUND = 20.0
LOW_VAR_KL_BOUND = 10.0


def k1(log_ratio: np.ndarray) -> np.ndarray:
    """``log_ratio`` (the unbiased, high-variance estimator)."""
    import numpy as np

    return np.asarray(log_ratio, dtype=np.float64).copy()


def k2(log_ratio: np.ndarray) -> np.ndarray:
    """``log_ratio² / 2``."""
    import numpy as np

    log_ratio = np.asarray(log_ratio, dtype=np.float64)
    return log_ratio * log_ratio / 2.0


def k3(log_ratio: np.ndarray) -> np.ndarray:
    """``exp(−log_ratio) − 1 + log_ratio`` (Schulman's unbiased, non-negative estimator)."""
    import numpy as np

    log_ratio = np.asarray(log_ratio, dtype=np.float64)
    return np.expm1(-log_ratio) + log_ratio


def low_var_kl(log_ratio: np.ndarray) -> np.ndarray:
    """``k3`` computed on ``−log_ratio`` clamped to [−20, 20] (NaN → 0), the result
    clamped to [−10, 10]."""
    import numpy as np

    negative = np.clip(-np.asarray(log_ratio, dtype=np.float64), -LOW_VAR_LOG_RATIO_BOUND, LOW_VAR_LOG_RATIO_BOUND)
    negative = np.where(np.isnan(negative), 0.0, negative)
    return np.clip(np.expm1(negative) - negative, -LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)


KL_ESTIMATORS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "low_var_kl": low_var_kl,
}


def check_kl_options(coef: Optional[float], estimator: str) -> None:
    """Refuse (:class:`gaecli.errors.InvalidOptionError`) an unknown estimator or a
    coefficient that is not a finite number (None: no KL rewards)."""
    check_choice("--kl-estimator", estimator, KL_ESTIMATORS, "KL estimator")
    check_number("--kl-coef", coef)


def kl_estimate(log_probs: np.ndarray, ref_log_probs: np.ndarray, estimator: str) -> np.ndarray:
    """Per-token KL estimate ``[N]`` (float64) of flat ``log_probs`` and ``ref_log_probs``
    ``[N]`` (any float dtype) under ``estimator`` (a key of :data:`KL_ESTIMATORS`)."""
    import numpy as np

    check_choice("--kl-estimator", estimator, KL_ESTIMATORS, "KL estimator")
    log_ratio = np.asarray(log_probs, dtype=np.float64) - np.asarray(ref_log_probs, dtype=np.float64)
    return KL_ESTIMATORS[estimator](log_ratio)


def kl_rewards(log_probs: np.ndarray, ref_log_probs: np.ndarray, coef: float, estimator: str) -> np.ndarray:
    """KL-shaped per-token rewards ``−coef · KL`` ``[N]`` (float64)."""
    check_kl_options(coef, estimator)
    return -float(coef) * kl_estimate(log_probs, ref_log_probs, estimator)
