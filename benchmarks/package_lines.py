"""Lines of ``empathy_gym/`` at two revisions and what each commit between them added,
every revision formatted alike first.

    python benchmarks/package_lines.py --since f58d761 --until HEAD

Issue 21 counted 15.8k package lines before the package had a formatter; the ruff format
it asked for (pyproject.toml) re-wraps the same code into more lines, so a count taken
before it and one taken after do not compare. Here each revision's ``empathy_gym/`` is
exported to a temporary folder and formatted with the current ``[tool.ruff]`` settings
before its lines are counted, and each commit's change is the difference from its
parent's count. Lines are physical lines of ``*.py`` files (what ``wc -l`` counts), also
split into code, docstrings, comments and blank lines.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import REPO


def kinds(source: str) -> dict[str, int]:
    """Physical lines of one module as code, docstring, comment and blank (they sum to ``wc -l``)."""
    lines = source.splitlines()
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                docstring_lines.update(range(first.lineno, first.end_lineno + 1))
    count = {"lines": len(lines), "docstring": len(docstring_lines), "comment": 0, "blank": 0}
    for number, line in enumerate(lines, 1):
        if number in docstring_lines:
            continue
        if not line.strip():
            count["blank"] += 1
        elif line.strip().startswith("#"):
            count["comment"] += 1
    count["code"] = count["lines"] - count["docstring"] - count["comment"] - count["blank"]
    return count


def count(revision: str) -> dict[str, int]:
    """The formatted package's line kinds at ``revision``."""
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", revision, "empathy_gym"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        subprocess.run(["ruff", "format", "--quiet", "--config", str(REPO / "pyproject.toml"), folder], check=True)
        total: dict[str, int] = {}
        for path in Path(folder).rglob("*.py"):
            for kind, lines in kinds(path.read_text()).items():
                total[kind] = total.get(kind, 0) + lines
        return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", required=True)
    parser.add_argument("--until", default="HEAD")
    args = parser.parse_args()
    commits = subprocess.run(
        ["git", "-C", str(REPO), "log", "--reverse", "--format=%h %s", f"{args.since}..{args.until}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    first = count(args.since)
    print(f"{args.since}: {first}")
    previous = first["lines"]
    for line in commits:
        commit, subject = line.split(" ", 1)
        lines = count(commit)["lines"]
        if lines != previous:
            print(f"{lines - previous:+6d} {commit} {subject[:100]}")
        previous = lines
    print(f"{args.until}: {count(args.until)}")


if __name__ == "__main__":
    sys.exit(main())
