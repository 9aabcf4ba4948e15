"""``EmpathyDialogueVectorEnv``: N dialogues stepped together, their simulated-user turns
sent to the backend as one batch; ``gym.make_vec(id, num_envs=N, **make_kwargs)`` builds it.

Gymnasium's ``SyncVectorEnv`` would call the user N times a step, and its
``AsyncVectorEnv`` gives every process its own model and breaks on sentences in shared
memory. Here N unwrapped envs share ONE user and step through
:func:`~empathy_gym.env.step_many`. See docs/integrations.md.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from empathy_gym.env import EmpathyDialogueEnv, reset_many, step_many
from empathy_gym.session import Session


class EmpathyDialogueVectorEnv(VectorEnv):
    """N :class:`~empathy_gym.env.EmpathyDialogueEnv` dialogues sharing one simulated
    user, stepped as one batch.

    Gymnasium 1.x conventions, as ``SyncVectorEnv``: observations are a tuple of N ``str``
    (``observation_space`` is ``batch_space`` of the single space); actions any sequence of
    N ``str``; rewards float64 (N,); terminations and truncations bool (N,); infos merged
    into arrays with ``_key`` masks (nested dicts such as ``appraisal`` stay nested).
    Sub-env i seeded ``s + i`` (:meth:`reset`) plays exactly the dialogues of a single env
    reset with ``s + i``: its later (auto)resets continue its own ``np_random``.

    Autoreset (https://farama.org/Vector-Autoreset-Mode): ``NEXT_STEP`` (default) resets
    an ended sub-env on the next ``step``, ignoring its action there and returning the new
    opening line, reward 0, no flags and the reset ``info``; ``SAME_STEP`` resets it
    within the step, its last reply and ``info`` in ``infos["final_obs"]`` and
    ``infos["final_info"]``; ``DISABLED`` never does (``reset(options={"reset_mask":
    mask})`` does; stepping an ended sub-env raises ``RuntimeError``).

    Args:
        num_envs: N, the number of dialogues (>= 1).
        autoreset_mode: an :class:`~gymnasium.vector.AutoresetMode` or its value
            (``"NextStep"``, ``"SameStep"``, ``"Disabled"``).
        **kwargs: the :class:`~empathy_gym.env.EmpathyDialogueEnv` arguments, as for
            ``gym.make``. The first sub-env builds the simulated user from a ``user=`` spec
            (and closes it in :meth:`close`); a ready ``SimulatedUser`` is not closed.

    Attributes:
        envs: the N sub-envs (``list[EmpathyDialogueEnv]``), index = sub-env id.
        user: the shared :class:`~empathy_gym.user.SimulatedUser`.

    Raises:
        ValueError: ``num_envs`` not an int >= 1, an unknown ``autoreset_mode``; and
            whatever ``EmpathyDialogueEnv`` raises for bad arguments.

    Example:
        >>> envs = gym.make_vec("EmpathyDialogue-v0", num_envs=4)
        >>> observations, infos = envs.reset(seed=0)  # a tuple of 4 opening lines
        >>> observations, rewards, terminations, truncations, infos = envs.step(["That sounds hard."] * 4)
    """

    def __init__(
        self, num_envs: int = 1, *, autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, **kwargs: Any
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.autoreset_mode = (
            autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        )
        self.num_envs = int(num_envs)
        #: the simulated user and the sub-envs that share it (closed with this env)
        self.session = Session(EmpathyDialogueEnv, **kwargs)
        self.envs: list[EmpathyDialogueEnv] = self.session.envs(self.num_envs)
        first = self.envs[0]
        self.user = first.user
        self.metadata = {**first.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._observations: list[str] = [""] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)

    # -- reset ---------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset the sub-envs (all, or those in ``options["reset_mask"]``), asking the user
        for all their openings in one batch.

        Args:
            seed: ``None`` (continue each sub-env's ``np_random``), an int s (sub-env i
                gets ``s + i``) or a sequence of N ints or ``None``s.
            options: ``reset`` options for every reset sub-env (e.g. ``{"persona": id}``),
                plus an optional ``"reset_mask"``: bool array (N,), at least one True.

        Returns:
            ``(observations, infos)``: a tuple of N ``str`` (sub-envs not reset keep their
            last observation) and the merged infos of the reset sub-envs.

        Raises:
            ValueError: a seed list of the wrong length, a bad ``reset_mask`` shape or an
                all-False mask. TypeError: a ``reset_mask`` that is not a bool array.
        """
        super().reset(seed=seed if isinstance(seed, (int, np.integer)) else None)
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        indices = np.flatnonzero(mask)
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(indices, self._reset(indices, [seeds[i] for i in indices], options or None)):
            self._observations[i] = obs
            infos = self._add_info(infos, info, i)
        self._autoreset[indices] = False
        return tuple(self._observations), infos

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset(seed=...): got {len(seeds)} seeds for num_envs={self.num_envs}")
        return seeds

    def _reset_mask(self, mask: Any) -> np.ndarray:
        if mask is None:
            return np.ones(self.num_envs, dtype=np.bool_)
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            got = f"an array of {mask.dtype}" if isinstance(mask, np.ndarray) else type(mask).__name__
            raise TypeError(f"options['reset_mask'] must be a NumPy bool array, got {got}")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}")
        if not mask.any():
            raise ValueError("options['reset_mask'] has no True value: nothing to reset")
        return mask

    def _reset(
        self, indices: Sequence[int], seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> list[tuple[str, dict[str, Any]]]:
        if len(indices) == 0:
            return []
        return reset_many([self.envs[i] for i in indices], seeds, [options] * len(indices))

    # -- step ----------------------------------------------------------------------
    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Send one utterance per sub-env to the simulated user, as one batch.

        Args:
            actions: N ``str``; the action of a sub-env being autoreset is ignored.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``: a tuple of N
            ``str``, float64 (N,) rewards, bool (N,) arrays, and the merged infos.

        Raises:
            ValueError: not N actions. TypeError: a non-``str`` action (its index named).
            RuntimeError: ``step`` before ``reset``, or (``DISABLED``) on an ended sub-env.
            SimulatorError: an LLM user failed to give a valid appraisal.
        """
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        resetting = self._autoreset.copy() if next_step else np.zeros(n, dtype=np.bool_)
        stepping = np.flatnonzero(~resetting)
        actions = self._check_actions(actions, stepping)
        env_infos: list[dict[str, Any]] = [{}] * n
        final: dict[int, dict[str, Any]] = {}

        results = step_many([self.envs[i] for i in stepping], [actions[i] for i in stepping])
        for i, (obs, reward, terminated, truncated, info) in zip(stepping, results):
            self._observations[i] = obs
            rewards[i], terminations[i], truncations[i] = reward, terminated, truncated
            env_infos[i] = info
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            ended = np.flatnonzero(terminations | truncations)
            final = {i: {"final_obs": self._observations[i], "final_info": env_infos[i]} for i in ended}
            resetting[ended] = True
        to_reset = np.flatnonzero(resetting)
        for i, (obs, info) in zip(to_reset, self._reset(to_reset, [None] * len(to_reset), None)):
            self._observations[i] = obs
            env_infos[i] = info

        infos: dict[str, Any] = {}
        for i in range(n):
            if i in final:
                infos = self._add_info(infos, final[i], i)
            infos = self._add_info(infos, env_infos[i], i)
        if next_step:
            self._autoreset = terminations | truncations
        return tuple(self._observations), rewards, terminations, truncations, infos

    def _check_actions(self, actions: Sequence[str], stepping: Sequence[int]) -> list[str]:
        if isinstance(actions, str):
            raise TypeError(f"actions must be a sequence of {self.num_envs} str, got one str")
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (one per sub-env), got {len(actions)}")
        for i in stepping:
            if not isinstance(actions[i], str):
                raise TypeError(f"actions[{i}] must be a str (the agent's utterance), got {type(actions[i]).__name__}")
        return actions

    # -- the rest of the VectorEnv API ------------------------------------------------
    def render(self) -> tuple[str | None, ...]:
        """Each sub-env's :meth:`~empathy_gym.env.EmpathyDialogueEnv.render`."""
        return tuple(env.render() for env in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every sub-env (or read the attribute, if not callable)."""
        values = (getattr(env, name) for env in self.envs)
        return tuple(value(*args, **kwargs) if callable(value) else value for value in values)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-env."""
        return tuple(getattr(env, name) for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close the sub-envs and the simulated user, when it was built here (the session)."""
        for env in self.envs:
            env.close()
        self.session.close()
