"""The options of ``gae diff`` (the CLI options, one to one), checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gaecli.advantages.contract import BASELINES, CRITIC_FREE
from gaecli.comparison.token_sample import SCATTER_SAMPLE
from gaecli.errors import InvalidOptionError
from gaecli.io.format import Columns
from gaecli.io.reader import DEFAULT_BATCH_ROWS
from gaecli.options import check_choice, check_count, check_number
from gaecli.pipeline import check_device, check_estimators

DEFAULT_TOP = 10


@dataclass(frozen=True)
class DiffOptions:
    """Everything that shapes a diff (the CLI options, one to one).

    Old advantages: the ``baseline`` semantics recomputed from the same data (None means
    ``unmasked``), or with ``against`` the stored column (and ``against_returns`` the
    stored returns); ``baseline`` and ``against`` together are refused. ``normalize`` /
    ``normalize_by`` whiten new and old the same way, each with its own statistics.
    ``report_paths``: files the caller will write reports to, paths or (role, path) pairs
    (refused when one is an input or another output).
    ``estimator``: the new side's estimator (``gae``, masked GAE, or a critic-free one of
    docs/estimators.md); ``old_estimator``: another estimator recomputed on the same rows as
    the old side (exclusive with ``against`` and ``baseline``); a critic-free new side needs
    one of ``old_estimator`` and ``against``. ``group_by_id`` / ``step_by``: the prompt-group and
    step id columns the estimators read; ``gamma`` / ``lambd`` are given exactly where a side
    reads them (GAE, a GAE baseline, ``reinforce++``).
    Every value is checked when the options are made (:meth:`check`).
    """

    gamma: Optional[float] = None
    lambd: Optional[float] = None
    baseline: Optional[str] = None
    against: Optional[str] = None
    against_returns: Optional[str] = None
    normalize: bool = False
    normalize_by: Optional[str] = None
    group_by: Optional[str] = None
    id_col: Optional[str] = None
    top: int = DEFAULT_TOP
    tolerance: float = 1e-6
    kernel: str = "auto"
    device: str = "cpu"
    batch_rows: int = DEFAULT_BATCH_ROWS
    columns: Columns = field(default_factory=Columns)
    per_sample: Optional[str] = None
    report_paths: tuple = ()
    scatter_sample: int = SCATTER_SAMPLE
    estimator: str = "gae"
    old_estimator: Optional[str] = None
    group_by_id: Optional[str] = None
    step_by: Optional[str] = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse (:class:`InvalidOptionError`) a value out of range or not one of its
        choices, a kernel or device not usable here, and contradicting options."""
        from gaecli.advantages.kernels import resolve_kernel

        if self.old_estimator is not None and (self.against is not None or self.baseline is not None):
            other = "--against" if self.against is not None else "--baseline"
            raise InvalidOptionError(f"--old-estimator and {other} both name the old side: give one of them")
        if self.estimator in CRITIC_FREE and self.old_estimator is None and self.against is None:
            raise InvalidOptionError(
                f"--estimator {self.estimator}: give --old-estimator NAME or --against COLUMN as the old side "
                "(the trainer baselines are GAE only)"
            )
        check_estimators(self.side_estimators, self.gamma, self.lambd, self.group_by_id, self.step_by, self.whitening)
        if self.against is not None and self.baseline is not None:
            raise InvalidOptionError(
                "--against compares with stored advantages, --baseline with recomputed ones: give one of them"
            )
        if self.against_returns is not None and self.against is None:
            raise InvalidOptionError("--against-returns needs --against (the stored advantages to compare)")
        if self.baseline is not None:
            check_choice("--baseline", self.baseline, BASELINES, "baseline")
        check_count("--batch-rows", self.batch_rows, 1)
        check_count("--top", self.top, 0)
        check_number("--tol", self.tolerance, 0.0)
        check_device(self.device)
        resolve_kernel(self.kernel, self.device)

    @property
    def whitening(self) -> bool:
        return self.normalize or self.normalize_by is not None

    @property
    def side_estimators(self) -> tuple[str, ...]:
        """The estimators computed: the new side's, then the old side's when recomputed
        (``gae`` for a GAE baseline)."""
        if self.against is not None:
            return (self.estimator,)
        return (self.estimator, self.old_estimator or "gae")

    @property
    def old_semantics(self) -> Optional[str]:
        """The baseline recomputed as the old advantages; None under ``against`` or
        ``old_estimator``."""
        if self.against is not None or self.old_estimator is not None:
            return None
        return self.baseline or "unmasked"
