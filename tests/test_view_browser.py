"""``gae view``'s pages in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright for Python. The run page, a step's table (sorted, filtered), a sample's strips
(their numbers and colours against the float64 oracles, the masked spans, the turns), the
hover, group and rank navigation, switching the old side and the tokenizer's text.

Skipped, saying how to install it, only where no browser is installed (CI installs one:
``.ci/run``). ``GAE_VIEW_SCREENSHOTS=DIR`` saves the three pages of ``sample_data/`` there
(docs/view.md's pictures)."""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_view import (
    DEADLINE,
    GAMMA,
    GROUP_SIZE,
    LAMBD,
    explorer_of,
    oracle_rows,
    sample_of,
    served,
    token_ids,
    write_run,
)

from helpers import critic_free_oracle, masked_gae_oracle, unmasked_oracle, verl_oracle

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INSTALL = "install it with `sudo apt-get install -y chromium` and `pip install playwright` (CI does: .ci/run)"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no chromium browser here: {INSTALL}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason=f"Playwright is not installed: {INSTALL}")

WAIT_MS = int(DEADLINE * 1000)
BLUE, RED = (33, 102, 172), (178, 24, 43)
REPOSITORY = Path(__file__).resolve().parent.parent


def colour(value: float, scale: float) -> tuple[int, int, int]:
    """The diverging scale of docs/view.md, written again here."""
    t = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    end = BLUE if t >= 0 else RED
    return tuple(math.floor(255 + (channel - 255) * abs(t) + 0.5) for channel in end)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    yield opened
    context.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("browser_run")
    paths, runs = write_run(directory / "steps")
    broken = directory / "steps" / "step_999.parquet"  # named last in the directory
    broken.write_bytes(b"PAR1 but not really")
    explorer = explorer_of([paths[0].parent])
    with served(explorer) as url:
        yield url, paths, runs


def strip_cells(page, key: str) -> list[tuple]:
    return page.eval_on_selector_all(
        f"#strip-{key} .tok",
        "cells => cells.map(c => [c.dataset.value, getComputedStyle(c).backgroundColor, c.className, c.textContent])",
    )


def rgb(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def shown_rows(page) -> list[int]:
    return page.eval_on_selector_all("#samples tbody tr", "rows => rows.map(r => Number(r.dataset.row))")


# ----------------------------------------------------------------------------- the run page


def test_run_page_lists_the_steps_their_trends_and_the_bad_file(run, page):
    url, paths, runs = run
    page.goto(url)
    page.wait_for_selector('#progress[data-phase="done"]')
    names = page.eval_on_selector_all("#files tbody tr td.name", "cells => cells.map(c => c.textContent)")
    assert names[:3] == [str(path) for path in paths]
    assert "cannot read as Parquet" in names[4] and "step_999.parquet" in names[3]
    for chart in ("changed_share", "mean_abs_delta_advantage", "masked_share", "reward_mean", "lost_terminal_samples"):
        points = page.get_attribute(f'[data-chart="{chart}"] polyline', "points").split()
        assert len(points) == 3
    changed = page.eval_on_selector_all(
        "#files tbody tr", "rows => rows.slice(0, 3).map(r => r.children[5].textContent)"
    )
    assert changed == [str(sum(oracle_rows(rollouts)["changed"])) for rollouts in runs]
    page.click('#files tr[data-index="1"]')
    page.wait_for_selector("#samples tbody tr")
    assert page.url.endswith("#/step/1")


# ----------------------------------------------------------------------------- the step page


def test_step_table_sorts_and_filters_by_the_diff_figures(run, page):
    url, _, runs = run
    rows = np.arange(24)
    expected = oracle_rows(runs[2])
    page.goto(url + "#/step/2")
    page.wait_for_selector("#samples tbody tr")
    maxima = np.round(expected["max"], 9)
    assert shown_rows(page) == list(np.lexsort((rows, -maxima)))
    page.click('#samples th[data-key="length"]')
    assert shown_rows(page) == list(np.lexsort((rows, -np.array(expected["tokens"]))))
    page.select_option("#filter-flag", "tail")
    with_tail = set(np.flatnonzero(np.array(expected["tail"]) > 0).tolist())
    assert set(shown_rows(page)) == with_tail
    page.select_option("#filter-flag", "all")
    page.fill("#filter-group", "3")
    assert sorted(shown_rows(page)) == [12, 13, 14, 15]
    page.fill("#filter-group", "")
    page.click('#samples tr[data-row="7"]')
    page.wait_for_selector("#strip-new")
    assert "#/sample/2/7" in page.url


# ----------------------------------------------------------------------------- the sample page


def test_sample_strips_are_the_oracles_numbers_and_colours(run, page):
    url, _, runs = run
    values, rewards, mask, terminal = sample_of(runs[0], 0)  # the hand-built sample
    new = masked_gae_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
    old = unmasked_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
    delta = list(np.subtract(new, old))
    page.goto(url + "#/sample/0/0")
    page.wait_for_selector("#strip-delta .tok")
    shared = max(abs(x) for x in new + old)
    for key, expected, scale in (("new", new, shared), ("old", old, shared), ("delta", delta, max(map(abs, delta)))):
        cells = strip_cells(page, key)
        assert len(cells) == len(mask)
        for position, (value, background, classes, text) in enumerate(cells):
            assert abs(float(value) - expected[position]) <= 1e-12
            assert np.abs(np.subtract(rgb(background), colour(expected[position], scale))).max() <= 1, (key, position)
            assert ("masked" in classes.split()) == (mask[position] == 0)
            starts_run = position == 0 or mask[position] != mask[position - 1]
            assert ("turn-start" in classes.split()) == (starts_run and mask[position] != 0)
            assert ("masked-start" in classes.split()) == (starts_run and mask[position] == 0)
            assert text == str(token_ids(runs[0])[0][position])
    page.hover('#strip-delta .tok[data-pos="5"]')
    page.wait_for_selector("#hover:not([hidden])")
    shown = page.inner_text("#hover")
    assert f"new advantage: {new[5]:.6f}" in shown and f"old advantage: {old[5]:.6f}" in shown
    assert "trainable: yes" in shown and "turn: 2" in shown  # the second run of trainable tokens
    assert "2 turns, from the mask's runs" in page.inner_text("#legend") and "(2 spans)" in page.inner_text("#legend")
    page.hover('#strip-new .tok[data-pos="6"]')
    page.wait_for_function("document.getElementById('hover').textContent.includes('position: 6')")
    assert "trainable: no (masked)" in page.inner_text("#hover")


def test_group_and_rank_navigation(run, page):
    url, _, runs = run
    maxima = np.round(oracle_rows(runs[1])["max"], 9)
    order = list(np.lexsort((np.arange(24), -maxima)))
    page.goto(url + "#/sample/1/9")
    page.wait_for_selector("#next-group:not([disabled])")
    page.click("#next-group")
    page.wait_for_function("location.hash.startsWith('#/sample/1/10')")
    sync_api.expect(page.locator("h1")).to_have_text(re.compile(r"row 10$"), timeout=WAIT_MS)
    page.wait_for_selector("#prev-group:not([disabled])")
    place = order.index(10)
    page.click("#next-rank")
    page.wait_for_function(f"location.hash.startsWith('#/sample/1/{order[place + 1]}?')")
    # the previous page's #rank stays until the new page is drawn: wait for the new text itself
    sync_api.expect(page.locator("h1")).to_have_text(re.compile(f"row {order[place + 1]}$"), timeout=WAIT_MS)
    sync_api.expect(page.locator("#rank")).to_have_text(f"rank {place + 2} of 24 by max |Δ|", timeout=WAIT_MS)
    assert 10 // GROUP_SIZE == 2


def test_switching_the_old_side_redraws_its_strip(run, page):
    url, _, runs = run
    values, rewards, mask, terminal = sample_of(runs[1], 5)
    verl = verl_oracle(values, rewards, mask, terminal, GAMMA, LAMBD)[0]
    page.goto(url + "#/sample/1/5")
    page.wait_for_selector("#old-side")
    page.select_option("#old-side", "profile:verl")
    page.wait_for_function(
        "document.getElementById('facts') && document.getElementById('facts').textContent.includes('old side: verl')"
    )
    got = [float(value) for value, *_ in strip_cells(page, "old")]
    np.testing.assert_allclose(got, verl, rtol=0, atol=1e-12)


def test_another_estimator_as_the_old_side_after_its_run_pass(run, page):
    """GRPO over the page's groups, which span the run's three steps: its whole-run pass runs
    when chosen, with progress, then the strip is the oracle's."""
    url, _, runs = run
    rewards = [r for rollouts in runs for r in rollouts.rewards]
    masks = [m for rollouts in runs for m in rollouts.masks]
    terminal = [z for rollouts in runs for z in rollouts.terminal]
    groups = [row // GROUP_SIZE for rollouts in runs for row in range(len(rollouts))]
    expected = critic_free_oracle("grpo", rewards, masks, terminal, groups)[0][24 + 5]
    page.goto(url + "#/sample/1/5")
    page.wait_for_selector("#old-side")
    page.select_option("#old-side", "estimator:grpo")
    page.wait_for_function(
        "document.getElementById('facts') && document.getElementById('facts').textContent.includes('old side: grpo')"
    )
    got = [float(value) for value, *_ in strip_cells(page, "old")]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)
    assert page.input_value("#old-side") == "estimator:grpo"


def test_the_tokenizers_text_is_on_the_tokens(tmp_path, page):
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    model = tokenizers.models.WordLevel({f"w{index}": index for index in range(50)}, unk_token="w0")
    tokenizers.Tokenizer(model).save(str(tmp_path / "tokenizer.json"))
    paths, runs = write_run(tmp_path / "run", steps=1, rows=4)
    with served(explorer_of(paths, tokenizer=str(tmp_path / "tokenizer.json"))) as url:
        page.goto(url + "#/sample/0/1")
        page.wait_for_selector("#strip-new .tok")
        texts = [text for *_, text in strip_cells(page, "new")]
    assert texts == [f"w{token}" for token in token_ids(runs[0])[1]]


# ----------------------------------------------------------------------------- sample_data


def test_the_three_pages_on_sample_data(page, monkeypatch):
    """From the repository's root with relative inputs, as docs/view.md runs it: the names on
    the pages (and the screenshots) are the relative ones, no path of this machine."""
    from gaecli.diff import DiffOptions
    from gaecli.view import open_run

    folder = os.environ.get("GAE_VIEW_SCREENSHOTS")
    folder = None if folder is None else str(Path(folder).resolve())
    monkeypatch.chdir(REPOSITORY)
    inputs = ["sample_data/agentic", "sample_data/single_turn.parquet"]
    explorer = open_run(inputs, DiffOptions(gamma=1.0, lambd=0.95, group_by="rollout_id", id_col="sample_id"))
    with served(explorer) as url:
        page.goto(url)
        page.wait_for_selector('#progress[data-phase="done"]')
        assert page.eval_on_selector_all("#files tbody tr", "rows => rows.length") == 3
        names = page.eval_on_selector_all("#files tbody tr td.name", "cells => cells.map(c => c.textContent)")
        assert all(name.startswith("sample_data/") for name in names), names
        assert str(REPOSITORY) not in page.content()
        if folder:
            page.screenshot(path=str(Path(folder) / "view-run.png"), full_page=True)
        page.goto(url + "#/step/0")
        page.wait_for_selector("#samples tbody tr")
        top = shown_rows(page)[0]
        if folder:
            page.screenshot(path=str(Path(folder) / "view-step.png"))
        page.click(f'#samples tr[data-row="{top}"]')
        page.wait_for_selector("#strip-delta .tok")
        page.wait_for_selector("#rank")
        assert page.inner_text("#rank").startswith("rank 1 of 40")
        assert str(REPOSITORY) not in page.content()
        if folder:
            page.hover('#strip-delta .tok[data-pos="40"]')
            page.screenshot(path=str(Path(folder) / "view-sample.png"))
