"""The docs name the tests that hold each promise (docs/reliability.md above all): every test
they name exists, so a renamed or removed test cannot leave a promise pointing at nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMED_TEST = re.compile(r"`(test_[a-z0-9_]+)")


def defined_tests() -> set[str]:
    names = set()
    for module in (ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return names


@pytest.mark.parametrize("page", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))
def test_every_test_a_page_names_exists(page):
    named = set(NAMED_TEST.findall((ROOT / page).read_text(encoding="utf-8")))
    missing = sorted(named - defined_tests())
    assert not missing, f"{page} names tests that do not exist: {', '.join(missing)}"


def test_the_reliability_page_names_tests():
    """The check above reads something: the reliability page names its tests."""
    assert len(NAMED_TEST.findall((ROOT / "docs/reliability.md").read_text(encoding="utf-8"))) > 100
