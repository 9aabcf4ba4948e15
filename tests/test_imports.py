"""The import graph inside each subpackage: no module imports one that imports it back,
directly or through others, counting imports inside functions (issue 38: ``agents/config``,
``heldout`` and ``trainer`` imported each other, two of them lazily to dodge the cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "empathy_gym"


def imports_of(path: Path) -> set[str]:
    """The ``empathy_gym`` modules ``path`` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("empathy_gym"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("empathy_gym")}
    return found


def graph(folder: str) -> dict[str, set[str]]:
    modules = {
        "empathy_gym." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p
        for p in (PACKAGE / folder).glob("*.py")
        if p.name != "__init__.py"
    }
    return {name: imports_of(path) & set(modules) for name, path in modules.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges`` (a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("folder", ["agents", "user", "backends", "evaluation", "integrations"])
def test_the_modules_of_a_subpackage_import_no_cycle(folder):
    assert cycle(graph(folder)) is None


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
