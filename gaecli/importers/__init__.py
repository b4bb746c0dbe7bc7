"""Importers: trainers' own dump formats turned into gaecli's rollout Parquet format."""

from gaecli.importers.miles import ImportedFile, ImportReport, import_miles

__all__ = ["ImportReport", "ImportedFile", "import_miles"]
