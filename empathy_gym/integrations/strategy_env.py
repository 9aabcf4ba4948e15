"""``EmpathyStrategy-v0``: emotional support as a choice among the eight ESConv
strategies, for RL libraries that cannot act in free text (Stable-Baselines3 and the like).

Action: ``Discrete(8)``, the index into :data:`~empathy_gym.strategies.STRATEGIES`
(ESConv, Liu et al., 2021). The env turns the strategy into an utterance (templates, or an
LLM writer) and plays it in an inner :class:`~empathy_gym.env.EmpathyDialogueEnv`, whose
reward, termination, truncation and ``info`` it returns (``info`` adds ``strategy``).
Observation: ``Box((16,), float32)`` of :data:`FEATURES`, each in [0, 1] (the emotion
change in [-1, 1]); the table of features and scales is in docs/integrations.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from empathy_gym.backends.base import ChatBackend
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.personas import Persona, PersonaSource
from empathy_gym.strategies import (
    STRATEGIES,
    STRATEGY_DEFINITIONS,
    STRATEGY_NAMES,
    StrategyTemplates,
    load_templates,
    user_words,
)
from empathy_gym.user.specs import SpecError, chat_backend_target, init_keywords, parse_spec

#: Names of the observation features, in order (docs/integrations.md has their scales).
FEATURES: tuple[str, ...] = (
    "emotion",
    "emotion_change",
    "turn",
    "user_length",
    "user_question",
    "user_negative_cues",
    "user_positive_cues",
    "language_zh",
    *(f"last_action={s}" for s in STRATEGIES),
)
#: Words (en) that make the length feature 1.0.
LENGTH_SCALE = 40.0
#: Cue counts that make the cue features 1.0.
CUE_SCALE = 3.0

WRITER_PROMPTS: dict[str, str] = {
    "en": (
        "You are a supportive listener in a conversation with someone going through a hard "
        "time. Write your next reply using this support strategy: {name}: {definition}. "
        "Reply in English, in one to three natural sentences, without naming the strategy."
    ),
    "zh": (
        "你是一位倾听者，正在和一个遇到困难的人聊天。请用下面的支持策略写出你的下一句回复："
        "{name}：{definition}。用中文回复，一到三句自然的话，不要说出策略的名字。"
    ),
}


def utterance_features(text: str, templates: StrategyTemplates) -> np.ndarray:
    """Features 3-6 of the observation for one user utterance: float32 (4,) =
    (length, question, negative cues, positive cues), each in [0, 1]."""
    if templates.language == "zh":
        cjk = sum("\u4e00" <= ch <= "\u9fff" for ch in text)
        words = cjk / 2 + len([w for w in text.split() if w.isascii() and w.isalpha()])
    else:
        words = len(text.split())
    low = text.lower()
    return np.array(
        [
            min(1.0, words / LENGTH_SCALE),
            1.0 if ("?" in text or "？" in text) else 0.0,
            min(1.0, len(templates.negative_cues.findall(low)) / CUE_SCALE),
            min(1.0, len(templates.positive_cues.findall(low)) / CUE_SCALE),
        ],
        dtype=np.float32,
    )


def _writer_spec(writer: Any) -> tuple[Any, Any, str | None, dict[str, Any]]:
    """``(backend, model, base_url, backend options)`` of a ``writer`` that is not
    ``"templates"``: a ready ``ChatBackend`` or a backend spec string."""
    from empathy_gym.backends import backend_class, chat_backends, spec_form

    if isinstance(writer, ChatBackend):
        return writer, None, None, {}
    forms = ", ".join(map(spec_form, chat_backends()))
    problem = f"writer must be 'templates', a backend spec ({forms}, or hf:PATH) or a ChatBackend, got {writer!r}"
    if not isinstance(writer, str):
        raise SpecError(problem)
    spec = parse_spec(writer)
    kind = "transformers" if spec.kind == "hf" else spec.kind
    if kind not in chat_backends():
        raise SpecError(problem)
    target = chat_backend_target(spec, writer)
    taken = init_keywords(backend_class(kind), "model", "base_url")
    unknown = sorted(set(spec.options) - taken)
    if unknown:
        raise SpecError(
            f"writer {writer!r}: unknown option(s) {unknown}; the {kind} backend takes {', '.join(sorted(taken))} "
            "(the writer's sampling: writer_temperature=, writer_max_tokens=)"
        )
    return kind, target["model"], target.get("base_url"), spec.options


class EmpathyStrategyEnv(gym.Env[np.ndarray, np.int64]):
    """A dialogue in which each action is an ESConv support strategy.

    Args:
        personas, difficulty: as :class:`~empathy_gym.env.EmpathyDialogueEnv` (e.g. one
            part of :func:`~empathy_gym.personas.split_personas`).
        writer: ``"templates"`` (default); an LLM that writes a reply with the strategy,
            named as a user spec names its backend (``"hf:PATH"``, ``"vllm:PATH"``,
            ``"openai:MODEL@URL"``, a registered backend; backend options after commas:
            ``"openai:M@URL,max_concurrency=4"``); or a ready ``ChatBackend`` (not closed
            by the env).
        writer_backend, writer_model, writer_base_url, writer_kwargs: deprecated, with
            ``writer="llm"``: the backend by name and its arguments (a spec string says it).
        writer_temperature, writer_max_tokens: the LLM writer's sampling.
        templates_dir: a folder with your own ``<language>.json`` template files.
        render_mode: ``None``, ``"ansi"`` or ``"human"`` (the inner env's transcript).
        **dialogue_kwargs: more :class:`~empathy_gym.env.EmpathyDialogueEnv` arguments
            (``user``, ``protocol``, ``max_turns``, ...).

    Raises:
        SpecError (a ``ValueError``): a ``writer`` that is none of the above, naming it.
        ValueError: ``writer="llm"`` without a backend.
        TemplateError: a bad template file (naming the file and the field).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    def __init__(
        self,
        personas: PersonaSource | None = None,
        difficulty: Any = "moderate",
        *,
        writer: str | ChatBackend = "templates",
        writer_backend: str | ChatBackend | None = None,
        writer_model: Any = None,
        writer_base_url: str | None = None,
        writer_kwargs: Mapping[str, Any] | None = None,
        writer_temperature: float = 0.7,
        writer_max_tokens: int = 128,
        templates_dir: str | None = None,
        render_mode: str | None = None,
        **dialogue_kwargs: Any,
    ):
        if writer == "llm":
            warnings.warn(
                "writer='llm' with writer_backend=... is deprecated: pass writer='openai:MODEL@URL' (or hf:PATH, "
                "vllm:PATH, with backend options after commas) or writer=<a ChatBackend>",
                DeprecationWarning,
                stacklevel=2,
            )
            if writer_backend is None:
                raise ValueError("writer='llm' needs writer_backend= (a ChatBackend or a backend name)")
        elif writer != "templates":
            writer_backend, writer_model, writer_base_url, writer_kwargs = _writer_spec(writer)
        self.dialogue_env = EmpathyDialogueEnv(personas, difficulty, render_mode=render_mode, **dialogue_kwargs)
        self.render_mode = render_mode
        self.writer = "templates" if writer == "templates" else "llm"
        self._owns_writer = False
        self.writer_backend: ChatBackend | None = None
        if self.writer == "llm" and isinstance(writer_backend, ChatBackend):
            self.writer_backend = writer_backend
        elif self.writer == "llm":
            from empathy_gym.backends import make_backend

            self.writer_backend = make_backend(
                writer_backend, model=writer_model, base_url=writer_base_url, **dict(writer_kwargs or {})
            )
            self._owns_writer = True
        self.writer_temperature = float(writer_temperature)
        self.writer_max_tokens = int(writer_max_tokens)
        self.templates_dir = templates_dir
        for language in {p.language for p in self.dialogue_env.personas}:
            load_templates(language, templates_dir)  # fail now on a bad file, not mid-episode
        n = len(STRATEGIES)
        self.action_space = gym.spaces.Discrete(n)
        low = np.zeros(8 + n, dtype=np.float32)
        low[1] = -1.0
        self.observation_space = gym.spaces.Box(low, np.ones(8 + n, dtype=np.float32), dtype=np.float32)
        self._last_action: int | None = None
        self._last_change = 0
        self._last_user_text = ""
        self._used: dict[str, set[str]] = {}  # strategy -> utterances said this episode

    # -- gym API -------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a dialogue (``options["persona"]`` picks a persona by id). Returns the
        observation (float32 (16,)) and the inner env's ``info``."""
        super().reset(seed=seed)
        text, info = self.dialogue_env.reset(seed=seed, options=options)
        self._last_action, self._last_change, self._used = None, 0, {}
        self._last_user_text = text
        return self._observation(text), info

    def step(self, action: int | np.integer | np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Say an utterance with strategy ``STRATEGIES[action]``.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info["strategy"]``
            and ``info["utterance"]`` say what was done.

        Raises:
            ValueError: ``action`` is not an integer in [0, 8).
            RuntimeError: ``step`` before ``reset`` or after the episode ended.
        """
        index = self._action_index(action)
        dialogue = self.dialogue_env.dialogue
        if dialogue is None or dialogue.done_reason is not None:
            raise RuntimeError(
                "call reset() before step()"
                if dialogue is None
                else f"the episode has ended ({dialogue.done_reason}); call reset() before step()"
            )
        strategy = STRATEGIES[index]
        utterance = self.utterance(strategy)
        text, reward, terminated, truncated, info = self.dialogue_env.step(utterance)
        self._last_action, self._last_change = index, int(info["emotion_change"])
        self._last_user_text = text
        info.update(strategy=strategy)
        return self._observation(text), float(reward), terminated, truncated, info

    def render(self) -> str | None:
        """The inner env's transcript (``"ansi"``: returned, ``"human"``: printed)."""
        return self.dialogue_env.render()

    def close(self) -> None:
        self.dialogue_env.close()
        if self._owns_writer and self.writer_backend is not None:
            self.writer_backend.close()
        super().close()

    # -- strategy -> utterance -------------------------------------------------------
    def utterance(self, strategy: str) -> str:
        """The utterance that realises ``strategy`` now: from the LLM writer, or a template
        variant in the persona's language not used yet this episode (drawn with
        ``self.np_random``), filled with the user's newest words and the persona's name."""
        dialogue = self.dialogue_env.dialogue
        if dialogue is None:
            raise RuntimeError("call reset() before utterance()")
        persona = dialogue.persona
        if self.writer == "llm":
            return self._write_with_llm(strategy, persona, dialogue.messages)
        templates = load_templates(persona.language, self.templates_dir)
        variants = templates.variants(strategy, words=user_words(self._last_user_text), name=persona.name)
        used = self._used.setdefault(strategy, set())
        fresh = [v for v in variants if v not in used] or variants
        choice = fresh[int(self.np_random.integers(len(fresh)))]
        used.add(choice)
        return choice

    def _write_with_llm(self, strategy: str, persona: Persona, messages: Sequence[dict[str, str]]) -> str:
        assert self.writer_backend is not None
        system = WRITER_PROMPTS[persona.language].format(
            name=STRATEGY_NAMES[strategy], definition=STRATEGY_DEFINITIONS[strategy]
        )
        chat = [{"role": "system", "content": system}] + [dict(m) for m in messages if m["role"] != "system"]
        (text,) = self.writer_backend.generate(
            [chat],
            max_tokens=self.writer_max_tokens,
            temperature=self.writer_temperature,
            seeds=[int(self.np_random.integers(2**31 - 1))],
        )
        return text.strip()

    # -- helpers ---------------------------------------------------------------------
    def _action_index(self, action: Any) -> int:
        value = np.asarray(action)
        if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"action must be an integer in [0, {len(STRATEGIES)}) (a strategy index), got {action!r}")
        index = int(value.reshape(()))
        if not 0 <= index < len(STRATEGIES):
            raise ValueError(f"action must be in [0, {len(STRATEGIES)}), got {index}")
        return index

    def _observation(self, user_text: str) -> np.ndarray:
        dialogue = self.dialogue_env.dialogue
        assert dialogue is not None
        templates = load_templates(dialogue.persona.language, self.templates_dir)
        obs = np.zeros(self.observation_space.shape, dtype=np.float32)
        obs[0] = dialogue.emotion / 100.0
        obs[1] = np.clip(self._last_change / 10.0, -1.0, 1.0)
        obs[2] = min(1.0, dialogue.turn / self.dialogue_env.protocol.max_turns)
        obs[3:7] = utterance_features(user_text, templates)
        obs[7] = 1.0 if dialogue.persona.language == "zh" else 0.0
        if self._last_action is not None:
            obs[8 + self._last_action] = 1.0
        return obs


def final_emotions(
    policy: Callable[[np.ndarray], int],
    personas: Sequence[Persona],
    *,
    episodes_per_persona: int = 1,
    seed: int = 0,
    **env_kwargs: Any,
) -> np.ndarray:
    """Play ``policy`` once per persona and repeat, and return the final emotions.

    Args:
        policy: observation (float32 (16,)) -> strategy index. Called fresh each turn;
            a stateful policy (e.g. a random one with its own RNG) is fine.
        personas: the personas to play (each once per repeat, with
            ``options={"persona": id}``).
        episodes_per_persona: repeats, each with its own reset seed.
        seed: episode k of persona j is reset with ``seed + 1000 * k + j``.
        **env_kwargs: :class:`EmpathyStrategyEnv` arguments (``difficulty``, ``user``...).

    Returns:
        int64 array (len(personas) * episodes_per_persona,): the emotion (0-100) at the
        end of each episode, persona-major.
    """
    env = EmpathyStrategyEnv(list(personas), **env_kwargs)
    out = []
    try:
        for j, persona in enumerate(personas):
            for k in range(episodes_per_persona):
                obs, info = env.reset(seed=seed + 1000 * k + j, options={"persona": persona.id})
                done = False
                while not done:
                    obs, _, terminated, truncated, info = env.step(int(policy(obs)))
                    done = terminated or truncated
                out.append(info["emotion"])
    finally:
        env.close()
    return np.array(out, dtype=np.int64)
