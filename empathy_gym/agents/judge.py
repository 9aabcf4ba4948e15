"""The second judge during training: every step's replies re-judged by another user.

The held-out evaluation measures the policy under a second judge before and after
training (:mod:`~empathy_gym.agents.heldout`). :class:`TrainingJudge` watches in between:
after each step it shows every appraised reply of the step's first rollout round to the
second judge (``heldout.user``), with the history and emotion the training user had
seen before it (the replay of :mod:`empathy_gym.evaluation.replay`), and logs

* ``judge/change_mean``: the judge's change per reply, clamped by the protocol
  (emotion points);
* ``judge/train_change_mean``: the training user's applied change per reply on the same
  replies (emotion points);
* ``judge/gap``: the first minus the second (how much more the training user pays);
* ``judge/diverging``: 1 when, over the last :data:`WINDOW` steps, the training user's
  change rose and the judge's fell, each by at least :data:`MIN_MOVE` points per reply
  (the mean of the window's second half against its first half); a warning goes to the
  log then. 0 otherwise (NaN until :data:`WINDOW` steps have been judged).

The judge re-appraises replies, it does not play dialogues: a reply is judged in the
dialogue the training user shaped. Its cost is one ``appraise`` call per step (the rule
user: milliseconds; an LLM judge: one batched call).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from empathy_gym.agents.callbacks import TrainerCallback
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.evaluation.own_logs import own_dialogue
from empathy_gym.evaluation.replay import turn_request
from empathy_gym.seeding import derive_seed

log = logging.getLogger(__name__)

#: Steps compared by the divergence check (the last WINDOW: second half against first).
WINDOW = 10
#: The least move, in emotion points per reply, that counts as a rise or a fall.
MIN_MOVE = 0.5


def diverging(history: Sequence[tuple[float, float]], window: int = WINDOW, min_move: float = MIN_MOVE) -> bool:
    """Whether the training user's change rose while the judge's fell over the last
    ``window`` steps.

    Args:
        history: per step ``(training user's mean change, judge's mean change)``, in
            emotion points per reply, oldest first.
        window: how many of the last steps to compare (an even number >= 2).
        min_move: the least rise (training) and fall (judge), in points.

    Returns:
        True when the second half's mean of the training user's change exceeds the first
        half's by ``min_move`` or more and the judge's is ``min_move`` or more below it;
        False with fewer than ``window`` steps.
    """
    if len(history) < window:
        return False
    recent = np.asarray(history[-window:], dtype=float)
    first, second = recent[: window // 2].mean(axis=0), recent[window // 2 :].mean(axis=0)
    rise, fall = second - first
    return bool(rise >= min_move and fall <= -min_move)


class TrainingJudge(TrainerCallback):
    """Re-judges each step's replies with the second judge (``heldout.user``); a trainer
    whose config sets ``heldout.user`` adds one itself.

    Args:
        trainer: an :class:`~empathy_gym.agents.trainer.RLTrainer` whose config sets
            ``heldout.user``.

    Raises:
        RecipeError: a bad ``heldout.user`` (as for the held-out evaluation).
    """

    def __init__(self, trainer: Any):
        from empathy_gym.agents.trainer import make_envs

        config = trainer.config
        self.env = make_envs(config, 1, config.generation.think, user=config.heldout.user)[0]  # owns the judge
        self.bank = {persona.id: persona for persona in self.env.personas}
        self.seed = trainer.config.seed
        self.history: list[tuple[float, float]] = []

    def on_step_end(self, trainer: Any, step: int, trajectories: Sequence[Trajectory]) -> Mapping[str, float]:
        """The ``judge/*`` metrics of this step's replies (see the module docstring)."""
        requests, paid = [], []
        for trajectory in trajectories:
            dialogue = own_dialogue(trajectory.record(), self.bank)
            for turn in dialogue.turns:
                seed = derive_seed(self.seed, step, trajectory.key, turn.turn)
                requests.append(turn_request(turn, dialogue.persona, seed=seed))
                paid.append(turn.change)
        if not requests:
            return {}
        protocol = self.env.protocol
        judged = [protocol.clamp_change(appraisal.change) for appraisal in self.env.user.appraise(requests)]
        train_mean, judge_mean = float(np.mean(paid)), float(np.mean(judged))
        self.history.append((train_mean, judge_mean))
        metrics = {
            "judge/change_mean": judge_mean,
            "judge/train_change_mean": train_mean,
            "judge/gap": train_mean - judge_mean,
            "judge/diverging": float(diverging(self.history)) if len(self.history) >= WINDOW else float("nan"),
        }
        if metrics["judge/diverging"] == 1.0:
            log.warning(
                "step %d: over the last %d steps the training user's change per reply rose while the second "
                "judge's fell (judge/diverging); the policy may be learning its judge: read the replies "
                "in episodes.jsonl",
                step,
                WINDOW,
            )
        return metrics

    def on_train_end(self, trainer: Any) -> None:
        self.env.close()
