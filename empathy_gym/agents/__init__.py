"""PPO and GRPO for LLM policies against the simulated user.

Heavy: importing this package imports torch and transformers (``import empathy_gym``
alone does not).
"""

from empathy_gym.agents.config import (EnvConfig, GenerationConfig, GRPOConfig, PolicyConfig,
                                       PPOConfig, RecipeError, load_recipe)
from empathy_gym.agents.grpo import GRPOTrainer
from empathy_gym.agents.ppo import PPOTrainer
from empathy_gym.agents.rollout import RolloutEngine, Trajectory

TRAINERS = {"ppo": PPOTrainer, "grpo": GRPOTrainer}

__all__ = ["EnvConfig", "GRPOConfig", "GRPOTrainer", "GenerationConfig", "PPOConfig", "PPOTrainer",
           "PolicyConfig", "RecipeError", "RolloutEngine", "TRAINERS", "Trajectory", "load_recipe"]
