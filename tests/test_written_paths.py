"""Every path a run writes goes through the one check, round two (docs/reliability.md,
"Paths"): the side files of ``gae diff`` are data files refused when they exist; a report
named like any input format is refused; a stream (a device, FIFO or open descriptor, also
behind a user's symlink to ``/proc/self/fd/N``) is written into by every writer and never
renamed over; the final rename never replaces a file that appeared while the run wrote;
the columns a run writes are distinct; and every option of every command that names a path
to write is enumerated and proven checked."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from skyrl_dumps import dump_name, skyrl_batch, write_batch
from test_import import rollout_data, write_dump
from test_import_nemo_rl import batch as nemo_batch
from test_import_nemo_rl import write_step
from test_import_slime import slime_samples, write_slime

import gaecli.io.targets
from gaecli.cli.common import WRITE_PATH_OPTIONS
from gaecli.errors import GAEUsageError, InvalidOptionError
from gaecli.io.format import Columns
from gaecli.io.paths import DATA_SUFFIXES, INPUT_PATTERNS
from gaecli.io.targets import descriptor_behind, place, writes_through
from gaecli.io.writer import AtomicParquetWriter
from gaecli.recompute import RecomputeOptions

from rollout_files import files_under, gae, random_rollouts, rollout_table, sha256, write_table

GAMMA, LAMBD = 0.9, 0.8
ROOT = Path(__file__).resolve().parents[1]


def rollout(path: Path, rows: int = 8, seed: int = 1) -> Path:
    """A rollout file with an ``id`` column (one group per two rows)."""
    table = rollout_table(random_rollouts(rows, seed=seed), extra={"id": pa.array([i // 2 for i in range(rows)])})
    return write_table(table, path)


def one_line(stderr: str) -> bool:
    return len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def diff(*args):
    return gae("diff", *args, "--gamma", 1, "--lambd", 1, "--quiet", "--workers", 1)


# ----------------------------------------------------------------------------- 1, 2. diff's side files


@pytest.mark.parametrize("option, extra", [("--per-sample", ()), ("--groups-out", ("--group-by", "id"))])
def test_diff_side_files_onto_a_globbed_rollout_are_refused(tmp_path, option, extra):
    """``cd d; gae diff --per-sample *.parquet``: the shell makes ``a.parquet`` the side
    file's path and ``b.parquet`` the input; ``a.parquet`` is a rollout file, kept."""
    first, second = rollout(tmp_path / "a.parquet"), rollout(tmp_path / "b.parquet", seed=2)
    before = sha256(first)
    result = diff(*extra, option, first, second)
    assert result.exit_code == 2, result.output
    assert f"{first} exists; give --overwrite to replace it" in result.stderr and one_line(result.stderr)
    assert sha256(first) == before and files_under(tmp_path) == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize("option, extra", [("--per-sample", ()), ("--groups-out", ("--group-by", "id"))])
def test_diff_overwrite_replaces_an_existing_side_file(tmp_path, option, extra):
    source = rollout(tmp_path / "in.parquet")
    target = tmp_path / "old.parquet"
    target.write_bytes(b"an older side file")
    result = diff(source, *extra, option, target, "--overwrite")
    assert result.exit_code == 0, result.output
    written = pq.read_table(target)
    assert written.num_rows == (8 if option == "--per-sample" else 4) and "comparison" in written.column_names


# ----------------------------------------------------------------------------- 3. reports named like inputs


def test_importer_json_onto_a_globbed_dump_is_refused(tmp_path):
    """``gae import nemo-rl -o out.parquet --json d/*.jsonl``: the first dump becomes the
    JSON path; it is named like an input and kept."""
    dumps = [write_step(tmp_path / "d", step, nemo_batch(step, 4)) for step in (1, 2, 3)]
    before = sha256(dumps[0])
    result = gae("import", "nemo-rl", "-o", tmp_path / "out.parquet", "--json", *dumps, "--quiet")
    assert result.exit_code == 2, result.output
    assert str(dumps[0]) in result.stderr and "named like" in result.stderr and one_line(result.stderr)
    assert sha256(dumps[0]) == before and not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("suffix", DATA_SUFFIXES)
def test_a_report_named_like_any_input_format_is_refused(tmp_path, suffix):
    source = rollout(tmp_path / "in.parquet")
    other = tmp_path / f"other{suffix}"
    other.write_bytes(b"someone's data")
    recompute = ("recompute", source, "-o", tmp_path / "o.parquet", "--gamma", 1, "--lambd", 1)
    for command in (("validate", source), recompute, ("kernels",)):
        result = gae(*command, "--json", other, "--quiet")
        assert result.exit_code == 2 and "named like" in result.stderr and one_line(result.stderr), result.output
        assert other.read_bytes() == b"someone's data" and not (tmp_path / "o.parquet").exists()


def test_the_input_suffixes_are_the_readers_patterns():
    """One list: the report check refuses what the readers read (``.pkl``: a dump named so)."""
    from gaecli.importers import miles, nemo_rl, skyrl, slime

    assert miles.DUMP_PATTERNS == slime.DUMP_PATTERNS == INPUT_PATTERNS["torch.save dump"]
    assert nemo_rl.DUMP_PATTERNS == INPUT_PATTERNS["NeMo-RL dump"]
    assert skyrl.DUMP_PATTERNS == INPUT_PATTERNS["SkyRL dump"]
    assert set(DATA_SUFFIXES) == {".parquet", ".pt", ".pth", ".jsonl", ".pkl"}


# ----------------------------------------------------------------------------- 4. streams behind links


def test_the_descriptor_behind_a_path_is_found_through_links(tmp_path):
    (tmp_path / "so").symlink_to("/proc/self/fd/1")
    (tmp_path / "chain").symlink_to("so")  # relative, to a link
    (tmp_path / "fd").symlink_to("/dev/fd")
    assert descriptor_behind("/dev/stdout") == (1, True)
    assert descriptor_behind(tmp_path / "so") == (1, True)
    assert descriptor_behind(tmp_path / "chain") == (1, True)
    assert descriptor_behind(tmp_path / "fd" / "2") == (2, True)
    assert descriptor_behind(f"/proc/{os.getppid()}/fd/3") == (3, False)
    plain = tmp_path / "plain.parquet"
    plain.write_bytes(b"x")
    (tmp_path / "to-plain").symlink_to(plain)
    assert descriptor_behind(plain) is None and descriptor_behind(tmp_path / "to-plain") is None
    assert descriptor_behind(tmp_path / "absent") is None
    assert writes_through(tmp_path / "so") and not writes_through(tmp_path / "to-plain")


def cli_child(args, stdout, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m gaecli …`` in a child process whose stdout is ``stdout``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gaecli", *map(str, args)],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=cwd,
        timeout=300,
    )


def stream_commands(tmp_path: Path) -> dict:
    source = rollout(tmp_path / "in" / "x.parquet")
    dump = write_step(tmp_path / "dumps", 1, nemo_batch(1, 4))
    common = ("--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--workers", 1)
    return {
        "recompute -o": ("recompute", source, "-o", "so", "--overwrite", *common),
        "diff --per-sample": ("diff", source, "--per-sample", "so", "--overwrite", *common),
        "diff --groups-out": ("diff", source, "--group-by", "id", "--groups-out", "so", "--overwrite", *common),
        "import nemo-rl -o": ("import", "nemo-rl", dump, "-o", "so", "--overwrite", "--quiet"),
        "validate --json": ("validate", source, "--json", "so", "--quiet", "--workers", 1),
        "recompute --json": ("recompute", source, "-o", "y.parquet", "--overwrite", "--json", "so", *common),
    }


@pytest.mark.parametrize(
    "name",
    [
        "recompute -o",
        "diff --per-sample",
        "diff --groups-out",
        "import nemo-rl -o",
        "validate --json",
        "recompute --json",
    ],
)
def test_every_writer_writes_through_a_link_to_its_stdout(tmp_path, name):
    """``ln -s /proc/self/fd/1 so; gae … so > out`` in a child process whose stdout is a
    file: the file receives the whole output and ``so`` stays the link; the same into a
    pipe."""
    command = stream_commands(tmp_path)[name]
    (tmp_path / "so").symlink_to("/proc/self/fd/1")
    redirected = tmp_path / "redirected.out"
    with open(redirected, "wb") as stdout:
        result = cli_child(command, stdout, tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert os.readlink(tmp_path / "so") == "/proc/self/fd/1", "the link was replaced"
    assert [p for p in files_under(tmp_path) if ".gaecli-" in p] == []
    piped = cli_child(command, subprocess.PIPE, tmp_path)
    assert piped.returncode == 0, piped.stderr.decode()
    for data in (redirected.read_bytes(), piped.stdout):
        if name.endswith("--json"):
            assert json.loads(data)["files"][0]["file"].endswith("x.parquet")
        else:
            assert pq.read_table(io.BytesIO(data)).num_rows > 0


# ----------------------------------------------------------------------------- 8. the final rename


SCHEMA = pa.schema([("a", pa.int64())])


def writer_with_rows(target: Path, *, overwrite: bool = False) -> AtomicParquetWriter:
    writer = AtomicParquetWriter(target, SCHEMA, overwrite=overwrite)
    writer.write(pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA))
    return writer


def test_a_target_that_appears_while_writing_is_not_replaced(tmp_path):
    target = tmp_path / "out.parquet"
    writer = writer_with_rows(target)
    target.write_bytes(b"another run's output")  # after the check, before the commit
    with pytest.raises(GAEUsageError, match="out.parquet appeared while this run was writing; give --overwrite"):
        writer.commit()
    assert target.read_bytes() == b"another run's output" and files_under(tmp_path) == ["out.parquet"]
    writer = writer_with_rows(target, overwrite=True)
    writer.commit()
    assert pq.read_table(target).column("a").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("link_error", [errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP])
@pytest.mark.parametrize("renameat2", ["libc", "none"])
def test_without_hard_links_the_rename_still_refuses(tmp_path, monkeypatch, link_error, renameat2):
    """A file system that refuses hard links: ``renameat2(RENAME_NOREPLACE)``, or where the
    system has none a check then a rename."""

    def refuse(*args, **kwargs):
        raise OSError(link_error, os.strerror(link_error))

    monkeypatch.setattr(os, "link", refuse)
    if renameat2 == "none":
        monkeypatch.setattr(gaecli.io.targets, "_renameat2", lambda: None)
    temp, target = tmp_path / "temp", tmp_path / "target"
    temp.write_bytes(b"ours")
    target.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        place(temp, target, overwrite=False)
    assert target.read_bytes() == b"theirs" and temp.read_bytes() == b"ours"
    target.unlink()
    place(temp, target, overwrite=False)
    assert target.read_bytes() == b"ours" and not temp.exists()


def test_a_run_whose_output_appears_meanwhile_exits_2(tmp_path, monkeypatch):
    """``gae recompute x -o y`` while another run puts ``y`` in place (made here after the
    writer closed its file, before the rename): exit 2, one line, ``y`` kept, no temp."""
    source = rollout(tmp_path / "x.parquet")
    target = tmp_path / "y.parquet"
    close = AtomicParquetWriter.close

    def close_then_appear(self):
        close(self)
        target.write_bytes(b"the other run's")

    monkeypatch.setattr(AtomicParquetWriter, "close", close_then_appear)
    result = gae("recompute", source, "-o", target, "--gamma", GAMMA, "--lambd", LAMBD, "--quiet", "--workers", 1)
    assert result.exit_code == 2, result.output
    assert "appeared while this run was writing; give --overwrite to replace it" in result.stderr
    assert one_line(result.stderr) and target.read_bytes() == b"the other run's"
    assert files_under(tmp_path) == ["x.parquet", "y.parquet"]


RACER = """
import sys
import pyarrow as pa
from gaecli.errors import GAEUsageError
from gaecli.io.writer import AtomicParquetWriter
schema = pa.schema([("a", pa.int64())])
writer = AtomicParquetWriter(sys.argv[1], schema)
writer.write(pa.record_batch([pa.array([int(sys.argv[2])])], schema=schema))
writer.close()
print("ready", flush=True)
sys.stdin.readline()
try:
    writer.commit()
except GAEUsageError as error:
    print(error, flush=True)
    sys.exit(2)
print("committed", flush=True)
"""


def test_two_processes_into_one_new_output_one_wins(tmp_path):
    """Two writers of one new target, each released once both have their file whole: one
    commits, the other is refused and removes its temp file; the target is the winner's."""
    target = tmp_path / "out.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(target), str(marker)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for marker in (1, 2)
    ]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready"
        for racer in racers:
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outcomes = [(racer.wait(120), racer.stdout.read().strip()) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
            racer.wait(30)
    assert sorted(code for code, _ in outcomes) == [0, 2], outcomes
    winner = next(marker for marker, (code, _) in zip((1, 2), outcomes) if code == 0)
    assert "appeared while this run was writing" in next(text for code, text in outcomes if code == 2)
    assert pq.read_table(target).column("a").to_pylist() == [winner]
    assert files_under(tmp_path) == ["out.parquet"]


# ----------------------------------------------------------------------------- 10. output columns


@pytest.mark.parametrize(
    "options, flags",
    [
        (("--advantages-col", "x", "--returns-col", "x"), ("--advantages-col", "--returns-col")),
        (("--keep-baseline", "--advantages-col", "advantages_unmasked"), ("--advantages-col", "--keep-baseline")),
        (("--keep-baseline", "--returns-col", "returns_unmasked"), ("--returns-col", "--keep-baseline")),
        (("--advantages-col", ""), ("--advantages-col",)),
        (("--returns-col", "values", "--replace"), ("--returns-col", "--values-col")),
        (("--advantages-col", "id", "--normalize-by", "id", "--replace"), ("--advantages-col", "--normalize-by")),
    ],
)
def test_output_columns_that_collide_are_refused(tmp_path, options, flags):
    source = rollout(tmp_path / "x.parquet")
    result = gae("recompute", source, "-o", tmp_path / "y.parquet", "--gamma", 1, "--lambd", 1, "--quiet", *options)
    assert result.exit_code == 2, result.output
    assert one_line(result.stderr) and all(flag in result.stderr for flag in flags), result.stderr
    assert not (tmp_path / "y.parquet").exists()


def test_replace_may_write_over_an_input_column_the_run_does_not_read(tmp_path):
    source = rollout(tmp_path / "x.parquet")
    out = tmp_path / "y.parquet"
    result = gae(
        "recompute", source, "-o", out, "--gamma", 1, "--lambd", 1, "--quiet", "--advantages-col", "id", "--replace"
    )
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.column_names.count("id") == 1 and pa.types.is_list(table.schema.field("id").type)


def test_the_library_refuses_colliding_columns_when_the_options_are_made():
    with pytest.raises(InvalidOptionError, match="--advantages-col and --returns-col"):
        RecomputeOptions(gamma=1.0, lambd=1.0, columns=Columns(advantages="x", returns="x"))


# ----------------------------------------------------------------------------- the rule: every option, every command


def commands(group, prefix: tuple[str, ...] = ()):
    """(name path, command) of every command below the click ``group`` (typer's own click)."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def long_name(option) -> str:
    return next(name for name in option.opts if name.startswith("--"))


def write_options() -> list[tuple[tuple[str, ...], str]]:
    """(command, option) for every option of every command that names a path written."""
    from typer.main import get_command

    from gaecli.cli import app

    found = []
    for path, command in commands(get_command(app)):
        for param in command.params:
            if param.param_type_name == "option" and long_name(param) in WRITE_PATH_OPTIONS:
                found.append((path, long_name(param)))
    assert found, "no command option names a path written: the enumeration is broken"
    return found


PATHLIKE_METAVARS = {"PATH", "FILE", "OUT", "OUTPUT", "DIR", "DIRECTORY"}


def test_every_option_naming_a_path_is_registered():
    """An option that takes a path (metavar PATH or alike, or a path type) is in
    WRITE_PATH_OPTIONS, and each registered option is declared the one way (metavar PATH):
    a new path option cannot skip the check below."""
    from typer.main import get_command

    from gaecli.cli import app

    registered = set()
    for path, command in commands(get_command(app)):
        for param in command.params:
            if param.param_type_name != "option":
                continue
            name = long_name(param)
            annotation = getattr(param.type_descriptor, "annotation", None)
            pathlike = (param.metavar or "").upper() in PATHLIKE_METAVARS or annotation in (Path, os.PathLike)
            assert pathlike == (name in WRITE_PATH_OPTIONS), f"gae {' '.join(path)} {name}: register it or rename it"
            if name in WRITE_PATH_OPTIONS:
                assert param.metavar == "PATH", f"gae {' '.join(path)} {name}: declare it with write_path_option"
                registered.add(name)
    assert registered == set(WRITE_PATH_OPTIONS)


def miles_inputs(directory: Path) -> list[Path]:
    return [write_dump(directory / "g.pt", rollout_data(1, 4))]


def slime_inputs(directory: Path) -> list[Path]:
    return [write_slime(directory / "s.pt", 0, slime_samples([rollout_data(2, 4)]))]


def nemo_inputs(directory: Path) -> list[Path]:
    return [write_step(directory, 1, nemo_batch(1, 4))]


def skyrl_inputs(directory: Path) -> list[Path]:
    return [write_batch(directory / dump_name(1), skyrl_batch(1).state)]


def rollout_inputs(directory: Path) -> list[Path]:
    return [rollout(directory / "in.parquet")]


RUN = ("--gamma", GAMMA, "--lambd", LAMBD, "--workers", 1)
BASES = {  # command → (its inputs, options it needs, whether it takes -o)
    ("recompute",): (rollout_inputs, RUN, True),
    ("diff",): (rollout_inputs, RUN, False),
    ("identify",): (rollout_inputs, ("--against", "values"), False),
    ("validate",): (rollout_inputs, ("--workers", 1), False),
    ("inspect",): (rollout_inputs, (), False),
    ("import", "miles"): (miles_inputs, (), True),
    ("import", "slime"): (slime_inputs, (), True),
    ("import", "nemo-rl"): (nemo_inputs, (), True),
    ("import", "skyrl"): (skyrl_inputs, (), True),
    ("kernels",): (lambda directory: [], (), False),
}
NEEDS = {"--groups-out": ("--group-by", "id"), "--rejects": ("--on-invalid", "skip")}  # what an option needs beside it


def invocation(work: Path, path: tuple[str, ...], option: str):
    """The inputs of ``gae COMMAND`` (made fresh under ``work``) and its arguments with
    ``option`` set to a value: a function of the value."""
    make_inputs, needs, takes_output = BASES[path]
    inputs = make_inputs(work / "inputs")
    output = ["-o", work / "out" / "o.parquet"] if takes_output and option != "--output" else []
    return inputs, lambda value: [*path, *inputs, *needs, *NEEDS.get(option, ()), *output, option, value, "--quiet"]


@pytest.mark.parametrize(
    "path, option", write_options(), ids=lambda item: "-".join(item) if isinstance(item, tuple) else item
)
def test_every_written_path_goes_through_the_check(tmp_path, path, option):
    """For each (command, option naming a path written): a new path is written (exit 0);
    the path of an input (when the command has inputs) and of an existing rollout file that
    is no input (a data output exists; a report is named like an input) exit 2 with one
    line, every file byte-identical, nothing else written."""
    assert path in BASES, f"gae {' '.join(path)}: add its inputs and needed options to BASES"
    data = ("--output", "--per-sample", "--groups-out", "--rejects")
    fresh = tmp_path / "fresh" / ("o.parquet" if option in data else "r.txt")
    fresh.parent.mkdir()
    _, args = invocation(tmp_path / "ok", path, option)
    result = gae(*args(fresh))
    assert result.exit_code == 0 and fresh.stat().st_size > 0, result.output

    bystander = rollout(tmp_path / "other" / "someone.parquet", seed=7)
    for onto in ("input", "existing"):
        work = tmp_path / onto
        inputs, args = invocation(work, path, option)
        if onto == "input" and not inputs:
            continue  # no inputs to collide with (gae kernels)
        value = inputs[0] if onto == "input" else bystander
        before = {file: sha256(file) for file in [*inputs, bystander]}
        result = gae(*args(value))
        assert result.exit_code == 2, (onto, result.output)
        assert str(value) in result.stderr and one_line(result.stderr), result.stderr
        assert {file: sha256(file) for file in before} == before
        assert not (work / "out").exists()
