"""SkyRL training-input dumps written here the way SkyRL's ``TrainingInputBatch.save`` pickles
them (``pickle.dump`` of a ``TensorBatch`` whose ``__reduce__`` is
``(_rebuild_tensor_batch, (type(self), state))``), without SkyRL installed: stand-in modules
``skyrl.backends.skyrl_train.training_batch`` (and its packages) are put in ``sys.modules``
only while a dump is pickled, and removed afterwards, so the importer can never find them.

The batches follow SkyRL's layout (``convert_prompts_responses_to_batch_tensors``):
``[B, R]`` response-level tensors right-aligned (padding first, the response in the last
``response_length`` columns), ``[B, S]`` sequences left-padded, the score on column R−1,
batch padding rows copied from row 0 with ``loss_mask`` 0; their returns are computed by
independent float64 loops written here as SkyRL's estimators are described (plain GAE over
all R columns; reinforce++'s discounted sum with the mask reset), then stored as float32."""

from __future__ import annotations

import io
import pickle
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

MODULE = "skyrl.backends.skyrl_train.training_batch"
PACKAGES = ("skyrl", "skyrl.backends", "skyrl.backends.skyrl_train")


def _fake_module() -> types.ModuleType:
    """A module named like SkyRL's ``training_batch`` with the three names a dump refers to."""
    module = types.ModuleType(MODULE)

    def _rebuild_tensor_batch(cls, state):
        batch = cls()
        batch.state = state
        return batch

    class TensorBatch(dict):
        state: dict = {}

        def __getstate__(self):
            return self.state

        def __reduce__(self):
            return (_rebuild_tensor_batch, (type(self), self.__getstate__()))

    class TrainingInputBatch(TensorBatch):
        pass

    class TrainingOutputBatch(TensorBatch):
        pass

    for item in (_rebuild_tensor_batch, TensorBatch, TrainingInputBatch, TrainingOutputBatch):
        item.__module__ = MODULE
        item.__qualname__ = item.__name__
        setattr(module, item.__name__, item)
    return module


@contextmanager
def skyrl_modules() -> Iterator[types.ModuleType]:
    """The stand-in ``training_batch`` module, registered (with its packages) for the block only."""
    saved = {name: sys.modules.get(name) for name in (*PACKAGES, MODULE)}
    module = _fake_module()
    for name in PACKAGES:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[MODULE] = module
    try:
        yield module
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def numpy_entry(array: np.ndarray) -> dict:
    """SkyRL's fast path: the array's bytes, shape and dtype name."""
    return {"format": "numpy", "data": array.tobytes(), "shape": array.shape, "dtype": str(array.dtype)}


def torch_entry(tensor: torch.Tensor) -> dict:
    """SkyRL's fallback (bfloat16 and other dtypes numpy lacks): ``torch.save`` bytes."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return {"format": "torch", "data": buffer.getvalue()}


def pickle_batch(state: dict, kind: str = "TrainingInputBatch") -> bytes:
    """The bytes ``TrainingInputBatch.save`` writes for a batch of ``state``."""
    with skyrl_modules() as module:
        batch = getattr(module, kind)()
        batch.state = state
        return pickle.dumps(batch)


def write_batch(path: Path, state: dict, kind: str = "TrainingInputBatch") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle_batch(state, kind))
    return path


def dump_name(step: int) -> str:
    return f"global_step_{step}_training_input.pkl"


# ----------------------------------------------------------------------------- SkyRL's returns, float64


def gae_returns(rewards: np.ndarray, values: np.ndarray, gamma: float, lambd: float) -> tuple[np.ndarray, np.ndarray]:
    """Plain GAE over every column of every row, next value 0 after the last column, one
    row and one token at a time in Python floats: (advantages, returns = A + V)."""
    advantages = np.zeros(rewards.shape)
    for row in range(rewards.shape[0]):
        last = 0.0
        for t in reversed(range(rewards.shape[1])):
            next_value = float(values[row, t + 1]) if t + 1 < rewards.shape[1] else 0.0
            delta = float(rewards[row, t]) + gamma * next_value - float(values[row, t])
            last = delta + gamma * lambd * last
            advantages[row, t] = last
    return advantages, advantages + values.astype(np.float64)


def reinforce_returns(rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """``running = r_t + γ·running; returns_t = running; running *= mask_t``, one token at a time."""
    returns = np.zeros(rewards.shape)
    for row in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            running = float(rewards[row, t]) + gamma * running
            returns[row, t] = running
            running *= float(mask[row, t])
    return returns


def masked_whiten(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(x − mean) / sqrt(var + 1e-8) over the mask's tokens (float64)."""
    chosen = values[mask.astype(bool)]
    return (values - chosen.mean()) / np.sqrt(chosen.var() + 1e-8) if chosen.size else values


# ----------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """One step's batch as the test knows it: the ``[B, R]`` arrays stored (as SkyRL holds
    them), the true token rewards (float64, 0 outside the response), the prompt boundaries
    and the dump's state."""

    arrays: dict[str, Optional[np.ndarray]]
    rewards: np.ndarray
    lengths: list[int]
    boundaries: Optional[list[tuple[int, int]]]
    pad: int
    state: dict = field(default_factory=dict)

    def cut(self, key: str) -> list[list]:
        """Each row's response columns of ``key`` (a Python loop over rows: the oracle)."""
        array = self.arrays[key]
        width = array.shape[1]
        return [array[row, width - length :].tolist() for row, length in enumerate(self.lengths)]


def skyrl_batch(
    seed: int,
    *,
    prompts: int = 3,
    per_prompt: int = 2,
    width: int = 9,
    pad: int = 0,
    estimator: str = "gae",
    gamma: float = 0.99,
    lambd: float = 0.95,
    critic: bool = True,
    boundaries: bool = True,
    step: Optional[int] = None,
) -> Batch:
    """A training batch of ``prompts × per_prompt`` samples (+ ``pad`` padding rows) with
    responses of R = ``width`` columns: one row's response fills all R columns, one has a
    single token; multi-turn loss masks (tool output 0); a small per-token penalty on every
    response token and a score on the last; returns and (whitened) advantages of
    ``estimator``; ``base_action_log_probs`` in bfloat16 (SkyRL's torch-format entry);
    ``rollout_logprobs`` None; a numpy float in the metadata."""
    rng = np.random.default_rng(seed)
    rows = prompts * per_prompt
    lengths = [int(rng.integers(1, width + 1)) for _ in range(rows)]
    lengths[0], lengths[min(1, rows - 1)] = width, 1
    response = np.zeros((rows, width), dtype=np.int64)
    loss_mask = np.zeros((rows, width), dtype=np.float32)
    rewards = np.zeros((rows, width))
    for row, length in enumerate(lengths):
        start = width - length
        response[row, start:] = 1
        trainable = (rng.random(length) > 0.3).astype(np.float32)
        trainable[0] = 1.0
        loss_mask[row, start:] = trainable
        rewards[row, start:] = np.round(rng.normal(0.0, 0.02, length), 4)
        rewards[row, width - 1] += float(rng.choice([0.0, 1.0, -0.5]))
    values = rng.normal(0.0, 1.0, (rows, width)).astype(np.float32)
    if estimator == "gae":
        advantages, returns = gae_returns(rewards, values, gamma, lambd)
    else:
        returns = reinforce_returns(rewards, response, gamma)
        advantages = returns
    advantages = masked_whiten(advantages, response)
    log_probs = -rng.random((rows, width)).astype(np.float32)
    ref = torch.tensor(-rng.random((rows, width)), dtype=torch.bfloat16)
    arrays = {
        "response_mask": response,
        "loss_mask": loss_mask,
        "values": values if critic else None,
        "returns": returns.astype(np.float32),
        "advantages": advantages.astype(np.float32),
        "action_log_probs": log_probs,
        "base_action_log_probs": ref.float().numpy(),
        "kl": (log_probs - ref.float().numpy()).astype(np.float32),
        "rollout_logprobs": None,
    }
    bounds = [(p * per_prompt, (p + 1) * per_prompt) for p in range(prompts)]
    if pad:
        arrays = {
            key: None if a is None else np.concatenate([a, np.repeat(a[:1], pad, axis=0)]) for key, a in arrays.items()
        }
        arrays["loss_mask"][rows:] = 0.0
        rewards = np.concatenate([rewards, np.repeat(rewards[:1], pad, axis=0)])
        lengths = lengths + [lengths[0]] * pad
    batch = Batch(arrays, rewards, lengths, bounds if boundaries else None, pad)
    batch.state = training_state(batch, ref, rng, step)
    return batch


def training_state(batch: Batch, ref: torch.Tensor, rng: np.random.Generator, step: Optional[int]) -> dict:
    """The state ``TrainingInputBatch.__getstate__`` gives for ``batch``: the ``[B, R]``
    entries (numpy fast path; the reference log-probs in torch format), left-padded
    ``sequences`` / ``attention_mask`` ``[B, S]``, a device, the metadata."""
    rows, width = batch.arrays["response_mask"].shape
    prompt_width = 4
    attention = np.zeros((rows, prompt_width + width), dtype=np.int64)
    for row, length in enumerate(batch.lengths):
        attention[row, attention.shape[1] - (1 + row % 3) - length :] = 1  # a prompt of 1–3 tokens, left-padded
    sequences = rng.integers(0, 50_000, attention.shape).astype(np.int64) * attention
    if batch.pad:
        ref = torch.cat([ref, ref[:1].repeat(batch.pad, 1)])
    entries = {
        key: None if array is None else numpy_entry(array)
        for key, array in batch.arrays.items()
        if key != "base_action_log_probs"
    }
    entries["base_action_log_probs"] = torch_entry(ref)
    metadata = {
        "response_length": width,
        "avg_response_length": np.float64(np.mean(batch.lengths)),
        "policy_mini_batch_boundaries": [(0, rows)],
        "metrics": {"policy/kl": 0.01},
    }
    if batch.pad:
        metadata["pad_size"] = batch.pad
    if batch.boundaries is not None:
        metadata["policy_prompt_boundaries"] = list(batch.boundaries)
    if step is not None:
        metadata["global_step"] = step
    return {
        "batch_dict": {"sequences": numpy_entry(sequences), "attention_mask": numpy_entry(attention), **entries},
        "batch_size": rows,
        "device": torch.device("cpu"),
        "metadata": metadata,
    }
