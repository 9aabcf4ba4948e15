"""Controls for claims of learning: runs that see the same rewards but cannot learn from
them. Whatever a run gains without learning from its rewards (entropy collapse, drift,
the evaluation's own noise), :func:`shuffled_reward_trainer`'s control gains too
(``tests/test_learning.py``, ``benchmarks/heldout_control.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from empathy_gym.seeding import derive_seed


def shuffled_reward_trainer(cls: type) -> type:
    """A subclass ``ShuffledRewards<cls name>`` of ``cls`` (an
    :class:`~empathy_gym.agents.trainer.RLTrainer`) whose ``update`` alone sees each step's
    reward sequences permuted among the dialogues of equal length, with
    ``numpy.random.default_rng(derive_seed(seed, step, 4242))``; what it logs keeps the
    rewards the env paid.
    """

    def update(self: Any, trajectories: Any, step: int) -> dict[str, float]:
        rng = np.random.default_rng(derive_seed(self.config.seed, step, 4242))
        by_length: dict[int, list[int]] = {}
        for i, t in enumerate(trajectories):
            by_length.setdefault(len(t.rewards), []).append(i)
        rewards = [list(t.rewards) for t in trajectories]
        for members in by_length.values():
            for i, j in zip(members, rng.permutation(members)):
                trajectories[i].rewards = rewards[j]
        try:
            return cls.update(self, trajectories, step)
        finally:
            for t, own in zip(trajectories, rewards):
                t.rewards = own  # the metrics and logs report what the env paid

    return type(f"ShuffledRewards{cls.__name__}", (cls,), {"update": update})
