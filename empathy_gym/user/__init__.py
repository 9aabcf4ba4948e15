"""The simulated user: protocol, difficulty presets, the LLM user and the rule user."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from empathy_gym.backends.base import ChatBackend
from empathy_gym.user.base import Appraisal, SimulatedUser, SimulatorError, UserRequest, UserTurn
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import RLVER_TRAINING, SAGE, EmotionProtocol, emotion_band, resolve_protocol


def make_user(
    backend: str | ChatBackend = "rule",
    *,
    difficulty: Any = "moderate",
    protocol: EmotionProtocol = SAGE,
    model: Any = None,
    base_url: str | None = None,
    appraisal_mode: str = "free",
    backend_kwargs: Mapping[str, Any] | None = None,
    user_kwargs: Mapping[str, Any] | None = None,
) -> SimulatedUser:
    """``UserSpec(backend, model, ...).build(difficulty, protocol)``: the fields, errors and
    arguments of :class:`~empathy_gym.user.specs.UserSpec` and its ``build``."""
    from empathy_gym.user.specs import UserSpec

    return UserSpec(backend, model, base_url, appraisal_mode, backend_kwargs or {}, user_kwargs or {}).build(
        difficulty, protocol
    )


__all__ = [
    "Appraisal",
    "Difficulty",
    "EmotionProtocol",
    "RLVER_TRAINING",
    "SAGE",
    "SimulatedUser",
    "SimulatorError",
    "UserRequest",
    "UserTurn",
    "emotion_band",
    "load_difficulty",
    "make_user",
    "resolve_protocol",
]
