"""Object stores for real: inputs and outputs on an S3 endpoint (moto's S3 server on
localhost, reached through pyarrow's S3 client exactly as a bucket would be). Local with
one and two workers and Ray give objects byte-equal to a plain-path run, a large output
goes up in several multipart parts, a failing file leaves no object while the others are
whole, ``--skip-existing`` resumes, ``validate`` and ``diff`` read the bucket, an
aborted write leaves nothing behind, and a key pyarrow refuses, an endpoint that refuses
connections and one that never answers are each one line naming the URI (exit 2).

Needs the ``moto`` server (``pip install 'moto[s3,server]'``, in the dev extra); skipped
without it. The credentials ride in the URIs (moto accepts any), so worker processes and
Ray tasks need no environment.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from gaecli.io.writer import AtomicParquetWriter

from loopback_stores import SilentServer
from rollout_files import gae, output_content, random_rollouts, rollout_table, write_table

moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto: pip install 'moto[s3,server]'")

GAMMA, LAMBD = 0.99, 0.95
BUCKET = "rollouts"
NAMES = ("a.parquet", "day1/b.parquet", "day2/c.parquet", "large.parquet")


def large_table(seed: int) -> pa.Table:
    """Fifteen long rollouts built with numpy (about 1.5 M tokens, ~16 MB of output: more than
    one of the S3 client's 10 MB upload parts), masks in blocks."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50_000, 150_000, size=15)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = int(offsets[-1])
    mask = ((np.arange(tokens) // rng.integers(20, 200)) % 3 != 2).astype(np.int8)
    as_list = lambda flat: pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))  # noqa: E731
    return pa.table(
        {
            "values": as_list(rng.normal(0, 1, tokens).astype(np.float32)),
            "rewards": as_list(np.where(rng.random(tokens) < 0.01, 1.0, 0.0).astype(np.float32)),
            "loss_mask": as_list(mask),
            "terminal_reward": pa.array(rng.uniform(-1, 1, lengths.size).astype(np.float32)),
        }
    )


@pytest.fixture(scope="module")
def endpoint():
    """``host:port`` of an S3 server for this module."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


def uri(endpoint: str, key: str) -> str:
    return f"s3://key:secret@{BUCKET}/{key}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def shown(uri_text: str) -> str:
    """A URI of :func:`uri` as messages and JSON documents show it: its credentials redacted."""
    return uri_text.replace("s3://key:secret@", "s3://***@")


@pytest.fixture(scope="module")
def bucket(endpoint, tmp_path_factory):
    """The S3 file system, with the inputs under ``in/``; returns (file system, local copy)."""
    filesystem = pafs.S3FileSystem(
        access_key="key",
        secret_key="secret",
        endpoint_override=endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    filesystem.create_dir(BUCKET)
    local = tmp_path_factory.mktemp("s3") / "in"
    for index, (rows, name) in enumerate(zip((13, 21, 9), NAMES)):
        write_table(rollout_table(random_rollouts(rows, seed=90 + index)), local / name)
    write_table(large_table(93), local / "large.parquet", row_group_size=5)
    pafs.copy_files(str(local), f"{BUCKET}/in", destination_filesystem=filesystem)
    return filesystem, local


@pytest.fixture(scope="module")
def plain(bucket, tmp_path_factory):
    """The plain-path run every S3 run must equal byte for byte."""
    out = tmp_path_factory.mktemp("s3-plain") / "out"
    result = recompute(bucket[1], out, "--workers", 1)
    assert result.exit_code == 0, result.output
    return out


def recompute(inputs, output, *options):
    return gae(
        "recompute", inputs, "-o", output, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--batch-rows", 4, *options
    )


def keys_under(filesystem, prefix: str) -> list[str]:
    infos = filesystem.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True))
    return sorted(info.path.removeprefix(f"{BUCKET}/{prefix}/") for info in infos if info.type == pafs.FileType.File)


def object_bytes(filesystem, key: str) -> bytes:
    with filesystem.open_input_stream(f"{BUCKET}/{key}") as stream:
        return stream.read()


@pytest.mark.parametrize("engine, workers", [("local", 1), ("local", 2), ("ray", 2)])
def test_bucket_to_bucket_equals_plain_paths(endpoint, bucket, plain, local_ray, engine, workers):
    if engine == "ray" and local_ray is None:
        pytest.skip("ray is not installed")
    filesystem, _ = bucket
    prefix = f"out-{engine}-{workers}"
    result = recompute(
        uri(endpoint, "in"), uri(endpoint, prefix), "--engine", engine, "--workers", workers, "--json", "-"
    )
    assert result.exit_code == 0, result.output
    assert keys_under(filesystem, prefix) == sorted(NAMES)  # and nothing else
    for name in NAMES:
        assert output_content(object_bytes(filesystem, f"{prefix}/{name}")) == output_content(
            (plain / name).read_bytes()
        ), name
    assert (plain / "large.parquet").stat().st_size > 12 * 2**20  # went up in more than one part
    report = json.loads(result.stdout)
    expected = [shown(uri(endpoint, f"{prefix}/{name}")) for name in sorted(NAMES)]
    assert [f["output"] for f in report["files"]] == expected


def test_a_failing_file_leaves_no_object(endpoint, bucket, tmp_path):
    filesystem, local = bucket
    for name in NAMES[:3]:
        pafs.copy_files(str(local / name), f"{BUCKET}/mixed/{name}", destination_filesystem=filesystem)
    with filesystem.open_output_stream(f"{BUCKET}/mixed/day1/b.parquet") as stream:
        stream.write(b"PAR1 this is not parquet")
    result = recompute(uri(endpoint, "mixed"), uri(endpoint, "mixed-out"), "--workers", 2)
    assert result.exit_code == 2, result.output
    assert f"not written: {shown(uri(endpoint, 'mixed-out/day1/b.parquet'))}" in result.stderr
    assert "cannot read as Parquet" in result.stderr
    assert keys_under(filesystem, "mixed-out") == ["a.parquet", "day2/c.parquet"]


def test_skip_existing_resumes_on_a_bucket(endpoint, bucket, plain):
    filesystem, _ = bucket
    assert recompute(uri(endpoint, "in"), uri(endpoint, "resume"), "--workers", 2).exit_code == 0
    filesystem.delete_file(f"{BUCKET}/resume/day1/b.parquet")
    with filesystem.open_output_stream(
        f"{BUCKET}/resume/a.parquet"
    ) as stream:  # what a killed upload cannot leave, but
        stream.write(object_bytes(filesystem, "resume/a.parquet")[:-8])  # a footerless object is refused
    refused = recompute(uri(endpoint, "in"), uri(endpoint, "resume"), "--workers", 2, "--skip-existing")
    assert refused.exit_code == 2 and "not a whole Parquet file" in refused.stderr
    filesystem.delete_file(f"{BUCKET}/resume/a.parquet")
    result = recompute(uri(endpoint, "in"), uri(endpoint, "resume"), "--workers", 2, "--skip-existing", "--json", "-")
    assert result.exit_code == 0, result.output
    skipped = {f["output"]: f["skipped"] for f in json.loads(result.stdout)["files"]}
    kept = {shown(uri(endpoint, f"resume/{name}")): name not in ("a.parquet", "day1/b.parquet") for name in NAMES}
    assert skipped == kept
    for name in NAMES:
        assert output_content(object_bytes(filesystem, f"resume/{name}")) == output_content(
            (plain / name).read_bytes()
        ), name


def test_validate_and_diff_read_a_bucket(endpoint, bucket, plain):
    checked = gae("validate", uri(endpoint, "in"), "--workers", 2, "--json", "-")
    assert checked.exit_code == 0, checked.output
    assert [f["status"] for f in json.loads(checked.stdout)["files"]] == ["ok"] * len(NAMES)
    on_bucket = gae("diff", uri(endpoint, "in"), "--gamma", GAMMA, "--lambd", LAMBD, "--workers", 2, "--json", "-")
    local = gae("diff", bucket[1], "--gamma", GAMMA, "--lambd", LAMBD, "--workers", 1, "--json", "-")
    assert on_bucket.exit_code == 0 and local.exit_code == 0, on_bucket.output
    figures = lambda text: {k: json.loads(text)[k] for k in ("summary", "quantiles")}  # noqa: E731
    assert figures(on_bucket.stdout) == figures(local.stdout)
    # the reports themselves on the bucket
    to_bucket = gae(
        "diff",
        uri(endpoint, "in"),
        "--gamma",
        GAMMA,
        "--lambd",
        LAMBD,
        "--workers",
        2,
        "--quiet",
        "--json",
        uri(endpoint, "reports/diff.json"),
        "--per-sample",
        uri(endpoint, "reports/samples.parquet"),
    )
    assert to_bucket.exit_code == 0, to_bucket.output
    filesystem = bucket[0]
    assert figures(object_bytes(filesystem, "reports/diff.json")) == figures(local.stdout)
    samples = pq.read_table(pa.BufferReader(object_bytes(filesystem, "reports/samples.parquet")))
    assert samples.num_rows == sum(pq.read_metadata(bucket[1] / name).num_rows for name in NAMES)


def test_an_aborted_upload_leaves_no_object(endpoint, bucket):
    filesystem, local = bucket
    table = pq.read_table(local / "large.parquet")
    with pytest.raises(RuntimeError, match="stop here"):
        # uncompressed, 13.5 MB: the first 10 MB part is uploaded before it stops
        with AtomicParquetWriter(uri(endpoint, "aborted/large.parquet"), table.schema, compression="none") as writer:
            for batch in table.to_batches(max_chunksize=5):
                writer.write(batch)
            raise RuntimeError("stop here")
    assert keys_under(filesystem, "aborted") == []
    writer = AtomicParquetWriter(uri(endpoint, "whole/large.parquet"), table.schema)
    for batch in table.to_batches(max_chunksize=5):
        writer.write(batch)
    writer.close()
    writer.commit()
    assert pq.read_table(pa.BufferReader(object_bytes(filesystem, "whole/large.parquet"))).equals(table)


# ----------------------------------------------------------------------------- store faults: one line naming the URI


def named(uri_given: str) -> str:
    """What a message must hold of ``uri_given``: all after its credentials (which a
    message may hide)."""
    return uri_given.split("@", 1)[1]


def one_line_naming(result, uri_given: str, *words: str) -> None:
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and named(uri_given) in lines[0], result.stderr
    assert all(word in lines[0] for word in words), lines[0]


def unreadable_entry(stdout: str, uri_given: str, word: str) -> None:
    """validate's JSON lists ``uri_given`` alone as unreadable, its message naming it and ``word``."""
    (entry,) = json.loads(stdout)["unreadable"]
    assert named(uri_given) in entry["file"] and named(uri_given) in entry["message"], entry
    assert word in entry["message"], entry


def test_an_empty_path_component_is_refused_naming_the_uri(endpoint, bucket, tmp_path):
    """``s3://bucket//in/a.parquet``: pyarrow refuses the key; every command exits 2 naming
    the URI, and nothing is written."""
    filesystem, local = bucket
    for key in ("/in/a.parquet", "in//a.parquet"):
        given = uri(endpoint, key)
        one_line_naming(recompute(given, tmp_path / "out.parquet"), given, "Empty path component")
        one_line_naming(gae("diff", given, "--gamma", 1, "--lambd", 1, "--quiet"), given, "Empty path component")
        checked = gae("validate", given, "--json", "-", "--quiet")
        assert checked.exit_code == 2, checked.output
        unreadable_entry(checked.stdout, given, "Empty path component")
    output = uri(endpoint, "out//a.parquet")
    one_line_naming(recompute(local / "a.parquet", output), output, "Empty path component")
    assert not (tmp_path / "out.parquet").exists() and keys_under(filesystem, "out") == []


@pytest.fixture
def refusing_endpoint():
    """``127.0.0.1:PORT`` of a socket bound and not listening: every connection is refused
    (and no other process can take the port meanwhile)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{bound.getsockname()[1]}"


def test_an_endpoint_that_refuses_connections_is_one_line_naming_the_uri(refusing_endpoint, bucket, tmp_path):
    given = uri(refusing_endpoint, "in/a.parquet") + "&connect_timeout=1&request_timeout=1"
    one_line_naming(recompute(given, tmp_path / "out.parquet"), given, "Could not connect")
    one_line_naming(recompute(bucket[1] / "a.parquet", given, "--overwrite"), given, "Could not connect")
    one_line_naming(gae("diff", given, "--gamma", 1, "--lambd", 1, "--quiet"), given, "Could not connect")
    checked = gae("validate", given, "--json", "-", "--quiet")
    assert checked.exit_code == 2, checked.output
    unreadable_entry(checked.stdout, given, "Could not connect")
    assert not (tmp_path / "out.parquet").exists()


@pytest.fixture
def silent_endpoint():
    """``127.0.0.1:PORT`` of a server that accepts every connection and never answers (a
    stalled store)."""
    server = SilentServer()
    yield server.endpoint
    server.close()


def gae_process(*args) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` in a child process, ended after 120 s: a run that hangs on the
    store fails the test instead of holding the suite."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "1000"}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_store_that_never_answers_fails_discovery_and_planning_naming_the_uri(silent_endpoint, bucket, tmp_path):
    """While validate discovers its input and while recompute plans its output on the store
    (a request timeout of 1 s): exit 2, one line naming the URI and the timeout."""
    given = uri(silent_endpoint, "in/a.parquet") + "&connect_timeout=1&request_timeout=1"
    checked = gae_process("validate", given, "--workers", 1, "--json", "-", "--quiet")
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked.stderr
    unreadable_entry(checked.stdout, given, "Timeout")
    written = gae_process(
        "recompute", bucket[1] / "a.parquet", "-o", given, "--gamma", 1, "--lambd", 1, "--workers", 1, "--quiet"
    )
    lines = written.stderr.splitlines()
    assert written.returncode == 2 and len(lines) == 1, written.stderr
    assert lines[0].startswith("error: ") and named(given) in lines[0] and "Timeout" in lines[0], lines[0]


@pytest.mark.parametrize(
    "spelling",
    [
        "s3://key:secret@{bucket}/{key}?scheme=http&region=us-east-1&endpoint_override={endpoint}",
        "s3://key:secret@{bucket}/{key}?endpoint_override={endpoint}&scheme=http&region=us-east-1&request_timeout=9",
        "s3://other:creds@{bucket}/{key}?endpoint_override=http://{endpoint}/&scheme=http&region=us-east-1",
    ],
    ids=["reordered", "extra-option", "other-credentials-and-endpoint-spelling"],
)
def test_an_object_spelled_otherwise_is_still_the_input(endpoint, bucket, spelling):
    """``gae recompute s3://b/in.parquet?endpoint_override=…&scheme=http -o
    's3://b/in.parquet?scheme=http&endpoint_override=…' --overwrite``: the same object
    (its query reordered, an extra timeout, other credentials, the endpoint written as a
    URL) is the input, refused; the object keeps its bytes."""
    filesystem, local = bucket
    key = f"collide/{spelling.count('&')}-{len(spelling)}.parquet"
    with filesystem.open_output_stream(f"{BUCKET}/{key}") as stream:
        stream.write((local / "a.parquet").read_bytes())
    before = object_bytes(filesystem, key)
    output = spelling.format(bucket=BUCKET, key=key, endpoint=endpoint)
    for options in ((), ("--on-invalid", "skip")):
        result = recompute(uri(endpoint, key), output, "--overwrite", "--workers", 1, *options)
        assert result.exit_code == 2, result.output
        assert "this is an input file" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert object_bytes(filesystem, key) == before
