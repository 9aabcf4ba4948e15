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
    """Build a simulated user from :class:`~empathy_gym.user.specs.UserSpec` fields: the same
    as ``UserSpec(backend, model, ...).build(difficulty, protocol)``.

    Args:
        backend, model, base_url, appraisal_mode, backend_kwargs, user_kwargs: the
            :class:`~empathy_gym.user.specs.UserSpec` fields (see there).
        difficulty: preset name, path, dict or :class:`Difficulty`.
        protocol: the emotion protocol (tells the LLM user the allowed change range).

    Raises:
        SpecError (a ``ValueError``): a bad field (an unknown backend or
            ``appraisal_mode``; ``model``, ``base_url`` or ``backend_kwargs`` with the
            rule user; ...). ValueError, ImportError: from the backend.
    """
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
