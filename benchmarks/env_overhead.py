"""Environment overhead: EmpathyDialogue-v0's step beside Gymnasium's CartPole-v1.

    python benchmarks/env_overhead.py [--seconds 3] [--no-pin]

One process, pinned to CPU 0 (``os.sched_setaffinity``), so the numbers are for one
core. Rows:

* ``rule user``: ``gym.make("EmpathyDialogue-v0", personas=...)`` stepped with utterances
  the user has never seen (each one used once; the rule user caches the analysis of a
  text it saw before, so recycling a few utterances would flatter it; each measurement
  empties those caches first), English and Chinese banks. Goal: >= 5,000 steps/s.
* ``outside the backend``: the same env with a :class:`ScriptedUser` (its appraisal is a
  list lookup); the time inside ``user.respond`` is measured and subtracted, leaving
  what the env itself costs per step (action check, think split, request, bookkeeping,
  info). Goal: within 5x of CartPole-v1's step.
* ``CartPole-v1``: ``gym.make("CartPole-v1")`` with alternating actions: Gymnasium's
  own reference for a cheap step, through the same default wrappers (order enforcing,
  passive env checker).
* ``vector env``: ``gym.make_vec("EmpathyDialogue-v0", num_envs=16)`` with the rule user,
  counted in dialogue-steps per second (16 per vector step).

Columns: steps per second, microseconds per step, and the ratio to CartPole-v1's step.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from _machine import cpu_model  # benchmarks/_machine.py

import empathy_gym  # noqa: F401  (registers the ids)
from empathy_gym.user.rule_lexicon import load_rules
from empathy_gym.user.scripted import ScriptedUser

EN = (
    [
        "That sounds really hard.",
        "I hear you.",
        "It makes sense that you feel this way.",
        "That must have been exhausting.",
        "Thank you for telling me.",
        "No wonder you're upset.",
        "I can only imagine how that felt.",
        "That's a lot to carry.",
        "You did your best.",
        "It wasn't your fault.",
        "That seems so unfair.",
        "I'm sorry you went through that.",
        "You kept going anyway.",
        "That took real patience.",
        "Anyone would feel hurt.",
        "You had every right to be angry.",
        "It sounds lonely.",
        "That is a heavy week.",
        "You were in a tough spot.",
        "Your feelings make sense.",
        "Looking back, it was a lot.",
        "Part of this is on them.",
        "You handled a hard moment.",
        "That would sting anyone.",
        "It's been weighing on you.",
        "I'm listening.",
        "Take your time.",
        "This clearly matters to you.",
        "You stood up for yourself.",
        "It seems confusing.",
    ],
    [
        "What happened next",
        "How did your manager react",
        "What do you think you need now",
        "Which part hurts the most",
        "How are you sleeping these days",
        "What would help a little",
        "What did your friend say afterwards",
        "How do you see it now",
        "What stands out to you",
        "What would you like them to understand",
        "How long has this been going on",
        "What did you try already",
        "Who else knows about it",
        "What matters most to you here",
        "How did the meeting end",
        "What made it worse",
        "What do you wish had happened",
        "How did your family take it",
        "What was going through your mind",
        "Which moment keeps coming back",
        "What would a good outcome look like",
        "How did you manage that day",
        "What do you make of their reaction",
        "What part did the others play",
        "How does your body feel about it",
        "What did you learn about yourself",
        "How did you keep going",
        "What is the next step",
        "What would you tell a friend",
        "How did it start",
    ],
    [
        "",
        " at work",
        " with your family",
        " this week",
        " after all that",
        " on your own",
        " in the end",
        " right now",
        " at home",
        " since then",
        " with them",
        " today",
        " last month",
        " at school",
        " in that moment",
        " before the call",
        " on Sunday",
        " after the shift",
        " during the talk",
        " the next morning",
        " so far",
        " lately",
        " at the time",
        " in the office",
        " over dinner",
        " on the phone",
        " by then",
        " these days",
        " at night",
        " over the weekend",
    ],
)
ZH = (
    [
        "这确实很不容易。",
        "我在听。",
        "难怪你会难过。",
        "辛苦你了。",
        "谢谢你愿意说出来。",
        "这真的让人委屈。",
        "你已经尽力了。",
        "这不是你的错。",
        "听起来压力很大。",
        "换作是谁都会难受。",
        "你的感受很正常。",
        "这段时间一定很累。",
        "你一直在坚持。",
        "我能理解你的心情。",
        "这件事真的很难。",
    ],
    [
        "后来发生了什么",
        "你现在最需要什么",
        "哪一部分最让你难受",
        "你自己怎么看",
        "家里人怎么说",
        "你试过哪些办法",
        "你最希望他们明白什么",
        "那天是怎么结束的",
        "你觉得下一步是什么",
        "你学到了什么",
        "什么让事情变得更糟",
        "你当时在想什么",
        "这种情况持续多久了",
        "你身边还有谁知道",
        "你怎么撑过来的",
    ],
    [
        "？",
        "呢？",
        "，能说说吗？",
        "，你愿意聊聊吗？",
        "，慢慢说？",
        "，可以告诉我吗？",
        "，你觉得呢？",
        "，想说说吗？",
        "，方便讲讲吗？",
        "，现在呢？",
        "，那时候呢？",
        "，后来呢？",
        "，最近呢？",
        "，在家里呢？",
        "，在单位呢？",
    ],
)


def utterances(parts: tuple[list[str], list[str], list[str]], language: str) -> list[str]:
    """Every combination of the three parts, once each, in a fixed shuffled order."""
    joiner = " " if language == "en" else ""
    texts = [f"{a}{joiner}{b}{c}{'?' if language == 'en' else ''}" for a, b, c in itertools.product(*parts)]
    order = np.random.default_rng(0).permutation(len(texts))
    return [texts[i] for i in order]


def machine() -> str:
    cpu = cpu_model()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return (
        f"{cpu}; pinned to CPUs {affinity}; Python "
        f"{platform.python_version()}; gymnasium {gym.__version__}; numpy {np.__version__}"
    )


def forget_texts() -> None:
    """Empty the rule user's caches of analysed texts. They live with the compiled lexicons,
    which ``load_rules`` keeps for the whole process, so without this a second measurement
    would find every utterance already scanned (best-of-3 read 1.7x too fast before)."""
    load_rules.cache_clear()


def run_steps(env: gym.Env, actions: Callable[[int], object], n: int) -> float:
    """Step ``n`` times (resetting at episode ends, reset time included); seconds."""
    env.reset(seed=0)
    started = time.perf_counter()
    for i in range(n):
        _, _, terminated, truncated, _ = env.step(actions(i))
        if terminated or truncated:
            env.reset()
    return time.perf_counter() - started


class TimedUser(ScriptedUser):
    """A ScriptedUser that adds up the seconds spent in ``respond`` and ``opening``."""

    seconds = 0.0

    def respond(self, requests, protocol):
        started = time.perf_counter()
        out = super().respond(requests, protocol)
        self.seconds += time.perf_counter() - started
        return out

    def opening(self, personas, seeds):
        started = time.perf_counter()
        out = super().opening(personas, seeds)
        self.seconds += time.perf_counter() - started
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to CPU 0")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    best = lambda f: min(f() for _ in range(args.repeats))  # noqa: E731

    rows: list[tuple[str, float]] = []  # (name, seconds per step)
    cartpole = gym.make("CartPole-v1")
    cart = best(lambda: run_steps(cartpole, lambda i: i % 2, args.steps)) / args.steps
    for language, parts in (("en", EN), ("zh", ZH)):
        texts = utterances(parts, language)
        n = min(args.steps, len(texts))

        def rule(language: str = language, texts: list[str] = texts, n: int = n) -> float:
            forget_texts()
            env = gym.make("EmpathyDialogue-v0", personas=language)
            return run_steps(env, lambda i: texts[i], n)

        rows.append((f"rule user, {language} bank, unseen utterances", best(rule) / n))

    user = TimedUser([5, -5, 0, 5, -5])
    scripted = gym.make("EmpathyDialogue-v0", personas="en", user=user)
    texts = utterances(EN, "en")

    def outside() -> float:
        user.seconds = 0.0
        total = run_steps(scripted, lambda i: texts[i % len(texts)], args.steps)
        return (total - user.seconds) / args.steps

    def scripted_total() -> float:
        return run_steps(scripted, lambda i: texts[i % len(texts)], args.steps) / args.steps

    rows.append(("ScriptedUser, whole step", best(scripted_total)))
    rows.append(("outside the backend (ScriptedUser step - user time)", best(outside)))
    rows.append(("CartPole-v1 (gym.make)", cart))

    texts = utterances(EN, "en")
    vector_steps = max(1, min(args.steps, len(texts)) // 16)

    def vector_run() -> float:
        forget_texts()
        vector = gym.make_vec("EmpathyDialogue-v0", num_envs=16, personas="en")
        vector.reset(seed=0)
        started = time.perf_counter()
        for i in range(vector_steps):
            vector.step(texts[16 * i : 16 * i + 16])
        return (time.perf_counter() - started) / (16 * vector_steps)

    rows.append(("vector env, 16 dialogues, rule user (per dialogue-step)", best(vector_run)))

    print(f"machine: {machine()}")
    print(f"{args.steps} steps per measurement, best of {args.repeats}\n")
    width = max(len(name) for name, _ in rows)
    print(f"{'measurement'.ljust(width)}  steps/s   us/step  x CartPole")
    for name, seconds in rows:
        print(f"{name.ljust(width)}  {1 / seconds:7.0f}  {seconds * 1e6:8.1f}  {seconds / cart:10.1f}")
    rule_rate = min(1 / s for name, s in rows if name.startswith("rule user"))
    overhead = dict(rows)["outside the backend (ScriptedUser step - user time)"] / cart
    print(
        f"\ngoal >= 5,000 steps/s with the rule user: {'met' if rule_rate >= 5000 else 'MISSED'} "
        f"({rule_rate:,.0f} steps/s, the slower bank)"
    )
    print(
        f"goal outside-the-backend step within 5x CartPole-v1: {'met' if overhead <= 5 else 'MISSED'} ({overhead:.1f}x)"
    )


if __name__ == "__main__":
    main()
