"""Every measured table under benchmarks/results/ says where it came from (issue 37): the
commit of the code that made it and the command that ran, so a reader can tell whether
it went stale and rerun it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.txt"))
COMMIT = re.compile(r"\bcommit:? ([0-9a-f]{7,40})\b")
COMMAND = re.compile(r"python \S*(?:benchmarks|examples)/\S+\.py|\bpytest |\.ci/run|\bempathy-gym [a-z]+")


def provenance_problems(text: str) -> list[str]:
    """What a results file's text fails to name: ``"commit"`` and/or ``"command"``."""
    return [name for name, pattern in (("commit", COMMIT), ("command", COMMAND)) if not pattern.search(text)]


def test_the_check_catches_a_table_without_its_commit_or_command():
    assert provenance_problems("steps/s 7135\n") == ["commit", "command"]
    assert provenance_problems("# python benchmarks/env_overhead.py\nsteps/s 7135\n") == ["commit"]
    assert provenance_problems("# run at commit 8d14010\n") == ["command"]
    assert provenance_problems("# commit: 6279b19, python benchmarks/distilled_training.py --seeds 0\n") == []


def test_the_opening_line_benchmarks_write_passes_the_check(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "busy_cores.py"), "--steps", "4", "a b"])

    spec = importlib.util.spec_from_file_location("_machine", ROOT / "benchmarks" / "_machine.py")
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    line = machine.provenance()
    assert line.startswith("# run: ") and not provenance_problems(line), line
    assert line.endswith(", command: python benchmarks/busy_cores.py --steps 4 'a b'"), line


@pytest.mark.parametrize("path", RESULTS, ids=[path.name for path in RESULTS])
def test_each_results_file_names_its_commit_and_command(path):
    assert not provenance_problems(path.read_text(encoding="utf-8")), (
        f"{path.relative_to(ROOT)}: names no {' and no '.join(provenance_problems(path.read_text()))}; "
        "open it with benchmarks/_machine.py's provenance() line"
    )


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(
    _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false",
    reason="not a full git clone: the commits cannot be looked up",
)
def test_the_commits_they_name_exist():
    named = {(path.name, sha) for path in RESULTS for sha in COMMIT.findall(path.read_text(encoding="utf-8"))}
    missing = [
        f"{name}: {sha}" for name, sha in sorted(named) if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode
    ]
    assert not missing, f"results files name commits this repository does not have: {missing}"
