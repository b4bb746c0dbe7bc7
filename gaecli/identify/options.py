"""The options of ``gae identify`` (the CLI options, one to one), checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from gaecli.errors import InvalidOptionError
from gaecli.identify.defaults import DEFAULT_SAMPLE_ROWS, DEFAULT_SAMPLE_TOKENS, DEFAULT_TOLERANCE
from gaecli.io.format import Columns
from gaecli.options import check_count, check_number


@dataclass(frozen=True)
class IdentifyOptions:
    """What ``gae identify`` reads and how it judges a candidate (the CLI options, one to one).

    ``against``: the stored per-token advantages to explain; ``against_returns``: the stored
    returns, compared where a candidate has returns (GAE); ``group_col``: the prompt-group id
    of the grouped estimators and of per-group whitening (None: candidates that need groups
    are not tried); ``columns``: the input columns (:class:`gaecli.io.format.Columns`), with
    ``response_mask`` the response mask every candidate that reads one is computed with
    (docs/identify.md#skyrls-padding---response-mask-col); ``truncated_col`` and
    ``bootstrap_col`` (together): each row's truncated flag and bootstrap value, the
    truncation bootstrap every candidate that takes it is computed with (the ``areal``
    profile's, docs/identify.md#areals-no-eos-bootstrap---truncated-col---bootstrap-col);
    ``tolerance``: a sample is
    reproduced when every trainable token's |stored − computed| ≤ tol · (1 + |stored|);
    ``sample_rows`` (0: every row) and ``sample_tokens``: how much of the input is read, from
    its start; ``top``: the candidates listed (every explanation is, and the closest one when
    none explains, even with 0)."""

    against: str = "advantages"
    against_returns: Optional[str] = None
    group_col: Optional[str] = None
    columns: Columns = field(default_factory=Columns)
    truncated_col: Optional[str] = None
    bootstrap_col: Optional[str] = None
    tolerance: float = DEFAULT_TOLERANCE
    sample_rows: int = DEFAULT_SAMPLE_ROWS
    sample_tokens: int = DEFAULT_SAMPLE_TOKENS
    batch_rows: Optional[int] = None
    top: int = 20
    report_paths: tuple = ()

    def __post_init__(self) -> None:
        check_number("--tol", self.tolerance, 0.0)
        check_count("--sample-rows", self.sample_rows, 0)
        check_count("--sample-tokens", self.sample_tokens, 1)
        check_count("--batch-rows", self.batch_rows, 1)
        check_count("--top", self.top, 0)
        if self.columns.kl_coef is not None or self.columns.opd_coef is not None:
            raise InvalidOptionError("gae identify reads the rewards as stored: --kl-coef and --opd-coef are not taken")
        self.reading  # noqa: B018 - the reading options built and checked (--truncated-col's too)

    @property
    def variants(self):
        """The GAE variants' columns read (:class:`gaecli.pipeline.VariantOptions`: the
        truncation bootstrap's, where given), checked as ``gae diff`` checks them."""
        from gaecli.pipeline import VariantOptions

        return VariantOptions(truncated_col=self.truncated_col, bootstrap_col=self.bootstrap_col)

    @cached_property
    def reading(self):
        """What the sample is read and checked with (:class:`gaecli.pipeline.Computation`):
        the run of ``gae diff --against`` on the same columns, whose batches check every row
        read as diff's do."""
        from gaecli.pipeline import describe_run

        return describe_run(_Reading(self))


class _Reading:
    """The run options :func:`gaecli.pipeline.describe_run` reads, for identify's reading:
    masked GAE (γ = λ = 1, with the truncation bootstrap where its columns are given: computed
    once per batch and not used, its per-row columns checked and packed as diff's are) beside
    the stored column."""

    normalize = False
    normalize_by = None
    group_col = None
    step_by = None
    estimator = "gae"
    gamma = 1.0
    lambd = 1.0
    whitening_rule = None
    advantage_clip = None
    kernel = "native"
    device = "cpu"
    on_invalid = "stop"

    def __init__(self, options: IdentifyOptions) -> None:
        from gaecli.pipeline import ComparisonSide, EstimatorInputs

        self.columns = options.columns
        self.batch_rows = options.batch_rows
        self.estimator_inputs = EstimatorInputs()
        self.variants = options.variants
        self.old_sides = (ComparisonSide.stored(options.against, options.against_returns),)
