"""The quick start's training step on idle cores and beside a competing CPU job, with torch's
default threads and with ``OMP_NUM_THREADS=1``, side by side in one run (issue 37).

    python benchmarks/busy_cores.py [--steps 4] [--no-write]

Each setting runs the README's main command as a user would (``examples/train_grpo.py
--recipe agents/smollm2-cpu-grpo.yaml``), cut to ``--steps`` steps without its held-out
evaluation, in its own process. The competing job is the same in both busy settings: a
torch matrix product in a loop at torch's default threads (another training job on the
same machine), started before the run and stopped after it. Prints per setting: the mean
seconds per step (the first step, which builds things, left out), the slowest step, and
whether the run's log said that other work was using the cores (the package's notice;
it never changes the thread count itself). Writes ``benchmarks/results/busy_cores.txt``
unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import REPO, cpu_model, provenance, publish  # noqa: E402

COMPETITOR = "import torch\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a\n"
NOTICE = "other work is using the cores"
SLOW_NOTICE = "other work may be using the cores"


def quick_start(steps: int, threads: str | None, busy: bool) -> dict:
    unset = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env = unset if threads is None else {**unset, "OMP_NUM_THREADS": threads}
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=unset) if busy else None
    try:
        time.sleep(5 if busy else 0)  # the competitor at full speed before the run starts
        with tempfile.TemporaryDirectory() as out:
            overrides = [f"total_steps={steps}", f"output_dir={out}", "heldout.bank=null"]
            overrides += ["save_steps=0", "report_to=none", "progress=false"]
            command = [sys.executable, "examples/train_grpo.py", "--recipe", "agents/smollm2-cpu-grpo.yaml", *overrides]
            started = time.perf_counter()
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"{command} failed:\n{done.stderr[-3000:]}")
            log = (Path(out) / "train.log").read_text() + done.stderr
            steps_s = [json.loads(line)["time/step"] for line in (Path(out) / "metrics.jsonl").open()]
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    timed = steps_s[1:] or steps_s
    return {
        "mean": sum(timed) / len(timed),
        "slowest": max(timed),
        "wall": wall,
        "notice": "at start" if NOTICE in log else ("slow step" if SLOW_NOTICE in log else "none"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    settings = [
        ("idle", None, False),
        ("idle", "1", False),
        ("beside a competing job", None, True),
        ("beside a competing job", "1", True),
    ]
    load_before = os.getloadavg()
    rows = [(where, threads, quick_start(args.steps, threads, busy)) for where, threads, busy in settings]
    lines = [
        "# The quick start's step on idle cores and beside a competing CPU job (benchmarks/busy_cores.py)",
        provenance(inputs=["recipe agents/smollm2-cpu-grpo.yaml"]),
        f"# machine: {cpu_model()}; load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"# examples/train_grpo.py --recipe agents/smollm2-cpu-grpo.yaml total_steps={args.steps} heldout.bank=null; "
        "the competing job: a 1024x1024 torch matmul in a loop at torch's default threads",
        "",
        f"{'where':24} {'OMP_NUM_THREADS':>15} {'s/step':>7} {'slowest':>7} {'wall s':>7}  the package's notice",
    ]
    for where, threads, row in rows:
        lines.append(
            f"{where:24} {threads or 'unset':>15} {row['mean']:7.1f} {row['slowest']:7.1f} {row['wall']:7.0f}  "
            f"{row['notice']}"
        )
    publish(lines, "busy_cores.txt", write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
