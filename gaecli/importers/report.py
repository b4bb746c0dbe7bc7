"""What ``gae import FORMAT`` reports: the files read (:class:`ImportedFile`) and the
import's result (:class:`ImportReport`): its JSON document, the human summary and the next
steps to run on the output (see docs/import.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from gaecli._version import __version__


@dataclass
class ImportedFile:
    """One input file read: its rollout, rank and how many samples and tokens it gave.
    ``cp_rank``, ``data_parallel_rank`` and ``note`` are set only where they apply (a
    context-parallel miles dump, a file skipped or read as a copy of another). ``file``: the
    input, named so in every command's JSON."""

    file: str
    rollout_id: int
    rank: Optional[int]
    rows: int
    tokens: int
    cp_rank: Optional[int] = None
    data_parallel_rank: Optional[int] = None
    note: Optional[str] = None

    def to_dict(self) -> dict:
        optional = {"cp_rank", "data_parallel_rank", "note"}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in optional or getattr(self, f.name) is not None
        }


@dataclass
class ImportReport:
    """What an import wrote.

    ``files`` in output order; ``columns`` written; ``missing_keys`` the optional dump keys
    absent (their columns left out); ``ignored_keys`` dump keys that have no column;
    ``length_mismatch_rows`` rows whose per-token lists differ in length from ``loss_masks``
    or ``response_lengths`` (imported as they are: ``gae validate`` lists them); ``notes``
    what the reader decided on the way (files skipped, copies read once).
    """

    output: str
    files: list[ImportedFile]
    columns: list[str]
    missing_keys: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    length_mismatch_rows: int = 0
    format: str = "miles"
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    def to_dict(self) -> dict:
        document = {
            "version": __version__,
            "format": self.format,
            "output": self.output,
            "rows": self.rows,
            "tokens": self.tokens,
            "files": [f.to_dict() for f in self.files],
            "columns": list(self.columns),
            "missing_keys": list(self.missing_keys),
            "ignored_keys": list(self.ignored_keys),
            "length_mismatch_rows": self.length_mismatch_rows,
            "next_steps": self.next_steps(),
        }
        if self.notes:
            document["notes"] = list(self.notes)
        return document

    def next_steps(self) -> list[str]:
        """What to run on the output, one sentence each."""
        steps = []
        if "values" not in self.columns:
            steps.append(
                "the file has no values column (no critic): GAE needs values, so run gae recompute / gae diff "
                "with --values-col none (critic-free: values taken as 0)"
            )
        if "log_probs" in self.columns and "ref_log_probs" in self.columns:
            steps.append(
                "the file has no per-token rewards column: run gae recompute / gae diff with --kl-coef C "
                "(KL rewards from log_probs and ref_log_probs) or with --rewards-col none"
            )
        elif "log_probs" in self.columns:
            steps.append(
                "the file has no per-token rewards column and no ref_log_probs (no KL rewards): run gae recompute / "
                "gae diff with --rewards-col none"
            )
        else:
            steps.append(
                "the file has no per-token rewards column and no log-probs: run gae recompute / gae diff "
                "with --rewards-col none"
            )
        if self.length_mismatch_rows:
            steps.append(
                f"{self.length_mismatch_rows} row(s) have per-token lists whose lengths differ from loss_mask "
                f"or response_length: gae validate {self.output} lists them"
            )
        if "trained_advantages" in self.columns:
            steps.append(
                "trained_advantages holds the advantages the run trained on: gae diff --against trained_advantages "
                "shows how far they are from masked GAE"
            )
        return steps

    def summary_lines(self) -> list[str]:
        """The human summary, one line each (the CLI prints them)."""
        rollouts = sorted({f.rollout_id for f in self.files})
        parallel = any(f.data_parallel_rank is not None for f in self.files)
        ranks = sorted({f.data_parallel_rank if parallel else f.rank for f in self.files} - {None})
        rank_name = "data-parallel rank" if parallel else "rank"
        spans = _span("rollout", rollouts) + (f", {_span(rank_name, ranks)}" if ranks else "")
        lines = [
            f"imported {self.rows:,} samples ({self.tokens:,} tokens) from {len(self.files)} "
            f"{'dump ' if self.format != 'nemo-rl' else ''}file(s) ({spans}) into {self.output}",
            f"columns: {', '.join(self.columns)}",
        ]
        if self.missing_keys:
            lines.append(f"not in the dumps (columns left out): {', '.join(self.missing_keys)}")
        if self.ignored_keys:
            lines.append(f"dump keys not imported: {', '.join(self.ignored_keys)}")
        lines.extend(f"note: {note}" for note in self.notes)
        lines.extend(f"note: {step}" for step in self.next_steps())
        return lines


def _span(name: str, numbers: list[int]) -> str:
    if not numbers:
        return f"no {name}"
    if len(numbers) == 1:
        return f"{name} {numbers[0]}"
    return f"{len(numbers)} {name}s {numbers[0]}–{numbers[-1]}"
