"""Registering environment ids with Gymnasium: the built-in ones (:data:`BUILTIN_IDS` and
:data:`STRATEGY_ENV_ID`, all with the rule-based user unless ``gym.make`` passes
``user=``; table in docs/environment.md) and your own (:func:`register_persona_env`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym

from empathy_gym.personas import BUILTIN_BANKS, DERIVED_BANKS, PersonaSource, load_personas
from empathy_gym.user import SimulatedUser
from empathy_gym.user.difficulty import load_difficulty
from empathy_gym.user.specs import as_user_spec

ENTRY_POINT = "empathy_gym.env:EmpathyDialogueEnv"
#: ``gym.make_vec(id, num_envs=N)`` builds this: N dialogues sharing one simulated user,
#: whose turns go to the backend as one batch (:mod:`empathy_gym.vector`).
VECTOR_ENTRY_POINT = "empathy_gym.vector:EmpathyDialogueVectorEnv"

BUILTIN_IDS: dict[str, dict[str, Any]] = {
    "EmpathyDialogue-v0": {"difficulty": "moderate"},
    "EmpathyDialogue-Hard-v0": {"difficulty": "challenging"},
    "EmpathyDialogue-Easy-v0": {"difficulty": "easy"},
    "EmpathyDialogue-RLVER-v0": {"difficulty": "moderate", "personas": "rlver"},
}


def register_persona_env(
    id: str,
    personas: PersonaSource | None = None,
    difficulty: Any = "moderate",
    *,
    override: bool = False,
    **kwargs: Any,
) -> gym.envs.registration.EnvSpec:
    """Register a dialogue environment with its own persona bank and difficulty; the bank,
    the difficulty and the other keywords are validated now, not at the first ``gym.make``.

    Args:
        id: a Gymnasium id, version last: ``"MyClinic-v0"``, ``"MyClinic-Hard-v0"``.
        personas: a JSONL path (either format), a bank name, or a list of personas or
            dicts; ``None`` for the built-in bank.
        difficulty: preset name, JSON path or dict. Paths are kept absolute, so that
            ``gym.make`` finds them from any working folder.
        override: replace an existing id instead of raising.
        **kwargs: default :class:`~empathy_gym.env.EmpathyDialogueEnv` arguments (those of
            ``gym.make`` override them); an id with an LLM user is ``nondeterministic``.

    Returns:
        The registered ``EnvSpec``.

    Raises:
        PersonaError: an invalid bank. ValueError/KeyError: an invalid difficulty.
        SpecError (a ``ValueError``): an invalid ``user`` spec, naming the field.
        TypeError/ValueError: another keyword the env refuses (``max_turns=-1``...).
        gymnasium.error.Error: the id exists and ``override`` is false.
    """
    bank = load_personas(personas)
    load_difficulty(difficulty)
    if id in gym.registry and not override:
        raise gym.error.Error(f"environment id {id!r} is already registered; pass override=True to replace it")
    if personas is not None and not isinstance(personas, (str, os.PathLike)):
        personas = bank  # keep validated Persona objects, not raw dicts
    elif personas is not None and os.path.isfile(personas) and personas not in (*BUILTIN_BANKS, *DERIVED_BANKS):
        personas = os.path.abspath(personas)  # gym.make may run in another folder
    if isinstance(difficulty, (str, os.PathLike)) and Path(difficulty).suffix:  # a file, not a preset's name
        difficulty = os.path.abspath(difficulty)
    user = kwargs.get("user", "rule")
    spec = None if isinstance(user, SimulatedUser) else as_user_spec(user)
    if spec is not None and spec.on_policy:
        raise ValueError(
            f"register_persona_env: user backend {spec.backend!r} is built only by a trainer, from its policy; "
            "register the id with another user and give the recipe env.kwargs.user: policy"
        )
    deterministic = user.deterministic if spec is None else spec.deterministic
    from empathy_gym.env import EmpathyDialogueEnv

    EmpathyDialogueEnv(bank, difficulty, **{**kwargs, "user": "rule"}).close()  # the other keywords, checked now
    gym.register(
        id=id,
        entry_point=ENTRY_POINT,
        vector_entry_point=VECTOR_ENTRY_POINT,
        nondeterministic=not deterministic,
        kwargs={"personas": personas, "difficulty": difficulty, **kwargs},
    )
    return gym.spec(id)


#: The strategy-level env for RL libraries that act in discrete actions (SB3):
#: :mod:`empathy_gym.integrations.strategy_env`.
STRATEGY_ENV_ID = "EmpathyStrategy-v0"
STRATEGY_ENTRY_POINT = "empathy_gym.integrations.strategy_env:EmpathyStrategyEnv"


def register_builtin_envs() -> None:
    """Register :data:`BUILTIN_IDS` and :data:`STRATEGY_ENV_ID` (called on
    ``import empathy_gym``; idempotent)."""
    if STRATEGY_ENV_ID not in gym.registry:
        gym.register(
            id=STRATEGY_ENV_ID,
            entry_point=STRATEGY_ENTRY_POINT,
            nondeterministic=False,
            kwargs={"personas": None, "difficulty": "moderate"},
        )
    for env_id, kwargs in BUILTIN_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=ENTRY_POINT,
                vector_entry_point=VECTOR_ENTRY_POINT,
                nondeterministic=False,
                kwargs={"personas": kwargs.get("personas"), "difficulty": kwargs["difficulty"]},
            )
