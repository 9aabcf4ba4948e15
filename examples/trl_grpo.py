"""GRPO with TRL's ``GRPOTrainer`` on whole dialogues with the simulated user.

    python examples/trl_grpo.py                       # the tiny random model, 2 steps, CPU
    python examples/trl_grpo.py --model smollm2 --steps 20 --max-new-tokens 96

``EmpathyRollout`` (``empathy_gym.integrations.trl``) is the trainer's ``rollout_func``:
each prompt of the dataset is a dialogue opening; a GRPO group (``--generations``
dialogues) plays it to the end against the rule-based user, token in, token out, and
returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 on the
agent's sampled tokens, 0 on the user's turns). The reward is the dialogue's return,
(e_T - e_0) / 100 (``episode_return_reward``); RLVER's e_T / 100 is
``final_emotion_reward``.

The tiny model writes random tokens, so the rewards mean nothing: this shows the wiring
runs. ``--model`` takes any causal LM path or the ``smollm2`` alias.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from empathy_gym.backends.models import load_causal_lm  # noqa: E402
from empathy_gym.integrations.trl import EmpathyRollout, episode_return_reward  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="path, hub id, or alias: tiny, smollm2")
    parser.add_argument("--env", default="EmpathyDialogue-v0")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
    parser.add_argument("--prompts", type=int, default=8, help="distinct dialogue openings")
    parser.add_argument("--generations", type=int, default=4, help="dialogues per opening (GRPO group)")
    parser.add_argument("--max-turns", type=int, default=3, help="agent turns per dialogue")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per agent turn")
    parser.add_argument("--output-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> GRPOTrainer:
    """Train for ``--steps`` steps; returns the trainer (its ``state.log_history`` holds
    the logged rewards)."""
    args = parse_args(argv)
    model, tokenizer = load_causal_lm(args.model)
    rollout = EmpathyRollout(
        args.env, env_kwargs={"max_turns": args.max_turns}, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    config = GRPOConfig(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="empathy-gym-trl-"),
        max_steps=args.steps,
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        temperature=1.0,
        max_completion_length=args.max_turns * (args.max_new_tokens + 64),
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        reward_funcs=[episode_return_reward],
        train_dataset=rollout.dataset(args.prompts, seed=args.seed),
        rollout_func=rollout,
    )
    try:
        trainer.train()
    finally:
        rollout.close()  # the simulated user it built
    for record in trainer.state.log_history:
        if "reward" in record:
            print(
                f"step {record['step']}: mean reward {record['reward']:+.3f} "
                f"(std {record.get('reward_std', float('nan')):.3f})"
            )
    return trainer


if __name__ == "__main__":
    main()
