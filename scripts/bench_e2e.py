"""End-to-end benchmark: each ``gae`` command beside its limit, as whole processes.

    python scripts/bench_e2e.py [--tree DIR]... [--scale 1.0] [--repeat 5] [--data bench_data]
                                [--files large,short,small]

Generates (once, cached under ``--data``) three zstd rollout files: ``large``, ~500 MB of
agentic rollouts (14,000 rows, ~60 M tokens); ``short``, 1,000,000 single-turn rows of
8–120 tokens (~64 M tokens); ``small``, ~30 MB of agentic rollouts (840 rows). ``--scale``
multiplies every row count (a quicker run; the files of each scale are cached apart).
``--files estimators`` adds a fourth file, 262,144 critic-free rows in prompt groups of 8
with three reward components and a teacher's log-probs, on which gdpo, opd, grpo with the
distillation term and grpo under two score rules are each timed beside ``gae recompute
--estimator grpo`` of the first ``--tree`` (goal: 1.5x). ``--files turns`` adds a turn-row
file, 1,000,000 turn rows of 100,000 episodes, on which gigpo, step-reinforce and masked GAE
over episodes are each timed beside plain ``gae recompute`` of the first ``--tree`` (goal: 2x,
peak RSS 1 GB).

On each file it times, as separate processes, each command beside its limit:

- ``gae recompute`` beside a streaming copy: read a batch, append two list columns of the
  values' type and shape, write it (the input's codec, the row groups ``gae recompute``
  writes, no statistics, dictionaries off for floats, page checksums: as gae writes);
- ``gae diff``, ``gae diff --baseline all`` (the six profiles) and ``gae validate`` beside a
  streaming pyarrow read of the columns they read (values, rewards, loss_mask,
  terminal_reward, response_length), in the same batches;

then ``gae --help`` (absolute seconds). The limits run with the allocator settings the ``gae``
process makes for itself (``gaecli.cli.memory``: Arrow's buffers from glibc's heap, glibc
keeping freed batch buffers), so that both sides of a ratio allocate alike: under Arrow's
own default pool a streaming read of the large file spent 1.6 to 7 s in page faults, which
made the limit, and every ratio, vary by a factor of five between runs.
``--limit-allocator arrow`` runs the limits under Arrow's and glibc's defaults instead
(how the limits ran before). The runs are interleaved (limit, each tree, limit,
each tree, ...), ``--repeat`` times, and the table shows medians and the ratio of the
command's median to its limit's, beside the issue's goal.

``--tree DIR`` (repeatable) runs ``gae`` from another checkout (``python -m gaecli`` with
``PYTHONPATH=DIR``, from DIR), one column per tree, so that an old and a new checkout are
measured in the same run; default: the checkout this script is in. The trees are only read:
numba's cache and Python's bytecode go under ``--data``. Before a file is timed, each tree
runs ``gae recompute``, ``gae diff --baseline all`` and ``gae validate`` on it once, untimed
(its kernels compiled and cached, the file in the page cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

READ_COLUMNS = ("values", "rewards", "loss_mask", "terminal_reward", "response_length")

STREAMING_COPY = r"""
import sys
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
source, target, batch_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
parquet = pq.ParquetFile(source)
codec = parquet.metadata.row_group(0).column(0).compression.lower()
schema = parquet.schema_arrow
value_type = schema.field("values").type
schema = schema.append(pa.field("advantages", value_type)).append(pa.field("returns", value_type))
def floats(arrow_type):
    while pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_floating(arrow_type)
dictionary = [f.name for f in schema if not floats(f.type)]
writer = pq.ParquetWriter(target, schema, compression=codec, write_statistics=False,
                          use_dictionary=dictionary, write_page_checksum=True)
for batch in parquet.iter_batches(batch_size=batch_rows, use_threads=True):
    values = batch.column("values")
    offsets = values.offsets
    start = offsets[0].as_py()
    flat = values.values.slice(start, offsets[-1].as_py() - start)
    offsets = pc.subtract(offsets, pa.scalar(start, offsets.type))
    columns = [*batch.columns]
    for shift in (1.0, 2.0):
        columns.append(type(values).from_arrays(offsets, pc.add(flat, pa.scalar(shift, flat.type))))
    writer.write_table(pa.Table.from_batches([pa.RecordBatch.from_arrays(columns, schema=schema)]),
                       row_group_size=max(batch.num_rows, 1))
writer.close()
"""

STREAMING_READ = r"""
import sys
import pyarrow.parquet as pq
source, batch_rows, columns = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
parquet = pq.ParquetFile(source)
columns = [name for name in parquet.schema_arrow.names if name in columns]
for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True):
    pass
"""

GOALS = {
    "gae recompute": {"large": 1.1, "short": 1.1, "small": 2.0},
    "gae diff": {"large": 1.3, "short": 1.3, "small": 2.0},
    "gae diff --baseline all": {"large": 3.0, "short": 3.0, "small": 2.0},
    "gae validate": {"large": 1.2, "short": 1.2, "small": 2.0},
}
"""The issue's goals: the command's median over its limit's, by file."""

HELP_GOAL_SECONDS = 0.5

DISCOUNT = ("--gamma", "1", "--lambd", "0.95", "--quiet")

FILES = {  # label: (generator, rows at scale 1)
    "large": ("agentic", 14_000),
    "short": ("short_rows", 1_000_000),
    "small": ("agentic", 840),
    "estimators": ("grouped", 262_144),
    "turns": ("turn_rows", 1_000_000),
}

TURN_ROWS_GOAL = 2.0
"""The goal of gigpo, step-reinforce and masked GAE over episodes on the turn-row file, each
beside plain ``gae recompute`` (masked GAE) on the same file (of the same checkout); peak RSS
at most 1 GB."""

ESTIMATOR_GOAL = 1.5
"""The goal of gdpo (three reward columns), opd, and grpo with the distillation term, each
beside ``gae recompute --estimator grpo`` on the same file (of the same checkout)."""


# ----------------------------------------------------------------------------- data


def make_agentic(path: Path, rows: int, seed: int) -> None:
    """Write ``rows`` agentic rollouts in row groups of 1,024 rows (bounded memory)."""
    from rollout_files import workload_table
    from workloads import agentic

    write_chunks(
        path,
        rows,
        1024,
        lambda start, count: workload_table(
            agentic(num_samples=count, seed=seed * 1000 + start // 1024), rollout_id=start // 1024
        ),
    )


def write_chunks(path: Path, rows: int, chunk_rows: int, make_chunk) -> None:
    """Write ``make_chunk(start, rows)`` tables of ``chunk_rows`` rows (bounded memory),
    under a temporary name renamed once whole."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    writer = None
    for start in range(0, rows, chunk_rows):
        table = make_chunk(start, min(chunk_rows, rows - start))
        if writer is None:
            writer = pq.ParquetWriter(temp, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=chunk_rows)
    writer.close()
    temp.rename(path)


def ragged_rows(rng, rows: int, shortest: int, longest: int):
    """Random row lengths in [shortest, longest], their offsets ``[B + 1]`` and each token's
    position in its row."""
    import numpy as np

    lengths = rng.integers(shortest, longest + 1, rows)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return lengths, offsets, np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)


def short_rows_table(start: int, rows: int, shortest: int = 8, longest: int = 120):
    """``rows`` single-turn rows of ``shortest``–``longest`` tokens (vectorised): float32
    values and rewards, an int8 mask trainable but for a masked tail on 10 % of rows (the
    first token always trainable), float32 terminal rewards."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(start + 17)
    lengths, offsets, position = ragged_rows(rng, rows, shortest, longest)
    tokens = int(offsets[-1])
    tail = np.where(rng.random(rows) < 0.1, rng.integers(1, shortest, rows), 0)
    mask = (position < np.repeat(lengths - tail, lengths)).astype(np.int8)

    def as_list(flat, arrow_type):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, arrow_type))

    return pa.table(
        {
            "values": as_list(rng.normal(size=tokens).astype(np.float32), pa.float32()),
            "rewards": as_list(np.zeros(tokens, np.float32), pa.float32()),
            "loss_mask": as_list(mask, pa.int8()),
            "terminal_reward": pa.array(rng.normal(size=rows).astype(np.float32), pa.float32()),
            "response_length": pa.array(lengths, pa.int64()),
        }
    )


def grouped_table(start: int, rows: int, shortest: int = 32, longest: int = 256):
    """``rows`` critic-free rows in prompt groups of 8 (``prompt_id``), of ``shortest``–``longest``
    tokens: float32 rewards (0) and terminal rewards, an int8 mask with masked spans, three
    float32 reward components (``acc``, ``fmt``, ``len``), float32 ``log_probs`` and
    ``teacher_log_probs``; no values (vectorised)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(start + 29)
    lengths, offsets, position = ragged_rows(rng, rows, shortest, longest)
    tokens = int(offsets[-1])
    mask = ((position // 16) % 4 != 3).astype(np.int8)  # every fourth span of 16 tokens an observation

    def as_list(flat):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat))

    def per_row(values):
        return pa.array(values.astype(np.float32))

    return pa.table(
        {
            "prompt_id": pa.array((start + np.arange(rows)) // 8, pa.int64()),
            "rewards": as_list(np.zeros(tokens, np.float32)),
            "loss_mask": as_list(mask),
            "terminal_reward": per_row(rng.integers(0, 2, rows)),
            "response_length": pa.array(lengths, pa.int64()),
            "acc": per_row(rng.integers(0, 2, rows)),
            "fmt": per_row(rng.choice([0.0, 0.5, 1.0], rows)),
            "len": per_row(rng.normal(size=rows)),
            "log_probs": as_list(-rng.random(tokens, dtype=np.float32) * 3),
            "teacher_log_probs": as_list(-rng.random(tokens, dtype=np.float32) * 3),
        }
    )


def turn_rows_table(start: int, rows: int, shortest: int = 8, longest: int = 64, turns: int = 10):
    """``rows`` turn rows (vectorised), ``turns`` per episode (``episode_id``, ``turn``), eight
    episodes a group (``group_id``), an anchor state of four per turn index (``state``), a
    float32 turn reward (``step_score``) and the episode's outcome on each of its rows
    (``terminal_reward``); float32 values and rewards, an int8 mask whose first half of each row
    is the observation (masked)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(start + 41)
    lengths, offsets, position = ragged_rows(rng, rows, shortest, longest)
    tokens = int(offsets[-1])
    index = start + np.arange(rows)
    episode = index // turns
    mask = (position >= np.repeat(lengths // 2, lengths)).astype(np.int8)
    outcome = np.random.default_rng(7).integers(0, 2, int(episode.max()) + 1).astype(np.float32)

    def as_list(flat):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat))

    return pa.table(
        {
            "episode_id": pa.array(episode, pa.int64()),
            "turn": pa.array(index % turns, pa.int32()),
            "group_id": pa.array(episode // 8, pa.int64()),
            "state": pa.array((index % turns) * 4 + rng.integers(0, 4, rows), pa.int64()),
            "step_score": pa.array(rng.choice([0.0, 0.1, 1.0], rows).astype(np.float32)),
            "values": as_list(rng.normal(size=tokens).astype(np.float32)),
            "rewards": as_list(np.zeros(tokens, np.float32)),
            "loss_mask": as_list(mask),
            "terminal_reward": pa.array(outcome[episode]),
            "response_length": pa.array(lengths, pa.int64()),
        }
    )


def data_file(data: Path, label: str, scale: float) -> Path:
    """The cached file ``label`` at ``scale``, generated on first use."""
    kind, rows = FILES[label]
    rows = max(int(rows * scale), 2)
    path = data / f"{label}_{kind}_{rows}.parquet"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        if kind == "agentic":
            make_agentic(path, rows, seed=1 if label == "large" else 2)
        elif kind == "grouped":
            write_chunks(path, rows, 65_536, grouped_table)
        elif kind == "turn_rows":
            write_chunks(path, rows, 100_000, turn_rows_table)
        else:
            write_chunks(path, rows, 65_536, short_rows_table)
    return path


def describe(path: Path) -> str:
    import pyarrow.parquet as pq

    lengths = pq.read_table(path, columns=["response_length"]).column("response_length").to_numpy()
    return f"{path.stem.split('_')[0]}: {lengths.sum() / 1e6:.1f} M tokens, {path.stat().st_size / 1e6:.0f} MB"


# ----------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Tree:
    """A checkout whose ``gae`` is measured: ``python -m gaecli`` from it, on its path, its
    numba cache and bytecode under ``cache`` (the checkout itself is not written)."""

    root: Path
    label: str
    cache: Path

    def command(self, *arguments: str) -> list[str]:
        return [sys.executable, "-m", "gaecli", *arguments]

    def environment(self) -> dict:
        # bytecode written under the prefix even where the caller's environment says not to:
        # a prefix without its bytecode would compile every module from source at each start
        inherited = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        return {
            **inherited,
            "PYTHONPATH": str(self.root),
            "NUMBA_CACHE_DIR": str(self.cache / "numba"),
            "PYTHONPYCACHEPREFIX": str(self.cache / "pycache"),
        }


def tree_of(directory: str, data: Path) -> Tree:
    root = Path(directory).resolve()
    if not (root / "gaecli" / "__init__.py").exists():
        raise SystemExit(f"--tree {directory}: no gaecli package there")
    revision = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    label = revision.stdout.strip() or root.name
    return Tree(root, label, data / "cache" / f"{root.name}-{label}")


def gae_allocator_environment() -> dict:
    """This environment with the allocator settings the ``gae`` process makes for itself
    (``gaecli.cli.memory``, of this checkout), where they are not set already."""
    sys.path.insert(0, str(HERE.parent))
    from gaecli.cli import memory

    settings = {variable: str(value) for variable, _, value in memory.SETTINGS}
    settings[memory.ARROW_POOL_VARIABLE] = memory.ARROW_POOL
    return {**settings, **os.environ}


def run(command: list[str], *, cwd: Path | None = None, env: dict | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS in MB (of the process tree's largest) of one process; a
    failure stops the benchmark with its stderr."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.stderr.write(process.stderr.read().decode())
        raise SystemExit(f"command failed ({code}): {' '.join(command)}")
    process.stderr.close()
    return elapsed, usage.ru_maxrss / 1024.0


@dataclass
class Row:
    """One line of the table: a limit and a command (its arguments after ``gae``), timed
    interleaved; ``seconds`` and ``peaks`` by who ran (``limit`` or a tree's label)."""

    file: str
    name: str
    limit_name: str
    limit: list[str] | None
    arguments: list[str]
    goal: float | None
    seconds: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    limit_tree: Tree | None = None  # the limit is this checkout's gae (its cwd and environment)

    def time(self, trees: list[Tree], repeat: int, limit_environment: dict | None = None) -> None:
        for _ in range(repeat):
            if self.limit_tree is not None:
                tree = self.limit_tree
                self._record("limit", *run(self.limit, cwd=tree.root, env=tree.environment()))
            elif self.limit is not None:
                self._record("limit", *run(self.limit, env=limit_environment))
            for tree in trees:
                self._record(tree.label, *run(tree.command(*self.arguments), cwd=tree.root, env=tree.environment()))

    def _record(self, who: str, seconds: float, peak: float) -> None:
        self.seconds.setdefault(who, []).append(seconds)
        self.peaks[who] = max(self.peaks.get(who, 0.0), peak)

    def median(self, who: str) -> float:
        return statistics.median(self.seconds[who])


# ----------------------------------------------------------------------------- the table


def file_rows(path: Path, title: str, label: str, out: Path, batch_rows: int) -> list[Row]:
    """The rows of one file: each command beside its limit."""
    read = [sys.executable, "-c", STREAMING_READ, str(path), str(batch_rows), ",".join(READ_COLUMNS)]
    copy = [sys.executable, "-c", STREAMING_COPY, str(path), str(out / "copy.parquet"), str(batch_rows)]
    recompute = ["recompute", str(path), "-o", str(out / "gae.parquet"), "--overwrite", *DISCOUNT]
    diff = ["diff", str(path), *DISCOUNT]
    commands = [
        ("gae recompute", "streaming copy", copy, recompute),
        ("gae diff", "streaming read", read, diff),
        ("gae diff --baseline all", "streaming read", read, [*diff, "--baseline", "all"]),
        ("gae validate", "streaming read", read, ["validate", str(path), "--quiet"]),
    ]
    return [
        Row(title if index == 0 else "", name, limit_name, limit, arguments, GOALS[name][label])
        for index, (name, limit_name, limit, arguments) in enumerate(commands)
    ]


def estimator_rows(path: Path, title: str, out: Path, tree: Tree) -> list[Row]:
    """gdpo with three reward columns, the pure opd, grpo with the distillation term and grpo
    under two score rules (NeMo-RL's leave-one-out, the batch's std), each beside
    ``--estimator grpo`` of the same checkout on the same file."""
    recompute = ["recompute", str(path), "-o", str(out / "estimator.parquet"), "--overwrite", "--quiet"]
    groups = ["--group-col", "prompt_id", "--values-col", "none"]
    grpo = tree.command(*recompute, "--estimator", "grpo", *groups)
    commands = [
        ("gdpo, 3 reward columns", [*groups, "--estimator", "gdpo", "--reward-cols", "acc,fmt,len"]),
        ("opd", ["--estimator", "opd", "--values-col", "none"]),
        ("grpo --opd-coef 0.5", [*groups, "--estimator", "grpo", "--opd-coef", "0.5"]),
        ("grpo --norm-like nemo-rl", [*groups, "--estimator", "grpo", "--norm-like", "nemo-rl"]),
        ("grpo --norm-std batch", [*groups, "--estimator", "grpo", "--norm-std", "batch"]),
    ]
    return [
        Row(title if index == 0 else "", name, "grpo", grpo, [*recompute, *options], ESTIMATOR_GOAL, limit_tree=tree)
        for index, (name, options) in enumerate(commands)
    ]


def turn_row_rows(path: Path, title: str, out: Path, tree: Tree) -> list[Row]:
    """gigpo, step-reinforce and masked GAE over episodes on the turn-row file, each beside
    plain ``gae recompute`` (masked GAE, each row on its own) of the same checkout on the
    same file."""
    recompute = ["recompute", str(path), "-o", str(out / "turns.parquet"), "--overwrite", "--quiet"]
    plain = tree.command(*recompute, *DISCOUNT)
    episodes = ["--episode-col", "episode_id", "--turn-col", "turn", "--turn-rewards-col", "step_score"]
    turns = ["--values-col", "none", "--gamma", "0.95", "--group-col", "group_id", *episodes]
    commands = [
        ("gigpo", ["--estimator", "gigpo", *turns, "--state-col", "state"]),
        ("step-reinforce", ["--estimator", "step-reinforce", *turns]),
        ("masked GAE over episodes", [*DISCOUNT, *episodes]),
    ]
    return [
        Row(title if index == 0 else "", name, "recompute", plain, [*recompute, *options], TURN_ROWS_GOAL,
            limit_tree=tree)  # fmt: skip
        for index, (name, options) in enumerate(commands)
    ]


def output_batch_rows(tree: Tree, path: Path, out: Path) -> int:
    """Warm ``tree`` up on ``path`` (its kernels compiled and cached) and return the rows of
    the first row group its ``gae recompute`` writes: the copy's and the reads' batch."""
    import pyarrow.parquet as pq

    target = out / "warm.parquet"
    warm_up = (
        ["recompute", str(path), "-o", str(target), "--overwrite", *DISCOUNT],
        ["diff", str(path), "--baseline", "all", *DISCOUNT],
        ["validate", str(path), "--quiet"],
    )
    for arguments in warm_up:
        run(tree.command(*arguments), cwd=tree.root, env=tree.environment())
    metadata = pq.ParquetFile(target).metadata
    return metadata.row_group(0).num_rows if metadata.num_row_groups else 1


def render(rows: list[Row], trees: list[Tree]) -> str:
    header = f"{'file':<34} {'command':<26} {'limit':<15} {'limit s':>8}"
    for tree in trees:
        header += f" {tree.label + ' s':>11} {'ratio':>7} {'RSS MB':>7}"
    lines = [header + f" {'goal':>7}"]
    for row in rows:
        limit = f"{row.median('limit'):>8.2f}" if row.limit is not None else f"{'':>8}"
        line = f"{row.file:<34} {row.name:<26} {row.limit_name:<15} {limit}"
        for tree in trees:
            if tree.label not in row.seconds:  # a row of the first checkout alone
                line += f" {'—':>11} {'':>7} {'':>7}"
                continue
            seconds = row.median(tree.label)
            ratio = f"{seconds / row.median('limit'):.2f}x" if row.limit is not None else ""
            line += f" {seconds:>11.2f} {ratio:>7} {row.peaks[tree.label]:>7.0f}"
        goal = f"<={row.goal:g}x" if row.limit is not None else f"<={HELP_GOAL_SECONDS:g} s"
        lines.append(line + f" {goal:>7}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", help="a checkout whose gae to run (repeatable; default: this one)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every file's row count")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each process (medians shown)")
    parser.add_argument(
        "--files",
        default="large,short,small",
        help="which files to run, comma-separated: large, short, small, estimators (the estimators beside grpo, "
        "on the first --tree), turns (gigpo and step-reinforce beside recompute, on the first --tree)",
    )
    parser.add_argument("--data", default="bench_data", help="where the generated files and caches are kept")
    parser.add_argument(
        "--limit-allocator",
        choices=("gae", "arrow"),
        default="gae",
        help="the limits' allocator: the settings gae makes for itself, or Arrow's and glibc's defaults",
    )
    args = parser.parse_args()
    limit_environment = gae_allocator_environment() if args.limit_allocator == "gae" else None

    data = Path(args.data).resolve()
    trees = [tree_of(directory, data) for directory in (args.tree or [str(HERE.parent)])]
    paths = {label: data_file(data, label, args.scale) for label in args.files.split(",") if label}
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, scale {args.scale}, "
        f"repeat {args.repeat}, load {load[0]:.1f}, limits under the {args.limit_allocator} allocator settings",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=data) as scratch:
        out = Path(scratch)
        for label, path in paths.items():
            if label in ("estimators", "turns"):
                first = trees[0]
                made = estimator_rows if label == "estimators" else turn_row_rows
                for row in made(path, describe(path), out, first):
                    run(row.limit, cwd=first.root, env=first.environment())  # warm: compiled and cached
                    run(first.command(*row.arguments), cwd=first.root, env=first.environment())
                    row.time([first], args.repeat)
                    rows.append(row)
                    print(f"  {row.file or label:<34} {row.name} done", flush=True)
                continue
            batch_rows = [output_batch_rows(tree, path, out) for tree in trees][0]
            for row in file_rows(path, describe(path), label, out, batch_rows):
                row.time(trees, args.repeat, limit_environment)
                rows.append(row)
                print(f"  {row.file or label:<34} {row.name} done", flush=True)
        help_row = Row("start-up", "gae --help", "", None, ["--help"], None)
        help_row.time(trees, args.repeat)
        rows.append(help_row)
    print(render(rows, trees))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
