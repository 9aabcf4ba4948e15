"""The dialogue engine: one simulated user, many dialogues, and the loops that play them:
:class:`DialogueEngine`, :func:`play` (lock step) and :func:`play_one` (a coroutine).
Training's rollouts, the evaluations, verl's agent loop and verifiers drive it with only
their own policy step. See docs/integrations.md.

The env alone decides when a dialogue ends; a driver may stop one early only for a reason
of its own (no room left in its token budget).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from empathy_gym.batching import MicroBatcher
from empathy_gym.env import EmpathyDialogueEnv, reset_many, step_many
from empathy_gym.session import Session

#: ``observation, reward, terminated, truncated, info``, as ``env.step`` returns it.
StepResult = tuple[str, float, bool, bool, dict[str, Any]]
State = TypeVar("State")

#: Config keys :class:`DialogueEngine` reads itself; every other key (except ``name``) is
#: a ``gym.make`` keyword.
ENGINE_KEYS: dict[str, Any] = {"env_id": "EmpathyDialogue-RLVER-v0", "batch_window_ms": 5.0, "max_batch_size": 64}


class DialogueEngine:
    """One simulated user, built once, and the envs that share it.

    Args:
        config: ``env_id`` (default ``"EmpathyDialogue-RLVER-v0"``), ``batch_window_ms``
            (5: how long :meth:`submit` waits for more turns after the first) and
            ``max_batch_size`` (64), plus any ``gym.make`` keyword (``user``: as for
            :class:`~empathy_gym.env.EmpathyDialogueEnv`). ``name`` is ignored.

    Raises:
        gymnasium.error.Error: an unknown ``env_id``. TypeError: ``env_id`` is not an
            :class:`~empathy_gym.env.EmpathyDialogueEnv`. ValueError/KeyError: bad options.
    """

    def __init__(self, config: Mapping[str, Any]):
        config = dict(config)
        config.pop("name", None)
        self.options: dict[str, Any] = {key: config.pop(key, default) for key, default in ENGINE_KEYS.items()}
        self.env_id: str = self.options["env_id"]
        self.env_kwargs: dict[str, Any] = config
        try:
            #: the simulated user and the envs that share it
            self.session = Session.of_id(self.env_id, **self.env_kwargs)
        except TypeError as error:
            if "a session needs EmpathyDialogueEnv" not in str(error):
                raise
            raise TypeError(f"env_id {self.env_id!r} is not an EmpathyDialogueEnv ({error})") from None
        self.user = self.session.user
        #: held by every batch of turns and by :meth:`reset`: the user never serves two threads at once
        self.user_lock = threading.Lock()
        self.batcher: MicroBatcher[tuple[EmpathyDialogueEnv, str], StepResult] = MicroBatcher(
            self._step_batch,
            window_s=float(self.options["batch_window_ms"]) / 1000.0,
            max_batch=int(self.options["max_batch_size"]),
        )

    def new_env(self) -> EmpathyDialogueEnv:
        """An env with this config and the shared user (closing it leaves the user open)."""
        return self.session.new_env()

    def _step_batch(self, items: Sequence[tuple[EmpathyDialogueEnv, str]]) -> list[StepResult]:
        with self.user_lock:
            return step_many([env for env, _ in items], [action for _, action in items])

    async def reset(
        self, env: EmpathyDialogueEnv, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``env.reset(seed=seed, options=options)`` in a worker thread, under the lock the
        turns' batches hold (a coroutine: the event loop goes on meanwhile).

        Raises:
            As ``env.reset``.
        """
        return await asyncio.to_thread(self._reset_locked, env, seed, options)

    def _reset_locked(
        self, env: EmpathyDialogueEnv, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        with self.user_lock:
            return env.reset(seed=seed, options=options)

    async def submit(self, env: EmpathyDialogueEnv, action: str) -> StepResult:
        """``env.step(action)``, batched with the other coroutines' turns queued within
        ``batch_window_ms`` into one call of the simulated user.

        Raises:
            As ``env.step``; SimulatorError for every dialogue of a batch the user failed.
        """
        return await self.batcher.submit((env, action))

    def close(self) -> None:
        """Close the simulated user (it was built here); the envs handed out hold nothing else."""
        self.session.close()


@dataclass(frozen=True)
class Start:
    """How to reset a dialogue: ``env.reset(seed=seed, options=options)``."""

    seed: int | None
    options: dict[str, Any] | None = None


class Driver(Generic[State]):
    """What a caller of :func:`play` supplies: its own per-dialogue state and policy step
    (subclasses implement all three methods).

    Attributes:
        user_seconds: wall-clock seconds :func:`play` spent in the envs' resets and steps
            (the simulated user's turns), summed over the rounds.
    """

    user_seconds: float = 0.0

    def begin(self, index: int, env: EmpathyDialogueEnv, info: dict[str, Any]) -> State:
        """The state of dialogue ``index`` (its position in ``starts``), just reset in
        ``env`` (``info``: the reset's info)."""
        raise NotImplementedError

    def act(self, states: Sequence[State]) -> list[str]:
        """One utterance per running dialogue, in the order given (a batched policy step)."""
        raise NotImplementedError

    def record(self, state: State, env: EmpathyDialogueEnv, result: StepResult) -> bool:
        """Take in one turn's ``env.step`` result; True ends the dialogue here although
        the env did not (the driver's own limit, e.g. no room for another turn)."""
        raise NotImplementedError


def play(envs: Sequence[EmpathyDialogueEnv], starts: Sequence[Start], driver: Driver[State]) -> Iterator[list[State]]:
    """Play one dialogue per start, ``len(envs)`` at a time, in lock step.

    Each round: the waiting dialogues take the free envs (one batched reset), the driver
    answers every running dialogue in one call (:meth:`Driver.act`), each shared user
    answers in one call (:func:`~empathy_gym.env.step_many`), and the driver records each
    result. Every dialogue keeps its own env until it ends, so one that ends never shifts
    the others (RLVER's released rollout sent replies to the wrong user once one had ended).

    Args:
        envs: the slots: unwrapped envs, ideally sharing one user (at least one).
        starts: one :class:`Start` per dialogue, started in this order.
        driver: the caller's states and policy step.

    Yields:
        After each round, the states of the dialogues that ended in it (maybe none), in
        slot order; a caller may stop between rounds.

    Raises:
        ValueError: no envs for a non-empty ``starts``.
        TypeError: ``act`` returned the wrong number of utterances.
        Whatever the driver or the simulated user raises.
    """
    if starts and not envs:
        raise ValueError("play needs at least one env")
    waiting = deque(enumerate(starts))
    free = list(range(min(len(envs), len(starts))))[::-1]
    running: dict[int, State] = {}
    while waiting or running:
        starting = [(free.pop(), *waiting.popleft()) for _ in range(min(len(free), len(waiting)))]
        tick = time.perf_counter()
        if starting:
            resets = reset_many(
                [envs[slot] for slot, _, _ in starting],
                [start.seed for _, _, start in starting],
                [start.options for _, _, start in starting],
            )
            driver.user_seconds += time.perf_counter() - tick
            for (slot, index, _), (_, info) in zip(starting, resets):
                running[slot] = driver.begin(index, envs[slot], info)
        order = sorted(running)
        actions = driver.act([running[slot] for slot in order])
        if len(actions) != len(order):
            raise TypeError(f"the policy step returned {len(actions)} utterances for {len(order)} dialogues")
        tick = time.perf_counter()
        results = step_many([envs[slot] for slot in order], actions)
        driver.user_seconds += time.perf_counter() - tick
        ended = []
        for slot, result in zip(order, results):
            _, _, terminated, truncated, _ = result
            if driver.record(running[slot], envs[slot], result) or terminated or truncated:
                ended.append(running.pop(slot))
                free.append(slot)
        yield ended


async def play_one(
    engine: DialogueEngine,
    env: EmpathyDialogueEnv,
    act: Callable[[str | None], Awaitable[str | None]],
    record: Callable[[StepResult], bool],
) -> None:
    """Play the dialogue already started in ``env`` (a :meth:`DialogueEngine.new_env`)
    to its end, one turn at a time, as a coroutine.

    Args:
        engine: the shared user; each turn goes through :meth:`DialogueEngine.submit`.
        env: the dialogue.
        act: the policy step: ``act(None)`` for the first utterance, then
            ``act(observation)`` with the user's last reply; ``None`` stops the dialogue
            before the user sees anything more (the driver's own limit).
        record: takes in each turn's ``env.step`` result; True ends the dialogue although
            the env did not.

    Raises:
        Whatever ``act``, ``record`` or the simulated user raises.
    """
    observation: str | None = None
    while (action := await act(observation)) is not None:
        result = await engine.submit(env, action)
        observation, _, terminated, truncated, _ = result
        if record(result) or terminated or truncated:
            return
