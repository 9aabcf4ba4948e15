"""What the distilled user costs, side by side in one run: appraisals per second of the rule
user, the distilled user and the SmolLM2 LLM user, and the quick start's training step
against the rule user and against the distilled user.

    python benchmarks/distilled_cost.py [--batches 6] [--steps 4] [--no-write]

Part 1, the quick start's batch and dialogue length: batches of 8 requests (2 personas of
the English bank's training split x 4 replies, as GRPO's 2 groups of 4), each the
persona's opening line and a reply of at most 40 tokens (the scripted listener's and
ESConv's, a sentence of them, and a longer caring reply), the personas new in every
batch. Rates are over ``--batches`` batches after a warm-up batch (which also builds the
model). Users: ``rule``; ``distilled`` (the shipped appraiser; its prefix cache keeps a
persona's opening between the 4 replies); ``transformers:smollm2,appraisal_mode=choice``
(one forward pass over the LLM user's prompt, the cheapest LLM appraisal: the free mode
also generates its analysis).

Part 2: the quick start's recipe (``agents/smollm2-cpu-grpo.yaml``) for ``--steps`` steps
without its held-out evaluation, ``env.kwargs.user=rule`` and then ``=distilled``, each in
its own process; the first step is a warm-up and left out.

Writes ``benchmarks/results/distilled_cost.txt`` (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _machine import cpu_model  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "distilled_cost.txt"
USERS = ("rule", "distilled", "transformers:smollm2,appraisal_mode=choice")
REPLIES = (
    "It sounds like that was really hard. What has been weighing on you the most?",
    "I'm so sorry. That sounds exhausting, and it makes sense that you feel worn down.",
    "That must have hurt. Do you want to tell me what happened next?",
    "I hear you. It's a lot to carry alone, and you don't have to have it all figured out tonight.",
)


def batches(count: int) -> list[list]:
    from empathy_gym.personas import builtin_bank, split_personas
    from empathy_gym.user.base import UserRequest
    from empathy_gym.user.rule_user import RuleUser

    personas = split_personas(builtin_bank("en"), 0.25, seed=0)[0]
    opening = RuleUser().opening
    out = []
    for index in range(count):
        pair = personas[2 * index % len(personas) : 2 * index % len(personas) + 2]
        out.append(
            [
                UserRequest(p, (("user", opening([p], [0])[0]),), reply, 40, 1, seed=k)
                for p in pair
                for k, reply in enumerate(REPLIES)
            ]
        )
    return out


def appraisal_rate(spec: str, count: int) -> dict:
    from empathy_gym.user.specs import UserSpec

    work = batches(count + 1)
    started = time.perf_counter()
    user = UserSpec.parse(spec).build()
    user.appraise(work[0])
    warm = time.perf_counter() - started
    started = time.perf_counter()
    for batch in work[1:]:
        user.appraise(batch)
    seconds = time.perf_counter() - started
    user.close()
    appraisals = sum(len(batch) for batch in work[1:])
    return {"user": spec, "per_s": appraisals / seconds, "ms_each": 1000 * seconds / appraisals, "first_s": warm}


def step_time(user: str, steps: int) -> dict:
    from empathy_gym.agents import GRPOTrainer, load_recipe

    with tempfile.TemporaryDirectory() as out:
        overrides = [f"total_steps={steps}", f"output_dir={out}", "report_to=none", "progress=false", "save_steps=0"]
        overrides += ["heldout.bank=null", f"env.kwargs.user={user}"]
        config = load_recipe(ROOT / "agents" / "smollm2-cpu-grpo.yaml", overrides, algorithm="grpo")
        metrics = GRPOTrainer(config).train()
    timed = metrics[1:] or metrics
    mean = lambda key: sum(m[key] for m in timed) / len(timed)
    return {"user": user, "s_per_step": mean("time/step"), "user_s": mean("time/user"), "steps": len(timed)}


def child(kind: str, argument: str, count: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", kind, argument, "--batches", str(count), "--steps", str(count)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} {argument} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, argument = args.worker
        result = appraisal_rate(argument, args.batches) if kind == "rate" else step_time(argument, args.steps)
        print(json.dumps(result))
        return
    load_before = os.getloadavg()
    rates = [child("rate", spec, args.batches) for spec in USERS]
    steps = [child("step", user, args.steps) for user in ("rule", "distilled")]
    lines = [
        "# What the distilled user costs (benchmarks/distilled_cost.py)",
        f"# run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, command: python "
        f"benchmarks/distilled_cost.py --batches {args.batches} --steps {args.steps}",
        f"# machine: {cpu_model()}; torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}; load average "
        f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after",
        "",
        f"appraisals at the quick start's batch (8: 2 personas x 4 replies, 1 turn), {args.batches} batches, "
        "new personas each",
        f"{'user':46s} {'appraisals/s':>12s} {'ms each':>8s} {'first batch s':>14s}",
    ]
    lines += [f"{r['user']:46s} {r['per_s']:12.1f} {r['ms_each']:8.1f} {r['first_s']:14.1f}" for r in rates]
    lines += [
        "",
        f"the quick start's recipe, {args.steps} GRPO steps (the first left out), no held-out evaluation",
        f"{'env.kwargs.user':46s} {'s/step':>12s} {'user s':>8s}",
    ]
    lines += [f"{s['user']:46s} {s['s_per_step']:12.2f} {s['user_s']:8.2f}" for s in steps]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        OUT.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
