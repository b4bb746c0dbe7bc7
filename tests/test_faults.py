"""Faults reported in one line with the documented exit code and nothing left behind: a full
disk while the footer is written (one worker and two), an output on a read-only file system
(recompute and import), duplicate column names, rows whose advantages or returns overflow,
JSON documents holding non-finite numbers, and ``--skip-existing`` refusing outputs of
another computation. Real small tmpfs mounts where this machine allows them (skipped with
the reason otherwise); the writer's guarded paths also with a patched Parquet writer."""

from __future__ import annotations

import errno
import json
import math
import subprocess
from dataclasses import replace as replace_options
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.errors import GAEUsageError
from gaecli.io.format import Columns
from gaecli.io.writer import AtomicParquetWriter

from rollout_files import files_under, gae, random_rollouts, reference_outputs, rollout_table, write_table

PAGE = 4096


# ----------------------------------------------------------------------------- mounts


def _mount(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *arguments], capture_output=True, text=True)


@pytest.fixture
def tmpfs(tmp_path):
    """``make(name, size_bytes, read_only=False)``: a fresh tmpfs of that size at
    ``tmp_path/name``, unmounted after the test. Skips where mounting is not allowed."""
    mounted: list[Path] = []

    def make(name: str, size: int, read_only: bool = False) -> Path:
        where = tmp_path / name
        where.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = _mount("-t", "tmpfs", "-o", options, "tmpfs", str(where))
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


def _footer_sizes(source: Path, scratch: Path, *options) -> tuple[int, int]:
    """(bytes before the footer, footer bytes) of the output recompute writes for ``source``."""
    output = scratch / f"{source.stem}.sized.parquet"
    result = gae("recompute", source, "-o", output, "--gamma", 1, "--lambd", 1, "--quiet", *options)
    assert result.exit_code == 0, result.output
    footer = pq.read_metadata(output).serialized_size + 8  # + footer length and magic
    size = output.stat().st_size
    output.unlink()
    return size - footer, footer


def _one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.output
    return "\n".join(lines)


def _left_in(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


# ----------------------------------------------------------------------------- 5: full disk at the footer


@pytest.fixture
def long_file(tmp_path):
    """400 rows written with one row group per row (``--batch-rows 1``): a footer of ~170 KB."""
    return write_table(rollout_table(random_rollouts(400, seed=11, max_length=200)), tmp_path / "in" / "b.parquet")


def test_full_disk_while_the_footer_is_written(tmp_path, tmpfs, long_file):
    data, footer = _footer_sizes(long_file, tmp_path, "--batch-rows", 1)
    assert footer > 4 * PAGE  # room to aim between the data pages and the footer
    disk = tmpfs("disk", _pages(data + footer // 2))
    result = gae(
        "recompute", long_file, "-o", disk / "b.parquet", "--gamma", 1, "--lambd", 1, "--batch-rows", 1, "--quiet"
    )
    assert result.exit_code == 2
    message = _one_line_error(result)
    assert message == f"error: {disk / 'b.parquet'}: cannot write (No space left on device)"
    assert _left_in(disk) == []  # neither the output nor its temp file


def test_full_disk_with_two_workers_lists_written_and_not_written(tmp_path, tmpfs, long_file):
    small = write_table(rollout_table(random_rollouts(8, seed=12)), tmp_path / "in" / "a.parquet")
    data, footer = _footer_sizes(long_file, tmp_path, "--batch-rows", 1)
    small_size = sum(_footer_sizes(small, tmp_path, "--batch-rows", 1))
    disk = tmpfs("disk", _pages(_pages(small_size) + data + footer // 2))
    result = gae(
        "recompute",
        tmp_path / "in",
        "-o",
        disk / "out",
        "--gamma",
        1,
        "--lambd",
        1,
        "--batch-rows",
        1,
        "--workers",
        2,
        "--quiet",
    )
    assert result.exit_code == 2, result.output
    message = _one_line_error(result)
    assert message.startswith("error: 1 of 2 files failed; 1 written, 1 not written")
    assert f"  written: {disk / 'out' / 'a.parquet'}" in message
    target = disk / "out" / "b.parquet"
    assert f"  not written: {target} ({target}: cannot write (No space left on device))" in message
    assert _left_in(disk) == ["out", "out/a.parquet"]
    assert pq.read_table(disk / "out" / "a.parquet").num_rows == 8


def test_writer_close_failing_is_a_usage_error_and_removes_the_temp(tmp_path, monkeypatch):
    """The guarded footer path without a mount: the Parquet writer's close raises ENOSPC."""

    def no_space(self):
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "close", no_space)
    schema = pa.schema([("x", pa.int64())])
    writer = AtomicParquetWriter(tmp_path / "o.parquet", schema)
    writer.write(pa.record_batch([pa.array([1, 2, 3])], schema=schema))
    with pytest.raises(GAEUsageError, match=r"o\.parquet: cannot write \(No space left on device\)$"):
        writer.commit()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_recompute_with_the_footer_failing_leaves_nothing(tmp_path, monkeypatch):
    source = write_table(rollout_table(random_rollouts(5, seed=13)), tmp_path / "in.parquet")

    def no_space(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "close", no_space)
    result = gae(
        "recompute", source, "-o", tmp_path / "out" / "o.parquet", "--gamma", 1, "--lambd", 1, "--quiet", "--workers", 1
    )
    assert result.exit_code == 2
    assert "cannot write (No space left on device)" in _one_line_error(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]  # the output directory made goes too


# ----------------------------------------------------------------------------- 6: read-only output


def test_recompute_onto_a_read_only_file_system(tmp_path, tmpfs):
    source = write_table(rollout_table(random_rollouts(5, seed=14)), tmp_path / "in.parquet")
    read_only = tmpfs("ro", 1 << 20, read_only=True)
    for target in (read_only / "o.parquet", read_only / "deeper" / "o.parquet"):
        result = gae("recompute", source, "-o", target, "--gamma", 1, "--lambd", 1, "--quiet")
        assert result.exit_code == 2
        message = _one_line_error(result)
        assert "\n" not in message and "Read-only file system" in message and str(read_only) in message
    assert _left_in(read_only) == []


def test_import_onto_a_read_only_file_system(tmp_path, tmpfs):
    torch = pytest.importorskip("torch")
    from test_import import rollout_data, write_dump

    dump = write_dump(tmp_path / "dump.pt", rollout_data(seed=3, rows=4))
    read_only = tmpfs("ro", 1 << 20, read_only=True)
    result = gae("import", "miles", dump, "-o", read_only / "o.parquet", "--quiet")
    assert torch is not None and result.exit_code == 2
    assert _one_line_error(result) == f"error: {read_only / 'o.parquet'}: cannot write (Read-only file system)"
    assert _left_in(read_only) == []


def test_writer_on_a_read_only_directory_without_a_mount(tmp_path, monkeypatch):
    """The guarded open path: the Parquet writer cannot create its temp file and even the
    unlink of the (absent) temp file is refused, as on a read-only file system."""

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(pq.ParquetWriter, "__init__", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(GAEUsageError, match=r"o\.parquet: cannot write \(Read-only file system\)$"):
        AtomicParquetWriter(tmp_path / "o.parquet", pa.schema([("x", pa.int64())]))


# ----------------------------------------------------------------------------- 8: duplicate columns


@pytest.fixture
def duplicated(tmp_path):
    table = rollout_table(random_rollouts(4, seed=15))
    table = table.append_column("values", table.column("values"))
    return write_table(table, tmp_path / "dup.parquet")


@pytest.mark.parametrize("command", ["recompute", "diff"])
def test_duplicate_column_stops_recompute_and_diff(tmp_path, duplicated, command):
    output = ["-o", tmp_path / "o.parquet"] if command == "recompute" else []
    result = gae(command, duplicated, *output, "--gamma", 1, "--lambd", 1, "--quiet")
    assert result.exit_code == 1
    assert _one_line_error(result) == (
        f"error: {duplicated}, column 'values': column 'values' appears 2 times [duplicate-column]"
    )
    assert not (tmp_path / "o.parquet").exists()


def test_validate_reports_a_duplicate_column(duplicated):
    result = gae("validate", duplicated, "--json", "-", "--quiet", "--id-col", "values")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert [(f["code"], f["column"], f["row"]) for f in document["findings"]] == [("duplicate-column", "values", None)]
    assert document["counts"]["duplicate-column"] == 1


# ----------------------------------------------------------------------------- 8: overflow


def _bound_loop(values, rewards, terminal) -> list[float]:
    """Σ|r| + 3·Σ|V| + |terminal| per row, a float64 Python loop."""
    return [
        sum(abs(float(r)) for r in rs) + 3.0 * sum(abs(float(v)) for v in vs) + abs(float(t))
        for vs, rs, t in zip(values, rewards, terminal)
    ]


def test_overflow_bound_matches_a_loop_and_bounds_the_reference():
    from gaecli.overflow import overflow_bounds

    rollouts = random_rollouts(60, seed=16, max_length=30)
    table = rollout_table(rollouts, float_type=pa.float64())
    lists = {}
    for name in ("values", "rewards"):
        array = table.column(name).combine_chunks()
        lists[name] = (array.offsets.to_numpy().astype(np.int64), array.values)
    bounds, names, largest = overflow_bounds(lists, Columns(), np.asarray(rollouts.terminal))
    expected = _bound_loop(rollouts.values, rollouts.rewards, rollouts.terminal)
    np.testing.assert_allclose(bounds, expected, rtol=1e-12)
    assert names == ["values", "rewards", "terminal_reward"] and largest.shape == (60,)
    assert any(len(mask) == 0 for mask in rollouts.masks)  # empty rows counted as 0 + |terminal|
    for gamma, lambd in ((1.0, 1.0), (0.99, 0.95), (0.0, 0.5)):
        advantages, returns = reference_outputs(rollouts, gamma, lambd)
        for row, bound in enumerate(bounds):
            assert all(abs(float(x)) <= bound * (1 + 1e-9) for x in [*advantages[row], *returns[row]])


@pytest.fixture
def overflowing(tmp_path):
    """Rows 1 (values near the float32 maximum) and 3 (terminal reward 1e308) overflow;
    row 4 (values 1e37, bounded by 3e38 < float32 max) does not."""
    rollouts = random_rollouts(6, seed=17, max_length=8)
    rollouts.masks[1] = [1, 1]
    rollouts.values[1], rollouts.rewards[1] = [3e38, -3e38], [0.0, 0.0]
    rollouts.terminal[3] = 1e308
    rollouts.masks[4] = [1, 1, 1, 1]
    rollouts.values[4], rollouts.rewards[4] = [2.5e37, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
    return write_table(rollout_table(rollouts), tmp_path / "big.parquet")


def test_validate_flags_rows_that_overflow(overflowing):
    result = gae("validate", overflowing, "--json", "-", "--quiet")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert [(f["row"], f["column"], f["code"]) for f in document["findings"] if f["severity"] == "error"] == [
        (1, "values", "overflow"),
        (3, "terminal_reward", "overflow"),
    ]


def test_recompute_stops_on_overflow_and_skips_it_to_the_rejects(tmp_path, overflowing):
    output = tmp_path / "o.parquet"
    result = gae("recompute", overflowing, "-o", output, "--gamma", 1, "--lambd", 1, "--quiet")
    assert result.exit_code == 1
    message = _one_line_error(result)
    assert message.startswith(f"error: {overflowing}, row 1, column 'values': ") and message.endswith("[overflow]")
    assert not output.exists()
    result = gae(
        "recompute",
        overflowing,
        "-o",
        output,
        "--gamma",
        1,
        "--lambd",
        1,
        "--quiet",
        "--on-invalid",
        "skip",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    rejects = pq.read_table(tmp_path / "o.rejected.parquet")
    assert [reason.split(":")[0] for reason in rejects.column("reason").to_pylist()] == ["values", "terminal_reward"]
    assert all(reason.endswith("[overflow]") for reason in rejects.column("reason").to_pylist())
    written = pq.read_table(output)
    assert written.num_rows == 4
    for name in ("advantages", "returns"):
        assert np.isfinite(written.column(name).combine_chunks().flatten().to_numpy()).all()


def test_diff_stops_on_overflow(overflowing):
    result = gae("diff", overflowing, "--gamma", 1, "--lambd", 1, "--json", "-", "--quiet")
    assert result.exit_code == 1
    assert "row 1, column 'values'" in _one_line_error(result)
    error = json.loads(result.stdout)["error"]  # --json -: the error document, not nothing
    assert error["exit_code"] == 1 and error["row"] == 1 and error["column"] == "values" and error["code"] == "overflow"


@pytest.fixture
def kl_overflowing(tmp_path):
    """Inputs that pass every input rule, but ``--kl-coef 1e37`` on row 2's log-prob gap of
    100 gives KL rewards of −1e39: beyond float32, found in the computed outputs."""
    rollouts = random_rollouts(6, seed=18, max_length=8)
    rollouts.masks[2] = [1, 0, 1]
    rollouts.values[2], rollouts.rewards[2] = [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]
    gaps = [[0.0] * len(mask) for mask in rollouts.masks]
    gaps[2] = [100.0, 100.0, 100.0]
    table = rollout_table(rollouts)
    logprobs = pa.array([[-1.0 + g for g in row] for row in gaps], pa.list_(pa.float32()))
    table = table.append_column("log_probs", logprobs)
    table = table.append_column("ref_log_probs", pa.array([[-1.0] * len(row) for row in gaps], pa.list_(pa.float32())))
    return write_table(table, tmp_path / "kl.parquet")


def test_computed_overflow_is_invalid_data(tmp_path, kl_overflowing):
    options = ("--gamma", 1, "--lambd", 1, "--kl-coef", 1e37, "--quiet")
    assert gae("validate", kl_overflowing, "--quiet").exit_code == 0  # the inputs themselves are fine
    result = gae("recompute", kl_overflowing, "-o", tmp_path / "o.parquet", *options)
    assert result.exit_code == 1
    assert _one_line_error(result) == (
        f"error: {kl_overflowing}, row 2, column 'advantages': 'advantages' overflowed to -inf at token 0 [overflow]"
    )
    assert not (tmp_path / "o.parquet").exists()
    result = gae("recompute", kl_overflowing, "-o", tmp_path / "o.parquet", *options, "--on-invalid", "skip")
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "o.rejected.parquet").column("reason").to_pylist() == [
        "advantages: 'advantages' overflowed to -inf at token 0 [overflow]"
    ]
    written = pq.read_table(tmp_path / "o.parquet")
    assert written.num_rows == 5
    assert np.isfinite(written.column("advantages").combine_chunks().flatten().to_numpy()).all()
    assert gae("diff", kl_overflowing, *options).exit_code == 1


# ----------------------------------------------------------------------------- 8: JSON never crashes


def test_json_text_writes_non_finite_numbers_as_strings():
    from gaecli.report import json_text

    text = json_text({"a": [math.nan, math.inf, -math.inf, 1.5, None], "b": (np.float64("inf"),)})
    assert json.loads(text) == {"a": ["nan", "inf", "-inf", 1.5, None], "b": ["inf"]}


def test_diff_json_with_statistics_that_overflow(tmp_path):
    """float64 values of 1e300 pass every rule (the results stay finite), but variances of
    such advantages do not: the JSON document holds "nan" where JSON has no number."""
    rollouts = random_rollouts(6, seed=19, max_length=10)
    rollouts.values = [[value * 1e300 for value in row] for row in rollouts.values]
    source = write_table(rollout_table(rollouts, float_type=pa.float64()), tmp_path / "huge.parquet")
    report = tmp_path / "report.json"
    result = gae("diff", source, "--gamma", 1, "--lambd", 1, "--json", report, "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads(report.read_text())["summary"]
    assert summary["new_advantage_std"] == "nan"
    result = gae(
        "recompute", source, "-o", tmp_path / "o.parquet", "--gamma", 1, "--lambd", 1, "--json", "-", "--quiet"
    )
    assert result.exit_code == 0 and json.loads(result.stdout)["rows"] == 6


# ----------------------------------------------------------------------------- 13: --skip-existing


@pytest.fixture
def resumable(tmp_path):
    rollouts = random_rollouts(6, seed=20)
    table = rollout_table(rollouts)
    logprobs = pa.array([[-0.5] * len(mask) for mask in rollouts.masks], pa.list_(pa.float32()))
    table = table.append_column("log_probs", logprobs).append_column("ref_log_probs", logprobs)
    return write_table(table, tmp_path / "in" / "a.parquet")


@pytest.mark.parametrize(
    ("first", "then", "named"),
    [
        ((), ("--keep-baseline",), "keep_baseline false, not true"),
        (("--keep-baseline",), (), "keep_baseline true, not false"),
        ((), ("--kl-coef", 0.1), "columns.kl_coef null, not 0.1"),
        (("--kl-coef", 0.1), ("--kl-coef", 0.1, "--kl-estimator", "k3"), 'columns.kl_estimator "k1", not "k3"'),
        ((), ("--advantages-col", "adv"), 'columns.advantages "advantages", not "adv"'),
        ((), ("--values-col", "none"), 'columns.values "values", not null'),
        ((), ("--kernel", "chunked"), "kernel native, not chunked"),
    ],
)
def test_skip_existing_refuses_another_computation(tmp_path, resumable, first, then, named):
    output = tmp_path / "out"
    base = (
        "recompute",
        resumable.parent,
        "-o",
        output,
        "--gamma",
        0.9,
        "--lambd",
        0.8,
        "--quiet",
        "--kernel",
        "native",
    )
    assert gae(*base, *first).exit_code == 0
    result = gae(*base, *then, "--skip-existing")
    assert result.exit_code == 2
    assert _one_line_error(result) == (
        f"error: {output / 'a.parquet'} exists but was written with {named}; give --overwrite to replace it"
    )
    same = gae(*base, *first, "--skip-existing", "--json", "-")
    assert same.exit_code == 0 and json.loads(same.stdout)["files"][0]["skipped"] is True


def test_outputs_record_the_whole_computation(tmp_path, resumable):
    """The library's ``baseline`` (no CLI option) is recorded and, with ``keep_baseline``,
    compared too."""
    from gaecli.recompute import RecomputeOptions, recompute_files

    output = tmp_path / "o.parquet"
    options = RecomputeOptions(
        gamma=1.0, lambd=1.0, kernel="native", keep_baseline=True, baseline="skip-masked", on_invalid="skip"
    )
    recompute_files([resumable], output, options)
    metadata = pq.read_schema(output).metadata
    assert (metadata[b"gaecli.keep_baseline"], metadata[b"gaecli.baseline"], metadata[b"gaecli.on_invalid"]) == (
        b"true",
        b"skip-masked",
        b"skip",
    )
    assert "advantages_skip_masked" in pq.read_schema(output).names
    with pytest.raises(GAEUsageError, match="written with baseline skip-masked, not zero-masked; give --overwrite"):
        recompute_files([resumable], output, replace_options(options, baseline="zero-masked", skip_existing=True))
    report = recompute_files([resumable], output, replace_options(options, on_invalid="stop", skip_existing=True))
    assert [f.skipped for f in report.files] == [True]  # on_invalid is recorded, not compared
    assert files_under(tmp_path) == ["in/a.parquet", "o.parquet"]


def test_screen_rows_flags_and_tails_match_a_loop():
    """The trainers' check pass: per row the error flags (a mask value neither 0 nor 1, a NaN
    or ±Inf value or reward) and the tail (last trainable token, last nonzero reward from it on,
    the rewards after it), against a plain loop; empty and fully masked rows included."""
    from gaecli.advantages.faults import screen_rows

    rng = np.random.default_rng(5)
    lengths = np.array([6, 0, 5, 9, 4, 7])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    mask = (rng.random(total) < 0.6).astype(np.float32)
    mask[offsets[2] : offsets[3]] = 0  # row 2 fully masked
    mask[offsets[4] + 1] = 0.5  # row 4: a bad mask value
    values = rng.normal(size=total).astype(np.float32)
    rewards = np.where(rng.random(total) < 0.4, rng.normal(size=total), 0.0).astype(np.float32)
    values[offsets[3] + 2] = np.inf  # row 3
    rewards[offsets[5] + 6] = np.nan  # row 5
    found = screen_rows(mask, values, rewards, offsets)
    for row in range(lengths.size):
        start, end = offsets[row], offsets[row + 1]
        span = range(start, end)
        assert found[0][row] == any(mask[t] not in (0.0, 1.0) for t in span)
        assert found[1][row] == any(not math.isfinite(values[t]) for t in span)
        assert found[2][row] == any(not math.isfinite(rewards[t]) for t in span)
        last = max((t for t in span if mask[t] != 0), default=-1)
        after = range(max(last + 1, start), end)
        assert found[3][row] == last
        from_last = range(max(last, start), end)  # the last trainable token's own reward counts
        assert found[4][row] == max((t for t in from_last if rewards[t] != 0), default=-1)
        tail = np.float32(0)
        for t in reversed(after):
            tail = np.float32(tail + rewards[t])
        assert found[5][row] == tail or (math.isnan(found[5][row]) and math.isnan(tail))
