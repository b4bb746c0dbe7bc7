"""Benchmark of the drop-ins of ``gaecli.trainers`` against each trainer's own algorithm, written
out in this script as the trainer writes it (a vectorised step per column, right to left), on
trainer-shaped padded batches, in one run; the table shows best-of-N milliseconds and the
speed-up of the drop-in over the trainer's function.

    python scripts/bench_trainers.py [--repeat 5] [--device cpu] [--workload micro,agentic,long]

Workloads (float32, right-padded ``[B, T]``): ``micro`` 64 × 2,048 (single turn, a short masked
tail on some rows), ``agentic`` 256 × 4,608 (tool blocks, 40–60 % of each response masked),
``long`` 8 × 131,072. Rows: verl's ``compute_gae_advantage_return`` (its loop and its
``masked_whiten``) beside the drop-in in both modes (``masked``, ``verl``), OpenRLHF's
``get_advantages_and_returns`` beside the drop-in. Each call runs once untimed first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gaecli.trainers import openrlhf, verl  # noqa: E402

WORKLOADS = {"micro": (64, 2048, 0.0), "agentic": (256, 4608, 0.5), "long": (8, 131_072, 0.5)}
"""name: (rows, columns, share of each response in tool blocks)."""

GAMMA, LAMBD = 1.0, 0.95


def padded_batch(rows: int, width: int, masked: float, device: str, seed: int = 0):
    """Rewards (the outcome on the response's last token), values and a 0/1 mask ``[B, T]``:
    responses of 60–100 % of the width, tool blocks of 64–512 tokens covering about ``masked``
    of each (none: a short masked tail on a quarter of the rows), then padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(int(0.6 * width), width + 1, rows)
    position = np.arange(width)[None, :]
    mask = position < lengths[:, None]
    if masked > 0:
        block = rng.integers(64, 513, rows)[:, None]
        phase = rng.integers(0, 512, rows)[:, None]
        tool = ((position + phase) // block) % 2 == 1
        mask &= ~tool | (position < block)  # the prompt's answer starts trainable
    else:
        tails = np.where(rng.random(rows) < 0.25, rng.integers(1, 32, rows), 0)
        mask &= position < (lengths - tails)[:, None]
    rewards = np.zeros((rows, width), dtype=np.float32)
    rewards[np.arange(rows), lengths - 1] = rng.choice([0.0, 1.0], rows)
    values = rng.normal(size=(rows, width)).astype(np.float32)
    as_tensor = lambda array: torch.from_numpy(np.ascontiguousarray(array)).to(device)  # noqa: E731
    return as_tensor(rewards), as_tensor(values), as_tensor(mask.astype(np.float32))


def verls_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's ``compute_gae_advantage_return`` as verl writes it: one step per column, then
    ``masked_whiten`` (the Bessel variance over the mask, rsqrt(var + 1e-8))."""
    next_values, last, reversed_advantages = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
        candidate = delta + gamma * lam * last
        next_values = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * next_values
        last = candidate * response_mask[:, t] + (1 - response_mask[:, t]) * last
        reversed_advantages.append(last)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = advantages + values
    mean = (advantages * response_mask).sum() / response_mask.sum()
    count = response_mask.sum()
    variance = (((advantages - mean) ** 2) * response_mask).sum() / count * (count / (count - 1))
    return (advantages - mean) * torch.rsqrt(variance + 1e-8), returns


def openrlhfs_gae(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF's ``get_advantages_and_returns`` as OpenRLHF writes it."""
    values, rewards = action_mask * values, action_mask * rewards
    last, reversed_advantages, length = 0, [], rewards.size(1)
    for t in reversed(range(length)):
        next_values = values[:, t + 1] if t < length - 1 else 0.0
        last = rewards[:, t] + gamma * next_values - values[:, t] + gamma * lambd * last
        reversed_advantages.append(last)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return advantages, advantages + values


def cases(r, v, m):
    """(label, the trainer's call, the drop-in's call) on one batch."""
    return [
        ("verl compute_gae_advantage_return (masked)", lambda: verls_gae(r, v, m, GAMMA, LAMBD),
         lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD)),
        ("verl compute_gae_advantage_return (verl)", lambda: verls_gae(r, v, m, GAMMA, LAMBD),
         lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD, semantics="verl")),
        ("openrlhf get_advantages_and_returns (masked)", lambda: openrlhfs_gae(v, r, m, GAMMA, LAMBD),
         lambda: openrlhf.get_advantages_and_returns(v, r, m, GAMMA, LAMBD)),
    ]  # fmt: skip


def best_ms(call, repeat: int, device: str) -> float:
    call()
    best = float("inf")
    for _ in range(repeat):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload", default=",".join(WORKLOADS))
    arguments = parser.parse_args()
    print(f"device {arguments.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; best of "
          f"{arguments.repeat}; speed-up = the trainer's function / the drop-in")  # fmt: skip
    print(f"| {'workload':<8} | {'function':<44} | {'trainer ms':>10} | {'drop-in ms':>10} | {'speed-up':>8} |")
    print(f"|{'-' * 10}|{'-' * 46}|{'-' * 12}|{'-' * 12}|{'-' * 10}|")
    for name in arguments.workload.split(","):
        rows, width, masked = WORKLOADS[name]
        batch = padded_batch(rows, width, masked, arguments.device)
        for label, trainer, drop_in in cases(*batch):
            trainer_ms = best_ms(trainer, max(1, arguments.repeat // (5 if name == "long" else 1)), arguments.device)
            drop_in_ms = best_ms(drop_in, arguments.repeat, arguments.device)
            speed_up = trainer_ms / drop_in_ms
            print(f"| {name:<8} | {label:<44} | {trainer_ms:10.1f} | {drop_in_ms:10.1f} | {speed_up:7.1f}x |")

if __name__ == "__main__":
    main()
