"""The time a training run prints for the evaluation it suggests next, against the time that
evaluation takes: ``eval_time_bound`` from the run's own ``metrics.jsonl``, then the
suggested command itself (``empathy-gym eval --policy hf:smollm2,adapter=... --personas en
--max-tokens 64``), timed end to end, for the trained adapter and for the untrained model.

    python benchmarks/eval_time.py RUN_DIR [--no-write]

RUN_DIR: a finished run of the README's main command (``agents/smollm2-cpu-grpo.yaml``).
Writes ``benchmarks/results/eval_time.txt`` unless ``--no-write``.
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
from _machine import cpu_model, provenance, publish  # noqa: E402

from empathy_gym.agents.checkpoint import latest_checkpoint  # noqa: E402
from empathy_gym.agents.cli import EVAL_MAX_TOKENS, eval_time_bound  # noqa: E402


def timed_eval(policy: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = ["empathy-gym", "eval", "--policy", policy, "--personas", "en"]
        command += ["--max-tokens", str(EVAL_MAX_TOKENS), "--out", out]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        seconds = time.perf_counter() - started
        report = json.loads((Path(out) / "report.json").read_text())
    return {"seconds": seconds, "turns": report["mean_turns"] * report["dialogues"], "score": report["sentient_score"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    checkpoint = latest_checkpoint(args.run_dir / "checkpoints")
    if checkpoint is None:
        parser.error(f"{args.run_dir}: no checkpoint; run the README's main command first")
    bound = eval_time_bound(args.run_dir / "metrics.jsonl", EVAL_MAX_TOKENS)
    load_before = os.getloadavg()
    rows = []
    for name, policy in (
        ("trained (step-30 adapter)", f"hf:smollm2,adapter={checkpoint / 'policy'}"),
        ("untrained SmolLM2", "hf:smollm2"),
    ):
        rows.append((name, timed_eval(policy)))
    load_after = os.getloadavg()
    lines = [
        "# The time a training run prints for its suggested evaluation, against that evaluation's time "
        "(benchmarks/eval_time.py)",
        provenance(no_inputs="a timing of the suggested evaluation; the bound is read from the run's metrics"),
        f"# machine: {cpu_model()}; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in load_after)}",
        f"# training run: {args.run_dir} (the README's main command); it printed: {bound}",
        "# each row: empathy-gym eval --policy POLICY --personas en --max-tokens 64 (48 dialogues, rule user), "
        "wall time with model loading",
        "",
        f"{'policy':<28} {'seconds':>8} {'minutes':>8} {'turns':>6} {'score':>6}",
    ]
    for name, row in rows:
        lines.append(
            f"{name:<28} {row['seconds']:8.1f} {row['seconds'] / 60:8.1f} {row['turns']:6.0f} {row['score']:6.1f}"
        )
    publish(lines, "eval_time.txt", write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
