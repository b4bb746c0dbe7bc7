"""``gae view``'s server and its JSON documents, held against float64 loops written here and
in ``helpers.py`` (the contract, the trainer profiles, whitening, GRPO), never against its own
output: a sample's per-token numbers for every old side, a step's per-sample figures, the
run's trends, the navigation; the safety rules (index-only requests, bad files shown in one
line, the port, the missing extra, Ctrl-C). The browser drives the pages in
``test_view_browser.py``."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers import critic_free_oracle, masked_gae_oracle, unmasked_oracle, verl_oracle, zero_masked_oracle
from rollout_files import Rollouts, random_rollouts, rollout_table, write_table

pytest.importorskip("starlette", reason="the view extra: pip install -e '.[view]'")
pytest.importorskip("uvicorn", reason="the view extra: pip install -e '.[view]'")

GAMMA, LAMBD = 0.9, 0.8
TOLERANCE = 1e-12
DEADLINE = 120.0  # seconds: a generous bound on waiting for an event, never a sleep
GROUP_SIZE = 4
HAND = Rollouts(  # a trainable turn, a masked observation, a second turn, a masked tail
    values=[[0.5, 0.2, 0.7, -0.3, 0.1, 0.4, 0.9, 0.6]],
    rewards=[[0.01, -0.02, 0.5, 0.5, 0.03, 0.0, 0.25, -0.25]],
    masks=[[1, 1, 0, 0, 1, 1, 0, 0]],
    terminal=[1.0],
)
STORED = "trainer_advantages"


# ----------------------------------------------------------------------------- the run


def step_rollouts(step: int, rows: int = 24) -> Rollouts:
    """The samples of one step: seeded random ones, the first of step 0 the hand-built one."""
    rollouts = random_rollouts(rows, seed=100 + step)
    if step == 0:
        for name in ("values", "rewards", "masks", "terminal"):
            getattr(rollouts, name)[0] = getattr(HAND, name)[0]
    return rollouts


def token_ids(rollouts: Rollouts) -> list[list[int]]:
    return [[(7 * position + row) % 50 for position in range(len(mask))] for row, mask in enumerate(rollouts.masks)]


def write_run(directory: Path, steps: int = 3, rows: int = 24) -> tuple[list[Path], list[Rollouts]]:
    """``steps`` float64 step files with a prompt id (groups of 4), token ids and the stored
    advantages of the unmasked loop."""
    paths, runs = [], []
    for step in range(steps):
        rollouts = step_rollouts(step, rows)
        stored = [
            unmasked_oracle(v, r, m, z, GAMMA, LAMBD)[0]
            for v, r, m, z in zip(rollouts.values, rollouts.rewards, rollouts.masks, rollouts.terminal)
        ]
        extra = {
            "prompt_id": pa.array([row // GROUP_SIZE for row in range(rows)], pa.int64()),
            "response_tokens": pa.array(token_ids(rollouts), pa.list_(pa.int32())),
            STORED: pa.array(stored, pa.list_(pa.float64())),
        }
        table = rollout_table(rollouts, float_type=pa.float64(), extra=extra)
        paths.append(write_table(table, directory / f"step_{step:03d}.parquet", row_group_size=10))
        runs.append(rollouts)
    return paths, runs


def explorer_of(paths, **options):
    from gaecli.diff import DiffOptions
    from gaecli.view import open_run

    fields = {"gamma": GAMMA, "lambd": LAMBD, "group_by": "prompt_id", **options}
    tokenizer = fields.pop("tokenizer", None)
    return open_run([str(path) for path in paths], DiffOptions(**fields), tokenizer=tokenizer)


def fetch(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"text": body.decode()}


def wait_until(condition, deadline: float = DEADLINE):
    """``condition()``'s first true value, asked again until ``deadline`` seconds passed."""
    end = time.monotonic() + deadline
    while True:
        try:
            found = condition()
        except OSError:
            found = None
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError("the event did not come in time")
        time.sleep(0.05)


@contextmanager
def served(explorer):
    """``explorer`` served on a free port of 127.0.0.1 in a thread; yields the URL once it answers."""
    from gaecli.view import bind, make_server, url_of

    sock = bind("127.0.0.1", 0)
    server = make_server(explorer)
    explorer.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = url_of(sock)
    try:
        wait_until(lambda: fetch(url + "api/run")[0] == 200)
        yield url
    finally:
        server.should_exit = True
        thread.join(DEADLINE)
        sock.close()


@pytest.fixture(scope="module")
def run_paths(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def server(run_paths):
    explorer = explorer_of(run_paths[0])
    with served(explorer) as url:
        assert explorer.wait(DEADLINE)
        yield url


def sample_of(rollouts: Rollouts, row: int) -> tuple:
    return rollouts.values[row], rollouts.rewards[row], rollouts.masks[row], rollouts.terminal[row]


def assert_numbers(got, expected, tolerance=TOLERANCE):
    assert got is not None and len(got) == len(expected)
    np.testing.assert_allclose(
        np.array(got, dtype=np.float64), np.array(expected, dtype=np.float64), rtol=0, atol=tolerance
    )


# ----------------------------------------------------------------------------- a sample's numbers


@pytest.mark.parametrize("step, row", [(0, 0), (0, 1), (0, 13), (1, 6), (2, 23)])
def test_sample_numbers_are_the_contract_and_the_unmasked_loop(server, run_paths, step, row):
    values, rewards, mask, terminal = sample_of(run_paths[1][step], row)
    new, new_returns = masked_gae_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)
    old, old_returns = unmasked_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)
    status, sample = fetch(f"{server}api/sample/{step}/{row}")
    assert status == 200 and sample["ready"] and sample["old_name"] == "unmasked"
    assert sample["mask"] == [int(m != 0) for m in mask]
    assert_numbers(sample["new_advantages"], new)
    assert_numbers(sample["new_returns"], new_returns)
    assert_numbers(sample["old_advantages"], old)
    assert_numbers(sample["old_returns"], old_returns)
    assert_numbers(sample["delta"], np.subtract(new, old))
    assert_numbers(sample["values"], values)
    assert sample["terminal_reward"] == terminal and sample["group"] == row // GROUP_SIZE
    assert sample["tokens"] == [str(token) for token in token_ids(run_paths[1][step])[row]]
    assert sample["tokens_from"] == "ids"


def test_the_hand_built_sample_by_hand(server):
    """The contract on the hand-built sample, worked out here: the second turn's last token
    carries z; the masked tail and the observation carry nothing."""
    _, sample = fetch(f"{server}api/sample/0/0")
    g = GAMMA * LAMBD
    a5 = 0.0 + 1.0 - 0.4  # r5 + z + 0 (zero bootstrap) - V5
    a4 = 0.03 + GAMMA * 0.4 - 0.1 + g * a5
    a1 = -0.02 + GAMMA * 0.1 - 0.2 + g * a4  # the gap crossed with one γλ, next value V4
    a0 = 0.01 + GAMMA * 0.2 - 0.5 + g * a1
    assert_numbers(sample["new_advantages"], [a0, a1, 0, 0, a4, a5, 0, 0])


@pytest.mark.parametrize(
    "key, oracle",
    [("profile:verl", verl_oracle), ("profile:openrlhf", zero_masked_oracle), (f"column:{STORED}", None)],
)
def test_switching_the_old_side_computes_that_side_for_the_sample(server, run_paths, key, oracle):
    values, rewards, mask, terminal = sample_of(run_paths[1][1], 5)
    status, sample = fetch(f"{server}api/sample/1/5?old={key}")
    assert status == 200 and sample["old"] == key
    expected = (
        oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
        if oracle
        else unmasked_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
    )
    assert_numbers(sample["old_advantages"], expected)
    assert_numbers(sample["new_advantages"], masked_gae_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0])
    assert {choice["key"] for choice in sample["choices"]} >= {"side:0", "profile:verl", f"column:{STORED}"}


def test_masked_spans_and_turns_are_marked(server, tmp_path):
    """The hand-built sample: turns start at 0 and 4 (the runs of trainable tokens), masked
    spans at 2 and 6; with --turn-ids-col the turns are the ids' (two turns in one run)."""
    _, sample = fetch(f"{server}api/sample/0/0")
    assert sample["masked_starts"] == [2, 6] and sample["turn_starts"] == [0, 4] and sample["turns_from"] == "mask"
    from gaecli.pipeline.options import VariantOptions

    turns = Rollouts(values=HAND.values, rewards=HAND.rewards, masks=[[1, 1, 1, 0, 1, 1, 1, 0]], terminal=[1.0])
    extra = {"turn_ids": pa.array([[0, 1, 1, -1, 2, 2, 3, -1]], pa.list_(pa.int64()))}
    path = write_table(rollout_table(turns, float_type=pa.float64(), extra=extra), tmp_path / "turns.parquet")
    explorer = explorer_of([path], group_by=None, variants=VariantOptions(timestep="turn", turn_ids_col="turn_ids"))
    with served(explorer) as url:
        _, sample = wait_until(lambda: (lambda a: a if a[1].get("ready") else None)(fetch(f"{url}api/sample/0/0")))
    assert sample["turns_from"] == "ids" and sample["turn_starts"] == [0, 1, 4, 6]
    assert sample["masked_starts"] == [3, 7]


def test_turn_rows_are_refused_in_one_line_naming_the_options(run_paths):
    from gaecli.errors import GAEUsageError
    from gaecli.pipeline.options import EstimatorInputs

    inputs = EstimatorInputs(episode_col="prompt_id", turn_col="turn")
    with pytest.raises(GAEUsageError, match="--episode-col and --turn-col") as raised:
        explorer_of(run_paths[0][:1], estimator_inputs=inputs)
    assert "\n" not in str(raised.value)


def test_the_sample_path_is_warmed_and_background_passes_wait_for_a_request(run_paths):
    """Before the first request the sample path has run once (its kernels loaded); while a
    request is served a background pass waits at its next batch, and goes on after."""
    from gaecli.view.explorer import Gate

    explorer = explorer_of(run_paths[0][:1])
    assert explorer.warm() and explorer.warmed
    gate, passed = Gate(), threading.Event()
    with gate.serving():
        waiter = threading.Thread(target=lambda: (gate.pause(), passed.set()))
        waiter.start()
        assert not passed.wait(0.2)  # still held: the request is being served
    assert passed.wait(DEADLINE)
    waiter.join(DEADLINE)


def test_a_stopped_server_ends_its_background_passes(run_paths):
    """Once closed, a pass waiting at its next batch ends at once (ViewClosed), a request
    still being served notwithstanding, and close() returns with the background thread ended:
    the process exits with no thread inside a native library."""
    from gaecli.view.explorer import Gate, ViewClosed

    gate, ended = Gate(), threading.Event()

    def waiting_pass():
        try:
            gate.pause()
        except ViewClosed:
            ended.set()

    with gate.serving():
        waiter = threading.Thread(target=waiting_pass)
        waiter.start()
        gate.close()
        assert ended.wait(DEADLINE)
    waiter.join(DEADLINE)
    explorer = explorer_of(run_paths[0])
    explorer.start()
    explorer.close(DEADLINE)
    assert not explorer._thread.is_alive()
    assert explorer.progress.phase in ("done", "failed")


# ----------------------------------------------------------------------------- figures and navigation


def oracle_rows(rollouts: Rollouts) -> dict:
    """Per sample: max |Δ| over trainable tokens (0 when none), the masked tail, whether it
    changed (some |Δ| > tol · (1 + |A|)), trainable and all tokens."""
    rows = {"max": [], "tail": [], "changed": [], "trainable": [], "tokens": []}
    for row in range(len(rollouts)):
        values, rewards, mask, terminal = sample_of(rollouts, row)
        new = masked_gae_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
        old = unmasked_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
        deltas = [abs(n - o) for n, o, m in zip(new, old, mask) if m]
        rows["max"].append(max(deltas, default=0.0))
        rows["changed"].append(any(abs(n - o) > 1e-6 * (1 + abs(n)) for n, o, m in zip(new, old, mask) if m))
        trainable = [t for t, m in enumerate(mask) if m]
        rows["tail"].append(len(mask) - 1 - trainable[-1] if trainable else 0)
        rows["trainable"].append(len(trainable))
        rows["tokens"].append(len(mask))
    return rows


def test_step_samples_are_the_oracles_figures(server, run_paths):
    expected = oracle_rows(run_paths[1][2])
    status, step = fetch(f"{server}api/step/2")
    assert status == 200 and step["ready"]
    samples = step["samples"]
    assert samples["row"] == list(range(24))
    assert_numbers(samples["max_abs_delta_advantage"], expected["max"], 1e-10)
    assert samples["masked_tail"] == expected["tail"]
    assert samples["changed"] == expected["changed"]
    assert samples["group"] == [row // GROUP_SIZE for row in range(24)]
    assert samples["reward"] == run_paths[1][2].terminal
    assert samples["length"] == expected["tokens"]


def test_run_page_trends_are_the_steps_figures(server, run_paths):
    _, run = fetch(f"{server}api/run")
    assert [entry["name"] for entry in run["files"]] == [str(path) for path in run_paths[0]]
    assert run["progress"]["phase"] == "done"
    for entry, rollouts in zip(run["files"], run_paths[1]):
        expected = oracle_rows(rollouts)
        figures = entry["figures"][0]
        assert entry["rows"] == 24 and entry["row_groups"] == 3
        assert figures["changed_samples"] == sum(expected["changed"])
        assert math.isclose(figures["reward_mean"], float(np.mean(rollouts.terminal)), rel_tol=1e-12)
        share = 1 - sum(expected["trainable"]) / sum(expected["tokens"])
        assert math.isclose(figures["masked_share"], share, rel_tol=1e-12)
        assert math.isclose(figures["max_abs_delta_advantage"], max(expected["max"]), rel_tol=1e-9)


def test_navigation_walks_the_group_and_the_rank(server, run_paths):
    maxima = np.round(oracle_rows(run_paths[1][1])["max"], 9)
    order = list(np.lexsort((np.arange(24), -maxima)))
    row = 9
    _, sample = fetch(f"{server}api/sample/1/{row}")
    navigation = sample["navigation"]
    assert navigation["group"] == 2 and navigation["group_size"] == GROUP_SIZE
    assert (navigation["prev_group"], navigation["next_group"]) == (8, 10)
    place = order.index(row)
    assert navigation["rank"] == place + 1 and navigation["of"] == 24
    assert navigation["prev_rank"] == (order[place - 1] if place else None)
    assert navigation["next_rank"] == (order[place + 1] if place + 1 < 24 else None)
    _, first = fetch(f"{server}api/sample/1/8")
    assert first["navigation"]["prev_group"] is None


# ----------------------------------------------------------------------------- whole-run statistics


def whitened(per_sample, masks):
    """Bessel-whitened over every trainable token of the run, masked positions 0."""
    tokens = [a for sample, mask in zip(per_sample, masks) for a, m in zip(sample, mask) if m]
    mean = math.fsum(tokens) / len(tokens)
    var = math.fsum((a - mean) ** 2 for a in tokens) / (len(tokens) - 1)
    return [
        [(a - mean) / math.sqrt(var + 1e-8) if m else 0.0 for a, m in zip(s, mask)]
        for s, mask in zip(per_sample, masks)
    ]


def test_normalize_runs_the_whole_run_pass_first(tmp_path):
    paths, runs = write_run(tmp_path, steps=2, rows=12)
    samples = [sample_of(rollouts, row) for rollouts in runs for row in range(len(rollouts))]
    masks = [sample[2] for sample in samples]
    new = whitened([masked_gae_oracle(*sample, GAMMA, LAMBD)[0] for sample in samples], masks)
    old = whitened([unmasked_oracle(*sample, GAMMA, LAMBD)[0] for sample in samples], masks)
    explorer = explorer_of(paths, normalize=True)
    with served(explorer) as url:
        status, sample = wait_until(
            lambda: (lambda answer: answer if answer[1].get("ready") else None)(fetch(f"{url}api/sample/1/3"))
        )
        assert status == 200
        assert_numbers(sample["new_advantages"], new[12 + 3], 1e-10)
        assert_numbers(sample["old_advantages"], old[12 + 3], 1e-10)
        keys = {choice["key"] for choice in sample["choices"]}
        assert {"side:0", "profile:verl", f"column:{STORED}"} <= keys
        assert not any(key.startswith("estimator:") for key in keys)  # refused with --normalize, as by gae diff
        # another profile needs its own whole-run pass: started when asked for, the page not ready until it is done
        verl = whitened([verl_oracle(*sample, GAMMA, LAMBD)[0] for sample in samples], masks)
        status, switched = wait_until(
            lambda: (lambda answer: answer if answer[1].get("ready") else None)(
                fetch(f"{url}api/sample/1/3?old=profile:verl")
            )
        )
        assert status == 200 and switched["old"] == "profile:verl" and switched["old_name"] == "verl"
        assert_numbers(switched["old_advantages"], verl[12 + 3], 1e-10)
        assert_numbers(switched["new_advantages"], new[12 + 3], 1e-10)


def test_another_estimator_as_the_old_side_reads_its_own_run_pass(tmp_path):
    """GRPO chosen on the page for a GAE run: its group scores over the whole run (the
    prompt groups span both files), computed on demand for that side."""
    paths, runs = write_run(tmp_path, steps=2, rows=12)
    rewards = [r for rollouts in runs for r in rollouts.rewards]
    masks = [m for rollouts in runs for m in rollouts.masks]
    terminal = [z for rollouts in runs for z in rollouts.terminal]
    groups = [row // GROUP_SIZE for _ in runs for row in range(12)]
    expected = critic_free_oracle("grpo", rewards, masks, terminal, groups)[0]
    explorer = explorer_of(paths)  # the page's groups (--group-by prompt_id) are GRPO's
    with served(explorer) as url:
        _, first = wait_until(lambda: (lambda a: a if a[1].get("ready") else None)(fetch(f"{url}api/sample/1/5")))
        assert "estimator:grpo" in {choice["key"] for choice in first["choices"]}
        status, sample = wait_until(
            lambda: (lambda a: a if a[1].get("ready") else None)(fetch(f"{url}api/sample/1/5?old=estimator:grpo"))
        )
        assert status == 200 and sample["old_name"] == "grpo"
        assert_numbers(sample["old_advantages"], expected[12 + 5], 1e-10)
        values, rewards_5, mask, z = sample_of(runs[1], 5)
        assert_numbers(sample["new_advantages"], masked_gae_oracle(values, rewards_5, mask, z, GAMMA, LAMBD)[0])


def test_a_group_estimator_reads_the_run_scores(tmp_path):
    paths, runs = write_run(tmp_path, steps=1, rows=12)
    rollouts = runs[0]
    groups = [row // GROUP_SIZE for row in range(12)]
    expected = critic_free_oracle("grpo", rollouts.rewards, rollouts.masks, rollouts.terminal, groups)[0]
    explorer = explorer_of(
        paths, estimator="grpo", gamma=None, lambd=None, group_by=None, group_by_id="prompt_id", old_estimator="rloo"
    )
    with served(explorer) as url:
        status, sample = wait_until(
            lambda: (lambda answer: answer if answer[1].get("ready") else None)(fetch(f"{url}api/sample/0/6"))
        )
        assert_numbers(sample["new_advantages"], expected[6], 1e-10)
        assert sample["group"] == 1


# ----------------------------------------------------------------------------- safety


def test_requests_name_files_by_index_only_and_bad_files_show_one_line(tmp_path):
    paths, _ = write_run(tmp_path / "run", steps=1, rows=8)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    explorer = explorer_of([paths[0], broken])
    with served(explorer) as url:
        assert explorer.wait(DEADLINE)
        _, run = fetch(f"{url}api/run")
        error = run["files"][1]["error"]
        assert "broken.parquet" in error and "cannot read as Parquet" in error and "\n" not in error
        assert fetch(f"{url}api/step/1")[1]["error"] == error
        for path in (
            "api/step/2",
            "api/sample/0/8",
            "api/sample/0/-1",
            "api/sample/0/x",
            "static/..%2fserver.py",
            "static/%2e%2e/explorer.py",
            "api/sample/0/1?old=column:values",
            "etc/passwd",
        ):
            assert fetch(url + path)[0] == 404, path
        assert fetch(f"{url}static/view.js")[0] == 200


def test_tokenizer_decodes_the_token_ids(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    vocabulary = {f"w{index}": index for index in range(50)}
    model = tokenizers.models.WordLevel(vocabulary, unk_token="w0")
    tokenizers.Tokenizer(model).save(str(tmp_path / "tokenizer.json"))
    paths, runs = write_run(tmp_path / "run", steps=1, rows=4)
    explorer = explorer_of(paths, tokenizer=str(tmp_path / "tokenizer.json"))
    with served(explorer) as url:
        _, sample = fetch(f"{url}api/sample/0/2")
    assert sample["tokens_from"] == "tokenizer"
    assert sample["tokens"] == [f"w{token}" for token in token_ids(runs[0])[2]]


# ----------------------------------------------------------------------------- the command


def gae(*arguments: str, env=None) -> subprocess.Popen:
    root = str(Path(__file__).resolve().parent.parent)
    environment = {**os.environ, "PYTHONPATH": root, **(env or {})}
    code = "import sys; from gaecli.cli import main; sys.argv = ['gae', *sys.argv[1:]]; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *arguments], stderr=subprocess.PIPE, text=True, env=environment
    )


def stderr_lines(process: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    return lines


def test_the_command_prints_the_url_serves_and_stops_on_ctrl_c(run_paths):
    process = gae("view", str(run_paths[0][0].parent), "--gamma", "0.9", "--lambd", "0.8", "--port", "0")
    lines = stderr_lines(process)
    try:
        line = lines.get(timeout=DEADLINE)
        assert line.startswith("gae view: http://127.0.0.1:")
        url = line.split()[2]
        _, run = wait_until(lambda: fetch(url + "api/run"))
        assert [entry["name"].rsplit("/", 1)[-1] for entry in run["files"]] == [p.name for p in run_paths[0]]
        process.send_signal(signal.SIGINT)
        assert process.wait(DEADLINE) == 130
    finally:
        process.kill()


def test_a_port_in_use_is_one_line_and_exit_2(run_paths):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        process = gae("view", str(run_paths[0][0]), "--gamma", "0.9", "--lambd", "0.8", "--port", str(port))
        _, stderr = process.communicate(timeout=DEADLINE)
    assert process.returncode == 2
    assert stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use: give another --port, or --port 0 for a free one"
    ]


def test_without_the_extra_the_message_says_what_to_install(run_paths, tmp_path):
    (tmp_path / "uvicorn.py").write_text("raise ImportError('no uvicorn here')\n")
    root = str(Path(__file__).resolve().parent.parent)
    process = gae(
        "view",
        str(run_paths[0][0]),
        "--gamma",
        "0.9",
        "--lambd",
        "0.8",
        "--port",
        "0",
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), root])},
    )
    _, stderr = process.communicate(timeout=DEADLINE)
    assert process.returncode == 2
    assert len(stderr.strip().splitlines()) == 1 and "pip install 'gaecli[view]'" in stderr


def test_a_stop_requested_before_the_server_listens_for_signals_stops_it(run_paths):
    """A signal that lands while uvicorn starts goes to the command's handler, which may only
    request the stop (gaecli.stop: in an import); the server exits on the request and serve()
    raises KeyboardInterrupt (the command's exit 130), instead of serving on."""
    from gaecli.stop import clear_stop, request_stop
    from gaecli.view.server import bind, serve

    explorer = explorer_of(run_paths[0])
    sock = bind("127.0.0.1", 0)
    outcome = {}

    def run_server():
        try:
            serve(explorer, sock)
        except KeyboardInterrupt:
            outcome["interrupted"] = True

    request_stop()
    try:
        server = threading.Thread(target=run_server)
        server.start()
        server.join(DEADLINE)
        assert not server.is_alive() and outcome == {"interrupted": True}
    finally:
        clear_stop()
        sock.close()


def test_another_host_warns(run_paths):
    process = gae("view", str(run_paths[0][0]), "--gamma", "0.9", "--lambd", "0.8", "--port", "0", "--host", "0.0.0.0")
    lines = stderr_lines(process)
    try:
        assert lines.get(timeout=DEADLINE).startswith("warning: serving on 0.0.0.0")
        assert lines.get(timeout=DEADLINE).startswith("gae view: http://0.0.0.0:")
        process.send_signal(signal.SIGINT)
        assert process.wait(DEADLINE) == 130
    finally:
        process.kill()
