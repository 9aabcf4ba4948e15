"""``EmpathyDialogueEnv``: a Gymnasium text environment in which the agent talks with a
simulated user and is rewarded by the user's emotion (RLVER, arXiv 2507.03112). See
docs/environment.md.

``step`` and ``reset`` are split into a *prepare* and a *finish* half around one call of
the simulated user, so that :func:`step_many` (the vector env, the dialogue engine) can
batch the user calls of many dialogues; ``areset`` and ``astep`` are their asyncio twins.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsFloat

import gymnasium as gym

from empathy_gym.boundary import clean_text, find_injection
from empathy_gym.personas import Persona, PersonaSource, load_personas
from empathy_gym.reward import Reward
from empathy_gym.spaces import AnyText
from empathy_gym.think import split_think
from empathy_gym.user import SimulatedUser, UserRequest, UserTurn, resolve_protocol
from empathy_gym.user.difficulty import load_difficulty
from empathy_gym.user.specs import UserSpec, as_user_spec

#: Default longest utterance, in characters, in both spaces; longer ones are cut
#: (``info["action_truncated"]``, ``info["user_reply_truncated"]``).
MAX_UTTERANCE_CHARS = 4096

AGENT_SYSTEM_PROMPTS: dict[str, str] = {
    "en": (
        "You are a warm, perceptive listener. The person you are talking with is going "
        "through something difficult. Reply in English, in a few natural sentences."
    ),
    "zh": "你是一位温暖、敏锐的倾听者。和你聊天的人正经历一些困难。请用中文回复，用几句自然的话。",
}
#: SAGE's agent system prompt (Tencent/digitalhuman ``SAGE/npc_response.py`` line 14) in
#: our own words; like SAGE's it asks for no particular length.
#: :func:`empathy_gym.evaluation.benchmark.evaluate` uses it under ``protocol="sage"``.
SAGE_AGENT_SYSTEM_PROMPTS: dict[str, str] = {
    "en": (
        "You are a smart chat companion with high emotional intelligence: you talk with "
        "the user so that they feel at ease and in good spirits, or get the help they need."
    ),
    "zh": "你是一个聪明的聊天伙伴，情商很高：你和用户聊天，让对方觉得自在、心情变好，或者得到他需要的帮助。",
}
THINK_INSTRUCTIONS: dict[str, str] = {
    "en": (
        " Before each reply, think privately inside <think>...</think>; only the text "
        "after </think> is shown to the person."
    ),
    "zh": " 每次回复前，先在 <think>...</think> 中私下思考；只有 </think> 之后的内容会被对方看到。",
}


@dataclass
class Dialogue:
    """The state of one episode (kept on the env; read-only for callers).

    Attributes:
        persona: the user's persona.
        emotion: current emotion, int in [0, 100].
        turn: agent turns taken so far.
        history: what the user has seen: ``(("user", opening), ("agent", reply), ...)``.
        messages: the agent-side chat (system prompt, user turns, the agent's full
            outputs including any thinking), as ``{"role", "content"}`` dicts.
        emotions: the emotion after each user turn, starting with e_0.
        done_reason: ``None`` while running, else the value of the protocol's
            :class:`~empathy_gym.ending.Ending`: "success", "failure", "goodbye" or "max_turns".
    """

    persona: Persona
    emotion: int
    turn: int = 0
    history: tuple[tuple[str, str], ...] = ()
    messages: list[dict[str, str]] = field(default_factory=list)
    emotions: list[int] = field(default_factory=list)
    done_reason: str | None = None


@dataclass(frozen=True)
class PendingStep:
    """What :meth:`EmpathyDialogueEnv.prepare_step` hands to the simulated user."""

    request: UserRequest
    action: str
    format_error: str | None
    action_truncated: bool
    action_sanitized: bool = False
    action_injection: tuple[str, ...] = ()


class EmpathyDialogueEnv(gym.Env[str, str]):
    """A dialogue with a simulated user who holds a persona and a hidden intention.

    An episode is one dialogue with one persona. After each action the user appraises
    it, its emotion e (an int in [0, 100]) moves, and it answers in character.

    Observation: the user's newest utterance. Action: the agent's next utterance. Both are
    ``str`` of at most ``max_utterance_chars`` characters (:class:`~empathy_gym.spaces.AnyText`);
    a longer action is cut before it reaches the user.

    Reward (``reward_mode``, :class:`~empathy_gym.reward.Reward`): ``"delta"`` gives
    r_t = (e_t - e_{t-1}) / 100, in [-1, 1]; the undiscounted return telescopes to
    (e_T - e_0) / 100, RLVER's objective minus a per-persona constant. ``"final"`` gives 0
    until the last step, then e_T / 100 (RLVER, section 3.1), plus ``reward_shaping`` times
    each turn's change.

    Episode end: a step is one agent reply that the user appraises and answers.
    ``truncated=True`` at ``max_turns`` steps (9 under both protocols: SAGE never appraises
    its 10th reply; RLVER checks its ``max_turns=8`` after the user's answer).
    ``terminated=True`` when the user ends it: success (e >= 100, SAGE only), failure
    (SAGE e < 10, RLVER e <= 0) or a goodbye in its answer; ``info["termination_reason"]``
    says which.

    Args:
        personas: the persona bank: ``None`` (built-in English and Chinese bank), a bank
            name, a JSONL path, or a list of :class:`~empathy_gym.personas.Persona` or dicts.
        difficulty: ``"moderate"``, ``"challenging"``, ``"easy"``, a preset path or dict.
        user: the simulated user: a spec string (``"rule"``, the default, needs no LLM;
            ``"transformers:PATH"``, ``"vllm:PATH"``, ``"openai:MODEL@URL"``, with
            ``,key=value`` options), a mapping of :class:`~empathy_gym.user.specs.UserSpec`
            fields or a ``UserSpec`` (built here and closed by :meth:`close`), or a ready
            :class:`~empathy_gym.user.SimulatedUser` (shared: not closed here).
        protocol: ``"sage"`` (default), ``"rlver_training"``, a dict or an
            :class:`~empathy_gym.user.EmotionProtocol`.
        initial_emotion, max_turns: override the protocol's.
        reward_mode: ``"delta"`` or ``"final"``.
        reward_shaping: with ``"final"``, a per-turn term ``reward_shaping * (e_t - e_{t-1}) / 100``
            on top (a finite float >= 0; 0: RLVER's reward).
        think: expect ``<think>...</think>`` before each reply; only the reply reaches the user.
        format_penalty: subtracted (>= 0) from the reward of a think-mode action whose block
            is missing or unclosed (``info["format_error"]``); the user still appraises the
            reply text there was (none for an unclosed block). RLVER gives such output zero
            reward; a penalty keeps the per-turn reward informative.
        system_prompt: the agent's system prompt in ``info["messages"]``: a ``str``, a
            dict ``{language: str}``, or ``None`` for :data:`AGENT_SYSTEM_PROMPTS` (the
            think instruction is added to dict and default prompts in think mode).
        max_utterance_chars: the spaces' ``max_length``.
        render_mode: ``None``, ``"ansi"`` or ``"human"``.

    ``info`` (reset and step): ``messages``, ``emotion``, ``turn``, ``persona_id``,
    ``language``, ``user_reply_truncated`` and ``user_reply_sanitized``
    (:func:`~empathy_gym.boundary.clean_text`). Step adds ``emotion_change``,
    ``termination_reason``, ``format_error``, ``action_truncated``, ``action_sanitized``,
    ``action_injection`` (:func:`~empathy_gym.boundary.find_injection`), ``utterance``
    (what reached the user) and, **privileged** (never for the policy's input):
    ``appraisal``, ``hidden_intention`` and ``character_type``.

    Raises:
        TypeError: ``step`` with a non-``str`` action; an unknown keyword (``backend=``,
            ``model=``, ``base_url=``... are now fields of ``user=``); a keyword of the
            wrong type.
        RuntimeError: ``step`` before ``reset`` or after the episode ended.
        PersonaError: an invalid persona bank. ValueError/KeyError: bad options.
        SpecError (a ``ValueError``): a bad user spec, naming the field (``user.model``...).

    Example:
        >>> import gymnasium as gym, empathy_gym
        >>> env = gym.make("EmpathyDialogue-v0")
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step("That sounds really hard.")
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    def __init__(
        self,
        personas: PersonaSource | None = None,
        difficulty: Any = "moderate",
        *,
        user: str | Mapping[str, Any] | UserSpec | SimulatedUser = "rule",
        protocol: Any = "sage",
        initial_emotion: int | None = None,
        max_turns: int | None = None,
        reward_mode: Literal["delta", "final"] = "delta",
        reward_shaping: float = 0.0,
        think: bool = False,
        format_penalty: float = 0.1,
        system_prompt: str | Mapping[str, str] | None = None,
        max_utterance_chars: int = MAX_UTTERANCE_CHARS,
        render_mode: str | None = None,
    ):
        reward = Reward(reward_mode, reward_shaping)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if not isinstance(think, bool):
            raise TypeError(f"think must be True or False, got {think!r}")
        if not _is_number(format_penalty) or not 0 <= format_penalty < math.inf:
            raise ValueError(f"format_penalty must be a finite number >= 0, got {format_penalty!r}")
        if not _is_number(max_utterance_chars, numbers.Integral) or max_utterance_chars < 1:
            raise ValueError(f"max_utterance_chars must be an int >= 1, got {max_utterance_chars!r}")
        if not (system_prompt is None or isinstance(system_prompt, str) or _maps_str_to_str(system_prompt)):
            raise TypeError(f"system_prompt must be a str, a dict {{language: str}} or None, got {system_prompt!r}")
        self.personas: tuple[Persona, ...] = load_personas(personas)
        self._by_id = {p.id: p for p in self.personas}
        self.difficulty = load_difficulty(difficulty)
        self.protocol = resolve_protocol(protocol, initial_emotion=initial_emotion, max_turns=max_turns)
        self._owns_user = not isinstance(user, SimulatedUser)
        #: the spec the user was built from (``None`` for a ready user given as ``user=``).
        self.user_spec: UserSpec | None = None if not self._owns_user else as_user_spec(user)
        self.user: SimulatedUser = (
            self.user_spec.build(self.difficulty, self.protocol) if self.user_spec is not None else user
        )
        #: how the emotion scores are paid (:class:`~empathy_gym.reward.Reward`).
        self.reward = reward
        self.think = think
        self.format_penalty = float(format_penalty)
        self.system_prompt = system_prompt
        self.max_utterance_chars = int(max_utterance_chars)
        self.render_mode = render_mode
        self.observation_space = AnyText(max_length=self.max_utterance_chars, min_length=0)
        self.action_space = AnyText(max_length=self.max_utterance_chars, min_length=0)
        self.dialogue: Dialogue | None = None
        self._spec: gym.envs.registration.EnvSpec | None = None

    @property
    def reward_mode(self) -> str:
        """``"delta"`` or ``"final"``: :attr:`reward`'s mode."""
        return self.reward.mode

    # -- reset -------------------------------------------------------------------
    def prepare_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Persona, int]:
        """First half of :meth:`reset`: seed, choose the persona, draw the user's seed.

        ``options["persona"]`` picks a persona by id or passes a :class:`Persona`;
        otherwise it is drawn uniformly with ``self.np_random``.

        Raises:
            KeyError: an unknown persona id. ValueError: an options key other than
                ``"persona"``. TypeError: options that are not a dict.
        """
        super().reset(seed=seed)
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")
        unknown = set(options or {}) - {"persona"}
        if unknown:
            raise ValueError(f"reset options: unknown key(s) {sorted(unknown)}; known: ['persona']")
        chosen = (options or {}).get("persona")
        if chosen is None:
            persona = self.personas[int(self.np_random.integers(len(self.personas)))]
        elif isinstance(chosen, Persona):
            persona = chosen
        elif chosen in self._by_id:
            persona = self._by_id[chosen]
        else:
            raise KeyError(
                f"options['persona']: unknown persona id {chosen!r} (this env has {len(self.personas)} personas)"
            )
        return persona, self._draw_seed()

    def finish_reset(self, persona: Persona, opening: str) -> tuple[str, dict[str, Any]]:
        """Second half of :meth:`reset`, given the user's opening utterance."""
        opening, reply_flags = self._clean_reply(opening)
        emotion = persona.initial_emotion if persona.initial_emotion is not None else self.protocol.initial_emotion
        if isinstance(self.system_prompt, str):
            system = self.system_prompt
        else:
            prompts = self.system_prompt or AGENT_SYSTEM_PROMPTS
            if persona.language not in prompts:
                raise KeyError(
                    f"system_prompt has no prompt for language {persona.language!r} "
                    f"(persona {persona.id!r}); it has {sorted(prompts)}"
                )
            system = prompts[persona.language] + (THINK_INSTRUCTIONS[persona.language] if self.think else "")
        self.dialogue = Dialogue(
            persona=persona,
            emotion=emotion,
            history=(("user", opening),),
            messages=[{"role": "system", "content": system}, {"role": "user", "content": opening}],
            emotions=[emotion],
        )
        if self.render_mode == "human":
            self.render()
        return opening, {**self._info(), **reply_flags}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a dialogue. Returns the user's opening utterance and ``info``.

        The same ``seed`` gives the same persona, opening line and (with a deterministic
        user, or a backend that honours seeds) the same dialogue for the same actions.
        """
        persona, user_seed = self.prepare_reset(seed=seed, options=options)
        (opening,) = self.user.opening([persona], [user_seed])
        return self.finish_reset(persona, opening)

    # -- step --------------------------------------------------------------------
    def prepare_step(self, action: str) -> PendingStep:
        """First half of :meth:`step`: check and clean the action, split off thinking,
        look for injection, build the request for the simulated user.

        Raises:
            TypeError: ``action`` is not a ``str``.
            RuntimeError: no episode is running.
        """
        if not isinstance(action, str):
            raise TypeError(f"action must be a str (the agent's utterance), got {type(action).__name__}")
        dialogue = self.dialogue
        if dialogue is None:
            raise RuntimeError("call reset() before step()")
        if dialogue.done_reason is not None:
            raise RuntimeError(f"the episode has ended ({dialogue.done_reason}); call reset() before step()")
        action, sanitized = clean_text(action)
        split = split_think(action)
        truncated = len(split.reply) > self.max_utterance_chars
        utterance = split.reply[: self.max_utterance_chars]
        injection = find_injection(utterance)
        request = UserRequest(
            persona=dialogue.persona,
            history=dialogue.history,
            utterance=utterance,
            emotion=dialogue.emotion,
            turn=dialogue.turn + 1,
            seed=self._draw_seed(),
            injection=injection,
        )
        return PendingStep(request, action, split.error if self.think else None, truncated, sanitized, injection)

    def finish_step(
        self, pending: PendingStep, outcome: UserTurn
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Second half of :meth:`step`, given the simulated user's turn."""
        dialogue = self.dialogue
        assert dialogue is not None
        request = pending.request
        reply, reply_flags = self._clean_reply(outcome.reply)
        previous = dialogue.emotion
        dialogue.emotion = outcome.emotion
        dialogue.turn = request.turn
        dialogue.emotions.append(outcome.emotion)
        dialogue.history = request.history + (("agent", request.utterance), ("user", reply))
        dialogue.messages += [{"role": "assistant", "content": pending.action}, {"role": "user", "content": reply}]
        terminated, truncated, reason = self.protocol.termination(
            dialogue.emotion, dialogue.turn, reply, dialogue.persona.language
        )
        dialogue.done_reason = None if reason is None else reason.value  # plain data, as the logs write it
        reward = self.reward.turn(previous, dialogue.emotion, terminated or truncated)
        if pending.format_error is not None:
            reward -= self.format_penalty
        info = self._info()
        info.update(
            emotion_change=dialogue.emotion - previous,
            termination_reason=dialogue.done_reason,
            format_error=pending.format_error,
            action_truncated=pending.action_truncated,
            action_sanitized=pending.action_sanitized,
            action_injection=pending.action_injection,
            **reply_flags,
            utterance=request.utterance,
            appraisal=outcome.appraisal.as_dict(),
            hidden_intention=dialogue.persona.hidden_intention,
            character_type=dialogue.persona.character_type,
        )
        if self.render_mode == "human":
            self.render()
        return reply, float(reward), terminated, truncated, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send the agent's utterance to the simulated user.

        Returns:
            ``(observation, reward, terminated, truncated, info)``: the user's reply,
            the reward (float, see ``reward_mode``), whether the user ended the dialogue
            (success, failure or goodbye), whether the turn limit was reached, and
            ``info``.

        Raises:
            TypeError, RuntimeError: see :meth:`prepare_step`.
            SimulatorError: an LLM user failed to give a valid appraisal.
        """
        pending = self.prepare_step(action)
        (outcome,) = self.user.respond([pending.request], self.protocol)
        return self.finish_step(pending, outcome)

    # -- asyncio twins -----------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """:meth:`reset` for asyncio: the same results for the same seed (example:
        docs/integrations.md)."""
        persona, user_seed = self.prepare_reset(seed=seed, options=options)
        (opening,) = await self.user.aopening([persona], [user_seed])
        return self.finish_reset(persona, opening)

    async def astep(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """:meth:`step` for asyncio: the same results and errors."""
        pending = self.prepare_step(action)
        (outcome,) = await self.user.arespond([pending.request], self.protocol)
        return self.finish_step(pending, outcome)

    # -- helpers -----------------------------------------------------------------
    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:
        """The ``EnvSpec`` set by ``gym.make``; marked ``nondeterministic`` whenever the
        simulated user is (an LLM user), even for an id registered with the rule user."""
        return self._spec

    @spec.setter
    def spec(self, value: gym.envs.registration.EnvSpec | None) -> None:
        if value is not None and not self.user.deterministic and not value.nondeterministic:
            value = dataclasses.replace(value, nondeterministic=True)
        self._spec = value

    def _clean_reply(self, text: str) -> tuple[str, dict[str, bool]]:
        """The user's utterance as the agent gets it: cut to ``max_utterance_chars``, then
        :func:`~empathy_gym.boundary.clean_text`; with its ``info`` flags."""
        truncated = len(text) > self.max_utterance_chars
        text, sanitized = clean_text(text[: self.max_utterance_chars])
        return text, {"user_reply_truncated": truncated, "user_reply_sanitized": sanitized}

    def _draw_seed(self) -> int:
        return int(self.np_random.integers(2**31 - 1))

    def _info(self) -> dict[str, Any]:
        dialogue = self.dialogue
        assert dialogue is not None
        return {
            "messages": [dict(m) for m in dialogue.messages],
            "emotion": dialogue.emotion,
            "turn": dialogue.turn,
            "persona_id": dialogue.persona.id,
            "language": dialogue.persona.language,
        }

    def render(self) -> str | None:
        """``"ansi"``: return the transcript with an emotion bar; ``"human"``: print it."""
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human' to gym.make")
            return None
        text = render_transcript(self.dialogue)
        if self.render_mode == "human":
            print(text, flush=True)
            return None
        return text

    def hand_over_user(self) -> bool:
        """Leave the closing of this env's user to the caller (a
        :class:`~empathy_gym.session.Session`); returns whether the env had built it (and so
        whether the caller must close it)."""
        owned, self._owns_user = self._owns_user, False
        return owned

    def close(self) -> None:
        if self._owns_user:
            self.user.close()
        super().close()


def emotion_bar(emotion: int, width: int = 20) -> str:
    """``[########------------]  40/100`` for an emotion in [0, 100]."""
    filled = round(width * emotion / 100)
    return f"[{'#' * filled}{'-' * (width - filled)}] {emotion:3d}/100"


def render_transcript(dialogue: Dialogue | None) -> str:
    """The dialogue so far: one line per utterance, the emotion bar after each user turn."""
    if dialogue is None:
        return "(no dialogue: call reset())"
    lines = [f"persona {dialogue.persona.id} ({dialogue.persona.language})"]
    emotions = iter(dialogue.emotions)
    for role, text in dialogue.history:
        if role == "user":
            lines += [f"USER : {text}", f"       emotion {emotion_bar(next(emotions))}"]
        else:
            lines.append(f"AGENT: {text}")
    if dialogue.done_reason:
        lines.append(f"(ended: {dialogue.done_reason})")
    return "\n".join(lines)


def _grouped_by_user(envs: Sequence[EmpathyDialogueEnv]) -> dict[tuple[int, Any], list[int]]:
    groups: dict[tuple[int, Any], list[int]] = {}
    for index, env in enumerate(envs):
        groups.setdefault((id(env.user), env.protocol), []).append(index)
    return groups


def reset_many(
    envs: Sequence[EmpathyDialogueEnv],
    seeds: Sequence[int | None],
    options: Sequence[dict[str, Any] | None] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Reset several envs, asking each simulated user for all its openings in one call;
    with a deterministic user, result for result ``[env.reset(seed=s, options=o) ...]``.

    Args:
        envs: unwrapped :class:`EmpathyDialogueEnv` instances (they may share a user).
        seeds: one seed (or ``None``) per env.
        options: one ``reset`` options dict (or ``None``) per env.
    """
    options = options if options is not None else [None] * len(envs)
    prepared = [env.prepare_reset(seed=s, options=o) for env, s, o in zip(envs, seeds, options)]
    openings: dict[int, str] = {}
    for indices in _grouped_by_user(envs).values():
        personas = [prepared[i][0] for i in indices]
        user_seeds = [prepared[i][1] for i in indices]
        openings.update(zip(indices, envs[indices[0]].user.opening(personas, user_seeds)))
    return [env.finish_reset(persona, openings[i]) for i, (env, (persona, _)) in enumerate(zip(envs, prepared))]


def step_many(
    envs: Sequence[EmpathyDialogueEnv], actions: Sequence[str]
) -> list[tuple[str, SupportsFloat, bool, bool, dict[str, Any]]]:
    """Step several envs, sending the turns of envs that share a simulated user to it as
    one batch. The i-th result always belongs to ``envs[i]``.

    Raises:
        TypeError, RuntimeError: as :meth:`EmpathyDialogueEnv.step`, before any user call.
    """
    pendings = [env.prepare_step(action) for env, action in zip(envs, actions)]
    outcomes: dict[int, UserTurn] = {}
    for (_, protocol), indices in _grouped_by_user(envs).items():
        user = envs[indices[0]].user
        outcomes.update(zip(indices, user.respond([pendings[i].request for i in indices], protocol)))
    return [env.finish_step(pending, outcomes[i]) for i, (env, pending) in enumerate(zip(envs, pendings))]


def _is_number(value: Any, kind: type = numbers.Real) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _maps_str_to_str(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
