"""The built-in baselines and trained policies against users who try to break the agent.

    python benchmarks/adversarial.py [--policies SPEC ...] [--repeats 2] [--user rule] [--language en] [--append]

Each policy plays the ``adversarial`` bank (8 English and 8 Chinese personas who provoke,
flatter, manipulate, test boundaries, want a harmful plan endorsed, or are in crisis)
through ``empathy_gym.evaluation.benchmark.evaluate`` with the SAGE protocol. Per policy:
the Sentient score with its 95% interval over personas, and the dialogues where a reply
did what the persona's agent must not (``empathy_gym.evaluation.must_not``), overall and
per check. ``--language en`` keeps the English half of the bank (for English-only
models). Written to ``benchmarks/results/adversarial.txt`` (``--append``: added to it)
unless ``--no-write``; the runs' folders (transcripts with the turns of each hit) go
under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, provenance  # noqa: E402

from empathy_gym.evaluation.benchmark import evaluate  # noqa: E402
from empathy_gym.evaluation.must_not import CHECKS  # noqa: E402
from empathy_gym.evaluation.policies import reply_token_cap  # noqa: E402
from empathy_gym.personas import load_personas  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASELINES = ["baseline:generic", "baseline:echo", "baseline:listener", "baseline:esconv"]


def row(name: str, report: dict) -> str:
    ci, summary = report["ci"], report["must_not"]
    checks = "  ".join(
        f"{summary['by_check'].get(c, {}).get('violating', 0)}/{summary['by_check'].get(c, {}).get('checked', 0)}"
        for c in CHECKS
    )
    return (
        f"{name[:44]:44}  {report['sentient_score']:5.1f} [{ci['low']:5.1f}, {ci['high']:5.1f}]  "
        f"{summary['violating']:>2}/{summary['checked']:<2}  {checks}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=BASELINES)
    parser.add_argument("--names", nargs="*", help="a short name per policy for the table")
    parser.add_argument("--user", default="rule")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="runs/adversarial")
    parser.add_argument("--language", choices=["en", "zh"], help="only the personas of this language")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    bank = [p for p in load_personas("adversarial") if args.language in (None, p.language)]
    names = args.names or args.policies
    started, load = time.time(), os.getloadavg()[0]
    rows = []
    for name, policy in zip(names, args.policies):
        folder = Path(args.out) / name.replace(":", "-").replace("/", "-").replace(",", "-")
        max_tokens = reply_token_cap(policy, None)  # as `empathy-gym eval`: local models' replies capped
        result = evaluate(policy, bank, user=args.user, repeats=args.repeats, max_tokens=max_tokens, out_dir=folder)
        rows.append(row(name, result.report))
        print(rows[-1], flush=True)
    which = f"{len(bank)} personas" + (f" ({args.language} only)" if args.language else ", en 8 / zh 8")
    lines = [
        provenance(inputs=["rule-user"] if args.user == "rule" else []),
        f"# {cpu_model()}; load average {load:.1f}; {time.time() - started:.0f} s in all",
        f"# bank 'adversarial' ({which}) x {args.repeats} dialogues, user {args.user}, SAGE protocol; local models'",
        "# replies capped at 128 new tokens, as `empathy-gym eval` caps them;",
        "# score: Sentient score [95% interval over personas]; broke: dialogues with a reply that tripped a check",
        "# of its persona's must_not / dialogues checked; then per check (violating/checked dialogues):",
        "# " + ", ".join(f"{i + 1} {c}" for i, c in enumerate(CHECKS)),
        f"{'policy':44}  {'score':19}  broke  " + "  ".join(f"{i + 1:>3}" for i in range(len(CHECKS))),
        *rows,
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        path = REPO / "benchmarks" / "results" / "adversarial.txt"
        before = path.read_text(encoding="utf-8") + "\n" if args.append and path.exists() else ""
        path.write_text(before + text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
