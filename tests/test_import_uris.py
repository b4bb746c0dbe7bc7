"""``gae import miles | slime | nemo-rl | skyrl`` read and write URIs like the other commands: dumps
in a mock object store (pyarrow's ``mock://``, this process only) import to the same rows as
the same files on disk, and a failed import leaves no object behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from skyrl_dumps import dump_name, skyrl_batch, write_batch
from test_import import rollout_data
from test_import_context_parallel import write_run
from test_import_nemo_rl import batch, write_step
from test_import_slime import slime_samples, write_slime

from gaecli.io.filesystem import resolve

from rollout_files import gae


@pytest.fixture
def bucket():
    filesystem, _ = resolve("mock://bucket/")
    filesystem.delete_dir_contents("", accept_root_dir=True)
    return filesystem


def upload(filesystem, directory: Path, prefix: str) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(directory).as_posix()}"
            filesystem.create_dir(key.rsplit("/", 1)[0], recursive=True)
            with filesystem.open_output_stream(key) as stream:
                stream.write(path.read_bytes())


def read_object(filesystem, key: str):
    with filesystem.open_input_file(key) as file:
        return pq.read_table(file)


@pytest.mark.parametrize("fmt", ["miles", "slime", "nemo-rl", "skyrl"])
def test_uris_in_and_out_give_the_rows_of_local_files(tmp_path, bucket, fmt):
    local = tmp_path / "dumps"
    if fmt == "miles":
        write_run(local, 2, rollouts=(0,))
    elif fmt == "slime":
        write_slime(local / "0.pt", 0, slime_samples([rollout_data(1, 3), rollout_data(2, 2)]))
    elif fmt == "nemo-rl":
        write_step(local, 4, batch(1, 5))
    else:
        for step in (2, 11):
            write_batch(local / "dumped_data" / dump_name(step), skyrl_batch(step, pad=1).state)
    upload(bucket, local, "dumps")
    assert gae("import", fmt, local, "-o", tmp_path / "local.parquet", "--quiet").exit_code == 0
    result = gae("import", fmt, "mock://bucket/dumps", "-o", "mock://bucket/out/run.parquet", "--quiet")
    assert result.exit_code == 0, result.output
    remote, plain = read_object(bucket, "out/run.parquet"), pq.read_table(tmp_path / "local.parquet")
    assert remote.equals(plain)


def test_a_failed_import_leaves_no_object(tmp_path, bucket):
    write_run(tmp_path / "dumps", 2, rollouts=(0,))
    broken = torch.load(tmp_path / "dumps" / "0_5.pt", weights_only=True)
    broken["rollout_data"]["values"][0] = broken["rollout_data"]["values"][0][:-1]
    torch.save(broken, tmp_path / "dumps" / "0_5.pt")
    upload(bucket, tmp_path / "dumps", "dumps")
    result = gae("import", "miles", "mock://bucket/dumps", "-o", "mock://bucket/out/run.parquet", "--quiet")
    assert result.exit_code == 1, result.output
    assert "mock://bucket/dumps/0_5.pt: rollout_data['values'][0]" in result.stderr.replace("\n", "")
    written = bucket.get_file_info(pafs.FileSelector("out", allow_not_found=True))
    assert not [info for info in written if info.is_file]
