"""The main command's learning claim over training seeds: the recipe and its
shuffled-reward control (``heldout_control.py``), each trained with seeds 0, 1 and 2.

    python benchmarks/heldout_seeds.py [--seeds 0 1 2] [--out runs/heldout-seeds] [key=value ...]

A training seed sets the policy's LoRA initialisation, the training dialogues and their
sampling; the held-out personas, their dialogues and sampling seeds are the same in every
run (``heldout.split_seed`` and ``heldout.seed`` stay fixed), so each run's before-score
is the same and its paired difference measures what that training run did. The real job
and its control run at the same time (``OMP_NUM_THREADS=1`` each), seed after seed.

Prints, per seed, each job's held-out difference with its 95% interval over personas,
then the mean over seeds with the standard deviation across them (the spread between
training runs, which one seed's interval does not show). Written to
``benchmarks/results/heldout_seeds.txt`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, provenance, publish, start_training  # noqa: E402
from heldout_control import CHILD, words_taken_up  # noqa: E402


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, dict]:
    """Train the real job and its control with ``seed``, at the same time; their held-out
    reports (``difference``, ``low``, ``high`` and the content-word share after)."""
    jobs = {}
    for name in ("real", "control"):
        out = Path(args.out) / f"seed-{seed}" / name
        command = ["-c", CHILD, "grpo", name, "--recipe", args.recipe]
        jobs[name] = (start_training(command, out, [f"seed={seed}", *args.overrides]), out)
    results = {}
    for name, (process, out) in jobs.items():
        code = process.wait()
        report = out / "heldout" / "report.json"
        if code != 0 or not report.exists():
            raise SystemExit(f"seed {seed}, {name}: exit {code}; see {out / 'console.log'}")
        difference = json.loads(report.read_text())["difference"]
        share = words_taken_up(out / "heldout" / "after.jsonl")
        results[name] = {**{k: difference[k] for k in ("difference", "low", "high")}, "share_after": share[0]}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="agents/smollm2-cpu-grpo.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/heldout-seeds")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    started, load_before = time.time(), os.getloadavg()
    runs = {seed: run_seed(seed, args) for seed in args.seeds}
    lines = [
        provenance(inputs=["rule-appraisal", f"recipe {args.recipe}"]),
        f"# {cpu_model()}, Python {sys.version.split()[0]}; real and control at once, OMP_NUM_THREADS=1 each",
        f"# {time.time() - started:.0f} s wall in all; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        "Held-out difference (after - before, paired by persona; 95% interval over the 16 held-out personas) "
        "and the share of held-out replies that take up a content word of the user's message after training:",
        f"{'training seed':>14}  {'real':>26}  {'control (shuffled rewards)':>28}",
    ]
    for seed, result in runs.items():
        cells = [
            f"{r['difference']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] {r['share_after']:.0%}"
            for r in (result["real"], result["control"])
        ]
        lines.append(f"{seed:>14}  {cells[0]:>26}  {cells[1]:>28}")
    for name in ("real", "control"):
        values = [runs[seed][name]["difference"] for seed in runs]
        spread = statistics.stdev(values) if len(values) > 1 else float("nan")
        lines.append(
            f"{name}: mean over {len(values)} training seeds {statistics.mean(values):+.2f}, "
            f"standard deviation across seeds {spread:.2f}; every seed's interval above 0: "
            f"{all(runs[seed][name]['low'] > 0 for seed in runs)}"
        )
    publish(lines, "heldout_seeds.txt", write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
