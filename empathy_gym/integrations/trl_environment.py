"""TRL's native environment path (``GRPOTrainer(environment_factory=...)``, TRL >= 1.x,
experimental) against an empathy-gym server (``empathy-gym serve``, OpenEnv).

TRL gives each rollout one instance of the factory's class: ``reset(**row)`` starts a
dialogue (its return, the user's opening line, is appended to the prompt's last user
message), the class's public methods are the tools the policy calls, and ``get_reward()``
scores the finished rollout. Here the one tool is :meth:`EmpathyToolEnv.reply`: the policy
speaks to the simulated user by calling it, and the user's answer comes back as the tool's
result. The dialogue is the server's, so a row (``env_seed``, ``persona_id``) plays the
dialogue that ``env.reset(seed=env_seed, options={"persona": persona_id})`` plays
in-process. A runnable example: ``examples/trl_openenv.py``.

The policy's chat template must render tool calls (TRL checks; Qwen2.5's does), and the
policy must call the tool: a completion without a tool call ends the rollout.
"""

from __future__ import annotations

import logging
from typing import Any

from empathy_gym.integrations.openenv import EmpathyAction, EmpathyEnvClient

log = logging.getLogger(__name__)

#: appended to the env's system prompt in :meth:`EmpathyToolEnv.dataset`'s prompts
TOOL_INSTRUCTION = (
    "Speak to the person only by calling the tool `reply` with what you want to say; "
    "its result is their answer. Keep talking with them until the conversation ends."
)


class EmpathyToolEnv:
    """One dialogue on an empathy-gym server, for TRL's ``environment_factory``.

    Args:
        base_url: the server's URL (``http://127.0.0.1:8000``).
        token: the server's bearer token, if it has one.

    Attributes:
        env_seed, persona_id: what the last :meth:`reset` played (the persona the server
            chose when none was given).
        user_lines: the user's opening line and each answer since :meth:`reset`.
        emotions: the user's emotion (0-100) after the reset and after each turn.
        episode_return: the sum of the rewards of the turns played since :meth:`reset`
            (the env's reward: emotion change / 100 under ``reward_mode="delta"``, so
            in [-1, 1]); what :meth:`get_reward` returns.
        done: the dialogue has ended (the user's emotion reached 0 or 100, or the turn
            budget ran out), or no reset has succeeded yet.

    Each :meth:`reset` opens a new session on the server (and closes the last one), so an
    object that TRL keeps across batches survives an expired session, a dropped
    connection and a restarted server. :meth:`reply`'s docstring is the tool's description
    the policy reads; what it raises TRL hands to the policy as the tool's error:
    ``ValueError`` after the dialogue ended, ``RuntimeError`` for the server's refusal
    (an utterance over its limit, the user's failure), websockets' ``ConnectionClosed``
    for a connection that dropped (the next :meth:`reset` opens a new one).

    Example:
        >>> from functools import partial  # doctest: +SKIP
        >>> trainer = GRPOTrainer(model, args=config, train_dataset=dataset,
        ...     environment_factory=partial(EmpathyToolEnv, "http://127.0.0.1:8000"))
    """

    def __init__(self, base_url: str, *, token: str | None = None):
        self.base_url, self._token = base_url, token
        self._client: Any = None
        self.env_seed: int | None = None
        self.persona_id: str | None = None
        self.user_lines: list[str] = []
        self.emotions: list[int] = []
        self.episode_return = 0.0
        self.done = True

    @classmethod
    def dataset(cls, base_url: str, num_prompts: int, *, seed: int = 0, token: str | None = None) -> Any:
        """A ``datasets.Dataset`` of ``num_prompts`` dialogues for ``GRPOTrainer``.

        Row ``i`` holds the persona that env seed ``seed + i`` draws: ``prompt`` (the env's system
        prompt with :data:`TOOL_INSTRUCTION`, and an empty user message that TRL fills
        with the opening line :meth:`reset` returns), ``env_seed`` (int) and
        ``persona_id`` (str).

        Raises:
            ConnectionError: the server is not there or refused the session.
            ValueError: ``num_prompts`` < 1.
        """
        from datasets import Dataset

        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        rows = []
        with EmpathyEnvClient(base_url=base_url, token=token).sync() as client:
            for env_seed in range(seed, seed + num_prompts):
                observation = client.reset(seed=env_seed).observation
                system = observation.messages[0]["content"]
                prompt = [
                    {"role": "system", "content": f"{system}\n\n{TOOL_INSTRUCTION}"},
                    {"role": "user", "content": ""},
                ]
                rows.append({"prompt": prompt, "env_seed": env_seed, "persona_id": observation.persona_id})
        return Dataset.from_list(rows)

    def reset(self, env_seed: int | None = None, persona_id: str | None = None, **row: Any) -> str:
        """Start a dialogue as ``env.reset(seed=env_seed, options={"persona": persona_id})``
        does in-process (TRL passes a dataset row's columns; ``None``: drawn). Returns the
        user's opening line.

        Raises:
            ConnectionError: the server is not there or refused the session.
            RuntimeError: the server refused the reset (an unknown persona, say).
        """
        self.user_lines, self.emotions, self.episode_return, self.done = [], [], 0.0, True
        self._close()
        self._client = EmpathyEnvClient(base_url=self.base_url, token=self._token).sync().connect()
        result = self._client.reset(seed=env_seed, persona=persona_id)
        self.env_seed, self.persona_id = env_seed, result.observation.persona_id
        self.user_lines, self.emotions = [result.observation.text], [result.observation.emotion]
        self.episode_return, self.done = 0.0, bool(result.done)
        return result.observation.text

    def reply(self, message: str) -> str:
        """Say something to the person you are talking with, and hear their answer.

        Args:
            message: what you say to them.

        Returns:
            Their answer.
        """
        if self.done or self._client is None:
            raise ValueError("the conversation has ended: the person is no longer listening")
        result = self._client.step(EmpathyAction(utterance=message))
        self.episode_return += float(result.reward or 0.0)
        self.done = bool(result.done)
        self.user_lines.append(result.observation.text)
        self.emotions.append(result.observation.emotion)
        return result.observation.text

    def get_reward(self) -> float:
        """The rollout's reward: :attr:`episode_return` (float; 0.0 before any turn)."""
        return self.episode_return

    # TRL takes every public method for a tool: closing is the context manager's
    def __enter__(self) -> EmpathyToolEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close()
            except Exception:  # noqa: BLE001  (a session the server already dropped)
                log.debug("closing the last session failed", exc_info=True)
