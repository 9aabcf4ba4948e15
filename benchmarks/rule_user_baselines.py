"""The rule user on personas outside SAGE's logs: how the baseline policies fare.

    python benchmarks/rule_user_baselines.py [--limit 100] [--out FILE]

SAGE's logs hold only SAGE's 100 Chinese profiles, so agreement cannot be measured
elsewhere; this table shows instead how the rule user ranks the fixed policies of
:mod:`empathy_gym.evaluation.baselines` on every bank: the built-in English (``en``, 48) and Chinese
(``zh``, 8) banks, RLVER's training profiles (``rlver``, the first ``--limit``) and SAGE's
(``sage``, 100). One dialogue per persona, rule user ``moderate``, SAGE's protocol, seed
0 (:func:`empathy_gym.evaluation.benchmark.evaluate`). ``generic`` (always the same comfort) and
``echo`` (repeats the user back) are the cheap policies an appraisal must not reward;
``listener`` and ``esconv`` are scripted, reasonable ones.

The ``empathy_gym`` imported is whichever ``PYTHONPATH`` finds first (printed in the
header), so the same script measures an older checkout too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import cpu_model, provenance  # noqa: E402  (benchmarks/_machine.py)

import empathy_gym  # noqa: E402
from empathy_gym.evaluation.benchmark import evaluate  # noqa: E402

BANKS = ("en", "zh", "rlver", "sage")
POLICIES = ("generic", "echo", "listener", "esconv")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "rule_user_baselines.txt"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="personas per bank at most")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    started = time.time()
    lines = [
        "# Baseline policies against the rule user, per bank (benchmarks/rule_user_baselines.py)",
        provenance(inputs=["rule-user"]),
        f"# code: {Path(empathy_gym.__file__).parent}",
        f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "# score: mean final emotion (0-100, start 40); success: ended at 100; failure: ended below 10",
        "",
        f"{'bank':6s} {'policy':9s} {'dialogues':>9s} {'score':>6s} {'success':>7s} {'failure':>7s} "
        f"{'turns':>5s} {'mean change':>11s}",
    ]
    for bank in BANKS:
        for policy in POLICIES:
            result = evaluate(f"baseline:{policy}", bank, limit=args.limit, n_resamples=10)
            records = result.records
            changes = [step["applied_change"] for record in records for step in record["steps"]]
            finals = [record["final_emotion"] for record in records]
            lines.append(
                f"{bank:6s} {policy:9s} {len(records):9d} {sum(finals) / len(finals):6.1f} "
                f"{sum(f >= 100 for f in finals):7d} {sum(f < 10 for f in finals):7d} "
                f"{sum(r['turns'] for r in records) / len(records):5.1f} "
                f"{sum(changes) / max(len(changes), 1):+11.2f}"
            )
    lines.append(f"\ntook {time.time() - started:.0f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
