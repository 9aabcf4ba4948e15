"""The session a recipe names (``config.env``): one simulated user and the envs that share
it, whose turns then go to it as one batch. The trainer, the held-out evaluation and the
second judge build theirs here."""

from __future__ import annotations

import dataclasses
from typing import Any

from empathy_gym.agents.config import RecipeError, TrainerConfig
from empathy_gym.session import Session


def make_session(config: TrainerConfig, think: bool, policy_user: Any = None, **overrides: Any) -> Session:
    """A :class:`~empathy_gym.session.Session` of ``config.env``'s envs: one simulated user
    (built here; closed with the session) whose envs a rollout takes, so its user turns go
    to the user as one batch.

    Args:
        policy_user: the backend ``env.kwargs.user: policy`` stands for
            (:meth:`~empathy_gym.agents.trainer.RLTrainer.make_policy_user`).
        overrides: env keyword arguments over ``env.kwargs`` and ``env.personas``.

    Raises:
        RecipeError: a bad value under ``env.kwargs``.
    """
    import empathy_gym  # noqa: F401  (registers the ids)

    kwargs = config.env.gym_kwargs(**overrides)
    user = config.env.user_spec() if "user" not in overrides else None
    if user is not None and user.on_policy:
        if policy_user is None:
            raise RecipeError(f"env.kwargs.user {user.backend!r}: the trainer builds this user from its policy")
        # the trainer gave the backend_kwargs to policy_user
        kwargs["user"] = dataclasses.replace(user, backend=policy_user, backend_kwargs={})
    kwargs.setdefault("think", think)
    try:
        return Session.of_id(config.env.id, **kwargs)
    except (TypeError, ValueError, KeyError) as error:  # a bad value under env.kwargs
        raise RecipeError(
            f"field 'env' ({config.env.id} with kwargs {dict(config.env.kwargs)}): "
            f"{str(error).split(' was raised from the environment creator')[0]}"
        ) from None
