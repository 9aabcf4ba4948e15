"""The CPU description every benchmark prints beside its table."""

import os
import platform
import subprocess


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
