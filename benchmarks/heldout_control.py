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
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402


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
        cmd = [
            sys.executable,
            "-m",
            "empathy_gym.agents.study",  # the study's child: the real training or its control
            args.algorithm,
            name,
            "--recipe",
            args.recipe,
            f"output_dir={out}",
            "progress=false",
            *args.overrides,
        ]
        jobs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log, out)
    codes = {}
    for name, (process, log, _) in jobs.items():
        codes[name] = process.wait()
        log.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - started
    print(f"# python benchmarks/heldout_control.py --recipe {args.recipe} {' '.join(args.overrides)}".rstrip())
    print(f"# {cpu_model()}, Python {sys.version.split()[0]}")
    print(
        f"# load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; OMP_NUM_THREADS={args.threads} per job"
    )
    print(f"# both jobs at once: {wall:.0f} s wall, {children.ru_utime + children.ru_stime:.0f} CPU-seconds together")
    for name, (_, _, out) in jobs.items():
        title = (
            "REAL: rewards as the env paid them"
            if name == "real"
            else "CONTROL: each step's rewards shuffled among its dialogues before the update"
        )
        print(f"\n## {title} (exit code {codes[name]})")
        report = out / "heldout" / "report.txt"
        print(report.read_text(encoding="utf-8").rstrip() if report.exists() else "(no report: see console.log)")
        shares = {stage: words_taken_up(out / "heldout" / f"{stage}.jsonl") for stage in ("before", "after")}
        if all(shares.values()):
            print(
                "Held-out replies that share a content word with the user's message (the rule user's echo "
                "feature; content units of empathy_gym.user.rule_lexicon): "
                + ", ".join(
                    f"{stage} {share:.0%} ({words:.2f} words a reply)" for stage, (share, words) in shares.items()
                )
            )
    return max(codes.values())


def words_taken_up(path: Path) -> tuple[float, float] | None:
    """``(share, mean)`` over the held-out dialogues in ``path``: the share of first
    replies that share at least one content unit with the user's opening message, and
    the mean number shared; ``None`` when the file is missing or empty."""
    from empathy_gym.user.rule_lexicon import RULES_DIR, load_rules

    if not path.exists():
        return None
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not records:
        return None
    rules = load_rules(str(RULES_DIR))
    shared = []
    for record in records:
        language = rules[record["language"]]
        user, reply = record["messages"][1]["content"], record["messages"][2]["content"]
        shared.append(len(language.scan(reply).content & language.units(user)[1]))
    return sum(count > 0 for count in shared) / len(shared), sum(shared) / len(shared)


if __name__ == "__main__":
    raise SystemExit(main())
