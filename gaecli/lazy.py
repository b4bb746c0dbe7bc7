"""Names a package exports without importing their modules until first use (so that
importing the package, and ``gae --help``, loads neither torch nor numba), written once for
every package that does it."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], dict[str, str]]:
    """``(__getattr__, homes)`` for ``package``: ``modules`` maps a module to the names it
    exports through the package; ``homes`` maps each name to its module. The module's
    ``__getattr__`` imports a name's module on first use and keeps the value in the package."""
    homes = {name: module for module, names in modules.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__, homes
