"""The commands' batches and the kernel's screen: the rules the native kernel applies in its
own pass are checked in full only for a batch where it reports a fault (the finding then
the same as the full checks give), and a batch goes to a torch kernel's device once,
whatever the number of sides computed on it."""

from __future__ import annotations

import numpy as np
import pytest

from gaecli import checks
from gaecli.advantages.spec import AdvantageSpec
from gaecli.comparison.sides import ComparisonSide
from gaecli.errors import InvalidDataError
from gaecli.io.format import Columns
from gaecli.io.reader import RolloutFile
from gaecli.pipeline import batches, packing
from gaecli.pipeline.batches import Computation, computed_batches
from gaecli.pipeline.description import old_side_spec

from rollout_files import random_rollouts, rollout_table, write_table


def _counting(monkeypatch, module, name: str) -> list:
    """Record the keyword ``screened`` of every call of ``module.name`` (and call it)."""
    calls: list = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(tuple(kwargs.get("screened", ())))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _rollout_file(tmp_path, bad_row=None, column="values", bad_value=float("nan")):
    rollouts = random_rollouts(12, seed=3)
    if bad_row is not None:
        getattr(rollouts, column)[bad_row][0] = bad_value
    return RolloutFile(write_table(rollout_table(rollouts), tmp_path / "in.parquet"))


def _computation(kernel: str = "native", sides=None, **fields) -> Computation:
    sides = sides or (ComparisonSide.baseline("unmasked"),)
    specs = tuple(old_side_spec(side, 1.0, 0.95) for side in sides)
    return Computation(AdvantageSpec(1.0, 0.95), sides, specs, Columns(), kernel, device="cpu", batch_rows=4, **fields)


def test_clean_batches_leave_the_finite_and_mask_rules_to_the_kernel(tmp_path, monkeypatch):
    calls = _counting(monkeypatch, batches, "check_batch")
    computed = list(computed_batches(_rollout_file(tmp_path), _computation()))
    assert len(computed) == 3
    assert calls == [("loss_mask", "values", "rewards")] * 3  # never the full checks
    assert all(batch.check.ok and not batch.check.findings for batch in computed)


@pytest.mark.parametrize(
    ("column", "bad_value", "code"),
    [("values", float("nan"), "non-finite"), ("rewards", float("-inf"), "non-finite"), ("masks", 2, "mask-value")],
)
def test_a_fault_the_screen_finds_is_named_by_the_full_checks(tmp_path, monkeypatch, column, bad_value, code):
    row = 6  # in the second batch, at a token the mask may leave out
    rollout = _rollout_file(tmp_path, row, column, bad_value)
    expected = checks.check_batch(next(rollout.iter_batches(None, None, "loss_mask")), Columns(), str(rollout.path), 0)
    calls = _counting(monkeypatch, batches, "check_batch")
    with pytest.raises(InvalidDataError) as stopped:
        list(computed_batches(rollout, _computation()))
    assert stopped.value.finding == checks.first_error(expected.findings)
    assert stopped.value.finding.row == row and stopped.value.finding.code == code
    screened = ("loss_mask", "values", "rewards")
    assert calls == [screened, screened, ()]  # the full checks for the batch at fault only

    calls.clear()
    skipped = list(computed_batches(rollout, _computation(on_invalid="skip")))
    assert calls == [screened, screened, (), screened]
    assert [finding.row for batch in skipped for finding in batch.check.findings] == [row]
    assert [batch.valid.num_rows for batch in skipped] == [4, 3, 4]


def test_a_batch_goes_to_the_device_once_whatever_the_number_of_sides(tmp_path, monkeypatch):
    sides = tuple(ComparisonSide.baseline(profile) for profile in ("unmasked", "verl", "areal", "nemo-rl"))
    uploads = _counting(monkeypatch, packing, "device_tensors")
    rollout = _rollout_file(tmp_path)
    on_tensors = list(computed_batches(rollout, _computation(kernel="reference", sides=sides)))
    assert len(uploads) == len(on_tensors) == 3  # one upload per batch for the five sides
    native = list(computed_batches(rollout, _computation(sides=sides)))
    for got, expected in zip(on_tensors, native):
        np.testing.assert_allclose(got.new, expected.new, rtol=1e-5, atol=1e-6)
        for (old, _), (expected_old, _) in zip(got.olds, expected.olds):
            np.testing.assert_allclose(old, expected_old, rtol=1e-5, atol=1e-6)
