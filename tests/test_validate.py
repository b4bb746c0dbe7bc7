"""``gae validate`` end to end: real Parquet files in tmp dirs, the CLI through CliRunner,
every finding checked against facts known by construction (which row, which column,
which rule)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.rules import RULES

runner = CliRunner()

ERROR_CODES = [code for code, rule in RULES.items() if rule.severity == "error"]
WARNING_CODES = [code for code, rule in RULES.items() if rule.severity == "warning"]

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("step", pa.int64()),
        ("values", pa.list_(pa.float32())),
        ("rewards", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("terminal_reward", pa.float64()),
        ("response_length", pa.int64()),
    ]
)


def clean_row(index: int, length: int = 3) -> dict:
    """A row that breaks no rule: trainable to its last token."""
    return {
        "sample_id": f"s{index}",
        "step": index // 4,
        "values": [0.5] * length,
        "rewards": [0.0] * length,
        "loss_mask": [0] * (length - 1) + [1] if length > 1 else [1] * length,
        "terminal_reward": 1.0,
        "response_length": length,
    }


def write_rows(path: Path, rows: list[dict], schema: pa.Schema = SCHEMA, **parquet_options) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, **parquet_options)
    return path


def clean_file(path: Path, count: int = 5) -> Path:
    return write_rows(path, [clean_row(i) for i in range(count)])


def validate(*args: str):
    """Run ``gae validate --json - ARGS``: the exit code and the parsed JSON document."""
    result = runner.invoke(app, ["validate", "--json", "-", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout), result


def only_finding(document: dict) -> dict:
    assert len(document["findings"]) == 1, document["findings"]
    finding = document["findings"][0]
    assert document["counts"] == {code: int(code == finding["code"]) for code in RULES}
    return finding


def one_changed_row(tmp_path: Path, row: int, change: dict, length: int = 3) -> tuple[int, dict]:
    """``gae validate`` of four clean rows (``length`` tokens) but row ``row`` updated with
    ``change``: the exit code and the only finding."""
    rows = [clean_row(i, length=length) for i in range(4)]
    rows[row].update(change)
    code, document, _ = validate(write_rows(tmp_path / "f.parquet", rows))
    return code, only_finding(document)


# ----------------------------------------------------------------------------- one rule each


def test_clean_file_exits_0_with_no_findings(tmp_path):
    path = clean_file(tmp_path / "clean.parquet")
    code, document, result = validate(path)
    assert code == 0
    assert document["findings"] == []
    assert document["errors"] == document["warnings"] == 0
    assert set(document["counts"].values()) == {0}
    assert document["files"] == [
        {"file": str(path), "status": "ok", "rows": 5, "rows_checked": 5, "errors": 0, "warnings": 0, "message": None}
    ]
    assert "no errors" in result.stderr


def test_missing_column(tmp_path):
    schema = SCHEMA.remove(SCHEMA.get_field_index("rewards"))
    rows = [{k: v for k, v in clean_row(i).items() if k != "rewards"} for i in range(3)]
    path = write_rows(tmp_path / "f.parquet", rows, schema)
    code, document, _ = validate(path)
    finding = only_finding(document)
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"], finding["severity"]) == (
        None,
        "rewards",
        "missing-column",
        "error",
    )
    assert document["files"][0]["rows_checked"] == 0  # the rows are not checked


def test_wrong_type(tmp_path):
    schema = SCHEMA.set(SCHEMA.get_field_index("terminal_reward"), pa.field("terminal_reward", pa.string()))
    rows = [{**clean_row(i), "terminal_reward": "1.0"} for i in range(3)]
    path = write_rows(tmp_path / "f.parquet", rows, schema)
    code, document, _ = validate(path)
    finding = only_finding(document)
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (None, "terminal_reward", "wrong-type")
    assert "string" in finding["message"]


@pytest.mark.parametrize(
    "column, change",
    [
        ("terminal_reward", {"terminal_reward": None}),
        ("values", {"values": None}),  # a null list: not also a length mismatch
        ("rewards", {"rewards": [0.0, None, 0.0]}),
    ],
    ids=["null-terminal", "null-list", "null-in-list"],
)
def test_null(tmp_path, column, change):
    code, finding = one_changed_row(tmp_path, 2, change)
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (2, column, "null")


def test_length_mismatch(tmp_path):
    # mask, values and response_length say 3
    code, finding = one_changed_row(tmp_path, 1, {"rewards": [0.0] * 4})
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (1, "rewards", "length-mismatch")
    assert "4 tokens" in finding["message"] and "3" in finding["message"]


def test_response_length_mismatch(tmp_path):
    code, finding = one_changed_row(tmp_path, 3, {"response_length": 5})
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (3, "response_length", "response-length-mismatch")
    assert "5" in finding["message"]


def test_mask_value(tmp_path):
    code, finding = one_changed_row(tmp_path, 1, {"loss_mask": [0, 2, 1]})
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (1, "loss_mask", "mask-value")
    assert "value 2 at token 1" in finding["message"]


@pytest.mark.parametrize(
    "column, change, shown",
    [
        ("values", {"values": [0.5, math.nan, 0.5]}, "nan at token 1"),
        ("rewards", {"rewards": [math.inf, 0.0, 0.0]}, "inf at token 0"),
        ("terminal_reward", {"terminal_reward": -math.inf}, "-inf"),
    ],
    ids=["nan-values", "inf-rewards", "inf-terminal"],
)
def test_non_finite(tmp_path, column, change, shown):
    code, finding = one_changed_row(tmp_path, 2, change)
    assert code == 1
    assert (finding["row"], finding["column"], finding["code"]) == (2, column, "non-finite")
    assert shown in finding["message"]


def test_fully_masked(tmp_path):
    code, finding = one_changed_row(tmp_path, 1, {"loss_mask": [0, 0, 0]})
    assert code == 0  # a warning
    assert (finding["row"], finding["column"], finding["code"], finding["severity"]) == (
        1,
        "loss_mask",
        "fully-masked",
        "warning",
    )


def test_masked_tail_says_how_many_tokens(tmp_path):
    code, finding = one_changed_row(tmp_path, 3, {"loss_mask": [0, 1, 1, 0, 0, 0]}, length=6)
    assert code == 0
    assert (finding["row"], finding["column"], finding["code"]) == (3, "loss_mask", "masked-tail")
    assert "3 masked tokens" in finding["message"]


def test_empty_response(tmp_path):
    code, finding = one_changed_row(tmp_path, 0, dict(values=[], rewards=[], loss_mask=[], response_length=0))
    assert code == 0
    assert (finding["row"], finding["column"], finding["code"]) == (0, "loss_mask", "empty-response")


def test_duplicate_id_one_column_across_batches(tmp_path):
    rows = [clean_row(i) for i in range(10)]
    rows[7]["sample_id"] = "s2"  # row 2 and row 7 are in different batches of 3 rows
    path = write_rows(tmp_path / "f.parquet", rows, row_group_size=4)
    code, document, _ = validate(path, "--id-col", "sample_id", "--batch-rows", "3")
    finding = only_finding(document)
    assert code == 0
    assert (finding["row"], finding["column"], finding["code"], finding["id"]) == (7, "sample_id", "duplicate-id", "s2")
    assert "row 2" in finding["message"]


def test_duplicate_id_two_columns(tmp_path):
    rows = [clean_row(i) for i in range(12)]
    for index, row in enumerate(rows):  # (step, sample_id) unique; each column alone is not
        row.update(step=index // 2, sample_id=f"s{index % 2}")
    rows[9].update(step=0, sample_id="s0")  # (0, "s0") again, first at row 0
    rows[10].update(step=0, sample_id="s0")
    path = write_rows(tmp_path / "f.parquet", rows)
    code, document, _ = validate(path, "--id-col", "step,sample_id", "--batch-rows", "4")
    assert code == 0
    assert [(f["row"], f["column"], f["code"], f["id"]) for f in document["findings"]] == [
        (9, "step,sample_id", "duplicate-id", {"step": 0, "sample_id": "s0"}),
        (10, "step,sample_id", "duplicate-id", {"step": 0, "sample_id": "s0"}),
    ]
    assert all("row 0" in f["message"] for f in document["findings"])
    assert document["counts"]["duplicate-id"] == 2


def test_id_labels_findings_and_missing_id_column_is_an_error(tmp_path):
    rows = [clean_row(i) for i in range(4)]
    rows[2]["loss_mask"] = [1, 1, 0]
    path = write_rows(tmp_path / "f.parquet", rows)
    code, document, _ = validate(path, "--id-col", "sample_id")
    assert code == 0
    assert [(f["row"], f["id"]) for f in document["findings"]] == [(2, "s2")]
    code, document, _ = validate(path, "--id-col", "uid")
    assert code == 1
    assert [(f["row"], f["column"], f["code"]) for f in document["findings"]] == [
        (None, "uid", "missing-column"),
        (2, "loss_mask", "masked-tail"),
    ]


# ----------------------------------------------------------------------------- several files, options


def test_mixed_files_and_json_document(tmp_path):
    (tmp_path / "a").mkdir()
    clean = clean_file(tmp_path / "a" / "clean.parquet")
    rows = [clean_row(i) for i in range(6)]
    rows[1]["loss_mask"] = [1, 0, 0]  # masked-tail warning
    rows[4]["values"] = [0.5, 0.5]  # length-mismatch on values
    faulty = write_rows(tmp_path / "a" / "faulty.parquet", rows)
    code, document, result = validate(tmp_path / "a")  # a directory: both files, sorted
    assert code == 1
    assert list(document) == [
        "version",
        "estimator",
        "files",
        "findings",
        "counts",
        "errors",
        "warnings",
        "unreadable",
        "max_findings",
        "truncated",
    ]
    assert [(f["file"], f["status"], f["errors"], f["warnings"]) for f in document["files"]] == [
        (str(clean), "ok", 0, 0),
        (str(faulty), "invalid", 1, 1),
    ]
    assert [(f["file"], f["row"], f["column"], f["code"], f["severity"]) for f in document["findings"]] == [
        (str(faulty), 1, "loss_mask", "masked-tail", "warning"),
        (str(faulty), 4, "values", "length-mismatch", "error"),
    ]
    for finding in document["findings"]:
        assert list(finding) == ["file", "row", "id", "column", "code", "severity", "message"]
    assert set(document["counts"]) == set(RULES)
    assert (document["errors"], document["warnings"], document["unreadable"], document["truncated"]) == (
        1,
        1,
        [],
        False,
    )
    # the human view, on stderr, groups by rule: errors first
    assert result.stderr.index("length-mismatch") < result.stderr.index("masked-tail")
    assert "row 4" in result.stderr and "fix:" in result.stderr


def test_strict_fails_on_warnings(tmp_path):
    rows = [clean_row(i) for i in range(3)]
    rows[0]["loss_mask"] = [0, 0, 0]
    path = write_rows(tmp_path / "f.parquet", rows)
    assert validate(path)[0] == 0
    assert validate(path, "--strict")[0] == 1
    assert validate(clean_file(tmp_path / "clean.parquet"), "--strict")[0] == 0


def test_max_findings_caps_the_list_not_the_counts(tmp_path):
    rows = [clean_row(i) for i in range(10)]
    for index in (1, 3, 5, 7, 9):
        rows[index]["loss_mask"] = [1, 1, 0]
    rows[8]["response_length"] = 4
    path = write_rows(tmp_path / "f.parquet", rows)
    code, document, result = validate(path, "--max-findings", "2", "--batch-rows", "2")
    assert code == 1
    # two of each rule: the error at row 8 is listed though two warnings came before it
    assert [(f["row"], f["code"]) for f in document["findings"]] == [
        (1, "masked-tail"),
        (3, "masked-tail"),
        (8, "response-length-mismatch"),
    ]
    assert document["counts"]["masked-tail"] == 5 and document["counts"]["response-length-mismatch"] == 1
    assert (document["errors"], document["warnings"], document["max_findings"], document["truncated"]) == (
        1,
        5,
        2,
        True,
    )
    assert "… and 3 more (see --json)" in result.stderr and "not listed" not in result.stderr


@pytest.mark.parametrize("batch_rows", [None, "3"], ids=["one-batch", "batches-of-3"])
def test_max_findings_is_per_rule_with_two_rules_over_it(tmp_path, batch_rows):
    rows = [clean_row(i) for i in range(10)]
    for index in range(5):  # rows 0-4: a mask value of 2, an error
        rows[index]["loss_mask"] = [0, 0, 2]
    for index in range(5, 10):  # rows 5-9: end on a masked token, a warning
        rows[index]["loss_mask"] = [1, 1, 0]
    path = write_rows(tmp_path / "f.parquet", rows)
    batches = ("--batch-rows", batch_rows) if batch_rows else ()
    code, document, result = validate(path, "--max-findings", "2", *batches)
    assert code == 1
    assert [(f["row"], f["code"]) for f in document["findings"]] == [
        (0, "mask-value"),
        (1, "mask-value"),
        (5, "masked-tail"),
        (6, "masked-tail"),
    ]
    assert (document["counts"]["mask-value"], document["counts"]["masked-tail"], document["truncated"]) == (5, 5, True)
    assert result.stderr.count("… and 3 more (see --json)") == 2


def test_max_findings_per_rule_counts_across_files(tmp_path):
    from gaecli.validate import validate_files

    paths = []
    for name in ("a", "b"):
        rows = [clean_row(i) for i in range(4)]
        rows[0]["loss_mask"] = [0, 0, 2]  # one mask-value error in each file
        rows[1]["loss_mask"] = rows[2]["loss_mask"] = [1, 1, 0]  # two masked-tail warnings in each file
        paths.append(write_rows(tmp_path / f"{name}.parquet", rows))
    report = validate_files(paths, max_findings=3)
    listed = [(Path(f.file).stem, f.row, f.code) for f in report.findings]
    assert listed == [
        ("a", 0, "mask-value"),
        ("a", 1, "masked-tail"),
        ("a", 2, "masked-tail"),
        ("b", 0, "mask-value"),
        ("b", 1, "masked-tail"),
    ]
    assert (report.counts["mask-value"], report.counts["masked-tail"], report.truncated) == (2, 4, True)


def test_unreadable_file_among_good_ones(tmp_path):
    good = clean_file(tmp_path / "good.parquet")
    rows = [clean_row(i) for i in range(3)]
    rows[1]["loss_mask"] = [0, 2, 1]
    bad_rows = write_rows(tmp_path / "bad_rows.parquet", rows)
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("not parquet at all")
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-100])
    code, document, result = validate(good, not_parquet, bad_rows, truncated, tmp_path / "missing.parquet")
    assert code == 2  # wins over the invalid rows
    assert [(f["file"], f["status"]) for f in document["files"]] == [
        (str(good), "ok"),
        (str(not_parquet), "unreadable"),
        (str(bad_rows), "invalid"),
        (str(truncated), "unreadable"),
        (str(tmp_path / "missing.parquet"), "unreadable"),
    ]
    assert [(f["file"], f["row"], f["code"]) for f in document["findings"]] == [(str(bad_rows), 1, "mask-value")]
    assert [u["file"] for u in document["unreadable"]] == [
        str(not_parquet),
        str(truncated),
        str(tmp_path / "missing.parquet"),
    ]
    assert all(u["message"] for u in document["unreadable"])
    assert "could not be read" in result.stderr and "Traceback" not in result.stderr


def test_file_that_breaks_mid_read_keeps_its_findings(tmp_path):
    rows = [clean_row(i, length=50) for i in range(40)]
    rows[3]["loss_mask"] = [1] * 49 + [0]
    path = write_rows(tmp_path / "f.parquet", rows, row_group_size=10)
    chunk = pq.ParquetFile(path).metadata.row_group(3).column(SCHEMA.get_field_index("values"))
    first_page = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[first_page : first_page + 40] = b"\xff" * 40  # the last row group's values page header
    path.write_bytes(bytes(data))
    code, document, _ = validate(path, "--batch-rows", "10")
    assert code == 2
    assert [(f["status"], f["rows"], f["rows_checked"]) for f in document["files"]] == [("unreadable", 40, 30)]
    assert [(f["row"], f["code"]) for f in document["findings"]] == [(3, "masked-tail")]


def test_renamed_columns_and_values_none(tmp_path):
    rows = [{"v": [1.0, 2.0], "kl": [0.0, 0.0], "m": [True, False], "score": 1} for _ in range(3)]
    schema = pa.schema(
        [
            ("v", pa.large_list(pa.float64())),
            ("kl", pa.list_(pa.float32())),
            ("m", pa.large_list(pa.bool_())),
            ("score", pa.int32()),
        ]
    )
    path = write_rows(tmp_path / "f.parquet", rows, schema)
    code, document, _ = validate(
        path, "--values-col", "none", "--rewards-col", "kl", "--mask-col", "m", "--terminal-col", "score"
    )
    assert code == 0
    assert [(f["row"], f["column"], f["code"]) for f in document["findings"]] == [
        (r, "m", "masked-tail") for r in range(3)
    ]


def test_list_rules(tmp_path):
    result = runner.invoke(app, ["validate", "--list-rules"])
    assert result.exit_code == 0
    for code, rule in RULES.items():
        assert code in result.stdout and rule.hint in result.stdout
    result = runner.invoke(app, ["validate", "--list-rules", "--json", "-"])
    assert result.exit_code == 0
    rules = json.loads(result.stdout)["rules"]
    assert [(r["code"], r["severity"]) for r in rules] == [(code, rule.severity) for code, rule in RULES.items()]
    assert {
        "missing-column",
        "duplicate-column",
        "wrong-type",
        "null",
        "length-mismatch",
        "response-length-mismatch",
        "mask-value",
        "outside-response",
        "non-finite",
        "overflow",
        "turn-rewards-length",
        "turn-rewards-null",
        "turn-rewards-non-finite",
        "turn-ids-length",
        "turn-ids-null",
        "turn-ids-order",
        "truncated-null",
        "truncated-value",
        "bootstrap-invalid",
        "duplicate-turn",
        "episode-mismatch",
        "episode-rejected",
        "fully-masked",
        "masked-tail",
        "empty-response",
        "duplicate-id",
        "whitened-over-masked",
        "normalised-twice",
        "group-mean-batch-std",
        "equal-rewards-nonzero",
        "nonzero-at-masked",
    } == set(RULES)


def test_usage_errors_exit_2(tmp_path):
    assert runner.invoke(app, ["validate"]).exit_code == 2
    path = clean_file(tmp_path / "f.parquet")
    assert runner.invoke(app, ["validate", str(path), "--max-findings", "-1"]).exit_code == 2
    result = runner.invoke(app, ["validate", str(path), "--id-col", "a,,b"])
    assert result.exit_code == 2 and "empty" in result.stderr


def test_quiet_prints_nothing_and_json_to_a_file(tmp_path):
    rows = [clean_row(i) for i in range(3)]
    rows[2]["terminal_reward"] = math.nan
    path = write_rows(tmp_path / "f.parquet", rows)
    report = tmp_path / "report.json"
    result = runner.invoke(app, ["validate", str(path), "--quiet", "--json", str(report)])
    assert result.exit_code == 1
    assert result.stdout == "" and result.stderr == ""
    assert [(f["row"], f["code"]) for f in json.loads(report.read_text())["findings"]] == [(2, "non-finite")]


def test_docs_list_every_rule():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "validate.md").read_text()
    for code, rule in RULES.items():
        assert f"`{code}`" in docs and rule.hint in docs, code


def _tail_rows_file(tmp_path: Path, tails: int) -> Path:
    rows = [clean_row(i) for i in range(10)]
    for index in range(tails):
        rows[index]["loss_mask"] = [1, 1, 0]
    return write_rows(tmp_path / "tails.parquet", rows)


def _listed_rows(stderr: str) -> list[int]:
    """The rows of the findings listed under their rule on the terminal."""
    return [int(line.split(", row ")[1].split(",")[0]) for line in stderr.splitlines() if ", row " in line]


@pytest.mark.parametrize(
    "extra, shown", [((), [0, 1, 2]), (("--max-findings", "5"), [0, 1, 2, 3, 4]), (("--max-findings", "1"), [0])]
)
def test_max_findings_bounds_the_rows_shown_per_rule_on_the_terminal(tmp_path, extra, shown):
    path = _tail_rows_file(tmp_path, 6)
    result = runner.invoke(app, ["validate", str(path), *extra])
    assert result.exit_code == 0, result.output
    assert _listed_rows(result.stderr) == shown
    assert f"… and {6 - len(shown)} more" in result.stderr


def test_the_fully_masked_fix_says_how_to_fix_not_what_is_wrong():
    rule = RULES["fully-masked"]
    message = "every token is masked: the sample trains nothing and its terminal reward is dropped"
    assert rule.hint.split()[0] == "drop"  # an action
    assert "trains nothing" not in rule.hint and "terminal reward" not in rule.hint and message not in rule.hint
    assert "mask builder" in rule.hint


def test_the_input_is_named_file_in_every_command_json(tmp_path):
    path = clean_file(tmp_path / "f.parquet")
    _, validated, _ = validate(path)
    out = tmp_path / "out.parquet"
    recomputed = runner.invoke(
        app, ["recompute", str(path), "-o", str(out), "--gamma", "1", "--lambd", "1", "--json", "-"]
    )
    diffed = runner.invoke(app, ["diff", str(path), "--gamma", "1", "--lambd", "1", "--json", "-"])
    for document in (validated, json.loads(recomputed.stdout), json.loads(diffed.stdout)):
        assert [entry["file"] for entry in document["files"]] == [str(path)]
        assert all("source" not in entry for entry in document["files"])
