"""Where a rule-user step goes: the parts of one env step on the English bank of
``benchmarks/env_overhead.py`` (each utterance once, caches emptied first), timed apart.

    python benchmarks/rule_user_parts.py [--texts 20000] [--no-pin]

Rows (microseconds per utterance, best of 3, one process pinned to CPU 0):

* ``env step``: the whole ``gym.make("EmpathyDialogue-v0", personas="en")`` step, as
  env_overhead.py's ``rule user, en bank`` row.
* ``scan``: ``LanguageRules.scan`` (units, tokens, word verdicts), no lexicon.
* ``17 lexicon scans``: each cue lexicon's ``findall`` on the normalised text, as
  ``Scan.find`` runs them (every step needs all 17: 9 tone features, 8 intentions).
* ``17 scans of an empty lexicon``: the same patterns with a body that never matches
  (the word-start look-behind and end check kept): what ``re`` spends per lexicon only to
  walk the text, whatever the lexicon holds.
* ``repeats_itself``, ``find_injection``: the self-repetition guard and the env's
  injection check.

The rest of the step (features, weights, guards, thoughts, the reply, the env's
bookkeeping) is the whole step minus these rows.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable

import gymnasium as gym
from _machine import cpu_model  # benchmarks/_machine.py
from env_overhead import EN, forget_texts, run_steps, utterances

import empathy_gym  # noqa: F401  (registers the ids)
from empathy_gym.boundary import find_injection
from empathy_gym.user.rule_lexicon import RULES_DIR, LanguageRules, load_rules, normalise
from empathy_gym.user.rule_user import repeats_itself

LOOK_BEHIND = "(?<![a-z0-9])"


def per_text(texts: list[str], work: Callable[[LanguageRules, str], object], repeats: int) -> float:
    """Best-of-``repeats`` microseconds per text of ``work(english_rules, text)``, with
    freshly loaded rules each round (no text analysed yet; compiling is not timed)."""
    best = float("inf")
    for _ in range(repeats):
        forget_texts()
        english = load_rules(str(RULES_DIR))["en"]
        started = time.perf_counter()
        for text in texts:
            work(english, text)
        best = min(best, time.perf_counter() - started)
    return best / len(texts) * 1e6


def empty_lexicon(pattern: re.Pattern) -> re.Pattern:
    """An English lexicon's compiled pattern (``LanguageRules._compile``: look-behind,
    body, end check) with a body that never matches."""
    text = pattern.pattern
    if not text.startswith(LOOK_BEHIND):
        raise ValueError(f"not an English lexicon pattern: {text[:40]!r}")
    return re.compile(LOOK_BEHIND + "(?:(?!x)x)" + text[text.rindex("(?:(?<!") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    texts = utterances(EN, "en")[: args.texts]
    lows = [normalise(text) for text in texts]
    patterns = list(load_rules(str(RULES_DIR))["en"].patterns.values())
    empty = [empty_lexicon(pattern) for pattern in patterns]

    rows = {}
    rounds = []
    for _ in range(args.repeats):
        forget_texts()
        env = gym.make("EmpathyDialogue-v0", personas="en")
        rounds.append(run_steps(env, lambda i: texts[i], len(texts)))
    rows["env step (rule user, en bank)"] = min(rounds) / len(texts) * 1e6
    rows["scan (units, tokens, word verdicts)"] = per_text(texts, lambda rules, t: rules.scan(t), args.repeats)
    rows[f"{len(patterns)} lexicon scans"] = per_text(
        lows, lambda _, low: [p.findall(low) for p in patterns], args.repeats
    )
    rows[f"{len(empty)} scans of an empty lexicon (re's walk)"] = per_text(
        lows, lambda _, low: [p.findall(low) for p in empty], args.repeats
    )
    rows["repeats_itself"] = per_text(texts, lambda _, t: repeats_itself("en", t), args.repeats)
    rows["find_injection"] = per_text(texts, lambda _, t: find_injection(t), args.repeats)
    print(f"machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{len(texts)} utterances of the en bank, each once; best of {args.repeats}\n")
    width = max(map(len, rows))
    for name, micros in rows.items():
        print(f"{name.ljust(width)}  {micros:7.1f} us")
    parts = sum(micros for name, micros in rows.items() if not name.startswith(("env", f"{len(empty)} scans")))
    print(f"{'the rest of the step'.ljust(width)}  {rows['env step (rule user, en bank)'] - parts:7.1f} us")


if __name__ == "__main__":
    main()
