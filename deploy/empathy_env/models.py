"""The action, observation and state of the server (defined in ``empathy_gym.integrations.openenv``)."""

from empathy_gym.integrations.openenv import EmpathyAction, EmpathyObservation, EmpathyState

__all__ = ["EmpathyAction", "EmpathyObservation", "EmpathyState"]
