"""PPO and GRPO for LLM policies against the simulated user.

The configs (:mod:`~empathy_gym.agents.config`) import without torch; the trainers,
:data:`TRAINERS` and the rollout engine load torch and transformers on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from empathy_gym.agents.config import (
    EnvConfig,
    GenerationConfig,
    GRPOConfig,
    PolicyConfig,
    PPOConfig,
    RecipeError,
    load_recipe,
)

_HEAVY = {
    "GRPOTrainer": "empathy_gym.agents.grpo",
    "PPOTrainer": "empathy_gym.agents.ppo",
    "RolloutEngine": "empathy_gym.agents.rollout",
    "Trajectory": "empathy_gym.agents.rollout",
}


def __getattr__(name: str) -> Any:
    """PEP 562: the torch-backed names load when first used."""
    if name == "TRAINERS":
        return {"ppo": __getattr__("PPOTrainer"), "grpo": __getattr__("GRPOTrainer")}
    if name in _HEAVY:
        return getattr(importlib.import_module(_HEAVY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EnvConfig",
    "GRPOConfig",
    "GRPOTrainer",
    "GenerationConfig",
    "PPOConfig",
    "PPOTrainer",
    "PolicyConfig",
    "RecipeError",
    "RolloutEngine",
    "TRAINERS",
    "Trajectory",
    "load_recipe",
]
