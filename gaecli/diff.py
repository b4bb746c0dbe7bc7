"""How far old advantages are from the masked-GAE ones: a streaming accumulator of the
figures over trainable tokens (masked positions are 0 by contract and not compared)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gaecli.checks import masked_tail_lengths, trainable_counts
from gaecli.stats import ExactSum, compare_rows


def terminal_credit(baseline: str, gamma: float, lambd: float, tail_lengths: np.ndarray) -> np.ndarray:
    """Share of the terminal reward that ``baseline`` delivers to the last trainable token
    of samples whose response ends in ``tail_lengths`` masked tokens (masked GAE: 1).

    ``unmasked``: (γλ)^gap (0 when γλ = 0 and gap > 0); ``skip-masked``: 0 whenever the last
    token is masked, else 1; ``zero-masked`` and ``masked``: 1.
    """
    tails = np.asarray(tail_lengths, dtype=np.float64)
    if baseline == "unmasked":
        return np.power(gamma * lambd, tails)
    if baseline == "skip-masked":
        return np.where(tails > 0, 0.0, 1.0)
    return np.ones_like(tails)


@dataclass
class DiffAccumulator:
    """Streaming comparison of new (masked) against old advantages, batch by batch.

    Every figure is exact or order independent, so it does not depend on batch sizes.
    """

    gamma: float
    lambd: float
    baseline: str = "unmasked"
    tolerance: float = 1e-6
    samples: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    changed_samples: int = 0
    fully_masked_samples: int = 0
    empty_samples: int = 0
    masked_tail_samples: int = 0
    masked_tail_tokens: int = 0
    longest_masked_tail: int = 0
    max_abs_delta: float = 0.0
    min_terminal_credit: float = 1.0
    _abs_delta_sum: ExactSum = field(default_factory=ExactSum)
    _credit_sum: ExactSum = field(default_factory=ExactSum)

    def update(self, new: np.ndarray, old: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> None:
        """Add one batch: flat ``[N]`` new and old advantages, bool ``trainable``, zero-based
        int64 ``offsets`` ``[B + 1]``."""
        lengths = np.diff(offsets)
        trainable_per_row = trainable_counts(trainable, offsets)
        max_abs, max_relative, sum_abs = compare_rows(new, old, trainable, offsets)
        self.changed_samples += int((max_relative > self.tolerance).sum())
        self.max_abs_delta = max(self.max_abs_delta, float(max_abs.max(initial=0.0)))
        self._abs_delta_sum.add(sum_abs)
        self.samples += lengths.size
        self.tokens += int(lengths.sum())
        self.trainable_tokens += int(trainable_per_row.sum())
        self.empty_samples += int((lengths == 0).sum())
        self.fully_masked_samples += int(((lengths > 0) & (trainable_per_row == 0)).sum())
        tails = masked_tail_lengths(trainable, offsets)
        with_tail = (tails > 0) & (trainable_per_row > 0)
        self.masked_tail_samples += int(with_tail.sum())
        self.masked_tail_tokens += int(tails[with_tail].sum())
        self.longest_masked_tail = max(self.longest_masked_tail, int(tails[with_tail].max(initial=0)))
        credits = terminal_credit(self.baseline, self.gamma, self.lambd, tails[with_tail])
        self._credit_sum.add(credits)
        self.min_terminal_credit = min(self.min_terminal_credit, float(credits.min(initial=1.0)))

    def result(self) -> dict:
        """The figures as a JSON-ready dict (documented in docs/recompute.md)."""
        tail = self.masked_tail_samples
        return {
            "baseline": self.baseline,
            "tolerance": self.tolerance,
            "samples": self.samples,
            "tokens": self.tokens,
            "trainable_tokens": self.trainable_tokens,
            "changed_samples": self.changed_samples,
            "fully_masked_samples": self.fully_masked_samples,
            "empty_samples": self.empty_samples,
            "masked_tail_samples": tail,
            "mean_masked_tail_length": self.masked_tail_tokens / tail if tail else None,
            "longest_masked_tail": self.longest_masked_tail,
            "mean_terminal_credit": self._credit_sum.value() / tail if tail else None,
            "min_terminal_credit": self.min_terminal_credit if tail else None,
            "mean_abs_delta_advantage": self._abs_delta_sum.value() / self.trainable_tokens if self.trainable_tokens else 0.0,
            "max_abs_delta_advantage": self.max_abs_delta,
        }
