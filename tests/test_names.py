"""Names as they are, printed safely: a file name that is no UTF-8 is read and written by
its bytes and shown with them escaped (``\\xff``); credentials written in a URI never reach
a message, a JSON document or an output's metadata; ids and file names holding ANSI escapes
or line breaks reach neither the terminal nor the Markdown raw. ``display`` (the one
function that makes a name printable) is held against hand-written expectations.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from gaecli.display import display

from rollout_files import gae, random_rollouts, rollout_table, write_table

GAMMA, LAMBD = 0.99, 0.95
BAD_NAME = os.fsdecode(b"bad\xff\xfe.parquet")  # as Python holds the name: surrogate escapes
SHOWN_NAME = "bad\\xff\\xfe.parquet"  # as every message, report and metadata shows it


# ----------------------------------------------------------------------------- display


@pytest.mark.parametrize(
    "value, shown",
    [
        (os.fsdecode(b"d/bad\xff\xfe.parquet"), "d/bad\\xff\\xfe.parquet"),
        (Path(os.fsdecode(b"out/\x80x.parquet")), "out/\\x80x.parquet"),
        ("s3://key:secret@bucket/x.parquet?scheme=http", "s3://***@bucket/x.parquet?scheme=http"),
        ("s3://AKIA:se/cr+et@bucket/x.parquet", "s3://***@bucket/x.parquet"),  # an unencoded '/' in the secret
        ("gs://token@bucket/x.parquet", "gs://***@bucket/x.parquet"),
        (
            "s3://b/x.parquet?access_key=AK&secret_key=SK&session_token=TK&region=us-east-1",
            "s3://b/x.parquet?access_key=***&secret_key=***&session_token=***&region=us-east-1",
        ),
        ("s3://b/k@x.parquet: no such file", "s3://b/k@x.parquet: no such file"),  # an '@' in a key is no secret
        ("s3://bucket:9000/x.parquet: cannot read (a@b)", "s3://bucket:9000/x.parquet: cannot read (a@b)"),
        ("id \x1b[31mred\x1b[0m", "id \\x1b[31mred\\x1b[0m"),
        ("two\nlines\r\tand\x00\x7f\x9b", "two\\nlines\\r\\tand\\x00\\x7f\\x9b"),
        ("right-to-left \u202eabc", "right-to-left \\u202eabc"),
        ("plain ünïcödé · Δ σ", "plain ünïcödé · Δ σ"),
    ],
)
def test_display_escapes_names_and_redacts_credentials(value, shown):
    assert display(value) == shown
    assert display(shown) == shown  # idempotent: a message displayed twice reads the same
    display(value).encode("utf-8")  # printable: no surrogate left


def test_display_for_json_keeps_control_characters_for_the_encoder():
    assert display("a\x1b[1m" + os.fsdecode(b"\xff"), controls=False) == "a\x1b[1m\\xff"
    assert display("s3://k:s@b/x", controls=False) == "s3://***@b/x"


# ----------------------------------------------------------------------------- non-UTF-8 names (23)


def _write_rollouts(path: Path, rows: int = 12, seed: int = 5, table: pa.Table | None = None) -> Path:
    """A rollout file at ``path`` whatever its name's bytes (opened by Python, which passes
    the bytes, and written through the open file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        pq.write_table(rollout_table(random_rollouts(rows, seed=seed)) if table is None else table, file)
    return path


def _names(directory: Path) -> list[bytes]:
    return sorted(os.listdir(os.fsencode(directory)))


@pytest.fixture
def bad_input(tmp_path) -> Path:
    return _write_rollouts(tmp_path / "in" / BAD_NAME)


@pytest.mark.parametrize("given", ["directory", "file"])
def test_recompute_reads_and_writes_a_non_utf8_name(tmp_path, bad_input, given):
    out = tmp_path / "out"
    source = bad_input.parent if given == "directory" else bad_input
    target = out if given == "directory" else out / BAD_NAME
    result = gae("recompute", source, "-o", target, "--gamma", GAMMA, "--lambd", LAMBD, "--json", "-")
    assert result.exit_code == 0, result.output
    assert _names(out) == [b"bad\xff\xfe.parquet"]  # the input's bytes, as they are
    with open(os.fsencode(out / BAD_NAME), "rb") as file:
        written = pq.read_table(file)
    assert written.num_rows == 12 and "advantages" in written.column_names
    assert written.schema.metadata[b"gaecli.source"] == SHOWN_NAME.encode()
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["file"] == f"{tmp_path}/in/{SHOWN_NAME}" and entry["output"] == f"{out}/{SHOWN_NAME}"
    assert f"{out}/{SHOWN_NAME}" in result.stderr.replace("\n", "")  # the summary (wrapped to the width)


def test_recompute_names_a_non_utf8_output_as_it_is(tmp_path, bad_input):
    target = tmp_path / os.fsdecode(b"o\xff.parquet")
    result = gae("recompute", bad_input, "-o", target, "--gamma", GAMMA, "--lambd", LAMBD)
    assert result.exit_code == 0, result.output
    assert b"o\xff.parquet" in _names(tmp_path)
    assert not [name for name in _names(tmp_path) if b"gaecli-" in name]  # no temp file left
    again = gae("recompute", bad_input, "-o", target, "--gamma", GAMMA, "--lambd", LAMBD)
    assert again.exit_code == 2 and f"{tmp_path}/o\\xff.parquet exists" in again.stderr, again.output


def test_non_utf8_directories_are_read_and_written(tmp_path):
    source = _write_rollouts(tmp_path / os.fsdecode(b"in\xff") / "a.parquet")
    out = tmp_path / os.fsdecode(b"out\xfe")
    result = gae("recompute", source.parent, "-o", out, "--gamma", GAMMA, "--lambd", LAMBD)
    assert result.exit_code == 0, result.output
    assert _names(out) == [b"a.parquet"]  # whole, no temp file left
    with open(os.fsencode(out / "a.parquet"), "rb") as file:
        assert pq.read_table(file).num_rows == 12
    assert f"{tmp_path}/out\\xfe/a.parquet" in result.stderr.replace("\n", "")
    broken = tmp_path / os.fsdecode(b"in\xff") / "b.parquet"
    _write_rollouts(broken, table=rollout_table(random_rollouts(4, seed=2)).drop_columns(["terminal_reward"]))
    failed = gae("recompute", broken, "-o", out / "b.parquet", "--gamma", GAMMA, "--lambd", LAMBD)
    assert failed.exit_code in (1, 2) and "in\\xff/b.parquet" in failed.stderr, failed.output
    assert _names(out) == [b"a.parquet"]  # the failed writer left nothing


@pytest.mark.parametrize("given", ["directory", "file"])
def test_validate_lists_a_non_utf8_name(bad_input, given):
    source = bad_input.parent if given == "directory" else bad_input
    result = gae("validate", source, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [entry["file"] for entry in document["files"]] == [f"{bad_input.parent}/{SHOWN_NAME}"]
    assert document["unreadable"] == []


@pytest.mark.parametrize("given", ["directory", "file"])
def test_diff_of_a_non_utf8_name(tmp_path, bad_input, given):
    source = bad_input.parent if given == "directory" else bad_input
    per_sample = tmp_path / os.fsdecode(b"per\xfe.parquet")
    result = gae("diff", source, "--gamma", GAMMA, "--lambd", LAMBD, "--json", "-", "--per-sample", per_sample)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    shown = f"{bad_input.parent}/{SHOWN_NAME}"
    assert [entry["file"] for entry in document["files"]] == [shown]
    assert {entry["file"] for entry in document["top_samples"]} == {shown}
    assert b"per\xfe.parquet" in _names(tmp_path)
    with open(os.fsencode(per_sample), "rb") as file:
        assert set(pq.read_table(file).column("file").to_pylist()) == {shown}
    assert f"{tmp_path}/per\\xfe.parquet" in result.stderr.replace("\n", "")  # "per-sample figures → …"


# ----------------------------------------------------------------------------- ANSI escapes, line breaks (28)


ANSI_IDS = ["\x1b[31mred\x1b[0m", "line\nbreak", "\x1b]0;title\x07", "\x9b2J"]


def _ids_table(rows: int) -> pa.Table:
    ids = [ANSI_IDS[row % len(ANSI_IDS)] + f"-{row}" for row in range(rows)]
    return rollout_table(random_rollouts(rows, seed=11), extra={"sample_id": pa.array(ids)})


def test_diff_escapes_ids_on_the_terminal_and_in_markdown(tmp_path):
    data = write_table(_ids_table(16), tmp_path / "ids.parquet")
    markdown = tmp_path / "report.md"
    result = gae(
        "diff", data, "--gamma", GAMMA, "--lambd", LAMBD, "--id-col", "sample_id", "--group-by", "sample_id",
        "--top", 16, "--markdown", markdown,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = markdown.read_text()
    for text in (result.stderr, report):
        assert not any(control in text for control in ("\x1b", "\x07", "\x9b")), text
    assert "\\\\x1b[31mred\\\\x1b[0m-0" in report  # \x1b shown, its backslash escaped for Markdown
    assert "line\\\\nbreak-1" in report
    assert "\\x1b[31m" in result.stderr and "\\x9b2J-11" in result.stderr  # shown, escaped


def test_diff_html_of_a_non_utf8_name_with_escaped_ids(tmp_path):
    pytest.importorskip("matplotlib")
    data = _write_rollouts(tmp_path / BAD_NAME, table=_ids_table(16))
    html = tmp_path / os.fsdecode(b"report\xff.html")
    result = gae("diff", data, "--gamma", GAMMA, "--lambd", LAMBD, "--id-col", "sample_id", "--html", html, "-q")
    assert result.exit_code == 0, result.output
    with open(os.fsencode(html), encoding="utf-8") as file:
        report = file.read()
    assert f"{tmp_path}/{SHOWN_NAME}" in report and "\\x1b[31mred" in report
    assert "\x1b" not in report


def test_a_file_name_with_escapes_is_one_escaped_line_in_errors(tmp_path):
    name = "evil\x1b[2J\nsecond line.parquet"
    (tmp_path / name).write_bytes(b"PAR1 not parquet")
    for command in (
        ("recompute", tmp_path / name, "-o", tmp_path / "out.parquet", "--gamma", GAMMA, "--lambd", LAMBD),
        ("validate", tmp_path / name),
    ):
        result = gae(*command)
        assert result.exit_code == 2, result.output
        assert "\x1b" not in result.stderr, result.stderr
        (line,) = [line for line in result.stderr.splitlines() if "evil" in line]
        assert "evil\\x1b[2J\\nsecond line.parquet" in line


# ----------------------------------------------------------------------------- credentials in URIs (27)

SECRET = "s3cretVALUE42"
KEY_ID = "AKIDEXAMPLE77"
BUCKET = "rollouts-names"  # its own: moto keeps one in-process state for every server


def test_credentials_in_query_parameters_are_not_printed():
    uri = (
        f"s3://{BUCKET}/x.parquet?access_key={KEY_ID}&secret_key={SECRET}&session_token=TOKEN{SECRET}"
        "&endpoint_override=127.0.0.1:1&scheme=http"
    )
    for command in (("validate", uri, "--json", "-"), ("diff", uri, "--gamma", GAMMA, "--lambd", LAMBD)):
        result = gae(*command)
        assert result.exit_code == 2, result.output
        assert SECRET not in result.output and KEY_ID not in result.output, result.output
        assert "secret_key=***&session_token=***" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def endpoint():
    """``host:port`` of moto's S3 server, with one rollout file in the bucket."""
    moto_server = pytest.importorskip("moto.server", reason="needs moto: pip install 'moto[s3,server]'")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    filesystem = pafs.S3FileSystem(
        access_key=KEY_ID,
        secret_key=SECRET,
        endpoint_override=f"{host}:{port}",
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    filesystem.create_dir(BUCKET)
    with filesystem.open_output_stream(f"{BUCKET}/in/a.parquet") as stream:
        pq.write_table(rollout_table(random_rollouts(9, seed=3)), stream)
    yield f"{host}:{port}"
    server.stop()


def _uri(endpoint: str, key: str) -> str:
    return f"s3://{KEY_ID}:{SECRET}@{BUCKET}/{key}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def _shown(endpoint: str, key: str) -> str:
    return f"s3://***@{BUCKET}/{key}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


@pytest.mark.parametrize("command", ["recompute", "validate", "diff"])
def test_credentials_in_a_uri_never_reach_an_error(tmp_path, endpoint, command):
    missing = _uri(endpoint, "in/missing.parquet")
    arguments = {
        "recompute": ("-o", tmp_path / "out.parquet", "--gamma", GAMMA, "--lambd", LAMBD),
        "validate": (),
        "diff": ("--gamma", GAMMA, "--lambd", LAMBD),
    }[command]
    result = gae(command, missing, *arguments, "--json", tmp_path / "report.json")
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output and KEY_ID not in result.output, result.output
    assert _shown(endpoint, "in/missing.parquet") in result.stderr, result.stderr
    report = tmp_path / "report.json"
    assert not report.exists() or SECRET not in report.read_text()


def test_credentials_in_a_uri_never_reach_json_or_metadata(tmp_path, endpoint):
    out = tmp_path / "out"
    result = gae(
        "recompute", _uri(endpoint, "in"), "-o", out, "--gamma", GAMMA, "--lambd", LAMBD, "--json", "-", "--workers", 1
    )
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output and KEY_ID not in result.output, result.output
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["file"] == _shown(endpoint, "in/a.parquet")
    metadata = pq.read_schema(out / "a.parquet").metadata
    assert not any(SECRET.encode() in value or KEY_ID.encode() in value for value in metadata.values())
    validated = gae("validate", _uri(endpoint, "in"), "--json", "-")
    assert validated.exit_code == 0 and SECRET not in validated.output, validated.output
    assert [entry["file"] for entry in json.loads(validated.stdout)["files"]] == [_shown(endpoint, "in/a.parquet")]
