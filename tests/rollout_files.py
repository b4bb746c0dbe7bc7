"""Small rollout Parquet files for the ``gae recompute`` tests: seeded random multi-turn
samples, tables in any list / mask / float type, and the independent oracles the outputs
are held against (``reference_gae`` on the data as stored, plain Python GAE loops, numpy
whitening).

Kept apart from ``helpers.py`` (the kernel tests' module); nothing here calls the code
under test except the float64 oracle ``gaecli.advantages.kernels.reference.reference_gae``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from gaecli.advantages.kernels.reference import reference_gae

from helpers import masked_gae_oracle, unmasked_oracle

# |got - ref| <= TOLERANCE[type] * (1 + max |ref| of the sample)
TOLERANCE = {"float": 2e-5, "double": 1e-12}
WHITEN_EPSILON = 1e-8

MASK_TYPES = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}


# ----------------------------------------------------------------------------- samples


@dataclass
class Rollouts:
    """Samples as Python lists: per-token values, rewards, 0/1 mask; one terminal reward."""

    values: list[list[float]]
    rewards: list[list[float]]
    masks: list[list[int]]
    terminal: list[float]

    def __len__(self) -> int:
        return len(self.masks)

    def take(self, rows: Sequence[int]) -> "Rollouts":
        pick = lambda xs: [xs[row] for row in rows]  # noqa: E731
        return Rollouts(pick(self.values), pick(self.rewards), pick(self.masks), pick(self.terminal))


def _turn_mask(length: int, rng: np.random.Generator) -> list[int]:
    """Alternating trainable turns and masked observation blocks; sometimes a masked tail."""
    mask: list[int] = []
    trainable = True
    while len(mask) < length:
        block = int(rng.integers(1, 9))
        mask.extend([int(trainable)] * block)
        trainable = not trainable
    return mask[:length]


def random_rollouts(rows: int, seed: int, *, max_length: int = 40) -> Rollouts:
    """``rows`` samples: mostly multi-turn masks (with masked tails about half the time),
    plus, cycling, an empty response, a fully masked one, a one-token one and an all
    trainable one. Values and rewards are float64 with short decimals."""
    rng = np.random.default_rng(seed)
    values, rewards, masks, terminal = [], [], [], []
    for row in range(rows):
        kind = row % 10
        length = 0 if kind == 3 else 1 if kind == 5 else int(rng.integers(2, max_length + 1))
        if kind == 4:
            mask = [0] * length
        elif kind == 7:
            mask = [1] * length
        else:
            mask = _turn_mask(length, rng)
            if length and kind != 5 and not any(mask):
                mask[0] = 1
        values.append([round(float(x), 3) for x in rng.normal(0.0, 1.0, length)])
        rewards.append([round(float(x), 3) for x in rng.normal(0.0, 0.05, length)])
        masks.append(mask)
        terminal.append(float(rng.choice([0.0, 1.0, -1.0, 0.5])))
    return Rollouts(values, rewards, masks, terminal)


def reward_rows(rng: np.random.Generator, rows: int, max_length: int, scores: Sequence[float]) -> list[list]:
    """``rows`` samples ``[rewards, mask, score]`` as lists: lengths 3 to ``max_length``, a
    masked block of one to three tokens inside each, every third row ending masked, per-token
    rewards at every position (N(0, 0.1)), a score drawn from ``scores``."""
    samples = []
    for index in range(rows):
        n = int(rng.integers(3, max_length + 1))
        mask = [1] * n
        start = int(rng.integers(1, n))
        for t in range(start, min(n, start + int(rng.integers(1, 4)))):
            mask[t] = 0
        if index % 3 == 0:
            mask[-1] = 0  # ends in an observation
        samples.append([list(rng.normal(size=n) * 0.1), mask, float(rng.choice(scores))])
    return samples


def packed_reward_rows(samples: list[list]) -> tuple:
    """:func:`reward_rows`' samples packed as the API takes them: float64 rewards, bool mask,
    int64 offsets, float64 scores."""
    lengths = [len(m) for _, m, _ in samples]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    rewards = torch.tensor([x for r, _, _ in samples for x in r], dtype=torch.float64)
    mask = torch.tensor([x for _, m, _ in samples for x in m], dtype=torch.bool)
    terminal = torch.tensor([z for _, _, z in samples], dtype=torch.float64)
    return rewards, mask, offsets, terminal


# ----------------------------------------------------------------------------- tables


def list_of(value_type: pa.DataType, large: bool) -> pa.DataType:
    return pa.large_list(value_type) if large else pa.list_(value_type)


def mask_array(masks: list[list[int]], mask_type: pa.DataType, large: bool = False) -> pa.Array:
    if pa.types.is_boolean(mask_type):
        data = [[bool(m) for m in mask] for mask in masks]
    elif pa.types.is_floating(mask_type):
        data = [[float(m) for m in mask] for mask in masks]
    else:
        data = masks
    return pa.array(data, list_of(mask_type, large))


def rollout_table(
    rollouts: Rollouts,
    *,
    float_type: pa.DataType = pa.float32(),
    mask_type: pa.DataType = pa.int8(),
    large: bool = False,
    names: Optional[dict[str, Optional[str]]] = None,
    extra: Optional[dict[str, pa.Array]] = None,
    extra_first: Optional[dict[str, pa.Array]] = None,
    metadata: Optional[dict[bytes, bytes]] = None,
) -> pa.Table:
    """A rollout table. ``names`` renames the four data columns (role → name; None drops
    that column); ``extra_first`` columns come before them, ``extra`` after."""
    names = {
        "values": "values",
        "rewards": "rewards",
        "loss_mask": "loss_mask",
        "terminal_reward": "terminal_reward",
        **(names or {}),
    }
    columns: dict[str, pa.Array] = dict(extra_first or {})
    data = {
        "values": pa.array(rollouts.values, list_of(float_type, large)),
        "rewards": pa.array(rollouts.rewards, list_of(float_type, large)),
        "loss_mask": mask_array(rollouts.masks, mask_type, large),
        "terminal_reward": pa.array(rollouts.terminal, pa.float64()),
    }
    for role, array in data.items():
        if names[role] is not None:
            columns[names[role]] = array
    columns.update(extra or {})
    table = pa.table(columns)
    return table.replace_schema_metadata(metadata) if metadata else table


def write_table(table: pa.Table, path: Path, *, row_group_size: Optional[int] = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


INPUT_IDENTITY_KEYS = (b"gaecli.input", b"gaecli.inputs")


def output_content(data: bytes) -> tuple:
    """A recompute output's bytes but the identity of the inputs its metadata records
    (where and when they were read: the same rows read from another place differ there
    only): its pages (every byte before the footer), its schema and key-value metadata
    without those keys (``ARROW:schema`` holds them too: compared as the schema), and its
    row groups' layout."""
    footer_length = int.from_bytes(data[-8:-4], "little")
    metadata = pq.read_metadata(pa.BufferReader(data))
    dropped = (*INPUT_IDENTITY_KEYS, b"ARROW:schema")
    recorded = {key: value for key, value in (metadata.metadata or {}).items() if key not in dropped}
    schema = metadata.schema.to_arrow_schema()
    schema = schema.with_metadata({k: v for k, v in (schema.metadata or {}).items() if k not in dropped})
    layout = [metadata.row_group(group).to_dict() for group in range(metadata.num_row_groups)]
    return data[: len(data) - 8 - footer_length], recorded, schema, layout


def files_under(directory: Path) -> list[str]:
    """Every file below ``directory``, hidden ones included, relative and sorted
    (empty when it does not exist)."""
    found = []
    for root, _, names in os.walk(directory):
        found.extend(os.path.relpath(os.path.join(root, name), directory) for name in names)
    return sorted(found)


# ----------------------------------------------------------------------------- oracles


def rollouts_from_table(
    table: pa.Table,
    *,
    values: Optional[str] = "values",
    rewards: Optional[str] = "rewards",
    loss_mask: str = "loss_mask",
    terminal_reward: str = "terminal_reward",
) -> Rollouts:
    """The data of a table as stored (float32 already rounded), as float64 lists; a None
    column is zeros."""
    masks = [[int(m != 0) for m in row] for row in table.column(loss_mask).to_pylist()]
    zeros = [[0.0] * len(mask) for mask in masks]

    def as_floats(name):
        return zeros if name is None else [[float(x) for x in row] for row in table.column(name).to_pylist()]

    return Rollouts(
        as_floats(values), as_floats(rewards), masks, [float(x) for x in table.column(terminal_reward).to_pylist()]
    )


def reference_outputs(rollouts: Rollouts, gamma: float, lambd: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Masked-GAE advantages and returns per sample, float64, from ``reference_gae``."""
    lengths = [len(mask) for mask in rollouts.masks]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    flat = lambda rows: torch.tensor([x for row in rows for x in row], dtype=torch.float64)  # noqa: E731
    mask = torch.tensor([bool(m) for row in rollouts.masks for m in row], dtype=torch.bool)
    advantages, returns = reference_gae(
        flat(rollouts.values),
        flat(rollouts.rewards),
        mask,
        offsets,
        torch.tensor(rollouts.terminal, dtype=torch.float64),
        gamma=gamma,
        lambd=lambd,
    )
    split = lambda t: [piece.numpy() for piece in torch.split(t, lengths)]  # noqa: E731
    return split(advantages), split(returns)


def unmasked_advantages(values, rewards, terminal: float, gamma: float, lambd: float) -> list[float]:
    """The old behaviour (mask ignored, terminal reward on token R-1): the oracle of
    :mod:`helpers`."""
    return unmasked_oracle(values, rewards, None, terminal, gamma, lambd)[0]


def masked_advantages(values, rewards, mask, terminal: float, gamma: float, lambd: float) -> list[float]:
    """The contract's advantages (zeros at masked positions): the oracle of :mod:`helpers`."""
    return masked_gae_oracle(values, rewards, mask, terminal, gamma, lambd)[0]


def whiten_numpy(advantages: list[np.ndarray], masks: list[list[int]]) -> list[np.ndarray]:
    """(A − mean) / sqrt(var + 1e-8) over the trainable tokens of all samples given (mean
    and Bessel-corrected variance in float64); masked positions 0."""
    trainable = np.concatenate(
        [np.asarray(a, np.float64)[np.asarray(m, bool)] for a, m in zip(advantages, masks) if len(m)]
    )
    mean = trainable.mean()
    std = np.sqrt(trainable.var(ddof=1) + WHITEN_EPSILON)
    return [
        np.where(np.asarray(m, bool), (np.asarray(a, np.float64) - mean) / std, 0.0) for a, m in zip(advantages, masks)
    ]


def assert_rows_close(name: str, expected: Sequence[np.ndarray], got: Sequence, tolerance: float) -> None:
    """Per sample: same length, all finite, |got − expected| ≤ tolerance · (1 + max|expected|)."""
    assert len(got) == len(expected), f"{name}: {len(got)} rows, expected {len(expected)}"
    for row, (want, have) in enumerate(zip(expected, got)):
        want = np.asarray(want, dtype=np.float64)
        have = np.asarray(have, dtype=np.float64)
        assert have.shape == want.shape, f"{name}: row {row} has {have.size} tokens, expected {want.size}"
        assert np.isfinite(have).all(), f"{name}: row {row} holds NaN or inf"
        if want.size:
            error = float(np.abs(have - want).max())
            allowed = tolerance * (1.0 + float(np.abs(want).max()))
            assert error <= allowed, f"{name}: row {row}: max abs error {error:.3e} > {allowed:.3e}"


def count_footer_reads(monkeypatch) -> list:
    """From now on (until ``monkeypatch.undo()``), every footer this process reads through
    ``gaecli.io.reader.read_footer``, the one place footers are read: the list of their
    sources, growing."""
    import gaecli.io.reader as reader

    reads = []
    read_footer = reader.read_footer

    def counted(source):
        reads.append(source)
        return read_footer(source)

    monkeypatch.setattr(reader, "read_footer", counted)
    return reads


# ----------------------------------------------------------------------------- the worked example, in a process

# docs/semantics.md's worked example (one sample of 4 tokens, 2 trainable, z = 8; γ = 0.5,
# λ = 1) computed by the dispatch on numpy buffers for each name of the JSON list argv[1]:
# advantages, returns and (for a trainer profile) the terminal reward it loses.
WORKED_EXAMPLE_SCRIPT = (
    "import json, sys, numpy as np\n"
    "from gaecli.advantages import AdvantageSpec\n"
    "from gaecli.advantages.baselines import lost_terminal_abs_sum\n"
    "from gaecli.advantages.contract import PROFILES\n"
    "from gaecli.advantages.dispatch import compute\n"
    "v = np.array([1.0, 2.0, 3.0, 4.0]); r = np.array([0.5, 1.0, 0.25, 2.0])\n"
    "m = np.array([True, False, True, False]); o = np.array([0, 4]); z = np.array([8.0])\n"
    "results = {}\n"
    "for name in json.loads(sys.argv[1]):\n"
    "    a, g = compute(AdvantageSpec(0.5, 1.0, name), v, r, m, o, z)\n"
    "    lost = lost_terminal_abs_sum(name, m, o, z, gamma=0.5, lambd=1.0) if name in PROFILES else None\n"
    "    results[name] = [a.tolist(), g.tolist(), lost]\n"
    "print(json.dumps({'results': results, 'torch': 'torch' in sys.modules}))\n"
)


def worked_example_in_a_process(names: Sequence[str]) -> tuple[dict, bool]:
    """:data:`WORKED_EXAMPLE_SCRIPT` for ``names`` (semantics or profiles) in a fresh
    interpreter: ``{name: [advantages, returns, lost or None]}`` and whether it imported
    torch. A failing script fails the test."""
    process = subprocess.run(
        [sys.executable, "-c", WORKED_EXAMPLE_SCRIPT, json.dumps(list(names))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    document = json.loads(process.stdout)
    return document["results"], document["torch"]


def gae(*args):
    """Run the ``gae`` CLI in-process; an exception escaping it (a traceback for the user)
    fails the test."""
    from typer.testing import CliRunner

    from gaecli.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert "Traceback" not in result.output
    return result
