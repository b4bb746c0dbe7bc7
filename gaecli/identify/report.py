"""The result of ``gae identify``: the candidates ranked and grouped, what the column holds at
masked positions, and the verdict sentence (docs/identify.md#the-json-document)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from gaecli._version import __version__
from gaecli.identify.evaluate import Judged
from gaecli.identify.options import IdentifyOptions
from gaecli.identify.sample import Sample

SAME_FIGURES = 1e-9
"""Candidates that explain nothing are one group when their residual figures agree this closely."""


@dataclass
class CandidateGroup:
    """Computations that give the same numbers on the rows read, reported as one: the members
    in rank order, each with its own fitted γ and λ (the first fixes the figures)."""

    members: list[Judged]

    @property
    def first(self) -> Judged:
        return self.members[0]

    @property
    def name(self) -> str:
        return " = ".join(member.family.name for member in self.members)

    def to_dict(self) -> dict:
        first = self.first
        return {
            "name": self.name,
            "members": [
                {**member.family.record, "gamma": member.gamma, "lambd": member.lambd} for member in self.members
            ],
            "gamma": first.gamma,
            "lambd": first.lambd,
            "normalization": first.normalization,
            "whitening": first.whitening,
            "explains": first.explains,
            "max_abs_residual": first.max_abs,
            "rms_residual": first.rms,
            "returns_max_abs_residual": first.returns_max_abs,
            "samples": first.samples,
            "samples_reproduced": first.reproduced,
            "share_reproduced": first.share,
            "first_break": first.first_break,
            "breaks": first.breaks,
        }


def _same(one: Judged, other: Judged) -> bool:
    if one.explains or other.explains:
        return one.explains and other.explains and one.parameters == other.parameters
    figures = ((one.max_abs, other.max_abs), (one.rms, other.rms))
    close = all(abs(a - b) <= SAME_FIGURES * (1 + abs(a)) for a, b in figures)
    return close and one.reproduced == other.reproduced


def group_candidates(ranked: list[Judged]) -> list[CandidateGroup]:
    """Consecutive equal candidates of the ranking as one group: the explanations with the
    same normalisation, or candidates with the same figures."""
    groups: list[CandidateGroup] = []
    for judged in ranked:
        if groups and _same(groups[-1].first, judged):
            groups[-1].members.append(judged)
        else:
            groups.append(CandidateGroup([judged]))
    return groups


def masked_positions(sample: Sample, best: Judged, tolerance: float) -> dict:
    """What the stored column holds at masked positions: ``none`` (no masked token),
    ``zeros``, ``carry`` (the best candidate's values there: the trainer's own carry) or
    ``values`` (neither); with the tokens, the rows holding a non-zero and the share equal
    to the best candidate's."""
    masked = ~sample.trainable
    tokens = int(masked.sum())
    if tokens == 0:
        return {"holds": "none", "tokens": 0, "rows_nonzero": 0, "share_like_best": None}
    stored = sample.stored[masked]
    nonzero = np.abs(stored) > tolerance
    like = np.abs(stored - best.predicted[masked]) <= tolerance * (1.0 + np.abs(stored))
    holds = "zeros" if not nonzero.any() else "carry" if like.all() else "values"
    rows = np.bincount(sample.row_of_token[masked][nonzero], minlength=sample.rows) > 0
    return {"holds": holds, "tokens": tokens, "rows_nonzero": int(rows.sum()), "share_like_best": float(like.mean())}


def _number(value: float) -> str:
    return f"{value:.6g}"


def describe(judged: Judged) -> str:
    """The parameters of a candidate in words: ``γ = 1, λ = 0.95, whitened over the batch``."""
    words = []
    if judged.gamma is not None:
        words.append(f"γ = {_number(judged.gamma)}")
    if judged.lambd is not None:
        words.append(f"λ = {_number(judged.lambd)}")
    if judged.normalization == "none":
        words.append("not whitened")
    elif judged.normalization == "group":
        words.append("whitened within each group")
    else:
        whitening = judged.whitening or {}
        over = whitening.get("over")
        if over == "trainable":
            words.append("whitened over the batch")
        elif over == "response":
            words.append("whitened over every response token")
        elif whitening.get("std") is None:
            words.append("scaled to a constant")
        else:
            words.append(
                f"whitened with mean {_number(whitening['mean'])} and std {_number(whitening['std'])} "
                "(not the statistics of the rows read)"
            )
    return ", ".join(words)


def share_words(share: float) -> str:
    """``100 %``, ``99.5 %``: a share in percent, never rounded up to 100."""
    percent = share * 100
    if share < 1 and percent > 99.9:
        return "99.9 %"
    return f"{percent:.3g} %"


HOLDS_WORDS = {
    "zeros": "zeros at masked positions",
    "carry": "the computation's own values at masked positions",
    "values": "other values at masked positions",
}


@dataclass
class IdentifyReport:
    """What ``gae identify`` found: the candidate groups best first, the verdict, the masked
    positions, the rows read."""

    options: IdentifyOptions
    column: str
    groups: list[CandidateGroup]
    masked: dict
    lost_terminal: Optional[int]
    rows: int
    input_rows: int
    complete: bool
    fit_rows: int
    fit_lambda_rows: bool
    files: list

    @property
    def best(self) -> CandidateGroup:
        return self.groups[0]

    @property
    def explained(self) -> bool:
        return self.best.first.explains

    @property
    def notes(self) -> list[str]:
        """What the rows read leave open: γ or λ not identifiable, the rows read."""
        notes = []
        first = self.best.first
        for name, symbol in (("gamma", "γ"), ("lambd", "λ")):
            if first.identifiable.get(name) is False:
                notes.append(f"{symbol} is not identifiable from these rows (moving it by 0.01 changes no value)")
        if not self.fit_lambda_rows and first.family.fits_lambda:
            notes.append("no row has three trainable tokens: λ was fitted on shorter rows")
        if not self.complete:
            notes.append(f"read the first {self.rows} of {self.input_rows} rows (--sample-rows)")
        return notes

    @property
    def verdict(self) -> str:
        best = self.best
        names = " or ".join(member.family.name for member in best.members)
        first = best.first
        tolerance = f"{self.options.tolerance:g}"
        if first.explains:
            sentence = (
                f"computed like {names} ({describe(first)}): {share_words(first.share)} of samples within {tolerance}"
            )
            if self.lost_terminal:
                sentence += f"; the terminal reward reached no trainable token in {self.lost_terminal} samples"
            if self.masked["holds"] != "none":
                sentence += f"; {HOLDS_WORDS[self.masked['holds']]}"
            return sentence
        sentence = (
            f"nothing gaecli knows explains {self.column!r}: the closest is {names} ({describe(first)}), which "
            f"reproduces {share_words(first.share)} of samples within {tolerance}"
        )
        broken = first.first_break
        if broken is not None:
            sentence += (
                f"; it first breaks at {broken['where']}, token {broken['token']}: stored {_number(broken['stored'])}, "
                f"computed {_number(broken['computed'])}"
            )
        return sentence

    def to_dict(self) -> dict:
        """The JSON document (docs/identify.md#the-json-document)."""
        return {
            "gaecli_version": __version__,
            "column": self.column,
            "explained": self.explained,
            "verdict": self.verdict,
            "notes": self.notes,
            "tolerance": self.options.tolerance,
            "rows_read": self.rows,
            "input_rows": self.input_rows,
            "complete": self.complete,
            "fit_rows": self.fit_rows,
            "masked_positions": self.masked,
            "lost_terminal_samples": self.lost_terminal,
            "files": self.files,
            "candidates": [group.to_dict() for group in self.groups],
        }


def build_report(
    ranked: list[Judged], sample: Sample, options: IdentifyOptions, column: str, fit_rows: int, enough: bool
) -> IdentifyReport:
    """The report of the ranked candidates (the first holding its outputs at every position)."""
    from gaecli.advantages.baselines import lost_terminal_samples

    best = ranked[0]
    groups = group_candidates(ranked)
    kept = [group for group in groups if group.first.explains]
    others = [group for group in groups if not group.first.explains]
    kept += others[: max(options.top - len(kept), 0 if kept else 1)]
    lost = None
    if best.family.estimator == "gae":
        arrays = (sample.trainable, sample.offsets, sample.terminal_rewards)
        lost = int(lost_terminal_samples(best.family.semantics, *arrays, gamma=best.gamma, lambd=best.lambd).sum())
    files = [name for name in sample.files if name is not None]
    return IdentifyReport(
        options=options,
        column=column,
        groups=kept,
        masked=masked_positions(sample, best, options.tolerance),
        lost_terminal=lost,
        rows=sample.rows,
        input_rows=sample.input_rows,
        complete=sample.complete,
        fit_rows=fit_rows,
        fit_lambda_rows=enough,
        files=files,
    )
