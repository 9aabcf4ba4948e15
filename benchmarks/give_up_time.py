"""How long an LLM user at a dead URL takes to fail, with the default retries and timeouts:
a refused connection (nothing listens on the port) and a silent server (it accepts the
connection and never answers), each counted in requests sent and seconds.

    python benchmarks/give_up_time.py [--timeout 300] [--no-write]

Writes ``benchmarks/results/give_up_time.txt`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _machine import cpu_model, provenance, publish  # noqa: E402

from empathy_gym.backends.openai_backend import OpenAIBackend  # noqa: E402
from empathy_gym.personas import builtin_bank  # noqa: E402
from empathy_gym.user.base import UserRequest  # noqa: E402
from empathy_gym.user.llm_user import LLMUser  # noqa: E402


def one_appraisal(url: str, timeout: float) -> tuple[int, float, str]:
    """(requests sent, seconds, the error's first 120 characters) of one appraisal at ``url``."""
    sent = []
    real_post = httpx.Client.post

    def counting(self, target, **kwargs):
        sent.append(str(target))
        return real_post(self, target, **kwargs)

    httpx.Client.post = counting
    try:
        persona = builtin_bank("en")[0]
        request = UserRequest(persona=persona, history=(("user", "Hi."),), utterance="I see.", emotion=40, turn=1)
        started = time.monotonic()
        try:
            LLMUser(OpenAIBackend(url, "m", timeout=timeout)).appraise([request])
            error = "no error"
        except Exception as exc:  # noqa: BLE001 - what the user sees is the measurement
            error = f"{type(exc).__name__}: {exc}"
        return len(sent), time.monotonic() - started, error[:120]
    finally:
        httpx.Client.post = real_post


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0, help="the backend's answer timeout (its default)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel accepts connections; nobody reads or answers
    rows = [
        ("refused (nothing listens)", *one_appraisal(f"http://127.0.0.1:{dead}/v1", args.timeout)),
        (
            "silent (accepts, never answers)",
            *one_appraisal(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", args.timeout),
        ),
    ]
    silent.close()
    lines = [
        "# An LLM user's appraisal at a dead URL, default retries and timeouts (benchmarks/give_up_time.py)",
        provenance(no_inputs="a timing of the retries at a dead URL"),
        f"# machine: {cpu_model()}",
        f"{'server':34s} {'requests':>8s} {'seconds':>8s}  error",
        *(f"{name:34s} {count:8d} {seconds:8.1f}  {error}" for name, count, seconds, error in rows),
    ]
    publish(lines, "give_up_time.txt", write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
