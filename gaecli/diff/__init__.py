"""``gae diff`` as a library: how far old advantages are from the masked-GAE ones."""

from gaecli.comparison.figures import DiffOptions, DiffReport, TokenSample, diff_file, diff_files, diff_unit

__all__ = ["DiffOptions", "DiffReport", "TokenSample", "diff_file", "diff_files", "diff_unit"]
