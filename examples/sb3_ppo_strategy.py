"""Train Stable-Baselines3 PPO to choose ESConv support strategies, then compare it on
personas it never saw with a uniformly random strategy and with every fixed strategy.

    python examples/sb3_ppo_strategy.py                   # about 2.5 minutes on one CPU core
    python examples/sb3_ppo_strategy.py --timesteps 30000 --episodes 2   # a quick look

The env is ``EmpathyStrategy-v0`` (:mod:`empathy_gym.integrations.strategy_env`): the action is one of
the eight ESConv strategies, the observation a Box of conversation features, the user the
offline rule-based simulated user (a stand-in, not a judge of empathy). The persona bank
is split with :func:`empathy_gym.personas.split_personas` (stratified by hidden
intention); PPO trains on one part and every policy is scored on the other: the mean
final emotion (0-100) over each held-out persona played ``--episodes`` times.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from empathy_gym.integrations.strategy_env import EmpathyStrategyEnv, final_emotions
from empathy_gym.personas import load_personas, split_personas
from empathy_gym.strategies import STRATEGIES, STRATEGY_NAMES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--personas", default=None, help="persona bank: a name (en, zh, rlver) or a JSONL path (default: built-in)"
    )
    parser.add_argument("--difficulty", default="moderate")
    parser.add_argument("--test-fraction", type=float, default=0.25, help="held-out share of the bank")
    parser.add_argument("--timesteps", type=int, default=300_000, help="PPO environment steps")
    parser.add_argument("--n-envs", type=int, default=8, help="parallel envs (DummyVecEnv)")
    parser.add_argument("--episodes", type=int, default=5, help="evaluation episodes per held-out persona")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def train(personas: Sequence, args: argparse.Namespace) -> PPO:
    """PPO with SB3's defaults except: gamma = 1 (the per-turn rewards telescope to the
    final emotion change, the quantity we score), learning rate 1e-3, 256-step rollouts
    per env, batch 256 and an entropy bonus of 0.01."""
    envs = make_vec_env(
        EmpathyStrategyEnv,
        n_envs=args.n_envs,
        seed=args.seed,
        env_kwargs={"personas": list(personas), "difficulty": args.difficulty},
    )
    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=256,
        batch_size=256,
        gamma=1.0,
        learning_rate=1e-3,
        ent_coef=0.01,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    return model.learn(total_timesteps=args.timesteps)


def policies(model: PPO, seed: int, chosen: Counter) -> dict[str, Callable[[np.ndarray], int]]:
    """The contenders: the trained PPO policy (greedy; each strategy it picks is counted in
    ``chosen``), a uniformly random strategy, and each fixed strategy."""
    rng = np.random.default_rng(seed)

    def ppo(obs: np.ndarray) -> int:
        action = int(model.predict(obs, deterministic=True)[0])
        chosen[STRATEGY_NAMES[STRATEGIES[action]]] += 1
        return action

    out: dict[str, Callable[[np.ndarray], int]] = {
        "PPO (trained)": ppo,
        "random strategy": lambda obs: int(rng.integers(len(STRATEGIES))),
    }
    for index, strategy in enumerate(STRATEGIES):
        out[f"always {STRATEGY_NAMES[strategy]}"] = lambda obs, index=index: index
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Train, evaluate and print the table; returns policy name -> final emotions (int64)."""
    args = parse_args(argv)
    bank = load_personas(args.personas)
    train_personas, test_personas = split_personas(bank, args.test_fraction, seed=args.seed)
    print(
        f"{len(train_personas)} training personas, {len(test_personas)} held out "
        f"(stratified by hidden intention, seed {args.seed})"
    )
    started = time.perf_counter()
    model = train(train_personas, args)
    print(f"PPO: {args.timesteps} steps in {time.perf_counter() - started:.0f} s")

    chosen: Counter = Counter()
    results = {
        name: final_emotions(
            policy,
            test_personas,
            episodes_per_persona=args.episodes,
            seed=100_000 + args.seed,
            difficulty=args.difficulty,
        )
        for name, policy in policies(model, args.seed, chosen).items()
    }
    width = max(len(name) for name in results)
    print(
        f"\nHeld-out personas: mean final emotion over {len(test_personas)} personas x "
        f"{args.episodes} episodes (rule-based user, {args.difficulty})"
    )
    print(f"{'policy'.ljust(width)}  mean   s.e.  success  failure")
    for name, emotions in sorted(results.items(), key=lambda item: -item[1].mean()):
        se = emotions.std(ddof=1) / np.sqrt(len(emotions))
        print(
            f"{name.ljust(width)}  {emotions.mean():5.1f}  {se:4.1f}  "
            f"{(emotions >= 100).mean():7.0%}  {(emotions < 10).mean():7.0%}"
        )
    turns = sum(chosen.values())
    print(
        "PPO's strategies on the held-out turns: " + ", ".join(f"{n} {c / turns:.0%}" for n, c in chosen.most_common())
    )
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)  # a 64x64 MLP: more threads only add overhead
    main()
