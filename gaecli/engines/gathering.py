"""The bookkeeping every engine's map shares: the units' results in task order as they
finish, the files done told to the progress, and the stop after a failure."""

from __future__ import annotations

from typing import Any

from gaecli.engines import FilesDone, TaskFailure


class UnitResults:
    """The results of ``total`` units (None: not finished, or never started), kept as they
    come in whatever order; each one counts its file done on ``progress``."""

    def __init__(self, total: int, progress, stop_on_failure: bool) -> None:
        self.values: list[Any] = [None] * total
        self.stop_on_failure = stop_on_failure
        self.stopping = False
        self.files_done = FilesDone(progress, total)

    def record(self, index: int, result: Any) -> bool:
        """Keep unit ``index``'s ``result`` and count its file; True when this failure is the
        first to stop the map (``stop_on_failure``): the caller cancels the units pending."""
        self.values[index] = result
        self.files_done.add()
        if self.stop_on_failure and isinstance(result, TaskFailure) and not self.stopping:
            self.stopping = True
            return True
        return False
