"""The suite's own rules: a coroutine function a test defines is run; Hypothesis is deterministic in CI."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, settings

from tests.conftest import IN_CI

TESTS = Path(__file__).resolve().parent

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def own_coroutine_functions(scope: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AsyncFunctionDef]:
    """The ``async def`` statements whose nearest enclosing function is ``scope`` (not those of deeper functions)."""
    pending: list[ast.AST] = list(scope.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.AsyncFunctionDef):
            yield node
        if isinstance(node, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
            continue
        pending.extend(ast.iter_child_nodes(node))


def never_run(source: str, filename: str = "<test>") -> list[str]:
    """``file:line function.inner`` for each undecorated ``async def`` inside a function that the function never
    names (so nothing awaits, schedules or hands on its coroutine), or only calls as a bare statement (which
    makes a coroutine and drops it): its body never executes, and the assertions in it can never fail."""
    found = []
    for scope in ast.walk(ast.parse(source, filename)):
        if not isinstance(scope, FUNCTIONS):
            continue
        named = {node.id for node in ast.walk(scope) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        dropped = {node.value.func.id for node in ast.walk(scope) if isinstance(node, ast.Expr)
                   and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)}  # fmt: skip
        for inner in own_coroutine_functions(scope):
            if not inner.decorator_list and (inner.name not in named or inner.name in dropped):
                found.append(f"{filename}:{inner.lineno} {scope.name}.{inner.name}")
    return sorted(found)


def test_every_coroutine_function_a_test_defines_is_run() -> None:
    found = [hit for path in sorted(TESTS.glob("*.py")) for hit in never_run(path.read_text(), path.name)]
    assert found == []


def test_a_coroutine_function_defined_and_never_run_is_found() -> None:
    """The pattern that once left a test's whole body unexecuted: ``run`` defined, its coroutine never made."""
    source = """
def test_late_lease(redis_server) -> None:
    async def run() -> None:
        async def recorded(keys, args):
            return await script(keys=keys, args=args)

        idle._script = recorded
        assert False
"""
    assert never_run(source) == ["<test>:3 test_late_lease.run"]
    assert never_run(source + "\n    asyncio.run(run())\n") == []
    assert never_run(source + "\n    run()\n") == ["<test>:3 test_late_lease.run"]  # made and dropped
    assert never_run(source.replace("idle._script = recorded", "pass")) == [
        "<test>:3 test_late_lease.run",
        "<test>:4 run.recorded",
    ]


def test_hypothesis_draws_a_fixed_set_of_examples_in_ci_and_never_times_a_test() -> None:
    profile = settings()
    assert profile.deadline is None and HealthCheck.too_slow in profile.suppress_health_check
    assert profile.derandomize is IN_CI and (profile.database is None) is IN_CI
    if IN_CI:
        assert profile.max_examples == 50
