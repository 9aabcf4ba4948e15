"""The simulated user as a verifiers environment (verifiers >= 0.4, ``verifiers.v1``).

verifiers 0.4 has no ``MultiTurnEnv``: a multi-turn ``Env.run`` holds the agent's rollout
open with ``agent.interaction(task)`` and answers each turn, as verifiers' own TextArena
env does. Here :class:`EmpathyTaskset` yields one task per persona (the dialogue as
``reset`` starts it) and :class:`EmpathyEnv` answers each agent turn with the simulated
user's reply until the env ends the dialogue. See docs/integrations.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from empathy_gym.boundary import neutralise
from empathy_gym.engine import StepResult, play_one
from empathy_gym.integrations.dialogues import dialogue_starts, shared, start_env
from empathy_gym.reward import RLVER_REWARD

try:
    import verifiers.v1 as vf
except ImportError as error:  # pragma: no cover - depends on the installed verifiers
    raise ImportError(
        "empathy_gym.integrations.verifiers needs verifiers >= 0.4 (verifiers.v1): pip install 'empathy-gym[verifiers]'"
    ) from error

#: The taskset id verifiers resolves to the top-level module ``empathy_dialogue``.
TASKSET_ID = "empathy-dialogue"


class EmpathyData(vf.TaskData):
    """One dialogue start: verifiers' task data (``prompt``: the user's opening line,
    ``system_prompt``: the agent's system prompt, ``name``: the persona id) plus what
    recreates it in the env."""

    persona_id: str
    """The persona's id in the env's bank."""
    seed: int
    """The env seed that ``reset`` used."""
    opening: str
    """The user's opening line (also the task's prompt)."""


class EmpathyTaskConfig(vf.TaskConfig):
    """What every episode of the taskset runs with (``--env.taskset.task.*``)."""

    env_id: str = "EmpathyDialogue-v0"
    """The registered gym id (``EmpathyDialogue-v0``: SAGE protocol, built-in bank;
    ``EmpathyDialogue-RLVER-v0``: the 500 RLVER training profiles)."""
    env: dict[str, Any] = Field(default_factory=dict)
    """``gym.make`` keywords: ``user`` (a spec string such as ``"openai:MODEL@URL"``),
    ``protocol``, ``max_turns``, ``reward_mode``, ``think``, ``personas``, ..."""
    reward: Literal["emotion_change", "final_emotion"] = "emotion_change"
    """The trace's reward: the sum of the env's turn rewards, or e_T / 100."""
    batch_window_ms: float = Field(5.0, ge=0)
    """How long the shared user waits for more episodes' turns after the first."""
    max_batch_size: int = Field(64, ge=1)
    """The most user turns per batched call."""

    def user_config(self) -> dict[str, Any]:
        """The :class:`~empathy_gym.engine.DialogueEngine` config of these options."""
        return {
            "env_id": self.env_id,
            **self.env,
            "batch_window_ms": self.batch_window_ms,
            "max_batch_size": self.max_batch_size,
        }


class EmpathyTask(vf.Task[EmpathyData, vf.State, EmpathyTaskConfig]):
    """A dialogue with the simulated user. Scored by :class:`EmpathyEnv` from the env's
    rewards (the user's appraisals), not by a rubric over the transcript."""

    @property
    def key(self) -> str:
        return f"{self.data.persona_id}@{self.data.seed}"


class EmpathyTasksetConfig(vf.TasksetConfig):
    """Which dialogues the taskset starts (``--env.taskset.*``)."""

    task: EmpathyTaskConfig = EmpathyTaskConfig()
    persona_ids: list[str] | None = None
    """Persona ids, in order; ``None`` for the env's whole bank."""
    seed: int = 0
    """Task i gets env seed ``seed + i``."""


class EmpathyTaskset(vf.Taskset[EmpathyTask, EmpathyTasksetConfig]):
    """One task per persona, the user's openings written in one batched call when the taskset loads."""

    def load(self) -> list[EmpathyTask]:
        task_config = self.config.task
        starts = dialogue_starts(task_config.user_config(), persona_ids=self.config.persona_ids, seed=self.config.seed)
        return [
            EmpathyTask(
                EmpathyData(
                    name=start.persona_id,
                    prompt=start.opening,
                    system_prompt=start.messages[0]["content"],
                    persona_id=start.persona_id,
                    seed=start.seed,
                    opening=start.opening,
                ),
                task_config,
            )
            for start in starts
        ]


class EmpathyEnvConfig(vf.EnvConfig):
    """The env's one seat, ``agent``: the policy, in verifiers' tool-less chat harness
    (``null``) and a local subprocess runtime unless the run says otherwise."""

    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})


class EmpathyEnv(vf.Env[EmpathyEnvConfig]):
    """A dialogue between the agent and the simulated user; see the module docstring."""

    async def start(self) -> None:
        # Build the shared user before the first rollout, so a bad config fails fast.
        self.user = shared(self.taskset.config.task.user_config())

    async def run(self, task: EmpathyTask, agents: vf.Agents) -> None:
        """One episode: the agent answers the opening line, the simulated user answers
        each reply (steps of the task's recreated env, batched with the other episodes'),
        until the env ends the dialogue or verifiers ends the agent's run. Records the
        reward and the metrics ``emotion_change``, ``final_emotion`` (e_T / 100), ``turns``
        and ``success`` on the agent's trace, and the ``emotions`` and
        ``termination_reason`` in ``trace.info``.

        Raises:
            KeyError, TypeError: task data without a valid persona id, seed or opening.
            SimulatorError: the LLM user failed (for every episode of its batch).
        """
        engine = shared(task.config.user_config())
        env = engine.new_env()
        rewards: list[float] = []
        infos: list[dict[str, Any]] = [{}]
        try:
            start_env(env, task.data.model_dump())
            async with agents.agent.interaction(task) as interaction:

                async def act(observation: str | None) -> str | None:
                    # the agent answers the opening line, then each user reply (as data, not turns)
                    turn = interaction.turn() if observation is None else interaction.turn(neutralise(observation))
                    segment = await turn
                    return None if segment.terminated else segment.last_reply

                def record(result: StepResult) -> bool:
                    rewards.append(float(result[1]))
                    infos.append(result[4])
                    return False

                await play_one(engine, env, act, record)
            dialogue = env.dialogue
        finally:
            env.close()  # the shared user stays open
        trace = interaction.trace
        scores = {"emotion_change": float(sum(rewards)), "final_emotion": RLVER_REWARD.at_end(dialogue.emotion)}
        trace.record_reward(task.config.reward, scores[task.config.reward])
        trace.record_metrics(
            {**scores, "turns": float(len(rewards)), "success": float(dialogue.done_reason == "success")}
        )
        trace.info["emotions"] = list(dialogue.emotions)
        trace.info["termination_reason"] = infos[-1].get("termination_reason")


def load_environment(
    env_id: str = "EmpathyDialogue-v0",
    *,
    persona_ids: list[str] | None = None,
    seed: int = 0,
    reward: Literal["emotion_change", "final_emotion"] = "emotion_change",
    batch_window_ms: float = 5.0,
    max_batch_size: int = 64,
    agent: vf.AgentConfig | dict[str, Any] | None = None,
    **env_kwargs: Any,
) -> EmpathyEnv:
    """A verifiers environment of dialogues with the simulated user.

    Args:
        env_id: the registered gym id (``"EmpathyDialogue-v0"``,
            ``"EmpathyDialogue-RLVER-v0"``, ...).
        persona_ids: one task per persona id, in order; ``None`` for the whole bank.
        seed: task i gets env seed ``seed + i``.
        reward: ``"emotion_change"`` (the sum of the env's turn rewards) or
            ``"final_emotion"`` (e_T / 100, RLVER's reward).
        batch_window_ms, max_batch_size: micro-batching of concurrent episodes' user
            turns into one call of the simulated user.
        agent: the ``agent`` seat's ``vf.AgentConfig`` (or its dict); default: the
            ``null`` harness in a subprocess runtime.
        **env_kwargs: ``gym.make`` keywords (``user``, ``protocol``, ``max_turns``,
            ``reward_mode``, ``think``, ``personas``, ...), as JSON values: verifiers
            records the config (a ready ``SimulatedUser`` as ``user=`` works in-process but
            cannot be recorded).

    Returns:
        An :class:`EmpathyEnv`. Run it as verifiers does: ``async with env.serving():``
        then ``await env.run_episode(task, vf.ModelContext(model=..., client=...))`` for
        ``task`` in ``env.taskset``.

    Raises:
        pydantic.ValidationError: a bad option. As :func:`dialogue_starts` (when the
            taskset loads) for bad env options.
    """
    task = EmpathyTaskConfig(
        env_id=env_id, env=env_kwargs, reward=reward, batch_window_ms=batch_window_ms, max_batch_size=max_batch_size
    )
    config = {"taskset": {"id": TASKSET_ID, "task": task, "persona_ids": persona_ids, "seed": seed}}
    if agent is not None:
        config["agent"] = agent.model_dump() if isinstance(agent, vf.AgentConfig) else agent
    return EmpathyEnv(EmpathyEnvConfig.model_validate(config))


__all__ = ["EmpathyEnv", "EmpathyTaskset", "load_environment"]
