"""The simulated user in verl's agent loop (verl >= 0.8): one dialogue per sample, token in,
token out.

:class:`EmpathyAgentLoop` (registered as ``"empathy_dialogue"``) replays the dialogue of a
dataset row (:func:`empathy_gym.integrations.verl.build_rows`): the policy's replies stay
as sampled (response mask 1), the user's are appended as tokens (mask 0), and each
appraised reply's turn score sits on its last token in ``rm_scores``. Written against verl
0.9.1 (``verl/experimental/agent_loop/agent_loop.py`` and ``tool_agent_loop.py``);
importing this module needs verl. See agents/verl/README.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import torch

from empathy_gym.agents.generation import end_of_turn_ids
from empathy_gym.boundary import ChatEncoder
from empathy_gym.ending import Ending, close_cut_turn
from empathy_gym.engine import DialogueEngine, StepResult, play_one
from empathy_gym.integrations.dialogues import dialogue_fields, shared, start_env

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.utils.profiler import simple_timer
except ImportError as error:  # pragma: no cover - depends on the installed verl
    raise ImportError(
        "empathy_gym.integrations.verl_agent_loop needs verl >= 0.8 (the agent loop, "
        "verl.experimental.agent_loop): pip install 'verl>=0.8'. verl <= 0.7.1 is not "
        "supported."
    ) from error

logger = logging.getLogger(__name__)

#: The name the loop is registered under (``agent_name`` / ``default_agent_loop``).
AGENT_NAME = "empathy_dialogue"


def agent_turn_ends(response_mask: Sequence[int]) -> list[int]:
    """The index of the last token of each agent turn: the last position of every run of 1s
    in a response mask (1: sampled by the policy; 0: the user's turns and the boundary
    tokens that verl's Continuous Token builder inserts).

    Example:
        >>> agent_turn_ends([1, 1, 0, 0, 1, 0, 1, 1])
        [1, 4, 7]
    """
    last = len(response_mask) - 1
    return [i for i, flag in enumerate(response_mask) if flag and (i == last or not response_mask[i + 1])]


def turn_token_rewards(response_length: int, turn_ends: Sequence[int], turn_scores: Sequence[float]) -> torch.Tensor:
    """Token-level rewards: turn score ``k`` on token ``turn_ends[k]``, 0 elsewhere.

    Args:
        response_length: the number of response tokens (>= 0).
        turn_ends: the last token of each appraised agent turn (:func:`agent_turn_ends`),
            each in ``[0, response_length)``.
        turn_scores: one score per appraised turn. Scores beyond ``len(turn_ends)`` (a reply
            of no tokens has no run of 1s) are added to the last turn end, so the sum of
            the tensor is always the sum of the scores.

    Returns:
        A float32 tensor of shape ``(response_length,)``.

    Raises:
        ValueError: scores but no turn end or no token to put them on, or a turn end
            outside the response.
    """
    rewards = torch.zeros(response_length, dtype=torch.float32)
    if not turn_scores:
        return rewards
    if not turn_ends or response_length == 0:
        raise ValueError(
            f"{len(turn_scores)} turn scores but no agent token to put them on "
            f"(response length {response_length}, turn ends {list(turn_ends)})"
        )
    if turn_ends[-1] >= response_length or turn_ends[0] < 0:
        raise ValueError(f"turn ends {list(turn_ends)} fall outside a response of {response_length} tokens")
    for index, score in enumerate(turn_scores):
        rewards[turn_ends[min(index, len(turn_ends) - 1)]] += float(score)
    return rewards


class EmpathyAgentLoopOutput(AgentLoopOutput):
    """verl's ``AgentLoopOutput`` whose ``as_dict()`` (what verl's v1 trainer stores) puts
    each turn score on the last token of its agent turn in ``rm_scores``, instead of the
    whole ``reward_score`` on the last token."""

    def as_dict(self) -> dict[str, Any]:
        output = super().as_dict()
        if "rm_scores" in output:
            output["rm_scores"] = turn_token_rewards(
                len(self.response_ids), self.extra_fields["turn_ends"], self.extra_fields["turn_scores"]
            )
        return output


def _plain(value: Any) -> Any:
    """OmegaConf containers (hydra hands the YAML entry over as them) as dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl depends on omegaconf
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


@register(AGENT_NAME)
class EmpathyAgentLoop(AgentLoopBase):
    """One dialogue with the simulated user per dataset row, token in, token out.

    Args:
        trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
            hf_model_type: what verl's ``AgentLoopWorker`` passes every agent loop.
        tools: verl's tool list; ignored (the user is the environment, not a tool).
        name: the agent-loop name from the YAML entry (default ``"empathy_dialogue"``).
        **env_config: the :class:`~empathy_gym.engine.DialogueEngine` config: ``env_id``,
            ``batch_window_ms``, ``max_batch_size`` and any ``gym.make`` keyword (``user``,
            ``protocol``, ``max_turns``, ``reward_mode``, ...). Loops with equal configs in
            one process share one simulated user and one micro-batcher.

    Raises:
        gymnasium.error.Error, ValueError, KeyError: a bad env config (on the first loop
            of a config in a process, which builds the user).
    """

    def __init__(
        self,
        trainer_config,
        server_manager,
        tokenizer,
        processor,
        dataset_cls,
        data_config,
        hf_model_type: str | None = None,
        *,
        tools: Any = None,
        name: str = AGENT_NAME,
        **env_config: Any,
    ):
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type=hf_model_type
        )
        self.name = name
        self.session: DialogueEngine = shared({key: _plain(value) for key, value in env_config.items()})
        self.response_length: int = int(self.rollout_config.response_length)
        self.max_assistant_turns: int | None = self.rollout_config.multi_turn.max_assistant_turns
        self.chat = ChatEncoder(tokenizer)  # the user's text reaches verl's tokenizer as data
        self.end_of_turn_ids = set(end_of_turn_ids(tokenizer))
        self.eos_id: int = tokenizer.eos_token_id

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Play the dialogue of one dataset row.

        Args:
            sampling_params: verl's sampling parameters for the server manager.
            **kwargs: the row's fields from ``RLHFDataset``: ``raw_prompt`` (the
                messages), ``interaction_kwargs`` (``persona_id``, ``seed``,
                ``opening``; verl lifts them out of ``extra_info``), ``index``, ...

        Returns:
            An :class:`EmpathyAgentLoopOutput`, cut to ``rollout.response_length``:
            ``reward_score`` is the return (the sum of the turn scores), ``num_turns`` 1 +
            replies + user turns, and ``extra_fields`` holds ``turn_scores`` (one per
            appraised reply, the env's rewards; a dialogue cut by a budget is scored as
            if it had ended there, :meth:`Reward.at_end <empathy_gym.reward.Reward.at_end>`),
            ``turn_ends``, ``emotions`` (after reset and each reply),
            ``termination_reason`` (the env's, or ``"response_length"``,
            ``"max_assistant_turns"``), ``persona_id``, ``tool_rewards`` ([]) and
            ``reward_extra_info`` (``score``, ``final_emotion``).

        Raises:
            KeyError, TypeError: a row without valid ``persona_id``/``seed``/``opening``.
            ValueError: the row's prompt is not the dialogue the env recreates (rebuild the
                data with this loop's config).
            SimulatorError: the LLM user failed (for every dialogue of its batch).
        """
        start = dialogue_fields(
            kwargs.get("interaction_kwargs") or (kwargs.get("extra_info") or {}).get("interaction_kwargs") or {}
        )
        messages = [dict(message) for message in kwargs["raw_prompt"]]
        env = self.session.new_env()
        try:
            start_env(env, start)
            if messages != env.dialogue.messages:
                raise ValueError(
                    f"row {kwargs.get('index')!r} (persona {start['persona_id']!r}): its "
                    f"prompt is not the dialogue that agent loop {self.name!r} recreates "
                    f"(system prompt or opening differ); rebuild the data with this "
                    f"loop's config (python -m empathy_gym.integrations.verl prepare "
                    f"--config <agent-loop yaml>)"
                )
            return await self._play(env, messages, sampling_params)
        finally:
            env.close()  # the shared user stays open

    async def _play(
        self, env, messages: list[dict[str, Any]], sampling_params: dict[str, Any]
    ) -> EmpathyAgentLoopOutput:
        rollout = _Rollout(list(await self.ct_build_initial_tokens(messages)), emotions=[env.dialogue.emotion])
        request_id = uuid4().hex  # one id per dialogue: sticky to one server (prefix cache)

        async def act(observation: str | None) -> str | None:
            if observation is not None and not await self._add_user_turn(rollout, messages, observation):
                rollout.reason = Ending.RESPONSE_LENGTH  # no room for the user's turn
                return None
            output = await self._generate(rollout, request_id, sampling_params)
            if len(rollout.response_mask) >= self.response_length:
                rollout.reason = Ending.RESPONSE_LENGTH  # the reply filled the budget: not appraised
                return None
            rollout.unfinished = not output.token_ids or output.token_ids[-1] not in self.end_of_turn_ids
            reply = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": reply})
            rollout.metrics.setdefault("tool_calls", 0.0)  # verl's field for environment time
            rollout.user_started = time.perf_counter()
            return reply

        def record(result: StepResult) -> bool:
            _, reward, terminated, truncated, info = result
            rollout.metrics["tool_calls"] += time.perf_counter() - rollout.user_started
            rollout.turn_scores.append(float(reward))
            rollout.emotions.append(int(info["emotion"]))
            if terminated or truncated:
                rollout.reason = Ending(info["termination_reason"])
            elif self.max_assistant_turns and rollout.replies >= self.max_assistant_turns:
                rollout.reason = Ending.MAX_ASSISTANT_TURNS
            return rollout.reason is not None

        await play_one(self.session, env, act, record)
        return self._output(env, rollout, rollout.reason)

    async def _generate(self, rollout: _Rollout, request_id: str, sampling_params: dict[str, Any]) -> Any:
        """Sample the policy's next reply and add it to ``rollout`` (mask 1)."""
        with simple_timer("generate_sequences", rollout.metrics):
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=rollout.token_ids, sampling_params=sampling_params
            )
        _merge_server_extra_fields(rollout.extra_fields, output.extra_fields)
        metrics = rollout.metrics
        if metrics.get("num_preempted") is None:  # as ToolAgentLoop: -1 = not reported
            metrics["num_preempted"] = output.num_preempted if output.num_preempted is not None else -1
        elif output.num_preempted is not None:
            metrics["num_preempted"] += output.num_preempted
        merged, rollout.response_mask, logprobs = await self.ct_merge_assistant_token(
            rollout.token_ids,
            output.token_ids,
            rollout.response_mask,
            rollout.response_logprobs if (rollout.response_logprobs or output.log_probs) else None,
            assistant_logprobs=output.log_probs or None,
        )
        rollout.token_ids = merged.token_ids
        rollout.response_logprobs = logprobs if logprobs is not None else rollout.response_logprobs
        if output.routed_experts is not None:
            rollout.routed_experts = output.routed_experts
        rollout.replies += 1
        return output

    async def _add_user_turn(self, rollout: _Rollout, messages: list[dict[str, Any]], observation: str) -> bool:
        """Close a cut reply (end-of-turn token, mask 0, as the rollout engine does) and add
        the user's turn (mask 0); ``False`` when it does not fit in ``response_length``."""
        if rollout.unfinished:
            rollout.token_ids, rollout.response_mask, rollout.response_logprobs = close_cut_turn(
                rollout.token_ids, rollout.response_mask, rollout.response_logprobs, self.eos_id
            )
        before = list(messages)
        messages.append({"role": "user", "content": self.chat.plain_text(observation)})
        merged, mask, logprobs = await self.ct_merge_context_msg(
            before, messages, rollout.token_ids, rollout.response_mask, rollout.response_logprobs or None
        )
        if len(mask) >= self.response_length:
            return False
        rollout.token_ids, rollout.response_mask = merged.token_ids, mask
        rollout.response_logprobs = (logprobs or []) if rollout.response_logprobs else rollout.response_logprobs
        rollout.user_turns += 1
        return True

    def _output(self, env, rollout: _Rollout, reason: Ending) -> EmpathyAgentLoopOutput:
        """The dialogue as verl's output, cut to ``response_length``."""
        cut, token_ids, response_mask = self.response_length, rollout.token_ids, rollout.response_mask
        response_ids = token_ids[len(token_ids) - len(response_mask) :][:cut]
        prompt_ids = token_ids[: len(token_ids) - len(response_mask)]
        response_mask = response_mask[:cut]
        turn_scores = list(rollout.turn_scores)
        if reason.cut and turn_scores:  # scored as if it had ended there
            turn_scores[-1] += env.reward.at_end(rollout.emotions[-1])
        turn_ends = agent_turn_ends(response_mask)
        if len(turn_ends) < len(turn_scores):
            logger.warning(
                "empathy agent loop: %d appraised replies but %d agent turns in the "
                "response mask (an empty reply?); the extra scores go on the last "
                "agent token",
                len(turn_scores),
                len(turn_ends),
            )
        score = float(sum(turn_scores))
        rollout.extra_fields.update(
            {
                "turn_scores": turn_scores,
                "tool_rewards": [],
                "turn_ends": turn_ends[: len(turn_scores)],
                "emotions": rollout.emotions,
                "termination_reason": reason.value,
                "persona_id": env.dialogue.persona.id,
                "reward_extra_info": {"score": score, "final_emotion": float(rollout.emotions[-1])},
            }
        )
        experts = rollout.routed_experts
        return EmpathyAgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=rollout.response_logprobs[:cut] if rollout.response_logprobs else None,
            routed_experts=experts[: len(prompt_ids) + cut] if experts is not None else None,
            reward_score=score,
            num_turns=1 + rollout.replies + rollout.user_turns,
            metrics=rollout.metrics,
            extra_fields=rollout.extra_fields,
        )


@dataclass
class _Rollout:
    """One dialogue's growing token state (prompt + response) and what it has scored."""

    token_ids: list[int]
    emotions: list[int]
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)  # stays empty when the server returns none
    routed_experts: Any = None
    turn_scores: list[float] = field(default_factory=list)
    replies: int = 0
    user_turns: int = 0
    unfinished: bool = False  # the last reply was cut at the server's max_tokens
    user_started: float = 0.0  # perf_counter() when the last reply went to the user
    reason: Ending | None = None  # why the dialogue ended, once it has
    metrics: dict[str, Any] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)


def _merge_server_extra_fields(extra_fields: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Keep the server's bookkeeping as ``ToolAgentLoop`` does: the first generation's
    fields, then only the newest ``max_global_steps`` (which weights generated each
    turn, for verl's off-policy staleness control)."""
    if not extra_fields:
        extra_fields.update(new)
    elif new.get("max_global_steps"):
        extra_fields["max_global_steps"] = new["max_global_steps"]
