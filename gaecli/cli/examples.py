"""The examples each command's ``--help`` shows (an ``Examples:`` block above its exit codes),
by command name, in one place: ``tests/test_help_examples.py`` holds every command to having
some, each of its options a real option of the command."""

from __future__ import annotations

from typing import Optional

EXAMPLES: dict[str, tuple[str, ...]] = {
    "recompute": (
        "gae recompute rollouts/ -o fixed/ --gamma 1 --lambd 0.95",
        "gae recompute run.parquet -o fixed.parquet --estimator grpo --group-col uid",
        "gae recompute rollouts/ -o fixed/ --gamma 1 --lambd 0.95 --on-invalid skip",
    ),
    "diff": (
        "gae diff run.parquet --gamma 1 --lambd 0.95",
        "gae diff rollouts/ --gamma 1 --lambd 0.95 --baseline all --md report.md",
        "gae diff run.parquet --gamma 1 --lambd 0.95 --against advantages",
    ),
    "identify": (
        "gae identify run.parquet",
        "gae identify run.parquet --against advantages --group-col uid --json -",
    ),
    "inspect": (
        "gae inspect run.parquet",
        "gae inspect rollouts/ --json -",
    ),
    "validate": (
        "gae validate rollouts/",
        "gae validate rollouts/ --strict --quiet",
        "gae validate run.parquet --id-col uid --max-findings 20 --json report.json",
    ),
    "import": (
        "gae import miles debug_train/ -o run.parquet",
        "gae import skyrl dumps/ -o run.parquet --estimator gae --gamma 1 --lambd 1",
    ),
    "miles": ("gae import miles debug_train/ -o run.parquet",),
    "slime": ("gae import slime debug_rollout/ -o run.parquet",),
    "nemo-rl": ("gae import nemo-rl train_data_step_*.jsonl -o run.parquet",),
    "skyrl": ("gae import skyrl dumps/ -o run.parquet --estimator gae --gamma 1 --lambd 1",),
    "kernels": (
        "gae kernels",
        "gae kernels --json -",
    ),
    "view": (
        "gae view run.parquet --gamma 1 --lambd 0.95",
        "gae view rollouts/ --gamma 1 --lambd 0.95 --baseline verl --port 0",
    ),
}
"""Each command's examples, one command line each (short enough for an 80-column help)."""


def with_examples(name: Optional[str], epilog: Optional[str]) -> Optional[str]:
    """``epilog`` (rich markup) with the examples of command ``name`` above it, one a line."""
    examples = EXAMPLES.get(name or "")
    if not examples:
        return epilog
    from rich.markup import escape

    block = "[bold]Examples:[/]\n" + "\n".join(f"  {escape(example)}" for example in examples)
    return block if not epilog else f"{block}\n\n{epilog}"
