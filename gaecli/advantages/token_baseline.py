"""optimal-token-baseline (docs/estimators.md): each trainable token's return ``G_k`` and
cumulative path-variance proxy ``W_k`` over the row's trainable subsequence
(:func:`path_operand`), the group sums at each position ``k`` that give the per-token
baseline ``b_k = Σ G·W / (Σ W + ε)`` (:class:`PathSums`, keyed by (group, position) on one
:class:`gaecli.advantages.keyed.KeyedSums`), and the advantages ``G_k − b_k``
(:func:`token_baseline_advantages`)."""

from __future__ import annotations

from typing import Mapping, Optional

import numba
import numpy as np
import pyarrow as pa

from gaecli.advantages.contract import TOKEN_BASELINE_EPSILON
from gaecli.advantages.keyed import KeyedSums, position_keys


@numba.njit(cache=True, nogil=True)
def _paths(rewards, trainable, offsets, terminal_rewards, log_probs, sum_pi_squared, returns, weights):
    # Per row, over its trainable tokens only: W_k = Σ_{j ≤ k} (1 − 2·exp(logp_j) + Σπ²_j),
    # summed forward; G_k = z + Σ_{j ≥ k} r_j, summed backward (z on the last trainable token).
    # Masked positions keep 0.
    for row in range(offsets.shape[0] - 1):
        start, end = offsets[row], offsets[row + 1]
        cumulative = 0.0
        for t in range(start, end):
            if trainable[t]:
                cumulative += 1.0 - 2.0 * np.exp(np.float64(log_probs[t])) + np.float64(sum_pi_squared[t])
                weights[t] = cumulative
        running = np.float64(terminal_rewards[row])
        for t in range(end - 1, start - 1, -1):
            if trainable[t]:
                running = np.float64(rewards[t]) + running
                returns[t] = running


def path_operand(
    rewards: np.ndarray,
    trainable: np.ndarray,
    offsets: np.ndarray,
    terminal_rewards: np.ndarray,
    log_probs: np.ndarray,
    sum_pi_squared: np.ndarray,
) -> np.ndarray:
    """The returns ``G`` and the cumulative path weights ``W`` of every token (float64
    ``[2, N]``: row 0 ``G``, row 1 ``W``; 0 at masked positions). Flat ``[N]`` rewards,
    bool ``trainable``, log-probs and ``Σπ²``; ``offsets`` ``[B + 1]``, ``terminal_rewards``
    ``[B]``. A row depends on its own tokens alone."""
    paths = np.zeros((2, trainable.size), dtype=np.float64)
    _paths(
        np.ascontiguousarray(rewards),
        np.ascontiguousarray(trainable),
        np.ascontiguousarray(offsets, dtype=np.int64),
        np.ascontiguousarray(terminal_rewards),
        np.ascontiguousarray(log_probs),
        np.ascontiguousarray(sum_pi_squared),
        paths[0],
        paths[1],
    )
    return paths


def trainable_positions(trainable: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flat index of every trainable token, its row and its position ``k`` in its row's
    trainable subsequence (int64 each, in token order)."""
    tokens = np.flatnonzero(trainable)
    first = np.searchsorted(tokens, offsets)  # each row's first trainable token, by rank
    rows = np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(first))
    positions = np.arange(tokens.size, dtype=np.int64) - first[rows]
    return tokens, rows, positions


def path_rows(paths: np.ndarray, trainable: np.ndarray, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """What a batch adds to :class:`PathSums`: one entry per trainable token (its row, its
    position ``k``, a member count 1, ``G·W`` and ``W``), in token order."""
    tokens, rows, positions = trainable_positions(trainable, offsets)
    returns, weights = paths[0, tokens], paths[1, tokens]
    return {
        "row": rows,
        "position": positions,
        "members": np.ones(tokens.size, dtype=np.int64),
        "weighted": returns * weights,
        "weights": weights,
    }


class PathSums(KeyedSums):
    """Per (group, position ``k``): the group's rows that reach ``k`` (``members``) and the
    compensated sums of ``G_k·W_k`` and ``W_k`` over them. Keyed by the composite keys of
    :func:`gaecli.advantages.keyed.position_keys`: :meth:`add` takes the rows' group keys and
    the entries of :func:`path_rows` and adds one entry per trainable token."""

    COUNTS = ("members",)
    SUMS = ("weighted", "weights")

    def add(self, keys: Optional[pa.Array], rows: Mapping[str, np.ndarray]) -> None:
        if keys is None:
            raise ValueError("optimal-token-baseline: the group ids are needed")
        entries = position_keys(keys, rows["row"], rows["position"])
        super().add(entries, {name: rows[name] for name in (*self.COUNTS, *self.SUMS)})

    def key_baselines(self) -> np.ndarray:
        """Each (group, position)'s baseline ``Σ G·W / (Σ W + ε)`` (float64 ``[keys]``); 0 where
        fewer than two of the group's rows reach the position (a group of one; the tail of a
        group's one longest row)."""
        return self.derived("baselines", self._key_baselines)

    def _key_baselines(self) -> np.ndarray:
        weighted, weights = self.total("weighted"), self.total("weights")
        with np.errstate(divide="ignore", invalid="ignore"):
            baselines = weighted / (weights + TOKEN_BASELINE_EPSILON)
        return np.where(self.count("members") >= 2, baselines, 0.0)

    def baselines(self, keys: pa.Array, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The baseline of each entry (its row's group key ``keys[rows]``, its ``positions``),
        float64; an entry whose key has no statistics raises :class:`GAEInputError`."""
        entries = position_keys(keys, rows, positions)
        codes = self.known_codes(entries, rows.size, "group and position")
        return self.key_baselines()[codes]


def token_baseline_advantages(
    sums: PathSums, paths: np.ndarray, trainable: np.ndarray, offsets: np.ndarray, group_keys: pa.Array
) -> tuple[np.ndarray, np.ndarray]:
    """optimal-token-baseline's advantages ``G_k − b_k`` at trainable tokens (0 at masked
    ones) and returns ``G`` (float64 ``[N]`` each), from the rows' :func:`path_operand` and the
    merged :class:`PathSums` of the input."""
    tokens, rows, positions = trainable_positions(trainable, offsets)
    advantages = np.zeros(trainable.size, dtype=np.float64)
    if tokens.size:
        advantages[tokens] = paths[0, tokens] - sums.baselines(group_keys, rows, positions)
    return advantages, paths[0]
