"""OpenEnv's client for the server (defined in ``empathy_gym.integrations.openenv``)."""

from empathy_gym.integrations.openenv import EmpathyEnvClient

__all__ = ["EmpathyEnvClient"]
