"""A uniform sample of trainable tokens (new, old advantage) for ``gae diff``'s scatter
plot, independent of the batch size and the partition."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gaecli.stats import keyed_sample

SCATTER_SAMPLE = 20_000
NO_THRESHOLD = np.uint64(2**64 - 1)


class TokenSample:
    """A uniform sample of at most ``capacity`` trainable tokens (new, old advantage) for
    the scatter plot: each token gets a fixed pseudo-random key from (file, position) and
    the ``capacity`` smallest keys are kept (bottom-k sampling), so the sample does not
    depend on the batch size."""

    def __init__(self, capacity: int = SCATTER_SAMPLE) -> None:
        self.capacity = capacity
        self.keys = np.zeros(0, dtype=np.uint64)
        self.new = np.zeros(0)
        self.old = np.zeros(0)

    def threshold(self) -> np.uint64:
        return self.keys.max() if self.keys.size >= self.capacity else NO_THRESHOLD

    def update(
        self, new: np.ndarray, old: np.ndarray, trainable: np.ndarray, file_index: int, first_token: int
    ) -> None:
        update_samples((self,), ((new, old),), trainable, file_index, first_token)

    def _add(self, new: np.ndarray, old: np.ndarray, positions: np.ndarray, keys: np.ndarray) -> None:
        # the candidates at ``positions`` (keys ``keys``), then the ``capacity`` smallest kept
        self.keys = np.concatenate([self.keys, keys])
        self.new = np.concatenate([self.new, new[positions].astype(np.float64)])
        self.old = np.concatenate([self.old, old[positions].astype(np.float64)])
        if self.keys.size > self.capacity:
            kept = np.argpartition(self.keys, self.capacity - 1)[: self.capacity]
            self.keys, self.new, self.old = self.keys[kept], self.new[kept], self.old[kept]

    def merge(self, other: "TokenSample") -> None:
        """Add another partition's sample: the ``capacity`` smallest keys of both (keys are
        fixed per (file, token), so any partition keeps the same tokens)."""
        keys = np.concatenate([self.keys, other.keys])
        new = np.concatenate([self.new, other.new])
        old = np.concatenate([self.old, other.old])
        if keys.size > self.capacity:
            kept = np.argsort(keys, kind="stable")[: self.capacity]
            keys, new, old = keys[kept], new[kept], old[kept]
        self.keys, self.new, self.old = keys, new, old

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """(new, old) in key order."""
        order = np.argsort(self.keys, kind="stable")
        return self.new[order], self.old[order]


def update_samples(
    samples: Sequence[TokenSample], pairs: Sequence[tuple], trainable: np.ndarray, file_index: int, first_token: int
) -> None:
    """Each of ``samples`` updated with its (new, old) of ``pairs``, on one batch of a file:
    the trainable tokens' keys, which depend on their positions alone, are made once for
    all, below the largest of the samples' thresholds (a sample keeps its own smallest
    keys of those)."""
    taking = [(sample, pair) for sample, pair in zip(samples, pairs, strict=True) if sample.capacity]
    if not taking:
        return
    threshold = max(sample.threshold() for sample, _ in taking)
    first_key = (file_index << 40) + first_token
    positions, keys = keyed_sample(trainable, np.uint64(first_key), threshold)
    if positions.size == 0:
        return
    for sample, (new, old) in taking:
        sample._add(new, old, positions, keys)
