"""The second judge during training (docs/reward-hacking.md).

After each step :class:`TrainingJudge` shows every appraised reply of the step's first
rollout round to the second judge (``heldout.user``), in the dialogue the training user
shaped (the replay of :mod:`empathy_gym.evaluation.replay`), and logs
``judge/change_mean``, ``judge/train_change_mean``, ``judge/gap`` and ``judge/diverging``
(:func:`diverging`; NaN until :data:`WINDOW` steps have been judged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from empathy_gym.agents.callbacks import TrainerCallback, TrainingState
from empathy_gym.agents.envs import make_session
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
        Whether, window's second half against its first, the training user's mean change
        rose by ``min_move`` or more and the judge's fell as much; False with fewer steps.
    """
    if len(history) < window:
        return False
    recent = np.asarray(history[-window:], dtype=float)
    first, second = recent[: window // 2].mean(axis=0), recent[window // 2 :].mean(axis=0)
    rise, fall = second - first
    return bool(rise >= min_move and fall <= -min_move)


class TrainingJudge(TrainerCallback):
    """Re-judges each step's replies with the second judge; a trainer whose config sets
    ``heldout.user`` adds one itself.

    Raises:
        RecipeError: a bad ``heldout.user``.
    """

    def __init__(self, config: Any):
        #: the second judge (closed by :meth:`close`)
        self.session = make_session(config, config.generation.think, user=config.heldout.user)
        self.bank = {persona.id: persona for persona in self.session.personas}
        self.seed = config.seed
        self.history: list[tuple[float, float]] = []

    def on_step_end(
        self, state: TrainingState | None, step: int, trajectories: Sequence[Trajectory]
    ) -> Mapping[str, float]:
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
        protocol = self.session.protocol
        judged = [protocol.clamp_change(appraisal.change) for appraisal in self.session.user.appraise(requests)]
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

    def on_train_end(self, state: TrainingState | None) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()
