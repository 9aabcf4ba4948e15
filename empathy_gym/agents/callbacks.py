"""Trainer callbacks: work that runs around training, from Python as from the command
line, in the shape of Hugging Face's ``TrainerCallback`` with the trainer passed in
(docs/training.md, "Callbacks").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TrainerCallback:
    """Does nothing; subclass and override what you need."""

    def on_train_begin(self, trainer: Any) -> None:
        """Before the first step (and before ``--resume`` loads a checkpoint)."""

    def on_step_end(self, trainer: Any, step: int, trajectories: Sequence[Any]) -> Mapping[str, float] | None:
        """After a step's update, with the step's first-round trajectories
        (:class:`~empathy_gym.agents.rollout.Trajectory`) of every process; the metrics
        returned join the step's (``metrics.jsonl``, TensorBoard). With several processes
        it runs in the first one only, and its metrics reach the others."""
        return None

    def on_train_end(self, trainer: Any) -> None:
        """After the last of ``total_steps`` steps, once the checkpoint is saved (not after Ctrl-C)."""

    def close(self) -> None:
        """Release what the callback holds (a simulated user); the trainer's ``close``
        calls it, after Ctrl-C too. Called more than once, it does nothing more."""
