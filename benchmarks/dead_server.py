"""How long the OpenAI backend takes to give up on a server that is not there, for one
request and for a batch, at two revisions side by side in one run.

    python benchmarks/dead_server.py --before 38c34f9~1 --after HEAD

Each revision is checked out into a temporary git worktree and timed in its own
subprocess (``PYTHONPATH`` its checkout): one ``OpenAIBackend(url, "m")`` sends one
request, then a batch, to a port that is bound but never listens (every connection
refused), each timed until it gives up, with the default retries (5, exponential
backoff with jitter) and ``max_concurrency`` 8. The time
is almost all the backoff's sleep, so the cores' load barely moves it. Each cell lists
``--repeats`` runs, each "one request / the batch".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import REPO, cpu_model

PROBE = """
import socket, sys, time
from empathy_gym.backends.openai_backend import OpenAIBackend
from empathy_gym.backends.base import BackendError
port = socket.socket(); port.bind(("127.0.0.1", 0))
backend = OpenAIBackend(f"http://127.0.0.1:{port.getsockname()[1]}/v1", "m")
for n in (1, int(sys.argv[1])):  # one request, then a batch on the same backend, as a run sends them
    start = time.monotonic()
    try:
        backend.generate([[{"role": "user", "content": "hi"}]] * n)
    except BackendError:
        pass
    print(f"{time.monotonic() - start:.1f}", end=" ")
"""


def seconds_to_give_up(checkout: Path, requests: int) -> str:
    """The probe's times (s) at ``checkout``: one request, then a batch of ``requests``
    on the same backend."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, "-c", PROBE, str(requests)], capture_output=True, text=True, env=env)
    return result.stdout.strip() or f"error: {result.stderr.strip().splitlines()[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="38c34f9~1")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'revision':<12}seconds to give up: 1 request / then {args.batch}, on one backend ({args.repeats} runs)")
    with tempfile.TemporaryDirectory() as folder:
        for label, revision in (("before", args.before), ("after", args.after)):
            checkout = Path(folder) / label
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(checkout), revision])
            try:
                runs = ["/".join(seconds_to_give_up(checkout, args.batch).split()) for _ in range(args.repeats)]
                print(f"{label:<12}{'   '.join(runs)}   ({revision})")
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)])


if __name__ == "__main__":
    main()
