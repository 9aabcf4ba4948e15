"""The main command's claim and its control, side by side in one run.

Runs the README's main job (``agents/smollm2-cpu-grpo.yaml``: GRPO, held-out
before/after evaluation) twice at the same time, with the same seeds, personas,
opening lines and sampling seeds: once as is, once with each step's rewards shuffled
among the step's dialogues before the update (:mod:`empathy_gym.agents.controls`).
Prints both held-out tables, the CPU time of each job and the load average.

    python benchmarks/heldout_control.py [--recipe agents/smollm2-cpu-grpo.yaml] [key=value ...]

The claim holds when the real run's paired difference has a 95% interval above 0 and
the control's does not.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402

CHILD = """
import sys
from empathy_gym.agents import GRPOTrainer, PPOTrainer
from empathy_gym.agents.cli import train_main
from empathy_gym.agents.controls import shuffled_reward_trainer
algorithm, control, argv = sys.argv[1], sys.argv[2] == "control", sys.argv[3:]
cls = {"grpo": GRPOTrainer, "ppo": PPOTrainer}[algorithm]
raise SystemExit(train_main(algorithm, argv, trainer_class=shuffled_reward_trainer(cls) if control else None))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="agents/smollm2-cpu-grpo.yaml")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--out", default="runs/heldout-control")
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS of each job (two jobs run at once)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": args.threads}
    started = time.time()
    load_before = os.getloadavg()
    jobs = {}
    for name in ("real", "control"):
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "console.log", "w", encoding="utf-8")
        cmd = [sys.executable, "-c", CHILD, args.algorithm, name, "--recipe", args.recipe,
               f"output_dir={out}", "progress=false", *args.overrides]
        jobs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log, out)
    codes = {}
    for name, (process, log, _) in jobs.items():
        codes[name] = process.wait()
        log.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - started
    print(f"# python benchmarks/heldout_control.py --recipe {args.recipe} {' '.join(args.overrides)}".rstrip())
    print(f"# {cpu_model()}, Python {sys.version.split()[0]}")
    print(f"# load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; OMP_NUM_THREADS={args.threads} per job")
    print(f"# both jobs at once: {wall:.0f} s wall, {children.ru_utime + children.ru_stime:.0f} CPU-seconds together")
    for name, (_, _, out) in jobs.items():
        title = "REAL: rewards as the env paid them" if name == "real" else \
            "CONTROL: each step's rewards shuffled among its dialogues before the update"
        print(f"\n## {title} (exit code {codes[name]})")
        report = out / "heldout" / "report.txt"
        print(report.read_text(encoding="utf-8").rstrip() if report.exists() else "(no report: see console.log)")
    return max(codes.values())


if __name__ == "__main__":
    raise SystemExit(main())
