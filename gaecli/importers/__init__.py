"""Importers: trainers' own dump formats turned into gaecli's rollout Parquet format."""

from gaecli.importers.common import ImportedFile, ImportReport
from gaecli.importers.miles import import_miles

__all__ = ["ImportReport", "ImportedFile", "import_miles"]
