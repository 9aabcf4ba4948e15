"""empathy-gym's dialogue environment as an OpenEnv environment: the typed action,
observation and client (they live in ``empathy_gym.integrations.openenv``)."""

from .client import EmpathyEnvClient
from .models import EmpathyAction, EmpathyObservation, EmpathyState

__all__ = ["EmpathyAction", "EmpathyEnvClient", "EmpathyObservation", "EmpathyState"]
