"""Bad replies against a plain caring reply in the same context, judge by judge (issue 36's
"must": each kind below the caring reply in at least 95% of contexts).

    python benchmarks/distilled_probes.py [--no-write]

Contexts: the 16 English personas the quick start holds out (never in the distilled
appraiser's training) and the 8 Chinese ones of the ``zh`` bank, each at its opening and
at its second turn (after the scripted listener's reply and the rule user's answer); and
SAGE's 100 profiles at their opening line (those openings are in SAGE's logs, so the
appraiser saw these contexts, with other replies). In each, a caring reply and one reply
of every bad kind (:mod:`empathy_gym.user.probes`); the change is what the env pays
(``respond`` under SAGE's protocol). A kind's share: the contexts where its reply got a
lower change than the caring one (a tie is not below).

Writes ``benchmarks/results/distilled_probes.txt`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _machine import cpu_model  # noqa: E402

from empathy_gym.evaluation.baselines import ListenerAgent  # noqa: E402
from empathy_gym.personas import builtin_bank  # noqa: E402
from empathy_gym.user.base import UserRequest  # noqa: E402
from empathy_gym.user.distill_rows import english_bank_split  # noqa: E402
from empathy_gym.user.probes import BAD_KINDS, below_caring  # noqa: E402
from empathy_gym.user.protocol import SAGE  # noqa: E402
from empathy_gym.user.rule_user import RuleUser  # noqa: E402
from empathy_gym.user.specs import UserSpec  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "distilled_probes.txt"
JUDGES = ("distilled", "rule", "rule,difficulty=challenging")


def contexts(personas, turns: int) -> list[UserRequest]:
    """Each persona at turns 1..``turns``: the opening, then the listener's reply and the rule user's answer."""
    user, agent, out = RuleUser(), ListenerAgent(), []
    for persona in personas:
        history = [("user", user.opening([persona], [0])[0])]
        for turn in range(1, turns + 1):
            out.append(UserRequest(persona, tuple(history), "", 40, turn))
            messages = [{"role": "user" if r == "user" else "assistant", "content": t} for r, t in history]
            reply = agent(messages)
            [answer] = user.respond([UserRequest(persona, tuple(history), reply, 40, turn)], SAGE)
            history += [("agent", reply), ("user", answer.reply)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.time()
    sets = {
        "en held out (16 x 2 turns)": contexts(english_bank_split(0)[1], 2),
        "zh bank (8 x 2 turns)": contexts(builtin_bank("zh"), 2),
        "SAGE openings (100, seen)": contexts(builtin_bank("sage"), 1),
    }
    header = f"{'judge':30s} {'contexts':28s} " + " ".join(f"{k[:9]:>9s}" for k in (*BAD_KINDS, "all"))
    lines = [
        "# Bad replies against a plain caring reply (benchmarks/distilled_probes.py)",
        f"# run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, command: python "
        "benchmarks/distilled_probes.py",
        f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "# share of contexts where the bad reply's change is below the caring reply's (goal: >= 0.95 for every kind)",
        "",
        header,
    ]
    for spec in JUDGES:
        user = UserSpec.parse(spec).build()
        for name, requests in sets.items():
            shares = below_caring(user, requests)
            cells = " ".join(f"{shares[k]:9.2f}" for k in (*BAD_KINDS, "all"))
            lines.append(f"{spec:30s} {name:28s} {cells}")
        user.close()
    lines.append(f"took {time.time() - started:.0f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        OUT.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
