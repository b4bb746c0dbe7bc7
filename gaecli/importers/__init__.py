"""Importers: trainers' own dump formats turned into gaecli's rollout Parquet format."""

from gaecli.importers.miles import import_miles
from gaecli.importers.nemo_rl import import_nemo_rl
from gaecli.importers.report import ImportedFile, ImportReport
from gaecli.importers.skyrl import import_skyrl
from gaecli.importers.slime import import_slime

__all__ = ["ImportReport", "ImportedFile", "import_miles", "import_nemo_rl", "import_skyrl", "import_slime"]
