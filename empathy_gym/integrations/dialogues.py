"""Dialogues for trainer adapters (verl, verifiers), which get one sample at a time (a
dataset row, a task) and run many concurrently in one process.

* Starts are data: :func:`dialogue_starts` plays ``reset`` once per persona and keeps what
  it produced, so a row can recreate the very same dialogue later (:func:`start_env`); an
  LLM user's opening is never regenerated differently.
* One user per process: :func:`shared` returns the process-wide
  :class:`~empathy_gym.engine.DialogueEngine` of a config, so the user turns of concurrent
  dialogues meet in one batched call (:func:`~empathy_gym.engine.play_one`).
"""

from __future__ import annotations

import json
import numbers
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import empathy_gym  # noqa: F401  (registers the env ids)
from empathy_gym.engine import ENGINE_KEYS, DialogueEngine
from empathy_gym.env import EmpathyDialogueEnv, reset_many
from empathy_gym.personas import Persona, load_personas
from empathy_gym.session import Session

_SHARED: dict[str, DialogueEngine] = {}
_SHARED_LOCK = threading.Lock()


def _config_key(config: Mapping[str, Any]) -> str:
    plain = {key: value for key, value in config.items() if key != "name"}
    return json.dumps(plain, sort_keys=True, default=lambda value: f"<{type(value).__name__} at {id(value):#x}>")


def shared(config: Mapping[str, Any]) -> DialogueEngine:
    """The process-wide ``DialogueEngine(config)``, created on first use; configs equal up
    to ``name`` share one (objects in the config compare by identity)."""
    key = _config_key(config)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = DialogueEngine(config)
        return _SHARED[key]


def close_shared() -> None:
    """Close every shared user that :func:`shared` built and forget them."""
    with _SHARED_LOCK:
        for instance in _SHARED.values():
            instance.close()
        _SHARED.clear()


@dataclass(frozen=True)
class DialogueStart:
    """A dialogue as ``reset`` started it.

    Attributes:
        persona_id: the persona's id in the env's bank.
        seed: the env seed (int) that ``reset`` used.
        opening: the user's opening line.
        messages: the agent-side chat after reset, ``info["messages"]``: the agent's system
            prompt and the opening line, as ``[{"role": ..., "content": ...}, ...]``.
    """

    persona_id: str
    seed: int
    opening: str
    messages: list[dict[str, str]]


def dialogue_starts(
    config: Mapping[str, Any] | None = None, *, persona_ids: Sequence[str] | None = None, seed: int = 0
) -> list[DialogueStart]:
    """Start one dialogue per persona, with one batched call of the user for the openings.

    Args:
        config: as for :class:`~empathy_gym.engine.DialogueEngine` (its own keys and ``name``
            are ignored here), so the starts match what an env with that config recreates.
        persona_ids: which personas, in order; ``None`` for the env's whole bank.
        seed: dialogue i gets env seed ``seed + i``.

    Returns:
        One :class:`DialogueStart` per persona, in order.

    Raises:
        KeyError: an unknown persona id. As :class:`~empathy_gym.engine.DialogueEngine` for a bad config.
    """
    config = dict(config or {})
    env_id = config.pop("env_id", ENGINE_KEYS["env_id"])
    for key in (*ENGINE_KEYS, "name"):
        config.pop(key, None)
    bank = persona_bank({**config, "env_id": env_id})
    ids = list(persona_ids) if persona_ids is not None else [p.id for p in bank]
    seeds = [seed + index for index in range(len(ids))]
    with Session.of_id(env_id, **config) as session:
        envs = session.envs(max(1, len(ids)))
        results = reset_many(envs, seeds, [{"persona": pid} for pid in ids]) if ids else []
    return [
        DialogueStart(pid, row_seed, opening, info["messages"])
        for pid, row_seed, (opening, info) in zip(ids, seeds, results)
    ]


def persona_bank(config: Mapping[str, Any] | None = None) -> tuple[Persona, ...]:
    """The personas of the env that ``config`` makes (its ``personas`` key, else the
    registered ``env_id``'s bank), without building a user."""
    config = dict(config or {})
    env_id = config.get("env_id", ENGINE_KEYS["env_id"])
    return load_personas(config.get("personas", gym.spec(env_id).kwargs.get("personas")))


def dialogue_fields(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A dialogue start as a sample carries it (verl's ``interaction_kwargs``, a verifiers
    task's data), validated: ``persona_id`` (str), ``seed`` (int), ``opening`` (str).

    Returns:
        ``{"persona_id": str, "seed": int, "opening": str}``.

    Raises:
        KeyError: a missing (or ``None``) field. TypeError: a field of the wrong type.
    """
    kinds = {"persona_id": str, "seed": numbers.Integral, "opening": str}
    fields = {}
    for field, kind in kinds.items():
        value = kwargs.get(field)
        if value is None:
            raise KeyError(
                f"interaction_kwargs: field {field!r} is missing (rows from "
                f"empathy_gym.integrations.verl.build_rows carry it)"
            )
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"interaction_kwargs: field {field!r} must be {kind.__name__}, got {type(value).__name__}")
        fields[field] = int(value) if field == "seed" else value
    return fields


def start_env(env: EmpathyDialogueEnv, start: Mapping[str, Any]) -> None:
    """Recreate a dialogue start in ``env`` (validated with :func:`dialogue_fields`)."""
    fields = dialogue_fields(start)
    persona, _ = env.prepare_reset(seed=fields["seed"], options={"persona": fields["persona_id"]})
    env.finish_reset(persona, fields["opening"])
