"""``gae identify``: which computation produced a column of stored advantages — every profile,
masked GAE and the critic-free estimators fitted to it and ranked (docs/identify.md)."""

from gaecli.identify.options import IdentifyOptions
from gaecli.identify.report import IdentifyReport
from gaecli.identify.run import identify_files, identify_table

__all__ = ["IdentifyOptions", "IdentifyReport", "identify_files", "identify_table"]
