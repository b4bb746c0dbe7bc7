"""Benchmark of the drop-ins of ``gaecli.trainers`` against each trainer's own algorithm, written
out independently (a vectorised step per column, right to left, as the trainers write it; the
masked GAE in the chunked form of ``gaecli/advantages/kernels/chunked.py``, compressed to the
trainable tokens, the fastest torch form a trainer uses; a per-sample Python loop for the
outcome estimators), on trainer-shaped padded batches,
in one run; the tables show best-of-N milliseconds and the drop-in's speed-up over each.

    python scripts/bench_trainers.py [--repeat 5] [--device cpu] [--workload micro,agentic,long]

Workloads (float32, right-padded ``[B, T]``): ``micro`` 64 × 2,048 (single turn, a short masked
tail on some rows), ``agentic`` 256 × 4,608 (tool blocks, 40–60 % of each response masked),
``long`` 8 × 131,072. Tables, per workload:

1. GAE: verl's ``compute_gae_advantage_return`` (its loop and ``masked_whiten``) beside the
   drop-in in both modes (``masked``, ``verl``) and the drop-in into preallocated buffers
   (``out=``); OpenRLHF's ``get_advantages_and_returns``; the speed-up is given over the
   column loop and over the chunked form (of the masked GAE, then the same whitening).
2. The outcome estimators (verl's GRPO and RLOO, groups of 8) against a loop over samples, as
   verl writes them.
3. ``gaecli.trainers.check`` and ``credit_metrics`` on the verl batch, as a share of the
   verl drop-in's time (timed in turns with it, call by call: the median of the rounds'
   ratios is given, the ceiling being 10 %).

Then a good-neighbour table: a torch op (the chunked scan) timed alone, then right after a
gaecli call in the same process, and after a serial torch op of the same length as a control
(what a cold cache alone costs); the ceiling is 10 % over the control. Each call runs once
untimed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gaecli.advantages.kernels.chunked import chunked_gae, chunked_scan  # noqa: E402
from gaecli.trainers import check, credit_metrics, openrlhf, verl  # noqa: E402

WORKLOADS = {"micro": (64, 2048, 0.0), "agentic": (256, 4608, 0.5), "long": (8, 131_072, 0.5)}
"""name: (rows, columns, share of each response in tool blocks)."""

GAMMA, LAMBD = 1.0, 0.95
GROUP_SIZE = 8
MONITOR_CEILING = 0.10
NEIGHBOUR_CEILING = 0.10


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


def masked_whiten(advantages, response_mask):
    """verl's ``masked_whiten``: the Bessel variance over the mask, rsqrt(var + 1e-8)."""
    count = response_mask.sum()
    mean = (advantages * response_mask).sum() / count
    variance = (((advantages - mean) ** 2) * response_mask).sum() / count * (count / (count - 1))
    return (advantages - mean) * torch.rsqrt(variance + 1e-8)


def verls_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's ``compute_gae_advantage_return`` as verl writes it: one step per column, then
    ``masked_whiten``."""
    next_values, last, reversed_advantages = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
        candidate = delta + gamma * lam * last
        next_values = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * next_values
        last = candidate * response_mask[:, t] + (1 - response_mask[:, t]) * last
        reversed_advantages.append(last)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return masked_whiten(advantages, response_mask), advantages + values


def chunked_form(token_level_rewards, values, response_mask, gamma, lam):
    """The same masked GAE in the fastest torch form a trainer writes (``kernels/chunked.py``:
    each row's trainable tokens compressed and padded, the chunked scan, scattered back),
    then verl's whitening."""
    rows, width = values.shape
    offsets = torch.arange(rows + 1, device=values.device) * width
    terminal = values.new_zeros(rows)
    mask = response_mask.reshape(-1) != 0
    advantages, returns = chunked_gae(values.reshape(-1), token_level_rewards.reshape(-1), mask, offsets, terminal,
                                      gamma=gamma, lambd=lam)  # fmt: skip
    advantages = advantages.view(rows, width)
    return masked_whiten(advantages, response_mask), returns.view(rows, width)


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


def looped_outcome(token_level_rewards, response_mask, index, rloo: bool, epsilon: float = 1e-6):
    """verl's GRPO / RLOO as verl writes them: each sample's score appended to its group's
    list in a loop over samples, the groups' statistics in a loop over groups, then a loop over
    samples to normalise."""
    scores = token_level_rewards.sum(dim=-1)
    members: dict = {}
    for sample in range(scores.shape[0]):
        members.setdefault(int(index[sample]), []).append(scores[sample])
    mean, std, count = {}, {}, {}
    for group, group_scores in members.items():
        stacked = torch.stack(group_scores)
        count[group] = len(group_scores)
        mean[group] = stacked.mean() if len(group_scores) > 1 else torch.tensor(0.0)
        std[group] = stacked.std() if len(group_scores) > 1 else torch.tensor(1.0)
    normalised = scores.clone()
    for sample in range(scores.shape[0]):
        group = int(index[sample])
        if rloo:
            n = count[group]
            normalised[sample] = scores[sample] * n / (n - 1) - mean[group] * n / (n - 1) if n > 1 else scores[sample]
        else:
            normalised[sample] = (scores[sample] - mean[group]) / (std[group] + epsilon)
    advantages = normalised.unsqueeze(-1) * response_mask
    return advantages, advantages


def best_ms(call, repeat: int, device: str) -> float:
    call()
    best = float("inf")
    for _ in range(repeat):
        best = min(best, timed(call, device))
    return best * 1e3


def timed(call, device: str) -> float:
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def gae_rows(r, v, m, repeat: int, device: str, long: bool):
    """(label, loop ms, chunked ms or None, drop-in ms) for the GAE drop-ins."""
    adv, ret = torch.empty_like(v), torch.empty_like(v)
    loop_repeat = max(1, repeat // (5 if long else 1))
    verl_loop = best_ms(lambda: verls_gae(r, v, m, GAMMA, LAMBD), loop_repeat, device)
    chunked = best_ms(lambda: chunked_form(r, v, m, GAMMA, LAMBD), repeat, device)
    openrlhf_loop = best_ms(lambda: openrlhfs_gae(v, r, m, GAMMA, LAMBD), loop_repeat, device)
    drop_ins = [
        ("verl compute_gae_advantage_return (masked)", verl_loop, chunked,
         lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD)),
        ("verl compute_gae_advantage_return (verl)", verl_loop, chunked,
         lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD, semantics="verl")),
        ("verl … (masked, out=)", verl_loop, chunked,
         lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD, out=(adv, ret))),
        ("openrlhf get_advantages_and_returns (masked)", openrlhf_loop, None,
         lambda: openrlhf.get_advantages_and_returns(v, r, m, GAMMA, LAMBD)),
    ]  # fmt: skip
    return [(label, loop, chunk, best_ms(call, repeat, device)) for label, loop, chunk, call in drop_ins]


def outcome_rows(r, m, repeat: int, device: str):
    """(label, loop ms, drop-in ms) for verl's GRPO and RLOO on groups of GROUP_SIZE."""
    index = np.arange(r.shape[0]) // GROUP_SIZE
    rows = []
    for label, rloo, drop_in in (
        ("verl compute_grpo_outcome_advantage", False, verl.compute_grpo_outcome_advantage),
        ("verl compute_rloo_outcome_advantage", True, verl.compute_rloo_outcome_advantage),
    ):
        loop = best_ms(lambda rloo=rloo: looped_outcome(r, m, index, rloo), repeat, device)
        call = lambda drop_in=drop_in: drop_in(r, m, index, semantics="verl")  # noqa: E731
        rows.append((label, loop, best_ms(call, repeat, device)))
    return rows


def paired_shares(calls: dict, base, repeat: int, device: str) -> dict:
    """Each call's time over ``base``'s in the same round, timed in turns; the median per call."""
    for call in (base, *calls.values()):
        call()
    ratios = {name: [] for name in calls}
    for _ in range(max(repeat, 7)):
        base_time = timed(base, device)
        for name, call in calls.items():
            ratios[name].append(timed(call, device) / base_time)
    return {name: statistics.median(values) for name, values in ratios.items()}


def monitor_rows(r, v, m, repeat: int, device: str):
    """(label, share of the verl drop-in) for check and credit_metrics."""
    base = lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD)  # noqa: E731
    calls = {
        'check(…, layout="verl")': lambda: check(r, v, m, GAMMA, LAMBD, layout="verl"),
        'credit_metrics(…, layout="verl")': lambda: credit_metrics(r, v, m, GAMMA, LAMBD, layout="verl").lost.sum(),
    }
    return list(paired_shares(calls, base, repeat, device).items())


def neighbour_rows(repeat: int, device: str):
    """A torch op's median time alone, after a serial torch op (the control) and after a gaecli
    call, in turns; the gaecli case's ratio over the control."""
    r, v, m = padded_batch(*WORKLOADS["agentic"], device)
    op = lambda: chunked_scan(v, r, GAMMA, LAMBD)  # noqa: E731
    gaecli_call = lambda: verl.compute_gae_advantage_return(r, v, m, GAMMA, LAMBD)  # noqa: E731
    control = lambda: verls_gae(r[:, :256], v[:, :256], m[:, :256], GAMMA, LAMBD)  # noqa: E731
    op(), gaecli_call(), control()
    cases = {"alone": [], "after a serial torch op (control)": [], "after a gaecli call": []}
    for _ in range(max(repeat, 9)):
        cases["alone"].append(timed(op, device))
        control()
        cases["after a serial torch op (control)"].append(timed(op, device))
        gaecli_call()
        cases["after a gaecli call"].append(timed(op, device))
    return {name: statistics.median(times) * 1e3 for name, times in cases.items()}


def print_tables(name: str, batch, repeat: int, device: str) -> None:
    r, v, m = batch
    print(f"\n{name}: {r.shape[0]} × {r.shape[1]}, {float(m.mean()):.0%} of the positions trainable")
    print(f"| {'function':<44} | {'loop ms':>9} | {'chunked ms':>10} | {'drop-in ms':>10} | {'× loop':>7} | "
          f"{'× chunked':>9} |")  # fmt: skip
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 12}|{'-' * 12}|{'-' * 9}|{'-' * 11}|")
    for label, loop, chunk, drop_in in gae_rows(r, v, m, repeat, device, name == "long"):
        chunk_cells = (f"{chunk:10.1f}", f"{chunk / drop_in:8.1f}x") if chunk else (f"{'':>10}", f"{'':>9}")
        print(f"| {label:<44} | {loop:9.1f} | {chunk_cells[0]} | {drop_in:10.2f} | {loop / drop_in:6.1f}x | "
              f"{chunk_cells[1]} |")  # fmt: skip
    for label, loop, drop_in in outcome_rows(r, m, repeat, device):
        print(f"| {label:<44} | {loop:9.1f} | {'':>10} | {drop_in:10.2f} | {loop / drop_in:6.1f}x | {'':>9} |")
    for label, share in monitor_rows(r, v, m, repeat, device):
        verdict = "meets" if share <= MONITOR_CEILING else "MISSES"
        print(f"| {label:<44} | {share:>8.1%} of the verl drop-in ({verdict} the {MONITOR_CEILING:.0%} ceiling)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload", default=",".join(WORKLOADS))
    arguments = parser.parse_args()
    print(f"device {arguments.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; best of "
          f"{arguments.repeat}; × = the trainer's form's time over the drop-in's")  # fmt: skip
    for name in arguments.workload.split(","):
        print_tables(name, padded_batch(*WORKLOADS[name], arguments.device), arguments.repeat, arguments.device)
    medians = neighbour_rows(arguments.repeat, arguments.device)
    print("\ngood neighbour: torch's chunked scan on the agentic batch, median ms")
    for label, ms in medians.items():
        print(f"| {label:<34} | {ms:8.2f} |")
    over = medians["after a gaecli call"] / medians["after a serial torch op (control)"] - 1
    verdict = "meets" if over <= NEIGHBOUR_CEILING else "MISSES"
    print(f"after a gaecli call: {over:+.1%} over the control ({verdict} the {NEIGHBOUR_CEILING:.0%} ceiling)")


if __name__ == "__main__":
    main()
