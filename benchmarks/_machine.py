"""The CPU description every benchmark prints beside its table, the commit and command
that open its results file, and the training jobs that run side by side."""

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _inputs import inputs_line

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from ``lscpu`` (``platform.processor()`` where that fails)."""
    cpu = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{cpu}; nproc {os.cpu_count()}"


def provenance(inputs: Sequence[str] = (), no_inputs: str | None = None) -> str:
    """The line that opens a results file: when it ran (UTC), the commit of the code that
    made it (``+ uncommitted changes`` when the package, recipes or benchmark scripts
    differ from it; other results do not count) and the command, as this process was
    started (tests/test_results.py checks that every results file names both); with
    ``inputs`` (names as in benchmarks/_inputs.py: ``"rule-user"``, ``"recipe PATH"``...)
    a second line with their fingerprints, which the same tests compare with the checkout's;
    with ``no_inputs`` (why: "a timing of ..."), ``# inputs: none (why)`` instead."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    if git("status", "--porcelain", "--", "empathy_gym", "agents", "benchmarks", "envs", ":!benchmarks/results"):
        commit += " + uncommitted changes"
    command = shlex.join(["python", os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
    line = f"# run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, commit {commit}, command: {command}"
    if no_inputs is not None:
        return f"{line}\n# inputs: none ({no_inputs})"
    return line + (f"\n{inputs_line(list(inputs))}" if inputs else "")


def publish(lines: list[str], name: str, write: bool = True) -> str:
    """Print a benchmark's table (``lines``, joined) and, with ``write``, save it as
    ``benchmarks/results/NAME``; returns the text."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        (REPO / "benchmarks" / "results" / name).write_text(text)
    return text


def start_training(command: list[str], out: Path, overrides: list[str]) -> subprocess.Popen:
    """``python COMMAND output_dir=OUT progress=false OVERRIDES... [--resume]`` from the
    repository root, one thread (jobs share the cores), its output in ``OUT/console.log``;
    ``--resume`` when ``OUT`` holds a training run (a killed benchmark picks up where it was;
    the study's rule, :func:`~empathy_gym.evaluation.run_folder.holds_a_run`)."""
    from empathy_gym.evaluation.run_folder import holds_a_run

    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, *command, f"output_dir={out}", "progress=false", *overrides]
    if holds_a_run(out):
        argv.append("--resume")
    with open(out / "console.log", "w", encoding="utf-8") as log:  # the child keeps its own handle
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO
        )
