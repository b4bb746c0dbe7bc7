"""Functions stay small: no function body in ``gaecli/`` is over 80 lines, counted with
``ast`` from the first statement after the docstring to the end of the body (a Typer
command's signature of options is not its body, nor is its docstring)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import gaecli

PACKAGE = Path(gaecli.__file__).resolve().parent
MAX_BODY_LINES = 80


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of ``function``'s body after its docstring (decorators of a first nested
    function count with it)."""
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:
        return 0
    start = min([body[0].lineno, *(decorator.lineno for decorator in getattr(body[0], "decorator_list", ()))])
    return body[-1].end_lineno - start + 1


def long_functions(source: str, name: str, limit: int = MAX_BODY_LINES) -> list[str]:
    """``name:line:function (N lines)`` for each function of ``source`` whose body is over ``limit`` lines."""
    return [
        f"{name}:{node.lineno}:{node.name} ({body_lines(node)} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > limit
    ]


def test_the_count_starts_after_the_docstring_and_the_signature():
    source = textwrap.dedent(
        '''
        def command(
            first: int = 1,
            second: int = 2,
        ) -> None:
            """A docstring
            of three
            lines."""
            a = 1
            if a:
                a = 2
            return None


        def short():
            return 1
        '''
    )
    module = ast.parse(source)
    command, short = module.body
    assert body_lines(command) == 4 and body_lines(short) == 1
    assert long_functions(source, "x.py", limit=3) == ["x.py:2:command (4 lines)"]
    assert long_functions(source, "x.py", limit=4) == []


def test_no_function_body_is_over_80_lines():
    offenders = [
        offender
        for path in sorted(PACKAGE.rglob("*.py"))
        for offender in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not offenders, f"function bodies over {MAX_BODY_LINES} lines (split them):\n" + "\n".join(offenders)
