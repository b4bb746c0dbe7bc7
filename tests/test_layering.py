"""The layers of ``docs/architecture.md`` hold: no module of ``gaecli/`` imports a module of
a layer above its own, and no command imports another command. Read from each module's
imports with ``ast`` (module-level and function-level ones, those under ``if
TYPE_CHECKING:`` too), not from what an interpreter happens to load
(``tests/test_command_modules.py`` checks that for the commands)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import gaecli

PACKAGE = Path(gaecli.__file__).resolve().parent

# The one map of the layers (docs/architecture.md's table mirrors it): layer number, its
# name, and the modules and packages in it. A layer imports only its own and those below
# it (higher numbers). ``gaecli`` itself (the lazy public API) is the package's face.
LAYERS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("command line", ("gaecli", "gaecli.__main__", "gaecli.cli")),
    2: ("reports", ("gaecli.report", "gaecli.view")),
    3: (
        "commands",
        (
            "gaecli.recompute",
            "gaecli.diff",
            "gaecli.identify",
            "gaecli.inspection",
            "gaecli.validate",
            "gaecli.importers",
        ),
    ),
    4: ("the run driver", ("gaecli.run",)),
    5: ("comparison", ("gaecli.comparison",)),
    6: ("engines", ("gaecli.engines",)),
    7: ("data path", ("gaecli.pipeline", "gaecli.checks", "gaecli.io", "gaecli.stats", "gaecli.overflow")),
    8: ("the numbers", ("gaecli.advantages", "gaecli.flat", "gaecli.trainers")),
    9: (
        "foundation",
        (
            "gaecli.options",
            "gaecli.errors",
            "gaecli.display",
            "gaecli.lazy",
            "gaecli.rules",
            "gaecli.stop",
            "gaecli.progress",
            "gaecli._version",
        ),
    ),
}
COMMANDS = LAYERS[3][1]


def placed(module: str) -> Optional[str]:
    """The entry of :data:`LAYERS` that holds ``module`` (the longest that names it or a
    package above it; ``gaecli`` holds only itself), or None."""
    entries = [
        entry
        for _, (_, members) in LAYERS.items()
        for entry in members
        if module == entry or (entry != "gaecli" and module.startswith(entry + "."))
    ]
    return max(entries, key=len) if entries else None


def layer_of(module: str) -> Optional[int]:
    entry = placed(module)
    return next((number for number, (_, members) in LAYERS.items() if entry in members), None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The ``gaecli`` modules ``module`` (the file at ``path``) imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package, known)


def imports_in(source: str, package: str, known: set[str]) -> set[str]:
    """The ``gaecli`` modules ``source`` (a module of ``package``) imports, at any depth:
    ``from P import N`` counts as module ``P.N`` where that is one of ``known``, else as ``P``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name == "gaecli" or name.startswith("gaecli.")}


def command_of(module: str) -> Optional[str]:
    return placed(module) if placed(module) in COMMANDS else None


def layer_faults() -> list[str]:
    """Each import that breaks the layering, and each module the map does not place."""
    found = modules()
    faults = [f"{module} is in no layer: place it in LAYERS" for module in found if layer_of(module) is None]
    for module, path in found.items():
        own = layer_of(module)
        for imported in sorted(imported_modules(module, path, set(found))):
            above = layer_of(imported)
            if own is None or imported == module:
                continue
            if above is None:
                faults.append(f"{module} -> {imported} (in no layer)")
            elif above < own:
                faults.append(
                    f"{module} -> {imported} (layer {above} {LAYERS[above][0]} above layer {own} {LAYERS[own][0]})"
                )
            elif command_of(module) and command_of(imported) and command_of(module) != command_of(imported):
                faults.append(
                    f"{module} -> {imported} (command {command_of(module)} imports command {command_of(imported)})"
                )
    return faults


def test_every_module_is_placed_in_one_layer():
    assert layer_of("gaecli.cli.recompute") == 1 and layer_of("gaecli") == 1
    assert layer_of("gaecli.advantages.kernels.native") == 8 and layer_of("gaecli.errors") == 9
    assert layer_of("gaecli.runner") is None  # a package named like another is not in it
    assert command_of("gaecli.recompute.run") == "gaecli.recompute" and command_of("gaecli.run.driver") is None
    unplaced = [module for module in modules() if layer_of(module) is None]
    assert not unplaced, "modules in no layer (place them in LAYERS and docs/architecture.md): " + ", ".join(unplaced)


def test_imports_are_read_wherever_they_stand():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from . import sibling\n"
        "from ..io import reader\n"
        "from .sibling import name\n"
        "if TYPE_CHECKING:\n"
        "    from gaecli.run import driver\n"
        "def f():\n"
        "    import gaecli.report.html\n"
    )
    known = {"gaecli.diff.sibling", "gaecli.io.reader", "gaecli.run.driver", "gaecli.report.html"}
    assert imports_in(source, "gaecli.diff", known) == known
    path = PACKAGE / "cli" / "imports.py"
    imported = imported_modules("gaecli.cli.imports", path, set(modules()))
    assert {"gaecli.cli.common", "gaecli.importers", "gaecli.display"} <= imported  # the last two inside functions


def test_no_module_imports_a_layer_above_its_own_nor_a_command_another():
    faults = layer_faults()
    assert not faults, "imports against the layering of docs/architecture.md:\n" + "\n".join(faults)
