"""What a read checks of the bytes it is given: every page checksum a file carries (a byte
flipped inside an uncompressed data page is an unreadable input naming its row group;
gaecli's own outputs carry checksums), and the rows read against the footer's count (an
input shortened while it is read is an unreadable input). Each in recompute, diff and
validate: exit 2, one line, nothing written."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaecli.io.reader import RolloutFile

from rollout_files import files_under, gae, random_rollouts, rollout_table

ROWS, GROUP_ROWS, CORRUPT_ROW = 300, 100, 150  # the flipped value lies in row group 1


def _command(name: str, source: Path, out: Path) -> list:
    if name == "recompute":
        return ["recompute", source, "-o", out / "o.parquet", "--gamma", 1, "--lambd", 1, "--workers", 1, "--quiet"]
    if name == "diff":
        return ["diff", source, "--gamma", 1, "--lambd", 1, "--workers", 1, "--per-sample", out / "p.parquet"]
    return ["validate", source, "--workers", 1]


def _error_line(command: str, result) -> str:
    """The one line of a failed recompute or diff; validate's report line of the file."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if command == "validate":
        lines = [line for line in lines if line.startswith("unreadable ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _unique_value(data: bytes, candidates) -> bytes:
    """The bytes of the first of ``candidates`` (floats) found exactly once in ``data``."""
    for value in candidates:
        packed = struct.pack("<f", value)
        at = data.find(packed)
        if at > 0 and data.find(packed, at + 1) == -1:
            return packed
    raise AssertionError("no value found once")


def _flipped(tmp_path: Path, checksums: bool) -> tuple[Path, float]:
    """An uncompressed rollout file (checksums or not) with one bit of a value in a data page
    of row group 1 flipped; also that value as written."""
    rollouts = random_rollouts(ROWS, seed=61)
    source = tmp_path / "in" / "a.parquet"
    source.parent.mkdir(parents=True)
    pq.write_table(
        rollout_table(rollouts),
        source,
        row_group_size=GROUP_ROWS,
        compression="none",
        use_dictionary=False,
        write_page_checksum=checksums,
    )
    data = bytearray(source.read_bytes())
    value = _unique_value(data, rollouts.values[CORRUPT_ROW])
    at = data.find(value)
    data[at] ^= 0x01  # the lowest bit of the mantissa: still a finite number, just another one
    source.write_bytes(bytes(data))
    return source, struct.unpack("<f", value)[0]


@pytest.mark.parametrize("command", ["recompute", "diff", "validate"])
def test_a_flipped_byte_in_a_page_with_a_checksum_is_an_unreadable_input(tmp_path, command):
    source, _ = _flipped(tmp_path, checksums=True)
    before = source.read_bytes()
    out = tmp_path / "out"
    result = gae(*_command(command, source, out))
    assert result.exit_code == 2, result.output
    line = _error_line(command, result)
    assert str(source) in line and "row group 1: a page's checksum does not match its data" in line, line
    assert files_under(out) == [] and source.read_bytes() == before


def test_a_flipped_byte_without_checksums_is_not_detected(tmp_path):
    """The limit, pinned: a file written without page checksums reads the other number."""
    source, value = _flipped(tmp_path, checksums=False)
    result = gae("validate", source, "--workers", 1)
    assert result.exit_code == 0, result.output
    read = pq.read_table(source).column("values")[CORRUPT_ROW].as_py()
    assert value not in read and min(abs(each - value) for each in read) < 1e-5 * max(abs(value), 1.0)


def test_outputs_carry_page_checksums(tmp_path):
    source = tmp_path / "in.parquet"
    pq.write_table(rollout_table(random_rollouts(ROWS, seed=62)), source, row_group_size=GROUP_ROWS, compression="none")
    output = tmp_path / "out.parquet"
    options = ("--gamma", 1, "--lambd", 1, "--workers", 1, "--batch-rows", GROUP_ROWS, "--quiet")
    result = gae("recompute", source, "-o", output, *options)
    assert result.exit_code == 0, result.output
    assert pq.read_metadata(output).num_row_groups == ROWS // GROUP_ROWS
    data = bytearray(output.read_bytes())
    data[data.find(_unique_value(data, pq.read_table(output).column("values")[CORRUPT_ROW].as_py()))] ^= 0x01
    output.write_bytes(bytes(data))
    result = gae("validate", output, "--workers", 1)
    assert result.exit_code == 2
    assert "row group 1: a page's checksum does not match its data" in _error_line("validate", result)


@pytest.fixture
def shortened_while_read(monkeypatch):
    """Truncate a file to 0 bytes once its footer was read and it was opened, before its
    first batch is read (as another process would, during the run)."""

    def install(source: Path) -> None:
        original = RolloutFile.iter_batches

        def iter_batches(self, *args, **kwargs):
            if Path(str(self.path)) == source and source.stat().st_size:
                os.truncate(source, 0)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(RolloutFile, "iter_batches", iter_batches)

    return install


@pytest.mark.parametrize("command", ["recompute", "diff", "validate"])
def test_an_input_shortened_while_it_is_read_is_an_unreadable_input(tmp_path, shortened_while_read, command):
    source = tmp_path / "in" / "a.parquet"
    source.parent.mkdir(parents=True)
    pq.write_table(rollout_table(random_rollouts(50, seed=63)), source)
    shortened_while_read(source)
    out = tmp_path / "out"
    result = gae(*_command(command, source, out))
    assert result.exit_code == 2, result.output
    line = _error_line(command, result)
    assert f"{source} changed while it was read: the footer says 50 rows, 0 were read" in line, line
    assert files_under(out) == []
