"""Training-step benchmark on CPU: the tiny and SmolLM2 recipes side by side.

    python benchmarks/training_cpu.py [--steps 3] [--recipes tiny smollm2 smollm2-grpo] [--write]

Each recipe runs in its own process (so peak memory is its own) for ``--steps`` steps of
its algorithm (``smollm2-grpo`` is the quick start's recipe) against its training user,
without its held-out evaluation; the first step is a warm-up and left out of the
means. Columns: generated tokens per second, seconds per step, the share of a step
spent in simulated-user calls, policy generation and the update (optimisation), and
the process's peak resident memory. The machine line gives the load average before and
after the run: on shared cores the times are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, provenance, publish  # noqa: E402

RECIPES = {
    "tiny": "agents/tiny-cpu.yaml",
    "smollm2": "agents/smollm2-cpu-ppo.yaml",
    "smollm2-grpo": "agents/smollm2-cpu-grpo.yaml",
}


def worker(recipe: str, steps: int) -> dict:
    from empathy_gym.agents import TRAINERS, load_recipe

    algorithm = "grpo" if recipe.endswith("grpo") else "ppo"
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"total_steps={steps}", f"output_dir={out}", "report_to=none", "progress=false", "save_steps=0"]
        config = load_recipe(ROOT / RECIPES[recipe], [*overrides, "heldout.bank=null"], algorithm=algorithm)
        metrics = TRAINERS[algorithm](config).train()
    timed = metrics[1:] or metrics
    mean = lambda key: sum(m[key] for m in timed) / len(timed)
    step = mean("time/step")
    return {
        "recipe": recipe,
        "tokens_per_s": mean("tokens/generated_per_second"),
        "s_per_step": step,
        "user_share": mean("time/user") / step,
        "generation_share": mean("time/generation") / step,
        "update_share": mean("time/update") / step,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps_timed": len(timed),
        "dialogues_per_step": config.rollout_batch_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--write", action="store_true", help="prepend the table to benchmarks/results/training_cpu.txt")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for recipe in args.recipes:
        out = subprocess.run(
            [sys.executable, __file__, "--worker", recipe, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        if out.returncode != 0:
            raise SystemExit(f"{recipe} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    header = (
        f"{'recipe':13}{'dialogues':>10}{'tok/s':>9}{'s/step':>9}{'user':>8}{'generate':>10}"
        f"{'update':>8}{'peak MiB':>10}"
    )
    lines = [
        provenance(inputs=[f"recipe {RECIPES[recipe]}" for recipe in args.recipes]),
        f"machine: {platform.machine()}, {cpu_model()}, Python {platform.python_version()}, torch threads "
        f"{os.environ.get('OMP_NUM_THREADS', 'default')}; load average {load_before} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after",
        header,
        "-" * len(header),
    ]
    for r in rows:
        lines.append(
            f"{r['recipe']:13}{r['dialogues_per_step']:>10}{r['tokens_per_s']:>9.1f}{r['s_per_step']:>9.2f}"
            f"{r['user_share']:>8.1%}{r['generation_share']:>10.1%}{r['update_share']:>8.1%}{r['peak_rss_mib']:>10.0f}"
        )
    lines.append(f"(means over steps 2..{args.steps}; dialogues per step; shares of the step's wall time)")
    results = ROOT / "benchmarks" / "results" / "training_cpu.txt"
    earlier = ["#", *results.read_text().splitlines()] if args.write and results.exists() else []
    publish(lines + earlier, "training_cpu.txt", write=args.write)


if __name__ == "__main__":
    main()
