"""Inputs and outputs through pyarrow's file systems: ``file://`` URIs (1 and 2 workers)
give the same bytes as plain paths; a mock object store (pyarrow's ``mock://`` file
system, in this process only, so one worker) is read, written, resumed and listed; an
aborted object-store write leaves no object; globs in URIs are refused."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from gaecli.io.filesystem import RemotePath, resolve, to_path
from gaecli.io.writer import AtomicParquetWriter

from rollout_files import files_under, gae, output_content, random_rollouts, rollout_table, sha256, write_table

GAMMA, LAMBD = 0.99, 0.95
NAMES = ("a.parquet", "day1/b.parquet", "day2/c.parquet")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("filesystems") / "in"
    for index, (rows, name) in enumerate(zip((13, 21, 9), NAMES)):
        write_table(rollout_table(random_rollouts(rows, seed=70 + index)), root / name)
    return root


@pytest.fixture(scope="module")
def plain(inputs, tmp_path_factory):
    """The plain-path run every other one must equal byte for byte."""
    out = tmp_path_factory.mktemp("plain") / "out"
    result = recompute(inputs, out, "--workers", 1)
    assert result.exit_code == 0, result.output
    return out


def recompute(inputs, output, *options):
    return gae(
        "recompute", inputs, "-o", output, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--batch-rows", 5, *options
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_file_uris_give_the_same_bytes_as_plain_paths(tmp_path, inputs, plain, workers):
    out = tmp_path / "out"
    result = recompute(inputs.as_uri(), out.as_uri(), "--workers", workers, "--json", "-")
    assert result.exit_code == 0, result.output
    assert files_under(out) == sorted(NAMES)  # no temp file left
    for name in NAMES:
        assert sha256(out / name) == sha256(plain / name), name
    report = json.loads(result.stdout)
    assert [f["output"] for f in report["files"]] == [str(out / name) for name in NAMES]


def test_file_uri_of_one_file(tmp_path, inputs, plain):
    target = tmp_path / "one.parquet"
    result = recompute((inputs / "day1/b.parquet").as_uri(), target.as_uri())
    assert result.exit_code == 0, result.output
    assert sha256(target) == sha256(plain / "day1/b.parquet")


@pytest.fixture
def store(inputs):
    """A fresh mock object store holding the inputs under ``in/``."""
    filesystem, _ = resolve("mock://bucket/")
    filesystem.delete_dir_contents("", accept_root_dir=True)
    for name in NAMES:
        key = f"in/{name}"
        filesystem.create_dir(key.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(key) as stream:
            stream.write((inputs / name).read_bytes())
    return filesystem


def object_bytes(filesystem, key: str) -> bytes:
    with filesystem.open_input_stream(key) as stream:
        return stream.read()


def object_keys(filesystem) -> list[str]:
    return sorted(
        i.path for i in filesystem.get_file_info(pafs.FileSelector("", recursive=True)) if i.type == pafs.FileType.File
    )


def test_mock_object_store_round_trip_and_resume(store, plain):
    result = recompute("mock://bucket/in", "mock://bucket/out", "--workers", 1, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [f["output"] for f in report["files"]] == [f"mock://bucket/out/{name}" for name in NAMES]
    assert object_keys(store) == sorted([f"in/{n}" for n in NAMES] + [f"out/{n}" for n in NAMES])
    for name in NAMES:
        assert output_content(object_bytes(store, f"out/{name}")) == output_content((plain / name).read_bytes()), name

    # an existing output is refused, resumed with --skip-existing
    assert recompute("mock://bucket/in", "mock://bucket/out", "--workers", 1).exit_code == 2
    store.delete_file("out/day1/b.parquet")
    result = recompute("mock://bucket/in", "mock://bucket/out", "--workers", 1, "--skip-existing", "--json", "-")
    assert result.exit_code == 0, result.output
    assert [f.get("skipped", False) for f in json.loads(result.stdout)["files"]] == [True, False, True]
    assert output_content(object_bytes(store, "out/day1/b.parquet")) == output_content(
        (plain / "day1/b.parquet").read_bytes()
    )

    # a local output from object-store inputs, and validate / diff reading URIs
    assert gae("validate", "mock://bucket/out", "--workers", 1).exit_code == 0
    assert gae("diff", "mock://bucket/out/a.parquet", "--gamma", GAMMA, "--lambd", LAMBD, "--workers", 1).exit_code == 0


def test_mock_object_store_single_file_and_local_output(store, plain, tmp_path):
    result = recompute("mock://bucket/in/a.parquet", "mock://bucket/single.parquet")
    assert result.exit_code == 0, result.output
    assert output_content(object_bytes(store, "single.parquet")) == output_content((plain / "a.parquet").read_bytes())
    result = recompute("mock://bucket/in", tmp_path / "local", "--workers", 1)
    assert result.exit_code == 0, result.output
    for name in NAMES:
        assert output_content((tmp_path / "local" / name).read_bytes()) == output_content((plain / name).read_bytes())


def test_diff_reports_go_to_an_object_store(store, inputs, tmp_path):
    # Every report of gae diff (JSON, Markdown, HTML, per-sample Parquet) written to URIs
    # equals the same report written to local paths.
    reports = {"--json": "r.json", "--markdown": "r.md", "--html": "r.html", "--per-sample": "samples.parquet"}
    common = ("diff", "mock://bucket/in/a.parquet", "--gamma", GAMMA, "--lambd", LAMBD, "--workers", 1, "--quiet")
    local = gae(*common, *[x for flag, name in reports.items() for x in (flag, tmp_path / name)])
    assert local.exit_code == 0, local.output
    remote = gae(*common, *[x for flag, name in reports.items() for x in (flag, f"mock://bucket/reports/{name}")])
    assert remote.exit_code == 0, remote.output
    assert object_keys(store) == sorted([f"in/{n}" for n in NAMES] + [f"reports/{n}" for n in reports.values()])
    # the reports name the per-sample file, else they are the same bytes
    named = lambda text: text.replace(str(tmp_path / "samples.parquet"), "mock://bucket/reports/samples.parquet")  # noqa: E731
    assert object_bytes(store, "reports/r.json").decode() == named((tmp_path / "r.json").read_text())
    assert object_bytes(store, "reports/r.md").decode() == named((tmp_path / "r.md").read_text())
    assert object_bytes(store, "reports/r.html").decode() == named((tmp_path / "r.html").read_text())
    remote_samples = pq.read_table(pa.BufferReader(object_bytes(store, "reports/samples.parquet")))
    assert remote_samples.equals(pq.read_table(tmp_path / "samples.parquet"))
    # a report onto an input is refused before any work
    clash = gae(*common, "--json", "mock://bucket/in/a.parquet")
    assert clash.exit_code == 2 and "this is an input file" in clash.stderr


def test_globs_in_uris_are_refused(store):
    result = recompute("mock://bucket/in/*.parquet", "mock://bucket/out", "--workers", 1)
    assert result.exit_code == 2
    assert "glob patterns work for local paths only" in result.output


def test_object_store_write_appears_whole_or_not_at_all(store):
    schema = pa.schema([("x", pa.float64())])
    batch = pa.record_batch([pa.array([1.0, 2.0])], schema=schema)
    with pytest.raises(RuntimeError):
        with AtomicParquetWriter("mock://bucket/w/aborted.parquet", schema) as writer:
            writer.write(batch)
            writer.close()  # footer written, object not yet in place
            raise RuntimeError("boom")
    assert store.get_file_info("w/aborted.parquet").type == pafs.FileType.NotFound
    writer = AtomicParquetWriter("mock://bucket/w/whole.parquet", schema)
    writer.write(batch)
    writer.commit()
    assert pq.read_table("w/whole.parquet", filesystem=store).column("x").to_pylist() == [1.0, 2.0]


def test_remote_paths():
    path = to_path("s3://bucket/dir/file.parquet?region=us-east-1")
    assert isinstance(path, RemotePath)
    assert path.fs_path == "bucket/dir/file.parquet"
    assert (path.name, path.stem, path.suffix) == ("file.parquet", "file", ".parquet")
    assert str(path.parent / "sub/x.parquet") == "s3://bucket/dir/sub/x.parquet?region=us-east-1"
    assert (path.parent / "sub/x.parquet").fs_path == "bucket/dir/sub/x.parquet"
    assert str(path.with_name("y.parquet")) == "s3://bucket/dir/y.parquet?region=us-east-1"
    assert to_path("file:///tmp/x.parquet") == to_path("/tmp/x.parquet")
