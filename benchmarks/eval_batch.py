"""A local policy's evaluation, its dialogues played together against one at a time, side
by side in one run: the command a training run suggests next
(``empathy-gym eval --policy hf:smollm2,... --personas en --max-tokens 64``) on its first
``--limit`` personas.

    python benchmarks/eval_batch.py [--limit 4] [--rounds 2] [--no-write]

Each round runs ``evaluate`` twice in this process, alternating: ``batch_size=1`` (one
dialogue at a time: every policy step and every appraisal is a batch of one) and
``batch_size=limit`` (every running dialogue's reply in one ``generate`` call, as
``eval`` does by default with its 32). Both play the same dialogues with the same seeds
against the rule user. Prints, per setting: seconds, turns played, turns per second, the
Sentient score, and whether the two transcripts are the same (per-row seeded sampling
makes them so up to the float noise of different batch widths, which can flip a token).
From the batched rate it prints what the suggested command (48 personas, up to 9 turns
each) takes at most on this machine. Writes ``benchmarks/results/eval_batch.txt`` unless
``--no-write``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, provenance, publish  # noqa: E402

from empathy_gym.evaluation.benchmark import evaluate  # noqa: E402
from empathy_gym.evaluation.policies import BackendPolicy, load_transformers_policy  # noqa: E402

PERSONAS, MAX_TOKENS, SUGGESTED_TURNS = "en", 64, 48 * 9


def one_run(policy: BackendPolicy, limit: int, batch_size: int) -> dict:
    started = time.perf_counter()
    result = evaluate(policy, PERSONAS, user="rule", limit=limit, batch_size=batch_size, seed=0, max_tokens=MAX_TOKENS)
    seconds = time.perf_counter() - started
    turns = sum(len(record["steps"]) for record in result.records)
    replies = [step["utterance"] for record in result.records for step in record["steps"]]
    return {"seconds": seconds, "turns": turns, "score": result.report["sentient_score"], "replies": replies}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    backend = load_transformers_policy("smollm2", device="cpu", dtype="float32")
    policy = BackendPolicy(backend, max_tokens=MAX_TOKENS, temperature=0.7, name="hf:smollm2")
    runs: dict[int, list[dict]] = {1: [], args.limit: []}
    for _ in range(args.rounds):
        for batch_size in runs:
            backend.prefix_cache.clear()
            runs[batch_size].append(one_run(policy, args.limit, batch_size))
    lines = [
        "# A local policy's evaluation: dialogues together against one at a time (benchmarks/eval_batch.py)",
        provenance(no_inputs="a timing of a local policy's evaluation; its replies are compared within the run"),
        f"# machine: {cpu_model()}; load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"# hf:smollm2 (no adapter), --personas {PERSONAS} --limit {args.limit} --max-tokens {MAX_TOKENS}, rule user, "
        f"seed 0; {args.rounds} rounds, the settings alternating",
        "",
        f"{'batch_size':>10} {'round':>5} {'seconds':>8} {'turns':>5} {'turns/s':>8} {'score':>6}",
    ]
    for batch_size, results in runs.items():
        for index, run in enumerate(results):
            lines.append(
                f"{batch_size:>10} {index:>5} {run['seconds']:8.1f} {run['turns']:>5} "
                f"{run['turns'] / run['seconds']:8.2f} {run['score']:6.1f}"
            )
    alone, together = runs[1], runs[args.limit]
    best = min(together, key=lambda run: run["seconds"])
    same = sum(a == b for a, b in zip(alone[0]["replies"], together[0]["replies"]))
    lines += [
        f"same replies in both settings: {same} of {len(together[0]['replies'])}",
        f"together / one at a time, best rounds: {min(r['seconds'] for r in alone) / best['seconds']:.2f}x faster",
        f"the suggested command (48 personas, at most {SUGGESTED_TURNS} turns, batch 32) at this machine's batched "
        f"rate: at most about {SUGGESTED_TURNS / (best['turns'] / best['seconds']) / 60:.0f} minutes "
        f"(a batch of 32 runs faster per turn than one of {args.limit}; longer dialogues slower)",
    ]
    publish(lines, "eval_batch.txt", write=not args.no_write)
    policy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
