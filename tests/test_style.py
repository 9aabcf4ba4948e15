"""The house style is kept by tools: ``ruff check`` and ``ruff format --check`` pass on
the whole repository with the settings in ``pyproject.toml`` (CONTRIBUTING.md)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    command = [shutil.which("ruff") or sys.executable, *([] if shutil.which("ruff") else ["-m", "ruff"]), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["lint", "format"])
def test_ruff_passes_on_the_repository(args):
    result = ruff(*args)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_finds_a_planted_problem(tmp_path):
    """The check can fail: an unused import and a badly formatted line are found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = {  'a':1 }\n")
    config = ["--config", str(ROOT / "pyproject.toml")]
    assert "F401" in ruff("check", *config, str(bad)).stdout
    assert ruff("format", *config, "--check", str(bad)).returncode == 1
