"""Play 20 dialogues on the RLVER training profiles with a scripted agent.

    python examples/quickstart.py                       # rule-based user, offline
    python examples/quickstart.py --personas en         # English personas (RLVER's are Chinese)
    python examples/quickstart.py --personas envs/rlver/train_profile.jsonl
    python examples/quickstart.py \
        --user openai:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1   # an LLM user on a server

Prints each transcript with its emotion bar, the per-turn rewards, and the mean final
emotion (SAGE's Sentient score, on this persona set and user). The RLVER profiles are
Chinese, so are their dialogues: a first line says so, and how to pick English ones.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import empathy_gym  # noqa: F401  (registers the environment ids)
from empathy_gym.cli import bank_language_line
from empathy_gym.evaluation.baselines import BASELINES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="EmpathyDialogue-RLVER-v0", help="environment id")
    parser.add_argument(
        "--personas", default=None, help="persona bank (JSONL path or bank name); default: the id's own"
    )
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--agent", choices=sorted(BASELINES), default="listener")
    parser.add_argument(
        "--user",
        default="rule",
        help="the simulated user: rule | transformers:PATH | vllm:PATH | openai:MODEL@URL, "
        "options after commas (,appraisal_mode=choice,temperature=0.3)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    args = parser.parse_args()

    kwargs = dict(user=args.user, render_mode="ansi")
    if args.personas:
        kwargs["personas"] = args.personas
    env = gym.make(args.env, **kwargs)
    print(bank_language_line(args.personas or f"{args.env}'s own", env.unwrapped.personas))
    agent = BASELINES[args.agent]()
    finals, returns = [], []
    for episode in range(args.episodes):
        obs, info = env.reset(seed=args.seed + episode)
        rewards, done = [], False
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent(info["messages"]))
            rewards.append(reward)
            done = terminated or truncated
        finals.append(info["emotion"])
        returns.append(sum(rewards))
        if not args.quiet:
            print(f"\n=== episode {episode + 1}/{args.episodes} ===")
            print(env.render())
            print(
                "rewards:",
                " ".join(f"{r:+.2f}" for r in rewards),
                f"| return {sum(rewards):+.2f} | final emotion {info['emotion']} ({info['termination_reason']})",
            )
    env.close()
    print(
        f"\n{args.episodes} dialogues, agent={args.agent}, user={args.user}: "
        f"mean final emotion {np.mean(finals):.1f} (sd {np.std(finals):.1f}), "
        f"mean return {np.mean(returns):+.3f}"
    )


if __name__ == "__main__":
    main()
