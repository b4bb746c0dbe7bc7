"""``gae validate --estimator``: only the columns the estimator reads are required (the
project's critic-free sample validates under ``grpo``), and a masked tail is worded for the
estimator (docs/validate.md#what-a-masked-tail-means-per-estimator)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from gaecli.cli import app
from gaecli.rules import TAIL_READINGS

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
CRITIC_FREE_SAMPLE = ROOT / "sample_data" / "critic_free" / "grpo_step_0000.parquet"


def validate(*args) -> tuple[int, dict, str]:
    result = runner.invoke(app, ["validate", "--json", "-", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout), result.stderr


def tail_file(path: Path, values: bool = True) -> Path:
    """Three rows; row 1 ends in two masked tokens (the only fault)."""
    masks = [[0, 1, 1], [1, 0, 0], [1, 1, 1]]
    columns = {
        "rewards": pa.array([[0.0] * 3] * 3, pa.list_(pa.float32())),
        "loss_mask": pa.array(masks, pa.list_(pa.int8())),
        "terminal_reward": pa.array([1.0, 0.0, 1.0], pa.float64()),
    }
    if values:
        columns["values"] = pa.array([[0.5] * 3] * 3, pa.list_(pa.float32()))
    pq.write_table(pa.table(columns), path)
    return path


def test_the_critic_free_sample_validates_without_an_error_under_grpo():
    code, document, stderr = validate(CRITIC_FREE_SAMPLE, "--estimator", "grpo")
    assert code == 0, stderr
    assert document["estimator"] == "grpo"
    assert document["errors"] == 0 and document["counts"]["missing-column"] == 0
    assert document["files"][0]["rows_checked"] == pq.ParquetFile(CRITIC_FREE_SAMPLE).metadata.num_rows == 32
    assert "decayed" not in stderr


def test_without_an_estimator_a_missing_values_column_names_the_option_to_pass():
    code, document, _ = validate(CRITIC_FREE_SAMPLE)
    assert code == 1 and document["estimator"] == "gae"
    [finding] = document["findings"]
    assert (finding["code"], finding["column"]) == ("missing-column", "values")
    assert "--estimator NAME" in finding["message"] and "--values-col none" in finding["message"]


def test_a_critic_free_estimator_does_not_read_the_values(tmp_path):
    path = tail_file(tmp_path / "t.parquet", values=False)
    code, document, _ = validate(path, "--estimator", "rloo")
    assert code == 0 and [(f["row"], f["code"]) for f in document["findings"]] == [(1, "masked-tail")]
    code, document, _ = validate(path, "--estimator", "gae")
    assert code == 1 and document["counts"]["missing-column"] == 1


def test_a_masked_tail_is_worded_for_the_estimator(tmp_path):
    path = tail_file(tmp_path / "t.parquet")
    messages, stderrs = {}, {}
    for estimator in ("gae", "grpo", "reinforce++", "opd"):
        extra = ("--logprobs-col", "rewards", "--teacher-logprobs-col", "rewards") if estimator == "opd" else ()
        code, document, stderr = validate(path, "--estimator", estimator, *extra)
        assert code == 0, stderr
        [finding] = document["findings"]
        assert (finding["row"], finding["code"]) == (1, "masked-tail")
        messages[estimator], stderrs[estimator] = finding["message"], stderr
    assert messages["gae"] == "the response ends in 2 masked tokens: the old GAE decayed the terminal reward over them"
    assert messages["grpo"] == (
        "the response ends in 2 masked tokens: under grpo they get advantage 0 and the row's score (its terminal "
        "reward and its trainable tokens' rewards) is credited whole to its trainable tokens: nothing decays or is "
        "lost over the tail"
    )
    assert messages["reinforce++"].startswith("the response ends in 2 masked tokens: under reinforce++ a trainer")
    assert "decays it by γ" in messages["reinforce++"]
    assert messages["opd"].startswith("the response ends in 2 masked tokens: under opd they get advantage 0")
    assert len(set(messages.values())) == 4
    # the fix shown under the rule follows the estimator too
    assert "fix: the old GAE decayed this sample's terminal reward over the tail" in stderrs["gae"]
    assert "decayed" not in stderrs["grpo"]
    assert "fix: nothing to recompute for the tail" in stderrs["grpo"]


def test_an_unknown_estimator_exits_2(tmp_path):
    result = runner.invoke(app, ["validate", str(tail_file(tmp_path / "t.parquet")), "--estimator", "ppo"])
    assert result.exit_code == 2 and "--estimator: unknown estimator 'ppo'" in result.stderr


def test_the_docs_give_every_reading():
    docs = (ROOT / "docs" / "validate.md").read_text()
    for message, hint in TAIL_READINGS.values():
        assert message.format(estimator="NAME") in docs
        assert hint in docs
