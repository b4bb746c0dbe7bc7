"""The validation rules: each fault a rollout row or file can have, with its stable code,
its severity, what it finds and how to fix it (``gae validate --list-rules``), and a finding
of one; the checks that find them are in :mod:`gaecli.checks` (files) and
:mod:`gaecli.trainers.monitor` (a trainer's tensors)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Rule:
    """A validation rule: stable code, severity, what it finds and how to fix it."""

    code: str
    severity: str
    summary: str
    hint: str


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            "missing-column",
            ERROR,
            "a required column is absent",
            "rename it with --values-col/--rewards-col/--mask-col/--terminal-col "
            "(--logprobs-col/--ref-logprobs-col with --kl-coef), "
            "or pass 'none' for values or rewards (a critic-free dump: --estimator NAME, which reads no values)",
        ),
        Rule(
            "duplicate-column",
            ERROR,
            "two or more columns share one name",
            "rename or drop the copies: a column is looked up by its name, which must be unique",
        ),
        Rule(
            "wrong-type",
            ERROR,
            "a column has a type other than the documented one",
            "cast it: lists of float32/float64 for values, rewards and log-probs, lists of bool/int/float for "
            "the mask, a number for the terminal reward",
        ),
        Rule(
            "null",
            ERROR,
            "a null list, a null inside a list, or a null terminal reward",
            "drop the row or fill the nulls before training on it",
        ),
        Rule(
            "length-mismatch",
            ERROR,
            "values, rewards, log-probs, loss_mask (and --response-mask-col) lists of a row differ in length",
            "the mask was cut or padded apart from the response: rebuild it to the response length",
        ),
        Rule(
            "response-length-mismatch",
            ERROR,
            "response_length disagrees with the list lengths",
            "trainers cut a longer mask and drop trailing tokens of a shorter one: align the lists with the response",
        ),
        Rule(
            "mask-value",
            ERROR,
            "a loss_mask (or --response-mask-col) value other than 0 or 1",
            "masks must be 0/1 (bool, int or float); threshold or rebuild the mask",
        ),
        Rule(
            "outside-response",
            ERROR,
            "a trainable token (loss_mask 1) whose response mask (--response-mask-col) is 0",
            "the loss mask lies inside the response mask (SkyRL's does): rebuild the one that is off, "
            "or leave --response-mask-col out",
        ),
        Rule(
            "non-finite",
            ERROR,
            "NaN or ±Inf in values, rewards, log-probs or the terminal reward",
            "find the step that produced it (critic divergence, log-prob of an impossible token) and drop the row",
        ),
        Rule(
            "overflow",
            ERROR,
            "values, rewards and terminal reward so large that advantages or returns can overflow "
            "to ±Inf in the output float type (or, in recompute, did)",
            "the row's magnitudes are far beyond any reward scale: find the step that produced them and drop the row",
        ),
        Rule(
            "turn-rewards-length",
            ERROR,
            "a turn-rewards list whose length is not the row's number of turns (maximal runs of trainable tokens)",
            "give one reward per turn, in order (an empty list for a fully masked row), or rebuild the mask",
        ),
        Rule(
            "turn-rewards-null",
            ERROR,
            "a null turn-rewards list or a null inside one",
            "fill the turn rewards (0 for a turn without one) or drop the row",
        ),
        Rule(
            "turn-rewards-non-finite",
            ERROR,
            "NaN or ±Inf in a turn-rewards list",
            "find the step that produced it (the turn's judge or environment) and drop the row",
        ),
        Rule(
            "turn-ids-length",
            ERROR,
            "a turn-ids list whose length is not the row's number of tokens",
            "give one turn id per token of the row (-1 at masked tokens)",
        ),
        Rule(
            "turn-ids-null",
            ERROR,
            "a null turn-ids list or a null inside one",
            "write -1 at masked tokens and the turn's id at trainable ones, or drop the row",
        ),
        Rule(
            "turn-ids-order",
            ERROR,
            "a turn id below 0, or below the previous trainable token's, at a trainable token",
            "number the turns 0, 1, ... in order; only masked tokens may hold -1",
        ),
        Rule(
            "truncated-null",
            ERROR,
            "a null truncated flag",
            "say for every row whether it was truncated (true) or ended (false)",
        ),
        Rule(
            "truncated-value",
            ERROR,
            "a truncated flag other than 0 or 1 (an integer --truncated-col)",
            "a flag says truncated (1) or ended (0): store a bool, or map the column to 0/1",
        ),
        Rule(
            "bootstrap-invalid",
            ERROR,
            "a truncated row whose bootstrap value is null, NaN or ±Inf",
            "store the critic's value after the last token of every truncated row, or drop the row",
        ),
        Rule(
            "duplicate-turn",
            ERROR,
            "two turn rows of one episode (--episode-col) have the same turn index (--turn-col)",
            "each turn of an episode is one row: drop the copy, or number the turns apart",
        ),
        Rule(
            "episode-mismatch",
            ERROR,
            "the turn rows of one episode disagree on its outcome (--terminal-col), group (--group-col) or step "
            "(--step-col)",
            "write the episode's outcome and group on every one of its rows; rows of different episodes need "
            "different episode ids",
        ),
        Rule(
            "episode-rejected",
            ERROR,
            "a turn row whose episode is rejected (with --on-invalid skip: another of its rows is invalid)",
            "fix the episode's invalid row: an episode is computed whole or not at all",
        ),
        Rule(
            "fully-masked",
            WARNING,
            "every response token is masked",
            "drop the row before training, or fix the mask builder if the response has generated tokens that "
            "should be trainable (a mask shifted by the prompt length or built from the wrong role)",
        ),
        Rule(
            "masked-tail",
            WARNING,
            "the response ends in masked tokens",
            "the old GAE decayed this sample's terminal reward over the tail; recompute with gae recompute",
        ),
        Rule("empty-response", WARNING, "the response has no token", "check the rollout that produced it"),
        Rule(
            "duplicate-id",
            WARNING,
            "the id appears more than once in the file",
            "deduplicate the rows or name the right id column with --id-col",
        ),
        Rule(
            "whitened-over-masked",
            WARNING,
            "stored advantages whitened with the masked tokens in the statistics: mean 0 and std 1 over every "
            "token, a mean clearly off 0 over the trainable ones",
            "whiten over the trainable tokens only (loss_mask == 1), or recompute them with gae recompute --normalize",
        ),
        Rule(
            "normalised-twice",
            WARNING,
            "stored advantages normalised in their groups (--group-col) and then whitened again over the batch",
            "normalise once: drop the batch whitening after the group normalisation, or the group step before it",
        ),
        Rule(
            "group-mean-batch-std",
            WARNING,
            "stored advantages centred on each group's mean (--group-col) but scaled by one batch std",
            "if the estimator is meant to be GRPO, divide each group by its own std; REINFORCE++-baseline scales "
            "so by design",
        ),
        Rule(
            "equal-rewards-nonzero",
            WARNING,
            "a group (--group-col) whose rows' rewards all agree carries non-zero stored advantages",
            "give such groups zero advantages or drop them; look for a batch shift or a std epsilon applied after "
            "the group normalisation",
        ),
        Rule(
            "nonzero-at-masked",
            WARNING,
            "stored advantages non-zero at masked tokens (loss_mask == 0)",
            "make sure the policy loss masks these positions, or zero the advantages at masked tokens",
        ),
    )
}


@dataclass
class Finding:
    """One fault: ``row`` is 0-based in the file, None for file-level findings."""

    file: str
    row: Optional[int]
    column: Optional[str]
    code: str
    message: str
    id: Optional[object] = None

    @property
    def severity(self) -> str:
        return RULES[self.code].severity

    def to_dict(self) -> dict:
        document = asdict(self)
        document["severity"] = self.severity
        return {key: document[key] for key in ("file", "row", "id", "column", "code", "severity", "message")}

    def line(self) -> str:
        """One line for a human: ``file, row N, column C: message``."""
        where = [self.file]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        return f"{', '.join(where)}: {self.message} [{self.code}]"


def cap_per_rule(
    findings: Sequence[Finding], max_findings: Optional[int], listed: Optional[dict[str, int]] = None
) -> list[Finding]:
    """``findings`` in their order, at most ``max_findings`` of each rule (None: all) counting
    those ``listed`` already (code → count; updated with the findings kept when given)."""
    if max_findings is None:
        return list(findings)
    counts = {} if listed is None else listed
    kept = []
    for finding in findings:
        if counts.get(finding.code, 0) < max_findings:
            counts[finding.code] = counts.get(finding.code, 0) + 1
            kept.append(finding)
    return kept


TAIL_READINGS: dict[str, tuple[str, str]] = {
    "gae": ("the old GAE decayed the terminal reward over them", RULES["masked-tail"].hint),
    "discounted": (
        "under {estimator} a trainer that puts the terminal reward on the last token and discounts back over the "
        "tail decays it by γ a masked token (loses it with γ = 0); masked, it goes to the last trainable token",
        "check the trainer's discounted returns skip the masked tail; recompute with gae recompute --estimator",
    ),
    "outcome": (
        "under {estimator} they get advantage 0 and the row's score (its terminal reward and its trainable tokens' "
        "rewards) is credited whole to its trainable tokens: nothing decays or is lost over the tail",
        "nothing to recompute for the tail: check that its tokens are meant to be masked (tool output, "
        "observations); a generated tail masked by mistake gets no credit",
    ),
    "distillation": (
        "under {estimator} they get advantage 0 (no distillation term): no reward is read, none is lost",
        "check that the tail's tokens are meant to be masked (tool output, observations): they are not distilled",
    ),
}
"""What a ``masked-tail`` finding means under each kind of estimator (:func:`gaecli.checks.tail_reading`):
the finding's words after "the response ends in N masked tokens: " (``{estimator}``: its name) and the fix."""


def rules_document() -> dict:
    """Every rule as JSON (``gae validate --list-rules --json``): ``{"rules": [{"code", "severity", "summary",
    "hint"}]}``."""
    return {
        "rules": [
            {"code": r.code, "severity": r.severity, "summary": r.summary, "hint": r.hint} for r in RULES.values()
        ]
    }


def rule_hint(code: str, reading: str = "gae") -> str:
    """The fix of rule ``code`` for an estimator of kind ``reading`` (a key of :data:`TAIL_READINGS`): the
    masked tail's of that kind, every other rule's own hint."""
    return TAIL_READINGS[reading][1] if code == "masked-tail" else RULES[code].hint


def first_error(findings: list[Finding]) -> Optional[Finding]:
    """The error with the lowest row (file-level errors first), or None."""
    errors = [f for f in findings if f.severity == ERROR]
    return min(errors, key=lambda f: -1 if f.row is None else f.row) if errors else None
