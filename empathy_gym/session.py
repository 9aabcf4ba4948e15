"""A session: one simulated user and the envs that share it, with one owner.

Every place that plays several dialogues against one user builds them here: the vector env,
the trainer's rollouts, the held-out evaluation and the second judge, the dialogue engine
behind verl's and verifiers' loops, the Sentient benchmark, and the dialogue starts of the
integrations. The session builds the user once (the first env builds it from the spec),
hands out envs that share it (their user turns then go to it as one batch:
:func:`~empathy_gym.env.step_many`), and closes it once, in :meth:`Session.close`; closing
one of its envs never closes the user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from empathy_gym.env import EmpathyDialogueEnv


class Session:
    """One simulated user and the envs that share it.

    Args:
        make: builds one unwrapped env from keywords (default
            :class:`~empathy_gym.env.EmpathyDialogueEnv`; :meth:`of_id` for a registered id).
        **env_kwargs: its keywords. ``user``: a spec (the session builds the user and
            closes it) or a ready :class:`~empathy_gym.user.base.SimulatedUser` (the
            caller's: never closed here).

    Attributes:
        user: the shared simulated user.
        owns_user: whether :meth:`close` closes it.

    Raises:
        TypeError: ``make`` built something that is not an ``EmpathyDialogueEnv``.
        As ``make`` for bad keywords (TypeError, ValueError, KeyError).
    """

    def __init__(self, make: Callable[..., Any] = EmpathyDialogueEnv, /, **env_kwargs: Any):
        first = make(**env_kwargs)
        if not isinstance(first, EmpathyDialogueEnv):
            first.close()
            raise TypeError(f"a session needs EmpathyDialogueEnv envs, got {type(first).__name__}")
        self._make, self.env_kwargs = make, env_kwargs
        self.user = first.user
        self.owns_user = first.hand_over_user()
        self._first = first
        self._spare: list[EmpathyDialogueEnv] = [first]
        self.handed_out = 0
        self.closed = False

    @classmethod
    def of_id(cls, env_id: str, /, **env_kwargs: Any) -> Session:
        """A session of ``gym.make(env_id, **env_kwargs).unwrapped`` envs."""
        import empathy_gym  # noqa: F401  (registers the ids)

        return cls(lambda **options: gym.make(env_id, **options).unwrapped, **env_kwargs)

    @property
    def personas(self) -> tuple[Any, ...]:
        """The envs' persona bank (:class:`~empathy_gym.personas.Persona` objects)."""
        return self._first.personas

    @property
    def protocol(self) -> Any:
        """The envs' :class:`~empathy_gym.user.protocol.EmotionProtocol`."""
        return self._first.protocol

    def new_env(self) -> EmpathyDialogueEnv:
        """One more env on the shared user (the first call returns the env that built it).

        Raises:
            RuntimeError: the session is closed.
        """
        if self.closed:
            raise RuntimeError("this session is closed: its simulated user is gone")
        env = self._spare.pop() if self._spare else self._make(**{**self.env_kwargs, "user": self.user})
        self.handed_out += 1
        return env

    def envs(self, count: int) -> list[EmpathyDialogueEnv]:
        """``count`` (>= 1) more envs on the shared user, as :meth:`new_env`."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        return [self.new_env() for _ in range(count)]

    def close(self) -> None:
        """Close the user, when the session built it; a second call does nothing. The envs
        handed out hold nothing else (closing one is the caller's choice, and never closes
        the user), so a session that hands out an env per dialogue does not keep them."""
        if self.closed:
            return
        self.closed = True
        for env in self._spare:
            env.close()
        if self.owns_user:
            self.user.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(user={self.user!r}, envs handed out={self.handed_out}, closed={self.closed})"
