"""The main recipe trained against the distilled user: is it hacked? Three training seeds,
each beside its shuffled-reward control, the rule user as the second judge.

    python benchmarks/distilled_training.py [--user distilled] [--seeds 0 1 2] [--out runs/distilled-training]
        [key=value ...]

Each run is the README's main job (``agents/smollm2-cpu-grpo.yaml``: 30 GRPO steps, the
held-out evaluation before and after on 16 personas it never trained on) with
``env.kwargs.user=distilled`` (the shipped appraiser pays the reward; ``--user`` gives
another spec, e.g. ``distilled,pessimistic=true``) and
``heldout.user=rule`` (the rule user re-judges the same held-out dialogues). The control
shuffles each step's rewards among its dialogues (``heldout_control.py``). Real and
control run at once, ``OMP_NUM_THREADS=1`` each, seed after seed.

Prints, per seed and job: the held-out difference under the distilled user and under the
rule user (95% intervals over personas), and the reward-hacking monitors of the held-out
replies before -> after (self-repeating replies, distinct-2, parroting, wrong script,
non-words, injection-like). The check: no salads after training (self-repeat share and
distinct-2 as before) and the rule user's difference not below 0.

Writes ``benchmarks/results/distilled_training.txt`` unless ``--no-write``; ``--report-only``
prints the table of the finished runs in ``--out`` without training.
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
from heldout_control import CHILD  # noqa: E402

MONITORS = (
    ("self_repeat_share", "repeat"),
    ("distinct_2", "distinct-2"),
    ("parrot_share", "parrot"),
    ("wrong_script_share", "script"),
    ("nonword_share", "non-words"),
    ("injection_share", "injection"),
)


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, dict]:
    jobs = {}
    for name in ("real", "control"):
        out = Path(args.out) / f"seed-{seed}" / name
        overrides = [f"seed={seed}", f"env.kwargs.user={args.user}", "heldout.user=rule", *args.overrides]
        process = (
            None
            if args.report_only
            else start_training(["-c", CHILD, "grpo", name, "--recipe", args.recipe], out, overrides)
        )
        jobs[name] = (process, out)
    results = {}
    for name, (process, out) in jobs.items():
        code = process.wait() if process else 0
        path = out / "heldout" / "report.json"
        if code != 0 or not path.exists():
            raise SystemExit(f"seed {seed}, {name}: exit {code}, {path} {'found' if path.exists() else 'missing'}")
        report = json.loads(path.read_text())
        results[name] = {
            "distilled": report["difference"],
            "rule": report["judge"]["difference"],
            "monitors": report["monitors"],
            "steps": report.get("steps"),
        }
    return results


def interval(difference: dict) -> str:
    return f"{difference['difference']:+.2f} [{difference['low']:+.2f}, {difference['high']:+.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="agents/smollm2-cpu-grpo.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--user", default="distilled", help="the training user's spec (distilled,pessimistic=true)")
    parser.add_argument("--out", default="runs/distilled-training")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="no training: the table of the runs in --out")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    started, load_before = time.time(), os.getloadavg()
    runs = {seed: run_seed(seed, args) for seed in args.seeds}
    lines = [
        provenance(inputs=["rule-user", "distilled", f"recipe {args.recipe}"]),
        f"# {cpu_model()}, Python {sys.version.split()[0]}; real and control at once, OMP_NUM_THREADS=1 each",
        f"# --report-only: the runs in {args.out}, trained earlier"
        if args.report_only
        else f"# {time.time() - started:.0f} s wall in all; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"# training user: {args.user} (the shipped appraiser); second judge: heldout.user=rule",
        "",
        "Held-out difference (after - before, paired by persona; 95% interval over the 16 held-out personas):",
        f"{'seed':>4} {'job':8} {'distilled user (trained on)':>30} {'rule user (second judge)':>30}",
    ]
    for seed, result in runs.items():
        for name, job in result.items():
            lines.append(f"{seed:>4} {name:8} {interval(job['distilled']):>30} {interval(job['rule']):>30}")
    lines += ["", "Reward-hacking monitors of the held-out replies, before -> after (shares of replies; distinct-2):"]
    lines.append(f"{'seed':>4} {'job':8} " + " ".join(f"{label:>14}" for _, label in MONITORS))
    for seed, result in runs.items():
        for name, job in result.items():
            before, after = job["monitors"]["before"], job["monitors"]["after"]
            cells = [f"{before[f'monitor/{key}']:.2f} -> {after[f'monitor/{key}']:.2f}" for key, _ in MONITORS]
            lines.append(f"{seed:>4} {name:8} " + " ".join(f"{cell:>14}" for cell in cells))
    for judge in ("distilled", "rule"):
        values = [runs[seed]["real"][judge]["difference"] for seed in runs]
        spread = statistics.stdev(values) if len(values) > 1 else float("nan")
        lines.append(
            f"real runs under the {judge} user: mean {statistics.mean(values):+.2f} over {len(values)} seeds "
            f"(standard deviation {spread:.2f}); every interval's low end >= 0: "
            f"{all(runs[seed]['real'][judge]['low'] >= 0 for seed in runs)}"
        )
    publish(lines, "distilled_training.txt", write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
