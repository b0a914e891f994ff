"""The analysis stays readable (issue 22): no function in `gputop/analysis/` (recursively) is over 60 lines,
counted from its `def` line through its last line.  A long check is a decision and its wording mixed:
split it into a typed result and the function that words it."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ANALYSIS = Path(__file__).resolve().parent.parent / "gputop" / "analysis"
MAX_LINES = 60


def long_functions(source: str, filename: str = "<source>") -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function or method in `source` longer than MAX_LINES."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None  # ast.parse sets it on every node
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append((node.name, node.lineno, lines))
    return found


def _function_of(lines: int) -> str:
    """A function exactly `lines` long: its def line, then lines - 1 statements."""
    body = "\n".join(f"    x{i} = {i}" for i in range(lines - 1))
    return f"def f():\n{body}\n"


def test_the_counter_draws_the_line_at_60():
    assert long_functions(_function_of(MAX_LINES)) == []
    assert long_functions(_function_of(MAX_LINES + 1)) == [("f", 1, MAX_LINES + 1)]
    nested = "class C:\n" + textwrap.indent(_function_of(MAX_LINES + 5).replace("def f", "def method"), "    ")
    assert long_functions(nested) == [("method", 2, MAX_LINES + 5)]


def test_no_function_in_analysis_is_over_60_lines():
    files = sorted(ANALYSIS.rglob("*.py"))
    assert len(files) > 10, f"expected the analysis package under {ANALYSIS}"
    offenders = [
        f"{path.relative_to(ANALYSIS.parent.parent)}:{line} {name}: {lines} lines"
        for path in files
        for name, line, lines in long_functions(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not offenders, f"functions over {MAX_LINES} lines (split the decision from its wording):\n" + "\n".join(offenders)
