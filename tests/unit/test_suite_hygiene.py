"""The suite's own rules against tests that fail on a busy machine, checked on its sources.

A property test runs with Hypothesis's default deadline (200 ms an example) unless it says
otherwise, and an example that a loaded machine merely ran slowly then fails the test (or is
reported "Flaky" when its replay is fast): every `@given` in tests/ has a settings decorator with
`deadline=None`, given inline or through a module-level name (`PROPERTY = settings(...)`).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _calls_named(node: ast.expr, name: str) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def _no_deadline(call: ast.expr) -> bool:
    """A `settings(...)` call that passes `deadline=None`."""
    return (
        isinstance(call, ast.Call)
        and _calls_named(call, "settings")
        and any(
            k.arg == "deadline" and isinstance(k.value, ast.Constant) and k.value.value is None
            for k in call.keywords
        )
    )


def _module_settings(tree: ast.Module) -> dict[str, ast.expr]:
    named: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            named[stmt.targets[0].id] = stmt.value
    return named


def property_tests_with_a_deadline(source: str, path: str) -> list[str]:
    """`path:line name` of each `@given` function whose settings leave Hypothesis's deadline on."""
    tree = ast.parse(source, path)
    named = _module_settings(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        decorators = node.decorator_list
        if not any(_calls_named(d, "given") for d in decorators):
            continue
        resolved = [named.get(d.id, d) if isinstance(d, ast.Name) else d for d in decorators]
        if not any(_no_deadline(d) for d in resolved):
            found.append(f"{path}:{node.lineno} {node.name}")
    return found


def test_every_property_test_in_the_suite_runs_without_a_deadline() -> None:
    offenders = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        for hit in property_tests_with_a_deadline(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert offenders == [], "add @settings(..., deadline=None) to: " + ", ".join(offenders)


def test_the_check_sees_a_default_deadline_and_accepts_the_ways_the_suite_turns_it_off() -> None:
    bare = "from hypothesis import given\n@given(st.integers())\ndef test_x(n): ...\n"
    assert property_tests_with_a_deadline(bare, "t.py") == ["t.py:3 test_x"]
    timed = "@settings(max_examples=10)\n@given(st.integers())\ndef test_x(n): ...\n"
    assert property_tests_with_a_deadline(timed, "t.py") == ["t.py:3 test_x"]
    inline = "@settings(max_examples=10, deadline=None)\n@given(st.integers())\ndef test_x(n): ...\n"
    assert property_tests_with_a_deadline(inline, "t.py") == []
    by_name = "P = settings(deadline=None)\n@P\n@given(st.integers())\ndef test_x(n): ...\n"
    assert property_tests_with_a_deadline(by_name, "t.py") == []
    nested = (
        "def test_y():\n    @hypothesis.settings(deadline=None)\n    @given(x=s)\n    def check(x): ...\n"
    )
    assert property_tests_with_a_deadline(nested, "t.py") == []
