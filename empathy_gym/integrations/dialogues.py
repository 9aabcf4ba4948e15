"""Dialogues for trainer adapters (verl, verifiers): reproducible dialogue starts, and one
simulated user shared by many concurrent dialogues.

Trainers hand an adapter one sample at a time (a dataset row, a task) and run many of
them concurrently in one process. Two things follow:

* **Starts are data.** :func:`dialogue_starts` plays ``reset`` once per persona and keeps
  what it produced (persona id, env seed, the user's opening line, the agent-side
  messages), so a dataset row or task can recreate the very same dialogue later with
  ``env.prepare_reset(seed=..., options={"persona": ...})`` and ``env.finish_reset(persona,
  opening)``; an LLM user's opening is never regenerated differently.
* **One user per process.** :class:`SharedUser` builds the simulated user once per config
  and process, hands out envs that use it (:meth:`SharedUser.new_env`), and sends the user
  turns of concurrent dialogues as one batched :func:`~empathy_gym.env.step_many` call
  (:meth:`SharedUser.step`, through a
  :class:`~empathy_gym.integrations.batching.MicroBatcher`). :func:`shared` returns the
  process-wide instance for a config, so adapter objects that trainers build per sample
  still share one user.
"""

from __future__ import annotations

import json
import numbers
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import gymnasium as gym

import empathy_gym  # noqa: F401  (registers the env ids)
from empathy_gym.env import EmpathyDialogueEnv, reset_many, sharing_one_user, step_many
from empathy_gym.integrations.batching import MicroBatcher
from empathy_gym.personas import Persona, load_personas

#: Config keys that :class:`SharedUser` reads itself; every other key (except ``name``)
#: is a ``gym.make`` keyword (``user``: a spec string or a mapping of
#: :class:`~empathy_gym.specs.UserSpec` fields; ``protocol``, ``difficulty``,
#: ``personas``, ``max_turns``, ``reward_mode``, ``think``, ...).
SHARED_USER_KEYS: dict[str, Any] = {"env_id": "EmpathyDialogue-RLVER-v0", "batch_window_ms": 5.0, "max_batch_size": 64}


class SharedUser:
    """One simulated user, built once, for many concurrent dialogues of one process.

    Args:
        config: ``env_id`` (default ``"EmpathyDialogue-RLVER-v0"``), ``batch_window_ms``
            (5: how long the micro-batcher waits for more turns after the first), and
            ``max_batch_size`` (64), plus any ``gym.make`` keyword. The ``user`` key names
            the simulated user (a spec string, a mapping of
            :class:`~empathy_gym.specs.UserSpec` fields, or from Python a ``UserSpec`` or
            a ready :class:`~empathy_gym.user.SimulatedUser`). ``name``
            is ignored. Subclasses add keys through :attr:`option_defaults`.

    Raises:
        gymnasium.error.Error: an unknown ``env_id``. TypeError: ``env_id`` is not an
            :class:`EmpathyDialogueEnv`. ValueError/KeyError: bad env options.
    """

    option_defaults: ClassVar[dict[str, Any]] = SHARED_USER_KEYS

    def __init__(self, config: Mapping[str, Any]):
        config = dict(config)
        config.pop("name", None)
        self.options: dict[str, Any] = {key: config.pop(key, default) for key, default in self.option_defaults.items()}
        self.env_id: str = self.options["env_id"]
        self.env_kwargs: dict[str, Any] = config
        first = gym.make(self.env_id, **self.env_kwargs).unwrapped
        if not isinstance(first, EmpathyDialogueEnv):
            raise TypeError(f"env_id {self.env_id!r} is not an EmpathyDialogueEnv (got {type(first).__name__})")
        self._owner = first  # owns the user; never handed out, so no caller closes it
        self.user = first.user
        self.batcher: MicroBatcher[tuple[EmpathyDialogueEnv, str], tuple] = MicroBatcher(
            _step_batch,
            window_s=float(self.options["batch_window_ms"]) / 1000.0,
            max_batch=int(self.options["max_batch_size"]),
        )

    def new_env(self) -> EmpathyDialogueEnv:
        """An env with this config and the shared simulated user (closing it leaves the
        user open)."""
        return gym.make(self.env_id, **{**self.env_kwargs, "user": self.user}).unwrapped

    async def step(self, env: EmpathyDialogueEnv, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``env.step(action)``, batched with the other dialogues' concurrent turns: one
        call of the simulated user for all turns queued within ``batch_window_ms``.

        Returns:
            ``(observation, reward, terminated, truncated, info)`` as ``env.step``.

        Raises:
            As ``env.step``; SimulatorError for every dialogue of a batch the LLM user
            failed.
        """
        return await self.batcher.submit((env, action))

    def close(self) -> None:
        """Close the simulated user if this object built it."""
        self._owner.close()


def _step_batch(items: list[tuple[EmpathyDialogueEnv, str]]) -> list[tuple]:
    return step_many([env for env, _ in items], [action for _, action in items])


SharedT = TypeVar("SharedT", bound=SharedUser)
_SHARED: dict[tuple[type, str], SharedUser] = {}
_SHARED_LOCK = threading.Lock()


def _config_key(config: Mapping[str, Any]) -> str:
    plain = {key: value for key, value in config.items() if key != "name"}
    return json.dumps(plain, sort_keys=True, default=lambda value: f"<{type(value).__name__} at {id(value):#x}>")


def shared(cls: type[SharedT], config: Mapping[str, Any]) -> SharedT:
    """The process-wide ``cls(config)``, created on first use; configs equal up to
    ``name`` share one (objects in the config compare by identity)."""
    key = (cls, _config_key(config))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = cls(config)
        return _SHARED[key]  # type: ignore[return-value]


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
        config: as for :class:`SharedUser` (keys it reads itself, and ``name``, are
            ignored here; the rest are ``gym.make`` keywords), so
            the starts match what an env with that config recreates (system prompt,
            think mode).
        persona_ids: which personas, in order; ``None`` for the env's whole bank.
        seed: dialogue i gets env seed ``seed + i``.

    Returns:
        One :class:`DialogueStart` per persona, in order.

    Raises:
        KeyError: an unknown persona id. As :class:`SharedUser` for a bad config.
    """
    config = dict(config or {})
    env_id = config.pop("env_id", SHARED_USER_KEYS["env_id"])
    for key in (*SHARED_USER_KEYS, "name"):
        config.pop(key, None)
    bank = persona_bank({**config, "env_id": env_id})
    ids = list(persona_ids) if persona_ids is not None else [p.id for p in bank]
    envs = sharing_one_user(lambda **options: gym.make(env_id, **options).unwrapped, max(1, len(ids)), **config)
    first = envs[0]
    seeds = [seed + index for index in range(len(ids))]
    results = reset_many(envs, seeds, [{"persona": pid} for pid in ids]) if ids else []
    first.close()  # closes the user only if it was built here
    return [
        DialogueStart(pid, row_seed, opening, info["messages"])
        for pid, row_seed, (opening, info) in zip(ids, seeds, results)
    ]


def persona_bank(config: Mapping[str, Any] | None = None) -> tuple[Persona, ...]:
    """The personas of the env that ``config`` makes (its ``personas`` key, else the
    registered ``env_id``'s bank), without building a user."""
    config = dict(config or {})
    env_id = config.get("env_id", SHARED_USER_KEYS["env_id"])
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
