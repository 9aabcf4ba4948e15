"""The simulated user: protocol, difficulty presets, the LLM user and the rule user."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from empathy_gym.backends.base import ChatBackend
from empathy_gym.user.base import (
    Appraisal,
    SimulatedUser,
    SimulatorError,
    UserRequest,
    UserTurn,
)
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import (
    RLVER_TRAINING,
    SAGE,
    EmotionProtocol,
    emotion_band,
    resolve_protocol,
)


def make_user(backend: str | ChatBackend = "rule", *, difficulty: Any = "moderate",
              protocol: EmotionProtocol = SAGE, model: Any = None, base_url: str | None = None,
              appraisal_mode: str = "free", backend_kwargs: Mapping[str, Any] | None = None,
              user_kwargs: Mapping[str, Any] | None = None) -> SimulatedUser:
    """Build a simulated user.

    Args:
        backend: ``"rule"`` (the rule-based user, no LLM), a backend name
            (``"transformers"``, ``"vllm"``, ``"openai"``) or a :class:`ChatBackend`.
        difficulty: preset name, path, dict or :class:`Difficulty`.
        protocol: the emotion protocol (tells the LLM user the allowed change range).
        model, base_url: passed to :func:`empathy_gym.backends.make_backend`.
        appraisal_mode: ``"free"`` or ``"choice"`` (LLM users only).
        backend_kwargs: more backend constructor arguments.
        user_kwargs: more :class:`~empathy_gym.user.llm_user.LLMUser` or
            :class:`~empathy_gym.user.rule_user.RuleUser` arguments.

    Raises:
        ValueError: unknown backend or bad options (an unknown ``appraisal_mode``;
            ``model``, ``base_url`` or ``backend_kwargs`` with the rule user).
    """
    user_kwargs = dict(user_kwargs or {})
    if appraisal_mode not in ("free", "choice"):
        raise ValueError(f"appraisal_mode must be 'free' or 'choice', got {appraisal_mode!r}")
    if isinstance(backend, str) and backend == "rule":
        unused = [name for name, value in (("model", model), ("base_url", base_url),
                                           ("backend_kwargs", backend_kwargs)) if value]
        if unused:
            raise ValueError(f"{', '.join(unused)} given, but backend='rule' (the rule-based user "
                             "uses no LLM); set backend='openai', 'transformers' or 'vllm'")
        from empathy_gym.user.rule_user import RuleUser
        unknown = sorted(set(user_kwargs) - {"model", "rules_dir"})
        if unknown:
            raise ValueError(f"user_kwargs {unknown} given, but backend='rule' takes only 'model' (an appraisal "
                             "model artefact) and 'rules_dir'; the others are LLM-user options: set "
                             "backend='openai', 'transformers' or 'vllm'")
        return RuleUser(difficulty, **user_kwargs)
    from empathy_gym.user.llm_user import LLMUser
    owns = not isinstance(backend, ChatBackend)
    if owns:
        from empathy_gym.backends import make_backend
        backend = make_backend(backend, model=model, base_url=base_url, **dict(backend_kwargs or {}))
    return LLMUser(backend, difficulty, protocol=protocol, appraisal_mode=appraisal_mode,
                   owns_backend=owns, **user_kwargs)


__all__ = ["Appraisal", "Difficulty", "EmotionProtocol", "RLVER_TRAINING", "SAGE",
           "SimulatedUser", "SimulatorError", "UserRequest", "UserTurn", "emotion_band",
           "load_difficulty", "make_user", "resolve_protocol"]
