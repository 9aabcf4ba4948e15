"""Batching: N dialogues with an LLM user, the batched vector env against N envs stepped
one after another, side by side in one run.

    python benchmarks/batching.py                         # SmolLM2-135M-Instruct and tiny, N = 16
    python benchmarks/batching.py --models smollm2 --n 16 --steps 2 --max-tokens 32

For each model, one :class:`~empathy_gym.backends.transformers_backend.TransformersBackend`
and one LLM user serve both contenders (same weights, same threads):

* ``sequential``: N :class:`~empathy_gym.env.EmpathyDialogueEnv` reset with seeds
  0..N-1 and stepped one after another: N single-conversation calls per phase;
* ``batched``: ``EmpathyDialogueVectorEnv(N)`` reset with seed 0 (sub-env i gets seed
  i, so the same N dialogues): one batched call per phase.

Both get the same agent utterances (``ListenerAgent``), and the first ``--steps`` agent
turns of every dialogue are timed after one warm-up generation; the two contenders run
``--repeats`` times, alternating, and each keeps its fastest run (the machine may be
shared: other processes only ever slow a run down). The user appraises in
``choice`` mode by default (one forward pass scores the five options: no parse failures
from a small model) and replies with at most ``--max-tokens`` new tokens.

Both contenders share the backend's prefix cache (the states of the persona, scene and
history that a dialogue's appraisal and reply prompts share, and that the next turn
repeats), emptied before each contender's run.

Columns: seconds per vector step (N dialogue turns), dialogue turns per second, the
speed-up, the time in the backend's two phases (``choice_logprobs``: a prefill only;
``generate``: prefill plus decoding), and the mean prompt length in tokens. On a CPU a
prefill of a few hundred tokens is already compute-bound at batch size 1, so batching
helps mainly the decoding part; the speed-up grows with the share of decoding and on a
GPU, where batch 1 leaves the chip idle.

A last row per model isolates that decoding part: ``backend.generate`` on N one-line
prompts, ``--max-tokens`` new tokens each, as N single calls and as one batch.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import transformers
from _machine import cpu_model  # benchmarks/_machine.py

from empathy_gym.backends.transformers_backend import TransformersBackend
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.evaluation.baselines import ListenerAgent
from empathy_gym.user.specs import UserSpec
from empathy_gym.vector import EmpathyDialogueVectorEnv


class TimedBackend:
    """Wraps a backend's ``generate`` and ``choice_logprobs`` to add up their seconds and
    keep the conversations they saw (for token counts afterwards)."""

    def __init__(self, backend: TransformersBackend):
        self.backend = backend
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.conversations: list[Any] = []
        for name in ("generate", "choice_logprobs"):
            setattr(backend, name, self._timed(name, getattr(backend, name)))

    def _timed(self, name, method):
        def timed(conversations, *args, **kwargs):
            started = time.perf_counter()
            out = method(conversations, *args, **kwargs)
            self.seconds[name] += time.perf_counter() - started
            self.calls[name] += 1
            self.conversations.extend(conversations)
            return out

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.conversations.clear()

    def mean_prompt_tokens(self) -> float:
        tokenizer = self.backend.tokenizer
        lengths = [
            len(
                tokenizer.apply_chat_template(list(c), add_generation_prompt=True, tokenize=True, return_dict=True)[
                    "input_ids"
                ]
            )
            for c in self.conversations
        ]
        return float(np.mean(lengths)) if lengths else 0.0


def play_sequential(
    user: Any, agent: ListenerAgent, n: int, steps: int, timer: TimedBackend
) -> tuple[list[list[int]], float]:
    """N single envs (seeds 0..N-1), ``steps`` turns each, one env after another.
    Returns the emotions after each turn and the seconds the turns took (resets not timed)."""
    singles = [EmpathyDialogueEnv(personas="en", user=user) for _ in range(n)]
    infos = [env.reset(seed=i)[1] for i, env in enumerate(singles)]
    timer.reset()
    started = time.perf_counter()
    emotions = []
    for _ in range(steps):
        actions = [agent(info["messages"]) for info in infos]
        infos = [env.step(action)[4] for env, action in zip(singles, actions)]
        emotions.append([info["emotion"] for info in infos])
    return emotions, time.perf_counter() - started


def play_batched(
    user: Any, agent: ListenerAgent, n: int, steps: int, timer: TimedBackend
) -> tuple[list[list[int]], float]:
    """The vector env (sub-env i seeded i), ``steps`` vector steps; as :func:`play_sequential`."""
    vector = EmpathyDialogueVectorEnv(n, personas="en", user=user)
    _, infos = vector.reset(seed=0)
    timer.reset()
    started = time.perf_counter()
    emotions = []
    for _ in range(steps):
        actions = [agent(messages) for messages in infos["messages"]]
        _, _, _, _, infos = vector.step(actions)
        emotions.append(infos["emotion"].tolist())
    return emotions, time.perf_counter() - started


def run_model(model: str, n: int, steps: int, max_tokens: int, appraisal_mode: str, repeats: int) -> list[dict]:
    """Time both contenders ``repeats`` times, alternating, and keep each one's fastest
    run (other processes on a shared machine slow runs down, never speed them up)."""
    backend = TransformersBackend(model)
    timer = TimedBackend(backend)
    # reply_plan off: a 135M model rarely writes the planned JSON reply (docs/backends.md, "Errors and small models")
    user = UserSpec(
        backend, appraisal_mode=appraisal_mode, user_kwargs={"max_tokens": max_tokens, "reply_plan": False}
    ).build()
    agent = ListenerAgent()
    backend.generate([[{"role": "user", "content": "Hello!"}]], max_tokens=4, seeds=[0])  # warm-up
    best: dict[str, dict] = {}
    emotions: dict[str, list] = {}
    for _ in range(repeats):
        for mode, play in (("sequential", play_sequential), ("batched", play_batched)):
            backend.prefix_cache.clear()  # each contender starts cold: no states from the other's dialogues
            emotions[mode], seconds = play(user, agent, n, steps, timer)
            seconds /= steps
            if mode not in best or seconds < best[mode]["seconds"]:
                best[mode] = dict(
                    model=model,
                    mode=mode,
                    seconds=seconds,
                    phases={k: v / steps for k, v in timer.seconds.items()},
                    calls={k: v / steps for k, v in timer.calls.items()},
                    prompt_tokens=timer.mean_prompt_tokens(),
                )
    best["batched"]["same_emotions"] = emotions["batched"] == emotions["sequential"]

    conversations = [[{"role": "user", "content": f"Say something kind to person {i}."}] for i in range(n)]
    single = batched = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for i, conversation in enumerate(conversations):
            backend.generate([conversation], max_tokens=max_tokens, seeds=[i])
        single = min(single, time.perf_counter() - started)
        started = time.perf_counter()
        backend.generate(conversations, max_tokens=max_tokens, seeds=list(range(n)))
        batched = min(batched, time.perf_counter() - started)
    backend.close()
    return [best["sequential"], best["batched"], dict(model=model, mode="decode-bound", single=single, batched=batched)]


def machine() -> str:
    cpu = cpu_model()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}; torch {torch.__version__} with {torch.get_num_threads()} "
        f"threads; transformers {transformers.__version__}; load average {load:.1f} at the start"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["smollm2", "tiny"], help="user models: paths or the aliases smollm2, tiny"
    )
    parser.add_argument("--n", type=int, default=16, help="dialogues")
    parser.add_argument("--steps", type=int, default=1, help="agent turns timed per dialogue")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per user reply")
    parser.add_argument("--appraisal-mode", default="choice", choices=["choice", "free"])
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs; the fastest counts")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    print(
        f"N = {args.n} dialogues, {args.steps} timed turn(s) each, appraisal_mode={args.appraisal_mode}, "
        f"replies of at most {args.max_tokens} tokens, built-in English personas; "
        f"fastest of {args.repeats} alternating runs\n"
    )
    header = (
        f"{'user model':<10} {'contender':<11} {'s/step':>8} {'turns/s':>8} {'speed-up':>8} "
        f"{'choice s':>9} {'generate s':>10} {'calls':>6} {'prompt tok':>10}"
    )
    print(header)
    for model in args.models:
        rows = run_model(model, args.n, args.steps, args.max_tokens, args.appraisal_mode, args.repeats)
        decode = rows.pop()
        base = rows[0]["seconds"]
        for row in rows:
            calls = sum(row["calls"].values())
            print(
                f"{model:<10} {row['mode']:<11} {row['seconds']:8.2f} {args.n / row['seconds']:8.2f} "
                f"{base / row['seconds']:7.1f}x {row['phases'].get('choice_logprobs', 0):9.2f} "
                f"{row['phases'].get('generate', 0):10.2f} {calls:6.0f} {row['prompt_tokens']:10.0f}"
            )
        print(f"{'':<10} same emotions batched and sequential: {rows[1]['same_emotions']}")
        print(
            f"{'':<10} decode-bound generate ({args.n} one-line prompts x {args.max_tokens} tokens): "
            f"{decode['single']:.2f} s as {args.n} calls, {decode['batched']:.2f} s as one batch, "
            f"{decode['single'] / decode['batched']:.1f}x"
        )
        speedup = base / rows[1]["seconds"]
        choice_share = rows[0]["phases"].get("choice_logprobs", 0) / rows[0]["seconds"]
        print(
            f"{'':<10} goal >= 4x throughput, batched vs sequential: "
            f"{'met' if speedup >= 4 else 'MISSED'} ({speedup:.1f}x); {choice_share:.0%} of the "
            f"sequential step is choice scoring, a prefill of {rows[0]['prompt_tokens']:.0f}-token "
            f"prompts that costs the same FLOPs batched or not"
        )


if __name__ == "__main__":
    main()
