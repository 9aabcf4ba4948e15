"""Run a script under ``torch.distributed.run`` on this machine (not a test module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servers import free_port

REPO = Path(__file__).resolve().parents[1]


def torchrun(script: Path, processes: int, *args: str, timeout: int = 600, env=None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node PROCESSES SCRIPT ARGS...`` from the
    repository root, on a free port, its output captured."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    command += ["--master_port", str(free_port()), str(script), *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
