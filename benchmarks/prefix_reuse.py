"""Tokens prefilled per turn against the length of the dialogue, with and without kept
key/value states, side by side in one run.

    python benchmarks/prefix_reuse.py                      # SmolLM2 policy and SmolLM2 user
    python benchmarks/prefix_reuse.py --model tiny --turns 4

Two parts, each played twice on the same dialogues (same seeds), once reusing states
and once prefilling every prompt from scratch:

* ``policy``: the transformers engine of the trainers (``TransformersGenerator``)
  plays N dialogues against the rule-based user on the built-in English personas,
  ``--turns`` turns of at most ``--reply-tokens`` tokens. Reuse keeps each dialogue's
  states from one turn to the next (``reuse_kv``).
* ``user``: an LLM user (``TransformersBackend``, appraisal in ``choice`` mode, replies
  of at most ``--reply-tokens`` tokens) answers the listener baseline in N dialogues;
  reuse keeps the states of the persona, scene and history that its appraisal and reply
  prompts share (``prefix_cache_tokens``).

The contenders alternate ``--repeats`` times and each turn keeps its fastest time (the
cores may be shared: other processes only ever slow a run down).

Columns per turn: the mean prompt length in tokens (what a turn must read), the mean
tokens actually prefilled per dialogue without and with reuse, and the seconds of the
turn's model calls without and with reuse. The two runs produce the same tokens (the
tests check that); only the work differs.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
import transformers
from _machine import cpu_model  # benchmarks/_machine.py

from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.rollout import RolloutEngine
from empathy_gym.backends.models import load_causal_lm
from empathy_gym.backends.transformers_backend import TransformersBackend
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.evaluation.baselines import ListenerAgent
from empathy_gym.user.specs import UserSpec
from empathy_gym.vector import EmpathyDialogueVectorEnv


class TurnLog:
    """Wraps a sampler call to record, per call (one per turn), prompt tokens, prefilled
    tokens and seconds."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def wrap(self, method, cache, lengths):
        def timed(prompts, *args, **kwargs):
            before = (cache.stats.prompt_tokens, cache.stats.prefilled_tokens) if cache is not None else None
            started = time.perf_counter()
            out = method(prompts, *args, **kwargs)
            seconds = time.perf_counter() - started
            total = sum(lengths(prompts))
            prefilled = total if before is None else cache.stats.prefilled_tokens - before[1]
            self.rows.append({"dialogues": len(prompts), "prompt": total, "prefilled": prefilled, "seconds": seconds})
            return out

        return timed


def policy_part(model_name: str, n: int, turns: int, reply_tokens: int, reuse: bool) -> list[dict]:
    model, tokenizer = load_causal_lm(model_name, dtype="float32", device="cpu")
    generator = TransformersGenerator(model, tokenizer, max_new_tokens=reply_tokens, temperature=1.0, reuse_kv=reuse)
    log = TurnLog()
    generator.generate = log.wrap(generator.generate, generator.prefix_cache, lambda ps: [len(p) for p in ps])
    user = UserSpec("rule").build()
    envs = [EmpathyDialogueEnv("en", user=user, max_turns=turns) for _ in range(n)]
    RolloutEngine(envs, generator, tokenizer, max_context_tokens=8192).collect(list(range(n)))
    return log.rows


def user_part(model_name: str, n: int, turns: int, reply_tokens: int, reuse: bool) -> list[dict]:
    backend = TransformersBackend(model_name, prefix_cache_tokens=1 << 20 if reuse else 0)
    user = UserSpec(
        backend, appraisal_mode="choice", user_kwargs={"max_tokens": reply_tokens, "reply_plan": False}
    ).build()
    log = TurnLog()
    cache = backend.prefix_cache if reuse else None
    rows: list[dict] = []
    for name in ("choice_logprobs", "generate"):
        setattr(backend, name, log.wrap(getattr(backend, name), cache, backend.prompt_lengths))
    vector = EmpathyDialogueVectorEnv(n, personas="en", user=user, max_turns=turns)
    _, infos = vector.reset(seed=0)
    log.rows.clear()  # the openings are the personas' own lines: no model call worth counting
    agent = ListenerAgent()
    for _ in range(turns):
        actions = [agent(messages) for messages in infos["messages"]]
        _, _, _, _, infos = vector.step(actions)
        calls, log.rows = log.rows, []
        rows.append(
            {key: sum(call[key] for call in calls) for key in ("prompt", "prefilled", "seconds")} | {"dialogues": n}
        )
    backend.close()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="policy and user model (alias or path)")
    parser.add_argument("--n", type=int, default=8, help="dialogues")
    parser.add_argument("--turns", type=int, default=6, help="agent turns per dialogue")
    parser.add_argument("--reply-tokens", type=int, default=48, help="tokens per policy turn and user reply")
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternating runs of each contender; each turn keeps its fastest"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    load = os.getloadavg()[0]
    print(
        f"machine: {cpu_model()}; torch {torch.__version__} with {torch.get_num_threads()} threads; "
        f"transformers {transformers.__version__}; load average {load:.1f} at the start"
    )
    print(
        f"model {args.model}; N = {args.n} dialogues, {args.turns} turns, at most {args.reply_tokens} "
        f"tokens per policy turn and per user reply; built-in English personas\n"
    )
    for part, play in (("policy", policy_part), ("user", user_part)):
        best: dict[bool, list[dict]] = {}
        for _ in range(args.repeats):  # other processes only ever slow a run down: keep the fastest
            for reuse in (False, True):
                rows = play(args.model, args.n, args.turns, args.reply_tokens, reuse)
                best[reuse] = (
                    rows
                    if reuse not in best
                    else [
                        dict(row, seconds=min(row["seconds"], kept["seconds"])) for row, kept in zip(rows, best[reuse])
                    ]
                )
        plain, reused = best[False], best[True]
        print(f"{part}: tokens per dialogue and turn")
        print(
            f"{'turn':>4} {'prompt tok':>10} {'prefilled, no reuse':>20} {'prefilled, reuse':>17} "
            f"{'s, no reuse':>12} {'s, reuse':>9}"
        )
        for turn, (a, b) in enumerate(zip(plain, reused), start=1):
            print(
                f"{turn:>4} {a['prompt'] / a['dialogues']:10.0f} {a['prefilled'] / a['dialogues']:20.0f} "
                f"{b['prefilled'] / b['dialogues']:17.0f} {a['seconds']:12.2f} {b['seconds']:9.2f}"
            )
        total_a, total_b = sum(r["seconds"] for r in plain), sum(r["seconds"] for r in reused)
        share = 1 - sum(r["prefilled"] for r in reused) / max(1, sum(r["prompt"] for r in reused))
        print(
            f"     all turns: {total_a:.1f} s without reuse, {total_b:.1f} s with ({total_a / total_b:.1f}x); "
            f"{share:.0%} of prompt tokens reused\n"
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
