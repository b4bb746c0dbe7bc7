"""``gae validate``'s rules on stored advantages (docs/validate.md#rules-on-stored-advantages):
for each rule a hand-built dump that breaks it and a near miss that does not, every expected
number worked out here in plain Python from the dump's own numbers; ``--strict``, the default
column, ``--against`` and ``--group-col`` through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.validate import validate_file

runner = CliRunner()

STORED_CODES = (
    "whitened-over-masked",
    "normalised-twice",
    "group-mean-batch-std",
    "equal-rewards-nonzero",
    "nonzero-at-masked",
)


def write_dump(path: Path, masks, advantages, *, scores=None, groups=None, name="advantages", ids=None) -> Path:
    """A dump of rows with ``masks`` and stored ``advantages`` (float32 lists), zero values
    and rewards, and ``scores`` as the terminal rewards (1 by default); ``groups``: a
    ``group`` column of prompt ids."""
    rows = len(masks)
    columns = {
        "values": pa.array([[0.0] * len(mask) for mask in masks], pa.list_(pa.float32())),
        "rewards": pa.array([[0.0] * len(mask) for mask in masks], pa.list_(pa.float32())),
        "loss_mask": pa.array(masks, pa.list_(pa.int8())),
        "terminal_reward": pa.array([1.0] * rows if scores is None else scores, pa.float64()),
        name: pa.array(advantages, pa.list_(pa.float32())),
    }
    if groups is not None:
        columns["group"] = pa.array(groups, pa.string())
    if ids is not None:
        columns["sample_id"] = pa.array(ids, pa.string())
    pq.write_table(pa.table(columns), path)
    return path


def stored_findings(report) -> list[tuple]:
    """(code, severity, row) of the findings of the rules on stored advantages."""
    return [(f.code, f.severity, f.row) for f in report.findings if f.code in STORED_CODES]


def mean_and_std(numbers) -> tuple[float, float]:
    """Mean and Bessel std by ``math.fsum``."""
    n = len(numbers)
    mean = math.fsum(numbers) / n
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in numbers) / (n - 1))


def broadcast(per_row, masks):
    """One advantage per row written at the row's trainable tokens (0 at its masked ones)."""
    return [[value if m else 0.0 for m in mask] for value, mask in zip(per_row, masks)]


# ----------------------------------------------------------------------------- whitened-over-masked

# Three rows, each ending on a trainable token (no masked-tail warning); the raw advantages are
# 0 at the masked tokens, as masked GAE leaves them.
MASKS = [[1, 0, 0, 1], [0, 0, 1], [0, 1, 1]]
RAW = [[1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 3.0], [0.0, 2.0, 1.0]]


def whitened(raw, masks, *, over_masked: bool):
    """The rows whitened (Bessel) over every token (``over_masked``: SkyRL's rule, masked
    positions whitened too) or over the trainable tokens only (masked positions left 0)."""
    cells = [x for row, mask in zip(raw, masks) for x, m in zip(row, mask) if m or over_masked]
    mean, std = mean_and_std(cells)
    return [[(x - mean) / std if m or over_masked else 0.0 for x, m in zip(row, mask)] for row, mask in zip(raw, masks)]


def test_whitening_over_the_masked_tokens_is_found(tmp_path):
    # all 10 tokens: mean 0.9, Bessel variance (19 − 10·0.81)/9 = 1.2111…; the 5 trainable tokens'
    # raw mean is 1.8, so whitened their mean is (1.8 − 0.9)/std = 0.8178…; each masked token holds
    # −0.9/std = −0.8178…
    std = math.sqrt((19 - 10 * 0.81) / 9)
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=True))
    report = validate_file(path, max_findings=None)
    assert stored_findings(report) == [
        ("nonzero-at-masked", "warning", 0),
        ("nonzero-at-masked", "warning", 1),
        ("nonzero-at-masked", "warning", 2),
        ("whitened-over-masked", "warning", None),
    ]
    finding = next(f for f in report.findings if f.code == "whitened-over-masked")
    assert finding.column == "advantages" and finding.file == str(path)
    assert f"mean is {0.9 / std:.4g}" in finding.message and "10 tokens" in finding.message
    assert "biased by the masked tokens' share of the statistics" in finding.message
    masked = [f for f in report.findings if f.code == "nonzero-at-masked"]
    assert [f.message.split(" at masked token ")[1].split(" ")[0] for f in masked] == ["1", "0", "0"]
    assert f"is {-0.9 / std:.4g} at masked token 1 (2 masked tokens non-zero)" in masked[0].message
    assert "the loss must mask these positions" in masked[0].message
    assert report.errors == 0 and report.warnings == 4 and report.exit_code() == 0 and report.exit_code(True) == 1


def test_whitening_over_the_trainable_tokens_only_is_no_finding(tmp_path):
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=False))
    report = validate_file(path, max_findings=None)
    assert report.findings == [] and report.exit_code(strict=True) == 0


def test_whitened_over_every_token_without_masked_tokens_is_no_finding(tmp_path):
    masks = [[1] * len(mask) for mask in MASKS]  # every token trainable: the two statistics are one
    path = write_dump(tmp_path / "f.parquet", masks, whitened(RAW, masks, over_masked=True))
    assert validate_file(path).findings == []


# ----------------------------------------------------------------------------- nonzero-at-masked


def test_advantages_at_masked_tokens_are_named_per_row(tmp_path):
    advantages = whitened(RAW, MASKS, over_masked=False)
    advantages[1][1] = 0.5  # row 1's second token is masked
    advantages[2][0] = 5e-7  # below ZERO_TOLERANCE (1e-6): zero
    path = write_dump(tmp_path / "f.parquet", MASKS, advantages)
    report = validate_file(path)
    assert stored_findings(report) == [("nonzero-at-masked", "warning", 1)]
    assert report.findings[0].message.startswith("'advantages' is 0.5 at masked token 1 (1 masked token non-zero)")
    assert report.findings[0].column == "advantages"


# ----------------------------------------------------------------------------- the group rules


def grpo(scores, groups, *, bessel: bool = True, divide: bool = True):
    """GRPO's (or, without ``divide``, Dr.GRPO's) advantage of each row: its score less its
    group's mean, divided by the group's std."""
    out = []
    for score, group in zip(scores, groups):
        members = [s for s, g in zip(scores, groups) if g == group]
        mean = math.fsum(members) / len(members)
        var = math.fsum((s - mean) ** 2 for s in members) / (len(members) - (1 if bessel else 0))
        out.append((score - mean) / math.sqrt(var) if divide and var > 0 else score - mean)
    return out


def batch_whitened(per_row, masks, *, centre: bool = True):
    """Each row's advantage whitened with the mean and Bessel std over every trainable token."""
    tokens = [value for value, mask in zip(per_row, masks) for m in mask if m]
    mean, std = mean_and_std(tokens)
    return [(value - (mean if centre else 0.0)) / std for value in per_row], mean, std


# Two groups of prompts with unequal lengths (so the token mean of the group-normalised
# advantages is not 0) and a third group whose two rows score the same.
SCORES = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
GROUPS = ["a", "a", "b", "b", "b", "c", "c"]
LENGTHS = [1, 3, 2, 1, 1, 2, 2]
ALL_TRAINABLE = [[1] * n for n in LENGTHS]


def test_group_normalised_then_whitened_again_is_normalised_twice(tmp_path):
    per_row = grpo(SCORES, GROUPS)  # a: ±0.7071; b: 1.1547, −0.5774, −0.5774; c: 0 (equal scores)
    twice, mean, std = batch_whitened(per_row, ALL_TRAINABLE)
    # tokens: 0.7071 − 3·0.7071 + 2·1.1547 − 0.5774 − 0.5774 + 4·0 = −0.2595 over 11 tokens
    assert mean == pytest.approx((math.sqrt(0.5) - 3 * math.sqrt(0.5) + 2 / math.sqrt(3) * 2 - 2 / math.sqrt(3)) / 12)
    path = write_dump(tmp_path / "f.parquet", ALL_TRAINABLE, broadcast(twice, ALL_TRAINABLE), scores=SCORES,
                      groups=GROUPS)  # fmt: skip
    report = validate_file(path, group_col="group", max_findings=None)
    assert stored_findings(report) == [("normalised-twice", "warning", None), ("equal-rewards-nonzero", "warning", 5)]
    twice_finding, silent = (f for f in report.findings if f.code in STORED_CODES)
    # every group's mean moved to −mean/std, every group's (Bessel) std scaled to 1/std
    assert f"share one mean {-mean / std:.4g} and one std {1 / std:.4g} (Bessel)" in twice_finding.message
    assert "all 2 groups of 'group'" in twice_finding.message  # group c has no spread of scores
    assert silent.column == "advantages"
    assert "the 2 rows of group 'c'" in silent.message and f"reaches {abs(mean / std):.4g}" in silent.message
    assert "should carry no learning signal" in silent.message


def test_group_normalisation_alone_is_no_finding(tmp_path):
    for bessel in (True, False):  # either std: the groups' stds are 1 under one of them
        per_row = grpo(SCORES, GROUPS, bessel=bessel)
        path = write_dump(tmp_path / f"{bessel}.parquet", ALL_TRAINABLE, broadcast(per_row, ALL_TRAINABLE),
                          scores=SCORES, groups=GROUPS)  # fmt: skip
        assert validate_file(path, group_col="group").findings == []


def test_without_group_col_the_group_rules_do_not_run(tmp_path):
    twice, _, _ = batch_whitened(grpo(SCORES, GROUPS), ALL_TRAINABLE)
    path = write_dump(tmp_path / "f.parquet", ALL_TRAINABLE, broadcast(twice, ALL_TRAINABLE), scores=SCORES,
                      groups=GROUPS)  # fmt: skip
    assert validate_file(path).findings == []


# Three groups, every row two trainable tokens: the group-centred scores have token mean 0.
MEAN_SCORES = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
MEAN_GROUPS = ["a", "a", "b", "b", "b", "b", "c", "c"]
TWO_TOKENS = [[1, 1]] * 8


def test_a_group_mean_with_a_batch_std_is_found(tmp_path):
    centred = grpo(MEAN_SCORES, MEAN_GROUPS, divide=False)  # a: ±0.5; b: 0.75, −0.25 ×3; c: ±1
    scaled, mean, std = batch_whitened(centred, TWO_TOKENS, centre=False)
    # 16 tokens, sum 0, sum of squares 2·(2·0.25 + 0.5625 + 3·0.0625 + 2·1) = 6.5: Bessel std √(6.5/15)
    assert mean == 0 and std == pytest.approx(math.sqrt(6.5 / 15))
    path = write_dump(tmp_path / "f.parquet", TWO_TOKENS, broadcast(scaled, TWO_TOKENS), scores=MEAN_SCORES,
                      groups=MEAN_GROUPS)  # fmt: skip
    report = validate_file(path, group_col="group")
    assert stored_findings(report) == [("group-mean-batch-std", "warning", None)]
    # a group d (scores 1, 0, 0: centred 2/3, −1/3, −1/3) whose third row is fully masked: the row
    # counted in d's mean but shows no advantage, so d (visible mean 1/6 / std) is not compared
    masks = [*TWO_TOKENS, [1, 1], [1, 1], [0, 0]]
    with_d, _, std_d = batch_whitened([*centred, 2 / 3, -1 / 3, -1 / 3], masks, centre=False)
    path_d = write_dump(tmp_path / "d.parquet", masks, broadcast(with_d, masks),
                        scores=[*MEAN_SCORES, 1.0, 0.0, 0.0], groups=[*MEAN_GROUPS, "d", "d", "d"])  # fmt: skip
    report_d = validate_file(path_d, group_col="group")
    assert stored_findings(report_d) == [("group-mean-batch-std", "warning", None)]
    assert f"to {1 / std_d:.4g}" in report_d.findings[-1].message
    # the groups' biased stds: b √0.1875/std, a 0.5/std, c 1/std
    message = report.findings[0].message
    assert f"stds range from {math.sqrt(0.1875) / std:.4g} to {1 / std:.4g}" in message
    assert "centred on one mean 0 in each of the 3 groups" in message and "a group mean with a batch std" in message


def test_a_group_mean_without_a_batch_std_is_no_finding(tmp_path):
    centred = grpo(MEAN_SCORES, MEAN_GROUPS, divide=False)  # Dr.GRPO: token std √(6.5/15) ≠ 1
    path = write_dump(tmp_path / "f.parquet", TWO_TOKENS, broadcast(centred, TWO_TOKENS), scores=MEAN_SCORES,
                      groups=MEAN_GROUPS)  # fmt: skip
    assert validate_file(path, group_col="group").findings == []


def test_token_level_advantages_run_no_group_normalisation_rule(tmp_path):
    centred = grpo(MEAN_SCORES, MEAN_GROUPS, divide=False)
    scaled, _, _ = batch_whitened(centred, TWO_TOKENS, centre=False)
    advantages = broadcast(scaled, TWO_TOKENS)
    advantages[0] = [advantages[0][0] + 0.1, advantages[0][1] - 0.1]  # row 0 is no longer one number
    path = write_dump(tmp_path / "f.parquet", TWO_TOKENS, advantages, scores=MEAN_SCORES, groups=MEAN_GROUPS)
    assert validate_file(path, group_col="group").findings == []


# ----------------------------------------------------------------------------- equal-rewards-nonzero


def test_groups_of_equal_rewards_with_advantages_are_named_by_their_first_row(tmp_path):
    # group y (rows 1 and 3) scores 0.5 twice yet carries 0.25; group x (rows 0, 2) has a spread of
    # scores; group z (row 4 alone) is one row: not judged
    masks = [[1, 1]] * 5
    scores = [1.0, 0.5, 0.0, 0.5, 1.0]
    advantages = [[1.0, 1.0], [0.25, 0.25], [-1.0, -1.0], [0.0, 0.25], [0.7, 0.7]]
    ids = ["s0", "s1", "s2", "s3", "s4"]
    path = write_dump(tmp_path / "f.parquet", masks, advantages, scores=scores, groups=["x", "y", "x", "y", "z"],
                      ids=ids)  # fmt: skip
    for batch_rows in (None, 1):  # the group's rows in one batch, or in two
        report = validate_file(path, group_col="group", id_columns=["sample_id"], batch_rows=batch_rows)
        assert stored_findings(report) == [("equal-rewards-nonzero", "warning", 1)]
        finding = report.findings[0]
        assert finding.id == "s1" and "the 2 rows of group 'y'" in finding.message
        assert "all score 0.5" in finding.message and "reaches 0.25" in finding.message


def test_groups_of_equal_rewards_with_zero_advantages_are_no_finding(tmp_path):
    masks = [[1, 1]] * 4
    path = write_dump(tmp_path / "f.parquet", masks, [[1.0] * 2, [0.0] * 2, [-1.0] * 2, [0.0] * 2],
                      scores=[1.0, 0.5, 0.0, 0.5], groups=["x", "y", "x", "y"])  # fmt: skip
    assert validate_file(path, group_col="group").findings == []


def test_the_file_level_rules_are_the_same_for_any_batch_size(tmp_path):
    over_masked = write_dump(tmp_path / "masked.parquet", MASKS, whitened(RAW, MASKS, over_masked=True))
    twice, _, _ = batch_whitened(grpo(SCORES, GROUPS), ALL_TRAINABLE)
    normalised = write_dump(tmp_path / "twice.parquet", ALL_TRAINABLE, broadcast(twice, ALL_TRAINABLE),
                            scores=SCORES, groups=GROUPS)  # fmt: skip
    scaled, _, _ = batch_whitened(grpo(MEAN_SCORES, MEAN_GROUPS, divide=False), TWO_TOKENS, centre=False)
    mixed = write_dump(tmp_path / "mixed.parquet", TWO_TOKENS, broadcast(scaled, TWO_TOKENS), scores=MEAN_SCORES,
                       groups=MEAN_GROUPS)  # fmt: skip
    for path, code in ((over_masked, "whitened-over-masked"), (normalised, "normalised-twice"),
                       (mixed, "group-mean-batch-std")):  # fmt: skip
        whole = validate_file(path, group_col="group" if path != over_masked else None, max_findings=None)
        assert code in [f.code for f in whole.findings]
        for batch_rows in (1, 2):
            part = validate_file(path, group_col="group" if path != over_masked else None, batch_rows=batch_rows,
                                 max_findings=None)  # fmt: skip
            assert [f.to_dict() for f in part.findings] == [f.to_dict() for f in whole.findings]


# ----------------------------------------------------------------------------- the column and the CLI


def validate_cli(*args):
    result = runner.invoke(app, ["validate", "--json", "-", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, (json.loads(result.stdout) if result.stdout else None), result


def test_strict_makes_the_warnings_fail_through_the_cli(tmp_path):
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=True))
    code, document, _ = validate_cli(path)
    assert code == 0 and document["counts"]["whitened-over-masked"] == 1 and document["counts"]["nonzero-at-masked"]
    assert document["warnings"] == 4 and document["errors"] == 0
    listed = [(f["code"], f["severity"], f["row"], f["column"]) for f in document["findings"]]
    assert ("whitened-over-masked", "warning", None, "advantages") in listed
    code, _, result = validate_cli(path, "--strict")
    assert code == 1
    human = runner.invoke(app, ["validate", str(path), "--strict"])
    assert human.exit_code == 1 and "whitened-over-masked" in human.stderr and "--strict" in human.stderr


def test_a_file_without_an_advantages_column_runs_none_of_the_rules(tmp_path):
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=True), name="trained")
    code, document, _ = validate_cli(path, "--strict", "--group-col", "group")  # no stored column: unused
    assert code == 0 and document["findings"] == []
    code, document, _ = validate_cli(path, "--against", "trained")
    assert code == 0 and document["counts"]["whitened-over-masked"] == 1
    assert {f["column"] for f in document["findings"]} == {"trained"}


def test_against_none_runs_none_of_the_rules(tmp_path):
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=True))
    code, document, _ = validate_cli(path, "--against", "none", "--strict")
    assert code == 0 and document["findings"] == []


def test_a_named_stored_column_that_is_missing(tmp_path):
    # validate reports a column an option names and a file lacks as a missing-column error
    # (exit 1, the file named), as it does for --id-col or --values-col; the rows are still checked
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=False))
    code, document, _ = validate_cli(path, "--against", "nope")
    assert code == 1
    assert [(f["code"], f["severity"], f["row"], f["column"]) for f in document["findings"]] == [
        ("missing-column", "error", None, "nope")
    ]
    assert document["files"][0]["rows_checked"] == 3
    code, document, _ = validate_cli(path, "--against", "advantages", "--group-col", "nope")
    assert code == 1 and [(f["code"], f["column"]) for f in document["findings"]] == [("missing-column", "nope")]


def test_misused_options_are_usage_errors(tmp_path):
    path = write_dump(tmp_path / "f.parquet", MASKS, whitened(RAW, MASKS, over_masked=False))
    code, _, result = validate_cli(path, "--against", "none", "--group-col", "group")
    assert code == 2 and "--against none" in result.stderr
    code, _, result = validate_cli(path, "--against", "")
    assert code == 2 and "--against" in result.stderr


def test_the_stored_column_is_checked_like_a_token_column(tmp_path):
    advantages = whitened(RAW, MASKS, over_masked=False)
    advantages[0] = advantages[0][:3]  # 3 tokens, the mask has 4
    advantages[2][1] = math.nan
    path = write_dump(tmp_path / "f.parquet", MASKS, advantages)
    code, document, _ = validate_cli(path)
    assert code == 1
    assert [(f["row"], f["column"], f["code"]) for f in document["findings"]] == [
        (0, "advantages", "length-mismatch"),
        (2, "advantages", "non-finite"),
    ]
    assert document["findings"][0]["message"] == "'advantages' has 3 tokens, 'loss_mask' has 4"
    assert document["findings"][1]["message"] == "'advantages' is nan at token 1"


def test_a_null_group_id_is_invalid_data(tmp_path):
    masks = [[1, 1]] * 3
    path = write_dump(tmp_path / "f.parquet", masks, [[0.0] * 2] * 3, groups=["x", None, "x"])
    code, document, _ = validate_cli(path, "--group-col", "group")
    assert code == 1
    assert [(f["row"], f["column"], f["code"]) for f in document["findings"]] == [(1, "group", "null")]
