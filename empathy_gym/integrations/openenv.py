"""The environment as an OpenEnv server (``openenv-core`` 0.3, the library OpenEnv's clients
and TRL speak to): typed action, observation and state, WebSocket sessions that share one
simulated user, and a typed client.

* :class:`EmpathyAction`: the agent's utterance. :class:`EmpathyObservation`: the user's
  line (the opening after ``reset``, the reply after ``step``), the emotion (0-100), the
  turn, the persona, why the dialogue ended, and the agent-side chat so far; ``reward``
  and ``done`` as OpenEnv defines them (``reward`` is the env's: the emotion change / 100
  under ``reward_mode="delta"``; ``done`` is ``terminated or truncated``).
  :class:`EmpathyState`: the episode id, the step count, the emotion, the persona.
* :func:`make_app`: the FastAPI app. Every WebSocket session gets its own env on one
  :class:`~empathy_gym.engine.DialogueEngine`, so the turns of concurrent sessions reach
  the simulated user together (``batch_window_ms``), as the vector env's do in-process;
  ``reset(seed=s, persona=ID)`` plays the same dialogue as ``env.reset(seed=s,
  options={"persona": ID})`` in-process. OpenEnv's plain HTTP ``/reset`` and ``/step``
  build a fresh env per request (its convention): a dialogue needs a WebSocket session.
* :class:`EmpathyEnvClient`: OpenEnv's ``EnvClient`` for this server (``.sync()`` for a
  blocking one).

Run it with ``empathy-gym serve`` (binds 127.0.0.1 by default). Needs
``pip install 'empathy-gym[openenv]'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field
except ImportError as error:  # pragma: no cover - the layered checks run with it
    raise ImportError(
        "empathy_gym.integrations.openenv needs openenv-core 0.3: pip install 'empathy-gym[openenv]'"
    ) from error

from empathy_gym.engine import DialogueEngine

ENV_NAME = "empathy_dialogue"
#: the info keys an observation carries as fields of their own
NAMED = ("messages", "emotion", "turn", "persona_id", "termination_reason")


class EmpathyAction(Action):
    """One agent turn."""

    utterance: str = Field(..., description="the agent's reply to the simulated user")


class EmpathyObservation(Observation):
    """What the agent sees after ``reset`` or ``step`` (``done`` and ``reward``: OpenEnv's)."""

    text: str = Field(default="", description="the user's line: the opening after reset, else the reply")
    emotion: int = Field(default=0, ge=0, le=100, description="the user's emotion after the turn, 0-100")
    turn: int = Field(default=0, ge=0, description="agent turns played so far")
    persona_id: str = Field(default="", description="the persona's id in the server's bank")
    termination_reason: str | None = Field(default=None, description="why the dialogue ended (None: it goes on)")
    messages: list[dict[str, str]] = Field(
        default_factory=list, description="the agent-side chat so far (system prompt, user and assistant turns)"
    )
    info: dict[str, Any] = Field(
        default_factory=dict, description="the rest of the env's info (its flags, the appraisal), as JSON"
    )


class EmpathyState(State):
    """The session's dialogue: OpenEnv's episode id and step count, and ours."""

    emotion: int = 0
    persona_id: str = ""


class EmpathyEnvironment(Environment):
    """One session's dialogue, an env of ``engine`` (whose simulated user every session shares).

    Raises (as an OpenEnv error answer to the client): ``step`` before ``reset`` or after
    the dialogue ended (``RuntimeError``), the user's failure
    (:class:`~empathy_gym.user.base.SimulatorError`). A reply longer than the env's
    ``max_utterance_chars`` is cut there (``info["action_truncated"]``), as in-process.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, engine: DialogueEngine):
        super().__init__()
        self.engine = engine
        self.env = engine.new_env()
        self._state = EmpathyState()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, persona: str | None = None, **kwargs: Any
    ) -> EmpathyObservation:
        """A new dialogue: ``env.reset(seed=seed, options={"persona": persona})``."""
        text, info = self.env.reset(seed=seed, options={"persona": persona} if persona is not None else None)
        self._state = EmpathyState(episode_id=episode_id, step_count=0, persona_id=info["persona_id"])
        return self._observation(text, info, reward=None, done=False)

    def step(self, action: EmpathyAction, timeout_s: float | None = None, **kwargs: Any) -> EmpathyObservation:
        """One turn without batching (OpenEnv calls :meth:`step_async`)."""
        return self._finish(self.env.step(action.utterance))

    async def step_async(
        self, action: EmpathyAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EmpathyObservation:
        """One turn, batched with the other sessions' turns into one call of the user."""
        return self._finish(await self.engine.submit(self.env, action.utterance))

    def _finish(self, result: tuple[str, Any, bool, bool, dict[str, Any]]) -> EmpathyObservation:
        text, reward, terminated, truncated, info = result
        self._state.step_count += 1
        return self._observation(text, info, reward=float(reward), done=bool(terminated or truncated))

    def _observation(self, text: str, info: dict[str, Any], *, reward: float | None, done: bool) -> EmpathyObservation:
        self._state.emotion = int(info["emotion"])
        return EmpathyObservation(
            text=text,
            emotion=int(info["emotion"]),
            turn=int(info["turn"]),
            persona_id=str(info["persona_id"]),
            termination_reason=info.get("termination_reason"),
            messages=[dict(message) for message in info["messages"]],
            info=json.loads(json.dumps({k: v for k, v in info.items() if k not in NAMED}, default=str)),
            reward=reward,
            done=done,
        )

    @property
    def state(self) -> EmpathyState:
        return self._state

    def close(self) -> None:
        """Nothing to release: the user belongs to the server's engine."""


def make_app(config: Mapping[str, Any] | None = None, *, max_sessions: int = 64) -> Any:
    """The OpenEnv FastAPI app of an env config.

    Args:
        config: as for :class:`~empathy_gym.engine.DialogueEngine`: ``env_id``,
            ``batch_window_ms``, ``max_batch_size`` and any ``gym.make`` keyword
            (``user``, ``personas``, ``difficulty``, ...).
        max_sessions: concurrent WebSocket sessions (each holds one dialogue).

    Returns:
        The app; ``app.state.engine`` is the engine (closed on the app's shutdown).

    Raises:
        As :class:`~empathy_gym.engine.DialogueEngine` for a bad config.
    """
    engine = DialogueEngine(config or {})
    app = create_app(
        lambda: EmpathyEnvironment(engine),
        EmpathyAction,
        EmpathyObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions,
    )
    app.state.engine = engine
    app.router.add_event_handler("shutdown", engine.close)
    return app


class EmpathyEnvClient(EnvClient[EmpathyAction, EmpathyObservation, EmpathyState]):
    """OpenEnv's client for this server: ``reset(seed=..., persona=...)``, ``step(EmpathyAction(utterance=...))``.

    Example:
        >>> with EmpathyEnvClient(base_url="http://127.0.0.1:8000").sync() as client:  # doctest: +SKIP
        ...     result = client.reset(seed=0)
        ...     result = client.step(EmpathyAction(utterance="That sounds hard."))
        ...     print(result.observation.emotion, result.reward, result.done)
    """

    def _step_payload(self, action: EmpathyAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EmpathyObservation]:
        fields = {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)}
        observation = EmpathyObservation(**fields)
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> EmpathyState:
        return EmpathyState(**payload)
