"""GRPO with TRL's environment path (``environment_factory``) against an empathy-gym server.

    empathy-gym serve --port 8000 &      # the env: every rollout talks to its one simulated user
    python examples/trl_openenv.py --url http://127.0.0.1:8000 --model Qwen/Qwen2.5-0.5B-Instruct

Each rollout gets an ``EmpathyToolEnv`` (``empathy_gym.integrations.trl_environment``):
TRL resets it with a dataset row (the user's opening line joins the prompt), the policy
speaks to the user by calling its tool ``reply(message)`` and hears the answer as the
tool's result, and the rollout's reward is the dialogue's return, (e_T - e_0) / 100 under
the server's default reward. The policy's chat template must render tool calls (Qwen2.5's
and Qwen3's do) and the policy must call the tool: an instruct model does; a random one
does not. ``examples/trl_grpo.py`` is the in-process path (``rollout_func``), which needs
no tool calls. A server with a token: ``EMPATHY_GYM_SERVE_TOKEN`` here too.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from functools import partial
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from empathy_gym.integrations.trl_environment import EmpathyToolEnv  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the empathy-gym server")
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="a causal LM id or path")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
    parser.add_argument("--prompts", type=int, default=8, help="dialogues in the dataset (env seeds)")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per dialogue (GRPO group)")
    parser.add_argument("--max-turns", type=int, default=4, help="tool calls (agent turns) per rollout")
    parser.add_argument("--max-completion-length", type=int, default=512, help="tokens per rollout, answers included")
    parser.add_argument("--output-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, *, model: Any = None, tokenizer: Any = None) -> GRPOTrainer:
    """Train for ``--steps`` steps; returns the trainer (``state.log_history``: the logged
    rewards, ``rewards/EmpathyToolEnv/mean``; ``environments``: the last batch's dialogues).
    ``model`` and ``tokenizer``: objects to use instead of loading ``--model``."""
    args = parse_args(argv)
    token = os.environ.get("EMPATHY_GYM_SERVE_TOKEN")
    config = GRPOConfig(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="empathy-gym-trl-openenv-"),
        max_steps=args.steps,
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns,
        learning_rate=1e-6,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
    )
    trainer = GRPOTrainer(
        model=model if model is not None else args.model,
        args=config,
        train_dataset=EmpathyToolEnv.dataset(args.url, args.prompts, seed=args.seed, token=token),
        processing_class=tokenizer,
        environment_factory=partial(EmpathyToolEnv, args.url, token=token),
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    main()
