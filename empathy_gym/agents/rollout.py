"""Multi-turn rollouts, token in, token out (see docs/training.md, "Rollouts").

The history is never decoded and re-tokenised (that changes the sampled tokens and
causes KL spikes, TRL issue 5224); the loss mask is 1 exactly on the sampled tokens.
A dialogue whose next whole turn would not fit in ``max_context_tokens`` is *cut*
(``"context_limit"``), after the user's last reply when that fits: a truncation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from empathy_gym.boundary import ChatEncoder
from empathy_gym.ending import Ending, close_cut_turn, is_cut
from empathy_gym.engine import Driver, Start, StepResult, play
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.reward import Reward
from empathy_gym.seeding import derive_seed
from empathy_gym.think import CLOSE as CLOSE_THINK


class RolloutInterrupted(RuntimeError):
    """``should_stop`` asked the rollout to stop (e.g. Ctrl-C); finished episodes were
    already passed to ``on_episode_end``."""


@dataclass
class Sample:
    """One sampled agent turn.

    Attributes:
        token_ids: the sampled ids, the end-of-turn token included when it was sampled.
        logprobs: log pi(token) under the sampling distribution (temperature applied), one
            per id (float).
        finished: True when the turn ended with an end-of-turn token (False: cut at
            ``max_new_tokens``).
        forced: per id, True where the sampler did not draw it but a wrapper added it
            (:mod:`~empathy_gym.agents.budget_forcing`'s tags: not trained on, log-prob
            0.0); ``None``: every id was sampled.
    """

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    forced: list[bool] | None = None

    def text(self, tokenizer: Any) -> str:
        """What the turn says: its ids decoded without the end-of-turn token, special
        tokens skipped."""
        ids = self.token_ids[:-1] if self.finished else self.token_ids
        return tokenizer.decode(ids, skip_special_tokens=True)


class Generator(Protocol):
    """A policy sampler: token prompts in, sampled continuations out."""

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: int | None = None
    ) -> list[Sample]:
        """One :class:`Sample` per prompt; ``seeds`` make each row's sampling reproducible;
        ``max_new_tokens`` overrides the generator's own limit for this call (budget forcing
        needs it; a generator used without it may leave it out)."""


class ChatTokens:
    """Renders chat pieces as token ids with the tokenizer's own chat template, message
    contents encoded as data (:class:`~empathy_gym.boundary.ChatEncoder`: a user's
    ``<|im_start|>`` stays text and never opens a turn in the policy's context).

    The tokens after an assistant turn (the user's message, the next generation prompt)
    are the difference between a fixed conversation encoded with and without one more
    user message, so no template token is written by hand.

    Attributes:
        eos_id: the assistant's end-of-turn token.
        after_eos_text: the template's text after that token (Qwen/ChatML: ``"\n"``).

    Raises:
        ValueError: the tokenizer has no eos token, or the template does not end
            assistant turns with it.
    """

    _BASE = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ]

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.encoder = ChatEncoder(tokenizer)
        eos = tokenizer.eos_token
        if eos is None:
            raise ValueError("the tokenizer has no eos_token (the assistant's end-of-turn token)")
        self.eos_id: int = tokenizer.convert_tokens_to_ids(eos)
        base = self.encoder.encode(self._BASE, add_generation_prompt=False)
        if self.eos_id not in base:
            raise ValueError(f"the chat template does not end assistant turns with {eos!r}")
        self._base = base
        self._after_eos = len(base) - base[::-1].index(self.eos_id)
        self.after_eos_text = tokenizer.decode(base[self._after_eos :])

    def prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The ids of ``messages`` followed by the generation prompt."""
        return self.encoder.encode(messages)

    def user_turn(self, text: str) -> list[int]:
        """The ids that follow the assistant's end-of-turn token: the template's trailer,
        the user message ``text`` (as data), and the next generation prompt.

        Raises:
            ValueError: the template changes earlier turns when a turn is added.
        """
        full = self.encoder.encode(self._BASE + [{"role": "user", "content": text}])
        if full[: len(self._base)] != self._base:
            raise ValueError(
                "the chat template changes earlier turns when a turn is added; "
                "token-in-token-out rollouts need a prefix-stable template"
            )
        return full[self._after_eos :]


@dataclass
class Trajectory:
    """One dialogue as the policy saw and produced it.

    Attributes:
        key: the dialogue's index in its step's rollout (later rounds number on).
        group: its GRPO group (dialogues of a group share ``env_seed``).
        env_seed: the seed its env was reset with.
        persona_id, language, hidden_intention, character_type: the persona.
        token_ids: the whole dialogue (prompt, agent turns, user turns), list[int].
        loss_mask: 1 where the policy sampled the token, else 0 (same length).
        rollout_logprobs: the sampler's log-prob at sampled tokens, 0.0 elsewhere.
        turn_ends: index in ``token_ids`` of each agent turn's last token.
        rewards: the env's reward for each agent turn (float).
        emotions: e_0, e_1, ..., e_T (ints in [0, 100]).
        messages: the agent-side chat as text (for transcripts).
        termination: why it ended (an :class:`~empathy_gym.ending.Ending`: the protocol's,
            or ``"context_limit"``), or None while it runs.
        format_errors: think-mode format errors (count).
        cut_turns: agent turns cut by length (``max_new_tokens``, or the room left in
            the context) before their end-of-turn token.
        thinking_tokens, reply_tokens: sampled tokens of all agent turns inside the
            ``<think>...</think>`` block (think mode; the closing tag included) and
            after it (everything outside think mode; end-of-turn tokens included).
        reward_mode, reward_shaping: the env's :class:`~empathy_gym.reward.Reward`
            (:attr:`reward`; see :meth:`outcome_rewards`).
        round: the step's rollout round it was played in (0: the first; GRPO's dynamic
            sampling adds more).
    """

    key: int
    group: int
    env_seed: int
    persona_id: str
    language: str
    hidden_intention: str
    character_type: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    emotions: list[int] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    termination: Ending | None = None
    format_errors: int = 0
    cut_turns: int = 0
    thinking_tokens: int = 0
    reply_tokens: int = 0
    reward_mode: str = "delta"
    reward_shaping: float = 0.0
    round: int = 0
    done: bool = False

    @property
    def episode_return(self) -> float:
        """Undiscounted sum of the turn rewards the env paid."""
        return float(sum(self.rewards))

    @property
    def reward(self) -> Reward:
        """How the env paid its turns (:class:`~empathy_gym.reward.Reward`)."""
        return Reward(self.reward_mode, self.reward_shaping)

    @property
    def cut(self) -> bool:
        """The rollout cut the dialogue at the context limit (a truncation, not an end)."""
        return is_cut(self.termination)

    def outcome_rewards(self) -> list[float]:
        """The turn rewards, a cut dialogue scored as if it had ended where it was cut (for
        GRPO; PPO bootstraps instead).

        A cut dialogue's last turn adds :meth:`Reward.at_end <empathy_gym.reward.Reward.at_end>`
        (e_T / 100 under ``"final"``, which the env pays only at the end; 0 under ``"delta"``).
        """
        rewards = list(self.rewards)
        if self.cut and rewards:
            rewards[-1] += self.reward.at_end(self.emotions[-1])
        return rewards

    def extend(
        self, ids: Sequence[int], trainable: bool | Sequence[bool], logprobs: Sequence[float] | None = None
    ) -> None:
        """Append ``ids``, trained on where ``trainable`` (one flag for all, or one per id)."""
        self.token_ids.extend(ids)
        flags = [trainable] * len(ids) if isinstance(trainable, bool) else list(trainable)
        self.loss_mask.extend(int(flag) for flag in flags)
        self.rollout_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def record(self) -> dict[str, Any]:
        """A JSON-serialisable summary (no token ids) for ``episodes.jsonl``."""
        return {
            "key": self.key,
            "group": self.group,
            "env_seed": self.env_seed,
            "persona_id": self.persona_id,
            "language": self.language,
            "hidden_intention": self.hidden_intention,
            "character_type": self.character_type,
            "turns": len(self.rewards),
            "rewards": self.rewards,
            "return": self.episode_return,
            "emotions": self.emotions,
            "final_emotion": self.emotions[-1],
            "termination": self.termination,
            "format_errors": self.format_errors,
            "cut_turns": self.cut_turns,
            "thinking_tokens": self.thinking_tokens,
            "reply_tokens": self.reply_tokens,
            "round": self.round,
            "reward_mode": self.reward_mode,
            "reward_shaping": self.reward_shaping,
            "messages": self.messages,
        }


@dataclass
class RolloutTimes:
    """Wall-clock seconds of one :meth:`RolloutEngine.collect`: ``generation`` (the
    policy's generate calls), ``user`` (the envs' resets and steps), ``total`` (with the
    bookkeeping between them); and ``generated_tokens``."""

    generation: float = 0.0
    user: float = 0.0
    total: float = 0.0
    generated_tokens: int = 0


class RolloutEngine:
    """Plays batches of dialogues between a policy and simulated users.

    Args:
        envs: unwrapped :class:`EmpathyDialogueEnv` instances, at least as many as the
            largest batch; envs that share a user get their user turns batched.
        generator: the policy sampler (:mod:`empathy_gym.agents.generation`).
        tokenizer: the policy's tokenizer (with a chat template).
        max_context_tokens: no dialogue grows past this many tokens: one whose next
            turn might not fit is cut (``"context_limit"``).
        max_new_tokens: the most tokens sampled per turn (default: the generator's
            ``max_new_tokens``); a sample longer than the room left is cut (unfinished).
    """

    def __init__(
        self,
        envs: Sequence[EmpathyDialogueEnv],
        generator: Generator,
        tokenizer: Any,
        *,
        max_context_tokens: int = 8192,
        max_new_tokens: int | None = None,
    ):
        self.envs = list(envs)
        self.generator = generator
        self.chat = ChatTokens(tokenizer)
        self.tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.max_new_tokens = int(
            max_new_tokens if max_new_tokens is not None else getattr(generator, "max_new_tokens", 1)
        )
        self.times = RolloutTimes()

    def fits_a_turn(self, length: int) -> bool:
        """A dialogue of ``length`` tokens has room for ``max_new_tokens`` sampled tokens,
        the tokens the generator adds to a turn unsampled (``forced_tokens``: budget
        forcing's tags) and the end-of-turn token a cut turn gets."""
        forced = getattr(self.generator, "forced_tokens", 0)
        return length + self.max_new_tokens + forced + 1 <= self.max_context_tokens

    def collect(
        self,
        env_seeds: Sequence[int],
        *,
        groups: Sequence[int] | None = None,
        sampling_seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        on_episode_end: Callable[[Trajectory], None] | None = None,
        key_offset: int = 0,
        seed_keys: Sequence[int] | None = None,
        round_index: int = 0,
    ) -> list[Trajectory]:
        """Play one dialogue per env seed, all at once, until every one has ended.

        Args:
            env_seeds: the reset seed of each dialogue (equal seeds: same persona and
                opening line, as a GRPO group needs).
            groups: the group of each dialogue (default: its index).
            sampling_seed: mixed with each dialogue's index and turn to seed its
                sampling, so dialogues that share an env seed still differ.
            should_stop: polled after each generation and each turn; True raises
                :class:`RolloutInterrupted`.
            on_episode_end: called with each trajectory as soon as it ends.
            key_offset: added to each trajectory's ``key`` (a step's later rounds number
                their dialogues after the first round's).
            seed_keys: the number each dialogue's sampling seeds are derived from
                (default: its index here); a trainer process passes the dialogues'
                indices in the whole step, so that the process count does not change them.
            round_index: recorded as each trajectory's ``round`` (0: the step's first
                round; GRPO's dynamic sampling plays more).

        Returns:
            The trajectories in the order of ``env_seeds``.

        Raises:
            ValueError: more dialogues than envs, or a persona whose opening prompt
                leaves no room for one turn within ``max_context_tokens``.
            RolloutInterrupted: see ``should_stop``.
        """
        n = len(env_seeds)
        if n > len(self.envs):
            raise ValueError(f"{n} dialogues but only {len(self.envs)} envs")
        driver = _TrainingDriver(
            self,
            groups=list(groups) if groups is not None else list(range(n)),
            seeds=[int(seed) for seed in env_seeds],
            seed_keys=list(seed_keys) if seed_keys is not None else list(range(n)),
            sampling_seed=sampling_seed,
            key_offset=key_offset,
            round_index=round_index,
            should_stop=should_stop or (lambda: False),
        )
        started = time.perf_counter()
        trajectories: dict[int, Trajectory] = {}
        for ended in play(self.envs[:n], [Start(seed) for seed in driver.seeds], driver):
            for trajectory in ended:
                trajectories[trajectory.key - key_offset] = trajectory
                if on_episode_end is not None:
                    on_episode_end(trajectory)
            if driver.should_stop():
                raise RolloutInterrupted(f"stopped after turn {driver.turn}")
        self.times = driver.times
        self.times.total = time.perf_counter() - started
        self.times.user = driver.user_seconds
        return [trajectories[key] for key in range(n)]

    def _start(
        self, env: EmpathyDialogueEnv, info: dict[str, Any], key: int, group: int, env_seed: int, round_index: int
    ) -> Trajectory:
        """The trajectory of a dialogue just reset (``info``: the reset's), holding the
        opening prompt's tokens (not trainable).

        Raises:
            ValueError: the opening prompt leaves no room for one turn.
        """
        persona = env.dialogue.persona
        reward = getattr(env, "reward", Reward())
        trajectory = Trajectory(
            key=key,
            group=group,
            env_seed=env_seed,
            persona_id=persona.id,
            language=persona.language,
            hidden_intention=persona.hidden_intention,
            character_type=persona.character_type,
            emotions=[info["emotion"]],
            messages=info["messages"],
            reward_mode=reward.mode,
            reward_shaping=reward.shaping,
            round=round_index,
        )
        trajectory.extend(self.chat.prompt(info["messages"]), trainable=False)
        if not self.fits_a_turn(len(trajectory.token_ids)):
            raise ValueError(
                f"persona {persona.id!r}: its opening prompt has {len(trajectory.token_ids)} tokens, so a turn "
                f"of max_new_tokens={self.max_new_tokens} does not fit in max_context_tokens="
                f"{self.max_context_tokens}; raise generation.max_context_tokens or shorten the persona"
            )
        return trajectory

    def _record_turn(
        self,
        trajectory: Trajectory,
        env: EmpathyDialogueEnv,
        sample: Sample,
        result: tuple[str, float, bool, bool, dict[str, Any]],
    ) -> None:
        """Add one turn to ``trajectory``: the sampled reply (trainable; a cut one closed
        with the end token, not trainable), the env's reward and emotion, then the user's
        reply (not trainable) or the end of the dialogue (``done``; ``termination`` the
        env's reason, or ``"context_limit"`` when the next turn would not fit)."""
        obs, reward, terminated, truncated, info = result
        sampled = True if sample.forced is None else [not forced for forced in sample.forced]
        trajectory.extend(sample.token_ids, trainable=sampled, logprobs=sample.logprobs)
        trajectory.turn_ends.append(len(trajectory.token_ids) - 1)
        thinking = self.thinking_length(sample.token_ids) if getattr(env, "think", False) else 0
        trajectory.thinking_tokens += thinking
        trajectory.reply_tokens += len(sample.token_ids) - thinking
        if not sample.finished:
            trajectory.cut_turns += 1
            trajectory.token_ids, trajectory.loss_mask, trajectory.rollout_logprobs = close_cut_turn(
                trajectory.token_ids, trajectory.loss_mask, trajectory.rollout_logprobs, self.chat.eos_id
            )
        trajectory.rewards.append(float(reward))
        trajectory.emotions.append(info["emotion"])
        trajectory.messages = info["messages"]
        trajectory.format_errors += info["format_error"] is not None
        if terminated or truncated:
            trajectory.termination = Ending(info["termination_reason"])
        else:
            reply = self.chat.user_turn(obs)
            fits = len(trajectory.token_ids) + len(reply) <= self.max_context_tokens
            if fits:
                trajectory.extend(reply, trainable=False)
            if not (fits and self.fits_a_turn(len(trajectory.token_ids))):
                trajectory.termination = Ending.CONTEXT_LIMIT  # a truncation, not an end
        trajectory.done = trajectory.termination is not None

    def _fit(self, sample: Sample, length: int) -> Sample:
        """``sample`` cut to the room a dialogue of ``length`` tokens has left (for
        generators that sample more than ``max_new_tokens``)."""
        room = self.max_context_tokens - length - 1  # one for the end token a cut turn gets
        if len(sample.token_ids) <= room or (sample.finished and len(sample.token_ids) <= room + 1):
            return sample
        forced = None if sample.forced is None else sample.forced[:room]
        return Sample(sample.token_ids[:room], sample.logprobs[:room], finished=False, forced=forced)

    def thinking_length(self, ids: Sequence[int]) -> int:
        """How many of a turn's sampled ``ids`` belong to its thinking: up to and
        including the token that completes the first ``</think>`` (all of them when the
        turn never closes it). Found by bisection on decoded prefixes, since the tag may
        share tokens with the text around it."""
        if CLOSE_THINK not in self.tokenizer.decode(list(ids)):
            return len(ids)
        low, high = 1, len(ids)  # the shortest prefix whose text holds the tag
        while low < high:
            middle = (low + high) // 2
            if CLOSE_THINK in self.tokenizer.decode(list(ids[:middle])):
                high = middle
            else:
                low = middle + 1
        return low


@dataclass
class _TrainingDriver(Driver[Trajectory]):
    """The rollout engine's side of :func:`~empathy_gym.engine.play`: token-in-token-out
    trajectories and one batched generate per turn."""

    engine: RolloutEngine
    groups: list[int]
    seeds: list[int]
    seed_keys: list[int]
    sampling_seed: int
    key_offset: int
    round_index: int
    should_stop: Callable[[], bool]
    times: RolloutTimes = field(default_factory=RolloutTimes)
    turn: int = 0
    _samples: dict[int, Sample] = field(default_factory=dict)

    def begin(self, index: int, env: EmpathyDialogueEnv, info: dict[str, Any]) -> Trajectory:
        return self.engine._start(
            env, info, self.key_offset + index, self.groups[index], self.seeds[index], self.round_index
        )

    def act(self, states: Sequence[Trajectory]) -> list[str]:
        self.turn += 1
        tick = time.perf_counter()
        samples = self.engine.generator.generate(
            [t.token_ids for t in states],
            [derive_seed(self.sampling_seed, self.seed_keys[t.key - self.key_offset], self.turn) for t in states],
        )
        self.times.generation += time.perf_counter() - tick
        if self.should_stop():  # before the (slow) user turn
            raise RolloutInterrupted(f"stopped while generating turn {self.turn}")
        samples = [self.engine._fit(sample, len(t.token_ids)) for t, sample in zip(states, samples)]
        self.times.generated_tokens += sum(len(sample.token_ids) for sample in samples)
        self._samples = {t.key: sample for t, sample in zip(states, samples)}
        return [sample.text(self.engine.tokenizer) for sample in samples]

    def record(self, state: Trajectory, env: EmpathyDialogueEnv, result: StepResult) -> bool:
        self.engine._record_turn(state, env, self._samples[state.key], result)
        return state.done
