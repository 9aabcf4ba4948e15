"""The main recipe with and without a KL penalty to the reference, side by side: does a
KL term keep the replies fluent, and what does it cost?

    python benchmarks/kl_fluency.py [--betas 0 0.1 0.5] [--out runs/kl-fluency] [key=value ...]

Each variant is the README's main job (``agents/smollm2-cpu-grpo.yaml``) with
``beta=<b>`` (GRPO's k3 KL to the reference: the base model with the LoRA adapter
disabled), the same seed, run at the same time as the others (``OMP_NUM_THREADS=1``
each), so their times compare. Per variant it prints the held-out gain under the training
user and under the second judge (95% intervals over personas), the gap, the held-out
replies' distinct-2 and self-repetition after training, the reference NLL of the sampled
tokens over the first and last five steps (``monitor/reference_nll``), and the wall time.
Written to ``benchmarks/results/kl_fluency.txt`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import REPO, cpu_model, start_training  # noqa: E402


def start(beta: float, args: argparse.Namespace) -> tuple[subprocess.Popen, Path, float]:
    out = Path(args.out) / f"beta-{beta:g}"
    # the reference NLL is measured in every variant (a threshold that never trips)
    overrides = [f"beta={beta}", "monitors.reference_nll=100.0", *args.overrides]
    return start_training(["examples/train_grpo.py", "--recipe", args.recipe], out, overrides), out, time.time()


def row(beta: float, out: Path, seconds: float) -> str:
    report = json.loads((out / "heldout" / "report.json").read_text())
    gain, judge, gap = report["difference"], report["judge"]["difference"], report["judges_gap"]
    after = report["monitors"]["after"]
    nll = report.get("training", {}).get("monitor/reference_nll", {})
    return (
        f"{beta:>5g}  {gain['difference']:+.2f} [{gain['low']:+.2f}, {gain['high']:+.2f}]  "
        f"{judge['difference']:+.2f} [{judge['low']:+.2f}, {judge['high']:+.2f}]  {gap['gap']:+.2f}  "
        f"{after['monitor/distinct_2']:.2f}  {after['monitor/self_repeat_share']:.2f}  "
        f"{nll.get('first', float('nan')):.2f} -> {nll.get('last', float('nan')):.2f}  {seconds / 60:5.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="agents/smollm2-cpu-grpo.yaml")
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.1, 0.5])
    parser.add_argument("--out", default="runs/kl-fluency")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    load_before = os.getloadavg()
    jobs = {beta: start(beta, args) for beta in args.betas}
    times = {}
    for beta, (process, out, started) in jobs.items():
        if process.wait() != 0:
            raise SystemExit(f"beta {beta}: exit {process.returncode}; see {out / 'console.log'}")
        times[beta] = time.time() - started
    lines = [
        f"# python benchmarks/kl_fluency.py --betas {' '.join(f'{b:g}' for b in args.betas)} "
        + " ".join(args.overrides),
        f"# {cpu_model()}; the variants ran at the same time, OMP_NUM_THREADS=1 each; load average "
        f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
        f"# recipe {args.recipe}; held-out gains: after - before, emotion points, 95% interval over personas;",
        "# distinct-2 and repeat: the held-out replies after training; NLL: the reference's, first 5 -> last 5 steps",
        " beta  training user          second judge           gap    dist-2  repeat  ref NLL (nats)  minutes",
    ]
    lines += [row(beta, jobs[beta][1], times[beta]) for beta in args.betas]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        (REPO / "benchmarks" / "results" / "kl_fluency.txt").write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
