"""Trainer callbacks: work that runs around training, from Python as from the command
line, in the shape of Hugging Face's ``TrainerCallback``. Each hook is given a
:class:`TrainingState`: what a callback may use of the run (its config, the steps done, the
training session and a sampler of the current policy), not the trainer itself
(docs/training.md, "Callbacks").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainingState:
    """What a callback is given of a training run, fresh at each hook.

    Attributes:
        config: the run's :class:`~empathy_gym.agents.config.TrainerConfig`.
        step: optimiser steps finished (0 before the first; a resumed run starts at its
            checkpoint's).
        session: the :class:`~empathy_gym.session.Session` the rollouts play in (the
            training user and its envs); ``None`` when the trainer was given its envs.
        sampler: ``sampler(**options)`` builds a
            :class:`~empathy_gym.agents.generation.TransformersGenerator` of the current
            policy with the recipe's sampling settings (``options``: its keywords, e.g.
            ``max_batch_size``, ``reuse_kv``).
        tokenizer: the policy's tokenizer (its chat template renders the dialogues).
        model: the policy module (a peft model with LoRA), for work that needs the module
            itself (lm-eval's capability tasks); leave its weights alone.
        rank, world: this process's rank and the process count (``on_step_end`` runs
            in rank 0 only).
    """

    config: Any
    step: int
    session: Any
    sampler: Callable[..., Any]
    tokenizer: Any
    model: Any = None
    rank: int = 0
    world: int = 1


class TrainerCallback:
    """Does nothing; subclass and override what you need."""

    def on_train_begin(self, state: TrainingState) -> None:
        """Before the first step (and before ``--resume`` loads a checkpoint)."""

    def on_step_end(self, state: TrainingState, step: int, trajectories: Sequence[Any]) -> Mapping[str, float] | None:
        """After a step's update (``step``: its number, 1-based; ``state.step`` too), with
        the step's first-round trajectories (:class:`~empathy_gym.agents.rollout.Trajectory`)
        of every process; the metrics returned join the step's (``metrics.jsonl``,
        TensorBoard). With several processes it runs in the first one only, and its metrics
        reach the others."""
        return None

    def on_train_end(self, state: TrainingState) -> None:
        """After the last of ``total_steps`` steps, once the checkpoint is saved (not after Ctrl-C)."""

    def close(self) -> None:
        """Release what the callback holds (a simulated user); the trainer's ``close``
        calls it, after Ctrl-C too. Called more than once, it does nothing more."""
