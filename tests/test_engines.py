"""The engines: local with one and two worker processes and Ray (a local 2-CPU instance
started once for the test session: ``local_ray`` in conftest.py) give bitwise-equal
advantages and returns for any batch size, with and without normalization; a bad file
among good ones; resuming with --skip-existing; a worker that dies; the missing Ray
extra."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaecli.engines import AUTO_BYTES_PER_WORKER, EngineOptions, EngineSession, TaskFailure, map_units
from gaecli.errors import GAEInputError

from rollout_files import (
    assert_rows_close,
    files_under,
    gae,
    random_rollouts,
    reference_outputs,
    rollout_table,
    rollouts_from_table,
    sha256,
    whiten_numpy,
    write_table,
)

GAMMA, LAMBD = 0.99, 0.95
OUTPUT_COLUMNS = ("advantages", "returns", "advantages_unmasked", "returns_unmasked")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three files of odd sizes in nested directories, with a group column."""
    root = tmp_path_factory.mktemp("engines") / "in"
    for index, (rows, name) in enumerate(((23, "a.parquet"), (31, "day1/b.parquet"), (17, "day2/c.parquet"))):
        data = random_rollouts(rows, seed=40 + index)
        groups = pa.array([f"step{(index + row) % 3}" for row in range(rows)])
        write_table(rollout_table(data, extra={"rollout_id": groups}), root / name)
    return root


def recompute(inputs, output, *options):
    return gae(
        "recompute", inputs, "-o", output, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--keep-baseline", *options
    )


def output_bits(out_dir) -> dict:
    """Every output column's flat values as raw bytes (bitwise comparison), per file."""
    found = {}
    for name in files_under(out_dir):
        table = pq.read_table(out_dir / name)
        found[name] = {
            column: table.column(column).combine_chunks().flatten().to_numpy().tobytes() for column in OUTPUT_COLUMNS
        }
        found[name]["rows"] = table.drop_columns(list(OUTPUT_COLUMNS)).to_pylist()
    return found


ENGINES = [("local", 1, 7), ("local", 2, 3), ("ray", 2, 5)]


def grid_options(engine: str, workers: int, batch_rows: int) -> tuple:
    """The options of one run of an engine grid (``ENGINES``, ``DIFF_ENGINES``)."""
    return ("--engine", engine, "--workers", workers, "--batch-rows", batch_rows)


@pytest.mark.parametrize(
    "normalize", [(), ("--normalize",), ("--normalize-by", "rollout_id")], ids=["plain", "normalize", "normalize-by"]
)
def test_engines_give_bitwise_equal_outputs(tmp_path, inputs, local_ray, normalize):
    results = {}
    for engine, workers, batch_rows in ENGINES:
        if engine == "ray" and local_ray is None:
            continue
        out_dir = tmp_path / f"{engine}{workers}"
        result = recompute(inputs, out_dir, *grid_options(engine, workers, batch_rows), "--json", "-", *normalize)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        results[engine, workers] = output_bits(out_dir), report["summary"], [f["rows"] for f in report["files"]]
    first = results["local", 1]
    assert sorted(first[0]) == ["a.parquet", "day1/b.parquet", "day2/c.parquet"]
    for key, other in results.items():
        assert other[0] == first[0], f"{key}: outputs differ from one worker's"
        assert other[1] == first[1], f"{key}: summary differs"
        assert other[2] == first[2]
    if not normalize:  # and the numbers are right, not only equal
        table = pq.read_table(tmp_path / "local2" / "day1" / "b.parquet")
        expected, _ = reference_outputs(rollouts_from_table(table), GAMMA, LAMBD)
        assert_rows_close("advantages", expected, table.column("advantages").to_pylist(), 2e-5)


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_bad_files_among_good_ones(tmp_path, inputs, local_ray, engine):
    if engine == "ray" and local_ray is None:
        pytest.skip("ray is not installed")
    source = tmp_path / "in"
    for name in files_under(inputs):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((inputs / name).read_bytes())
    (source / "day1" / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    out_dir = tmp_path / "out"
    result = recompute(source, out_dir, "--engine", engine, "--workers", 2, "--on-invalid", "skip")
    assert result.exit_code == 2, result.output
    assert str(source / "day1" / "b.parquet") in result.stderr and "cannot read as Parquet" in result.stderr
    assert f"not written: {out_dir / 'day1' / 'b.parquet'}" in result.stderr
    assert files_under(out_dir) == ["a.parquet", "day2/c.parquet"]  # whole, and nothing else (no temp file)
    reference = tmp_path / "reference"
    assert recompute(inputs / "a.parquet", reference / "a.parquet").exit_code == 0
    assert output_bits(out_dir)["a.parquet"] == output_bits(reference)["a.parquet"]


def test_skip_existing_resumes_a_run(tmp_path, inputs):
    out_dir = tmp_path / "out"
    assert recompute(inputs, out_dir, "--workers", 2, "--normalize").exit_code == 0
    before = output_bits(out_dir)
    hashes = {name: sha256(out_dir / name) for name in files_under(out_dir)}
    (out_dir / "day1" / "b.parquet").unlink()
    result = recompute(inputs, out_dir, "--workers", 2, "--normalize", "--skip-existing", "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(f["output"].removeprefix(str(out_dir) + "/"), f["skipped"]) for f in report["files"]] == [
        ("a.parquet", True),
        ("day1/b.parquet", False),
        ("day2/c.parquet", True),
    ]
    assert output_bits(out_dir) == before  # the normalize statistics still cover every input
    assert sha256(out_dir / "a.parquet") == hashes["a.parquet"]
    again = recompute(inputs, out_dir, "--skip-existing", "--overwrite")
    assert again.exit_code == 2 and "--skip-existing" in again.stderr
    other = recompute(inputs, out_dir, "--skip-existing")  # written with --normalize: refused, not mixed
    assert other.exit_code == 2 and "normalize" in other.stderr


def test_stop_cancels_files_not_started(tmp_path):
    source = tmp_path / "in"
    bad = random_rollouts(8, seed=1)
    bad.masks[2] = [2] * len(bad.masks[2])
    write_table(rollout_table(bad), source / "a.parquet")
    for index in range(1, 4):
        write_table(rollout_table(random_rollouts(8, seed=index + 1)), source / f"b{index}.parquet")
    result = recompute(source, tmp_path / "out", "--workers", 1)
    assert result.exit_code == 1
    assert "not started" in result.stderr and str(source / "a.parquet") in result.stderr
    assert files_under(tmp_path / "out") == []


def _die_on_two(value: int, progress=None):
    if value == 2:
        os._exit(3)
    return TaskFailure(0, "") if value < 0 else _Done(value)


class _Done:
    def __init__(self, value: int) -> None:
        self.value, self.rows, self.tokens = value, value, 0


def test_a_worker_that_dies_is_reported_with_its_file():
    results = map_units(_die_on_two, [(1,), (2,)], ["one.parquet", "two.parquet"], EngineOptions("local", 2))
    failures = [result for result in results if isinstance(result, TaskFailure)]
    assert failures and any("two.parquet" in failure.message and "died" in failure.message for failure in failures)


WAIT_SECONDS = 120.0  # bound on every wait for another worker's event


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _slow_or_die(value: int, started: str, progress=None):
    """Unit 1 starts and runs on (until its worker is stopped); unit 2 dies once unit 1 is
    running beside it (events, not durations: a busy machine starts workers late)."""
    if value == 1:
        open(started, "w").close()
        time.sleep(WAIT_SECONDS)
    if value == 2:
        _wait_for(started)
        os._exit(3)
    return _Done(value)


def test_the_dead_workers_file_is_told_from_the_ones_beside_it(tmp_path):
    labels = ["one.parquet", "two.parquet", "three.parquet"]
    started = str(tmp_path / "one-started")
    tasks = [(1, started), (2, started), (3, started)]
    results = map_units(_slow_or_die, tasks, labels, EngineOptions("local", 2))
    assert all(isinstance(result, TaskFailure) and result.code == 2 for result in results)
    assert [result.message for result in results] == [
        "one.parquet: stopped when the worker process running two.parquet died; nothing was written for it",
        "two.parquet: the worker process running this file died (killed, out of memory or crashed); nothing was "
        "written for it",
        "three.parquet: not started: the worker process running two.parquet died; nothing was written for it",
    ]


def _in_steps(steps: int, progress=None):
    """A unit that reports ``steps`` batches of 3 rows and 5 tokens; negative: reports
    ``-steps`` batches, then fails."""
    for _ in range(abs(steps)):
        progress.advance(3, 5)
    if steps < 0:
        raise GAEInputError("bad.parquet: row 0: failed")
    return _Done(3 * steps)


class _Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def start(self, phase: str, total_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        self.calls.append((rows, tokens))

    def finish(self) -> None:
        pass


@pytest.mark.parametrize("engine, workers", [("local", 1), ("local", 2), ("ray", 2)])
def test_progress_moves_batch_by_batch_in_workers(engine, workers, local_ray):
    # Each batch a unit reports reaches the parent's progress (not one jump per file),
    # also from a unit that fails afterwards.
    if engine == "ray":
        if local_ray is None:
            pytest.skip("ray is not installed")
        # Ray's workers cannot import this test module: send its functions by value
        local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    progress = _Recording()
    try:
        results = map_units(
            _in_steps, [(4,), (-2,), (7,)], ["a", "bad", "c"], EngineOptions(engine, workers), progress=progress
        )
    finally:
        if engine == "ray":
            local_ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert [type(result).__name__ for result in results] == ["_Done", "TaskFailure", "_Done"]
    assert progress.calls == [(3, 5)] * 13


class _FailingProgress(_Recording):
    def advance(self, rows: int, tokens: int) -> None:
        super().advance(rows, tokens)
        if len(self.calls) == 3:
            raise RuntimeError("the progress display broke")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_progress_fails_the_run_as_in_process(workers):
    # Raised in the parent as it would be in this process; the workers are not left stalled.
    with pytest.raises(RuntimeError, match="the progress display broke"):
        map_units(
            _in_steps, [(4,), (5,), (7,)], ["a", "b", "c"], EngineOptions("local", workers), progress=_FailingProgress()
        )


def _pid(value: int, barrier: str, progress=None):
    """This worker's pid, once two workers have run a unit of this map (so that the pool's
    both workers serve it, however late the second one starts)."""
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + WAIT_SECONDS
    while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return _Done(os.getpid())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_session_keeps_one_pool_for_its_passes(tmp_path):
    labels, engine = ["f"] * 4, EngineOptions("local", 2)
    passes = iter(range(100))

    def tasks() -> list[tuple]:
        barrier = tmp_path / f"pass-{next(passes)}"
        barrier.mkdir()
        return [(index, str(barrier)) for index in range(4)]

    with EngineSession() as session:
        first = {result.value for result in map_units(_pid, tasks(), labels, engine, session=session)}
        second = {result.value for result in map_units(_pid, tasks(), labels, engine, session=session)}
        assert len(first) == 2 and os.getpid() not in first
        assert second <= first  # the same workers served both passes
        assert all(_alive(pid) for pid in first)
        # a pool a dead worker broke is not used again: the next pass gets a fresh one
        broken = map_units(_die_on_two, [(1,), (2,)], ["one.parquet", "two.parquet"], engine, session=session)
        assert any(isinstance(result, TaskFailure) for result in broken)
        third = {result.value for result in map_units(_pid, tasks(), labels, engine, session=session)}
        assert third and not third & first
    assert not any(_alive(pid) for pid in first | third)  # the session closed its pools
    outside = [{result.value for result in map_units(_pid, tasks(), labels, engine)} for _ in range(2)]
    assert not outside[0] & outside[1]  # without a session each map starts its own workers


def test_default_worker_count_follows_cores_and_input_size(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    per_worker = AUTO_BYTES_PER_WORKER
    local = EngineOptions("local")
    assert local.worker_count() == 8
    assert [local.for_inputs(size).workers for size in (0, per_worker - 1, 3 * per_worker, 100 * per_worker)] == [
        1,
        1,
        3,
        8,
    ]
    assert EngineOptions("local", 5).for_inputs(0).workers == 5  # --workers is taken as given
    assert EngineOptions("ray").for_inputs(0).worker_count() == 8  # Ray's CPUs: the cores


def test_library_calls_stay_in_this_process_unless_given_an_engine(tmp_path, inputs, monkeypatch):
    # A worker pool re-imports the calling script (spawn): the library starts none by itself.
    import gaecli.engines
    import gaecli.engines.local
    from gaecli.diff import DiffOptions, diff_files
    from gaecli.recompute import RecomputeOptions, recompute_files
    from gaecli.validate import validate_files

    def no_pool(*args, **kwargs):
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(gaecli.engines, "AUTO_BYTES_PER_WORKER", 1)  # the CLI would start workers now
    monkeypatch.setattr(gaecli.engines.local, "map_units_local", no_pool)
    with pytest.raises(AssertionError, match="worker pool"):  # the patch is in effect for the CLI
        recompute(inputs, tmp_path / "cli")
    report = recompute_files([inputs], tmp_path / "out", RecomputeOptions(gamma=GAMMA, lambd=LAMBD))
    assert len(report.files) == 3
    assert validate_files([inputs]).files and diff_files([inputs], DiffOptions(gamma=GAMMA, lambd=LAMBD)).files


def test_validate_with_workers_matches_one(tmp_path, inputs):
    source = tmp_path / "in"
    for index in range(3):
        data = random_rollouts(12, seed=60 + index)
        data.masks[index + 1] = [2] * len(data.masks[index + 1])
        write_table(rollout_table(data), source / f"f{index}.parquet")
    reports = []
    for workers in (1, 2):
        result = gae("validate", source, "--workers", workers, "--max-findings", 2, "--json", "-", "--quiet")
        assert result.exit_code == 1
        reports.append(json.loads(result.stdout))
    listed = Counter(finding["code"] for finding in reports[0]["findings"])
    assert reports[0] == reports[1] and reports[0]["truncated"]
    assert listed == {code: min(count, 2) for code, count in reports[0]["counts"].items() if count}  # 2 of each rule


CURVE = ("--gamma", GAMMA, "--lambd", LAMBD)


def ray_recompute_process(inputs, out, *options) -> subprocess.CompletedProcess:
    """``gae recompute INPUTS -o OUT --engine ray OPTIONS`` in a fresh interpreter (text
    output captured, 300 s at most): the command starts or joins Ray itself."""
    command = ["recompute", inputs, "-o", out, "--engine", "ray", *options]
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, command)], capture_output=True, text=True, timeout=300
    )


def test_ray_started_by_the_command_is_quiet_and_gives_the_same_bits(tmp_path, inputs):
    # A fresh process: the command starts Ray itself (kept up for the statistics pass and
    # the work, then shut down), and --quiet keeps Ray's own log lines off stderr too.
    pytest.importorskip("ray")
    out = tmp_path / "out"
    done = ray_recompute_process(inputs, out, *CURVE, "--keep-baseline", "--normalize", "--workers", 2, "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == ""
    reference = tmp_path / "reference"
    assert recompute(inputs, reference, "--workers", 1, "--normalize").exit_code == 0
    assert output_bits(out) == output_bits(reference)


def test_ray_address_joins_a_running_ray(tmp_path, inputs, local_ray):
    # Another process joins the session's Ray by its address, as a user joins a cluster.
    if local_ray is None:
        pytest.skip("ray is not installed")
    address = local_ray.get_runtime_context().gcs_address
    out = tmp_path / "out"
    done = ray_recompute_process(inputs, out, *CURVE, "--keep-baseline", "--ray-address", address, "--quiet")
    assert done.returncode == 0, done.stderr
    reference = tmp_path / "reference"
    assert recompute(inputs, reference, "--workers", 1).exit_code == 0
    assert output_bits(out) == output_bits(reference)
    assert local_ray.is_initialized()  # the joining command left the cluster up


def test_an_unreachable_ray_address_is_refused_at_once(tmp_path, inputs):
    pytest.importorskip("ray")
    # in a fresh process: this one may hold a Ray already, which the command would reuse
    with socket.socket() as listener:  # a port nothing listens on: bound, never listening
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        done = ray_recompute_process(
            inputs, tmp_path / "out", "--gamma", 1, "--lambd", 1, "--ray-address", f"127.0.0.1:{port}"
        )
    assert done.returncode == 2
    assert (
        done.stderr == f"error: cannot join Ray at 127.0.0.1:{port}: nothing answers there (Connection refused); "
        f"start the cluster or check --ray-address\n"
    )
    assert not (tmp_path / "out").exists()


def test_ray_engine_without_ray_says_how_to_install(tmp_path, inputs, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = recompute(inputs, tmp_path / "out", "--engine", "ray")
    assert result.exit_code == 2 and "pip install 'gaecli[ray]'" in result.stderr
    assert files_under(tmp_path / "out") == []
    result = gae("validate", inputs, "--engine", "ray", "--quiet")
    assert result.exit_code == 2 and "pip install 'gaecli[ray]'" in result.stderr


def test_engine_usage_errors(tmp_path, inputs):
    result = recompute(inputs, tmp_path / "out", "--ray-address", "auto")
    assert result.exit_code == 2 and "--engine ray" in result.stderr
    result = recompute(inputs, tmp_path / "out", "--workers", 0)
    assert result.exit_code == 2


# ----------------------------------------------------------------------------- gae diff


DIFF_ENGINES = [("local", 1, 7), ("local", 2, 3), ("ray", 2, 5)]


@pytest.mark.parametrize(
    "options", [(), ("--normalize",), ("--normalize-by", "rollout_id")], ids=["plain", "normalize", "normalize-by"]
)
def test_diff_engines_give_identical_reports(tmp_path, inputs, local_ray, monkeypatch, options):
    results = {}
    for engine, workers, batch_rows in DIFF_ENGINES:
        if engine == "ray" and local_ray is None:
            continue
        run_dir = tmp_path / f"{engine}{workers}"
        run_dir.mkdir()
        monkeypatch.chdir(run_dir)  # the report names the per-sample file as given: the same relative path
        result = gae(
            "diff",
            inputs,
            "--gamma",
            GAMMA,
            "--lambd",
            LAMBD,
            "--group-by",
            "rollout_id",
            "--id-col",
            "rollout_id",
            "--top",
            7,
            *grid_options(engine, workers, batch_rows),
            "--quiet",
            "--json",
            "r.json",
            "--markdown",
            "r.md",
            "--per-sample",
            "rows.parquet",
            "--groups-out",
            "groups.parquet",
            *options,
        )
        assert result.exit_code == 0, result.output
        results[engine, workers] = (
            json.loads((run_dir / "r.json").read_text()),
            (run_dir / "r.md").read_text(),
            pq.read_table(run_dir / "rows.parquet"),
            pq.read_table(run_dir / "groups.parquet"),
        )
    document, markdown, rows, groups = results["local", 1]
    assert len(document["files"]) == 3 and len(document["top_samples"]) == 7 and len(document["groups"]) == 3
    assert rows.num_rows == 23 + 31 + 17 and groups.num_rows == 3
    for key, (other_document, other_markdown, other_rows, other_groups) in results.items():
        assert other_document == document, f"{key}: JSON differs from one worker's"
        assert other_markdown == markdown, f"{key}: Markdown differs"
        assert other_rows.equals(rows), f"{key}: per-sample rows differ"
        assert other_groups.equals(groups), f"{key}: groups file differs"


def test_diff_engines_keep_the_same_token_sample_and_top_arrays(inputs, local_ray):
    from gaecli.diff import DiffOptions, diff_files

    options = DiffOptions(gamma=GAMMA, lambd=LAMBD, normalize=True, top=4, batch_rows=5, scatter_sample=50)
    reports = [
        diff_files([inputs], options, engine=EngineOptions(engine, workers))
        for engine, workers, _ in DIFF_ENGINES
        if engine != "ray" or local_ray is not None
    ]
    first = reports[0]
    assert first.scatter[0].size == 50
    for report in reports[1:]:
        for mine, theirs in zip(first.scatter, report.scatter):
            assert mine.tobytes() == theirs.tobytes()
        assert [(e.file, e.row, e.new.tobytes(), e.old.tobytes(), e.trainable.tobytes()) for e in report.top] == [
            (e.file, e.row, e.new.tobytes(), e.old.tobytes(), e.trainable.tobytes()) for e in first.top
        ]
        assert (report.histogram.counts == first.histogram.counts).all()


def test_diff_bad_file_among_good_ones_names_it(tmp_path, inputs):
    source = tmp_path / "in"
    for name in files_under(inputs):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((inputs / name).read_bytes())
    bad = random_rollouts(8, seed=1)
    bad.masks[2] = [2] * len(bad.masks[2])
    write_table(rollout_table(bad, extra={"rollout_id": pa.array(["x"] * 8)}), source / "day1" / "z.parquet")
    result = gae(
        "diff",
        source,
        "--gamma",
        GAMMA,
        "--lambd",
        LAMBD,
        "--workers",
        2,
        "--per-sample",
        tmp_path / "rows.parquet",
        "--quiet",
    )
    assert result.exit_code == 1, result.output
    assert "z.parquet" in result.stderr
    assert not (tmp_path / "rows.parquet").exists() and list(tmp_path.glob(".rows.parquet*")) == []


def test_normalize_by_many_groups_is_bitwise_equal_for_any_batch_size_and_worker_count(tmp_path):
    """Integer keys spread over three files (groups span files): the statistics are the
    same bits for batches of 1, 7 and 256 rows and one or two workers, and each output is
    whitened per group as an independent float64 loop over the groups has it."""
    root, tables = tmp_path / "in", []
    for index, rows in enumerate((45, 38, 29)):
        data = random_rollouts(rows, seed=70 + index)
        keys = pa.array([(row * 7 + 13 * index) % 12 for row in range(rows)], pa.int64())
        tables.append(rollout_table(data, float_type=pa.float64(), extra={"prompt_uid": keys}))
        write_table(tables[-1], root / f"part{index}.parquet")
    runs = {}
    for batch_rows, workers in ((1, 1), (7, 2), (256, 1), (256, 2)):
        out_dir = tmp_path / f"out{batch_rows}-{workers}"
        result = recompute(
            root, out_dir, "--normalize-by", "prompt_uid", "--batch-rows", batch_rows, "--workers", workers
        )
        assert result.exit_code == 0, result.output
        runs[batch_rows, workers] = output_bits(out_dir)
    first = runs[1, 1]
    for key, bits in runs.items():
        assert bits == first, f"batch rows, workers {key}: outputs differ from batches of one row"
    data = [rollouts_from_table(table) for table in tables]
    advantages = [reference_outputs(d, GAMMA, LAMBD)[0] for d in data]
    keys = [table.column("prompt_uid").to_pylist() for table in tables]
    expected = [[None] * len(d) for d in data]
    for group in range(12):
        members = [(f, r) for f in range(3) for r in range(len(data[f])) if keys[f][r] == group]
        for (f, r), whitened in zip(
            members, whiten_numpy([advantages[f][r] for f, r in members], [data[f].masks[r] for f, r in members])
        ):
            expected[f][r] = whitened
    for index in range(3):
        table = pq.read_table(tmp_path / "out1-1" / f"part{index}.parquet")
        assert_rows_close(
            "advantages whitened per prompt_uid", expected[index], table.column("advantages").to_pylist(), 1e-9
        )


def test_each_file_unit_gets_the_statistics_of_its_own_groups(tmp_path):
    """engine_file_moments: per file, the merged statistics of the groups its rows hold,
    only those, equal to the merged statistics of those groups."""
    from gaecli.io.format import Columns
    from gaecli.progress import NoProgress
    from gaecli.recompute import RecomputeOptions
    from gaecli.run import Run, read_footers
    from gaecli.run.passes import engine_file_moments, engine_moments

    paths = []
    for index, groups in enumerate((("a", "b"), ("b", "c", "d"), ("d",))):
        data = random_rollouts(12, seed=90 + index)
        keys = pa.array([groups[row % len(groups)] for row in range(12)])
        paths.append(str(write_table(rollout_table(data, extra={"prompt": keys}), tmp_path / f"f{index}.parquet")))
    computation = RecomputeOptions(
        gamma=GAMMA, lambd=LAMBD, kernel="native", batch_rows=5, columns=Columns(), normalize_by="prompt"
    ).computation
    run = Run("recompute", paths, read_footers(paths), computation, EngineOptions(workers=1), NoProgress())
    merged_new, _ = engine_moments(run)
    assert merged_new.table.keys().to_pylist() == ["a", "b", "c", "d"]
    per_file = engine_file_moments(run)
    all_means, all_variances = merged_new.mean_variance()
    for (new, old), groups in zip(per_file, (("a", "b"), ("b", "c", "d"), ("d",))):
        assert new.table.keys().to_pylist() == list(groups) == old.table.keys().to_pylist()
        means, variances = new.mean_variance()
        where = [["a", "b", "c", "d"].index(group) for group in groups]
        assert means.tobytes() == all_means[where].tobytes() and variances.tobytes() == all_variances[where].tobytes()
