"""``gae diff`` as a library: how far old advantages are from the masked-GAE ones, over
rollout files (:func:`diff_files`), with its options (:class:`DiffOptions`) and report
(:class:`DiffReport`). The comparison itself lives in :mod:`gaecli.comparison`."""

from gaecli.diff.options import DiffOptions
from gaecli.diff.report import DiffReport
from gaecli.diff.run import diff_file, diff_files, diff_unit

__all__ = ["DiffOptions", "DiffReport", "diff_file", "diff_files", "diff_unit"]
