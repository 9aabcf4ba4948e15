"""The LLM simulated user: an LLM plays the persona, appraises each agent utterance and
answers in character (SAGE, arXiv 2505.02847, section 2.2; RLVER, arXiv 2507.03112,
section 3.1). Prompts, appraisal modes and the context check: docs/simulated-user.md.

An answer that fails its schema is repaired, then raises :class:`SimulatorError`; it
never silently scores zero. In choice mode an appraisal with no option among the
returned log-probabilities has its letter generated (``features["generated_choice"]``)
or raises :class:`ChoiceScoringUnavailable`; it never defaults to the first option.

The logic of each method is written once, as a generator that yields the backend calls
it needs (``("generate", args, kwargs)``) and receives their results: :meth:`LLMUser._run`
drives it with the backend's blocking methods, :meth:`LLMUser._arun` with its asyncio
twins (``agenerate``, ``achoice_logprobs``) where the backend has them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import jsonschema
import numpy as np

from empathy_gym.backends.base import ChatBackend, ChoiceScoringUnavailable
from empathy_gym.personas import Persona
from empathy_gym.user import prompts
from empathy_gym.user.base import Appraisal, SimulatedUser, SimulatorError, UserRequest, UserTurn, advance, respond_plan
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.prompts import APPRAISAL_STEPS, REPLY_STEPS
from empathy_gym.user.protocol import SAGE, EmotionProtocol

log = logging.getLogger(__name__)

#: JSON Schema of a free appraisal: one field per analysis step (SAGE's five steps).
APPRAISAL_SCHEMA: dict = {
    "type": "object",
    "required": list(APPRAISAL_STEPS),
    "properties": {
        **{name: {"type": "string"} for name in APPRAISAL_STEPS if name != "change"},
        "change": {"type": "integer", "minimum": -100, "maximum": 100},
    },
}
#: JSON Schema of a planned reply (SAGE's plan, draft and rewritten response).
REPLY_SCHEMA: dict = {
    "type": "object",
    "required": list(REPLY_STEPS),
    "properties": {
        **{name: {"type": "string"} for name in REPLY_STEPS},
        "response": {"type": "string", "pattern": r"\S"},
    },
}
_validator = jsonschema.Draft202012Validator(APPRAISAL_SCHEMA)
_reply_validator = jsonschema.Draft202012Validator(REPLY_SCHEMA)
_decoder = json.JSONDecoder()


class PromptTooLongError(SimulatorError):
    """A simulated-user prompt does not fit the user model's context.

    Attributes:
        persona_id: the dialogue's persona. turn: the agent turn (0 for the opening).
        prompt_tokens: the prompt's length. max_tokens: new tokens reserved.
        context_length: the model's context.
    """

    def __init__(
        self, persona_id: str, turn: int, stage: str, prompt_tokens: int, max_tokens: int, context_length: int
    ):
        super().__init__(
            f"dialogue with persona {persona_id!r}, turn {turn}: the {stage} prompt is "
            f"{prompt_tokens:,} tokens and {max_tokens:,} new tokens are reserved "
            f"({prompt_tokens + max_tokens:,} in all), but the user model's context is "
            f"{context_length:,} tokens. Use a user model with a longer context, a smaller "
            f"max_tokens, or (playing, not replaying logs) fewer turns: max_turns"
        )
        self.persona_id, self.turn, self.stage = persona_id, turn, stage
        self.prompt_tokens, self.max_tokens, self.context_length = prompt_tokens, max_tokens, context_length


#: A backend call asked for by the user's logic: (method name, args, kwargs).
BackendCall = tuple[str, tuple, dict]
T = TypeVar("T")
Steps = Generator[BackendCall, Any, T]


def _parse_json(text: str, validator: jsonschema.protocols.Validator) -> tuple[dict[str, Any] | None, str | None]:
    reason = "no JSON object found"
    for match in re.finditer(r"\{", text):
        try:
            value, _ = _decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return value, None
        field = "/".join(str(p) for p in error.absolute_path) or "object"
        reason = f"field {field!r}: {error.message}"
    return None, reason


def parse_appraisal(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Find the first JSON object in ``text`` that is a valid appraisal
    (:data:`APPRAISAL_SCHEMA`). Tolerates code fences and prose around the object.

    Returns:
        ``(appraisal, None)`` when valid, else ``(None, reason)`` (the reason names the
        field of the best candidate).
    """
    return _parse_json(text, _validator)


def parse_reply(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Find the first JSON object in ``text`` that is a valid planned reply
    (:data:`REPLY_SCHEMA`); like :func:`parse_appraisal`."""
    return _parse_json(text, _reply_validator)


def _parse_letter(text: str, letters: Sequence[str]) -> tuple[str | None, str | None]:
    match = re.search(r"\b([A-Z])\b", text.strip())
    if match and match.group(1) in letters:
        return match.group(1), None
    return None, f"expected one of {', '.join(letters)}"


class LLMUser(SimulatedUser):
    """A simulated user played by an LLM behind a :class:`ChatBackend`.

    Args:
        backend: the chat engine.
        difficulty: preset name, path, dict or :class:`Difficulty`.
        protocol: the emotion protocol, used to state the allowed change range.
        appraisal_mode: ``"free"`` or ``"choice"`` (docs/simulated-user.md).
        choices: the emotion changes offered in choice mode (ints).
        choice_fallback: ``"generate"`` or ``"error"``, when the backend has no logprobs.
        max_repairs: repair retries for an invalid appraisal or planned reply before
            SimulatorError.
        temperature: sampling temperature for replies and free appraisals.
        max_tokens: new-token limit for each call (the five-step analysis needs room).
        reply_plan: the reply plans attitude, goal, tone and content and writes a draft
            before the response, as one JSON object (SAGE's design); ``False`` asks for
            the bare message.
        owns_backend: close the backend in :meth:`close` (set when the user built it).

    Raises:
        ValueError: an unknown ``appraisal_mode`` or ``choice_fallback``.
    """

    def __init__(
        self,
        backend: ChatBackend,
        difficulty: Any = "moderate",
        *,
        protocol: EmotionProtocol = SAGE,
        appraisal_mode: str = "free",
        choices: Sequence[int] = (-10, -5, 0, 5, 10),
        choice_fallback: str = "generate",
        max_repairs: int = 2,
        temperature: float = 0.7,
        max_tokens: int = 1024,
        reply_plan: bool = True,
        owns_backend: bool = False,
    ):
        if appraisal_mode not in ("free", "choice"):
            raise ValueError(f"appraisal_mode must be 'free' or 'choice', got {appraisal_mode!r}")
        if choice_fallback not in ("generate", "error"):
            raise ValueError(f"choice_fallback must be 'generate' or 'error', got {choice_fallback!r}")
        self.backend = backend
        self.difficulty: Difficulty = load_difficulty(difficulty)
        self.protocol = protocol
        self.appraisal_mode = appraisal_mode
        self.choices = tuple(int(c) for c in choices)
        self.letters = prompts.option_letters(len(self.choices))
        self.choice_fallback = choice_fallback
        self.max_repairs = max_repairs
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.reply_plan = reply_plan
        self.owns_backend = owns_backend
        self._warned_fallback = False

    # -- context -----------------------------------------------------------------
    def check_context(
        self,
        chats: Sequence[Sequence[dict[str, str]]],
        personas: Sequence[Persona],
        turns: Sequence[int],
        max_tokens: int,
        stage: str,
    ) -> None:
        """Raise :class:`PromptTooLongError` for the first chat whose prompt plus
        ``max_tokens`` exceeds the backend's context (no check where the backend cannot
        count tokens)."""
        context = self.backend.context_length
        if context is None:
            return
        lengths = self.backend.prompt_lengths(chats)
        if lengths is None:
            return
        for length, persona, turn in zip(lengths, personas, turns):
            if length + max_tokens > context:
                raise PromptTooLongError(persona.id, turn, stage, length, max_tokens, context)

    def _generate(
        self,
        chats: list[list[dict[str, str]]],
        personas: Sequence[Persona],
        turns: Sequence[int],
        stage: str,
        **kwargs: Any,
    ) -> BackendCall:
        self.check_context(chats, personas, turns, kwargs["max_tokens"], stage)
        return ("generate", (chats,), kwargs)

    # -- opening -----------------------------------------------------------------
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        return self._run(self._opening(personas, seeds))

    def _opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> Steps[list[str]]:
        lines: list[str | None] = [p.opening_line for p in personas]
        missing = [i for i, line in enumerate(lines) if line is None]
        if missing:
            chats = [
                prompts.opening_messages(
                    personas[i],
                    self.difficulty,
                    personas[i].initial_emotion
                    if personas[i].initial_emotion is not None
                    else self.protocol.initial_emotion,
                )
                for i in missing
            ]
            texts = yield self._generate(
                chats,
                [personas[i] for i in missing],
                [0] * len(missing),
                "opening",
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                seeds=[seeds[i] for i in missing],
            )
            for i, text in zip(missing, texts):
                lines[i] = text.strip()
        return [line or "" for line in lines]

    # -- appraisal ---------------------------------------------------------------
    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        return self._run(self._appraise(requests))

    def _appraise(self, requests: Sequence[UserRequest]) -> Steps[list[Appraisal]]:
        if self.appraisal_mode == "free":
            return (yield from self._appraise_free(requests))
        chats = [prompts.appraisal_messages(r, self.difficulty, self.protocol, self.choices) for r in requests]
        self.check_context(chats, [r.persona for r in requests], [r.turn for r in requests], 1, "appraisal")
        try:
            scores = yield ("choice_logprobs", (chats, self.letters), {})
        except ChoiceScoringUnavailable:
            if self.choice_fallback == "error":
                raise
            if not self._warned_fallback:
                log.warning(
                    "backend %s returns no log-probabilities: choice appraisal falls "
                    "back to greedy generation of the option letter",
                    self.backend.name,
                )
                self._warned_fallback = True
            return (yield from self._appraise_choice_by_generation(requests, chats))
        unscored = [i for i, row in enumerate(scores) if not np.isfinite(row).any()]
        if unscored and self.choice_fallback == "error":
            first = requests[unscored[0]]
            raise ChoiceScoringUnavailable(
                f"persona {first.persona.id!r}, turn {first.turn}: none of the options "
                f"{', '.join(self.letters)} is among the log-probabilities {self.backend.name} returned "
                f"({len(unscored)} of {len(requests)} appraisals); use choice_fallback='generate'"
            )
        appraisals: list[Appraisal | None] = []
        for row in scores:
            if not np.isfinite(row).any():
                appraisals.append(None)  # scored below by generating the letter
                continue
            best = int(max(range(len(self.choices)), key=lambda k: row[k]))
            features = {f"logprob[{c:+d}]": float(v) for c, v in zip(self.choices, row)}
            appraisals.append(Appraisal(change=self.choices[best], features=features))
        if unscored:
            generated = yield from self._appraise_choice_by_generation(
                [requests[i] for i in unscored], [chats[i] for i in unscored]
            )
            for i, appraisal in zip(unscored, generated):
                appraisals[i] = appraisal
        return appraisals  # type: ignore[return-value]

    def _appraise_free(self, requests: Sequence[UserRequest]) -> Steps[list[Appraisal]]:
        chats = [prompts.appraisal_messages(r, self.difficulty, self.protocol) for r in requests]
        results = yield from self._generate_with_repair(requests, chats, parse_appraisal, kind="appraisal")
        appraisals = []
        for value, raw, repairs in results:
            analysis = {name: value[name].strip() for name in APPRAISAL_STEPS if name != "change"}
            appraisals.append(
                Appraisal(
                    change=int(value["change"]),
                    thoughts=analysis["inner_thoughts"],
                    raw=raw,
                    repairs=repairs,
                    analysis=analysis,
                )
            )
        return appraisals

    def _appraise_choice_by_generation(
        self, requests: Sequence[UserRequest], chats: list[list[dict[str, str]]]
    ) -> Steps[list[Appraisal]]:
        results = yield from self._generate_with_repair(
            requests,
            chats,
            lambda text: _parse_letter(text, self.letters),
            temperature=0.0,
            max_tokens=8,
            letters=self.letters,
            kind="appraisal",
        )
        return [
            Appraisal(
                change=self.choices[self.letters.index(letter)],
                raw=raw,
                repairs=repairs,
                features={"generated_choice": 1.0},
            )
            for letter, raw, repairs in results
        ]

    def _generate_with_repair(
        self,
        requests: Sequence[UserRequest],
        chats: list[list[dict[str, str]]],
        parse: Callable[[str], tuple[Any, str | None]],
        *,
        kind: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        letters: Sequence[str] | None = None,
        seed_offset: int = 0,
    ) -> Steps[list[tuple[Any, str, int]]]:
        """Generate for every chat; re-ask the invalid ones (batched) with a repair
        message, at most ``max_repairs`` times. Returns (parsed, raw, repairs) per chat.
        ``kind``: ``"appraisal"`` or ``"reply"``."""
        temperature = self.temperature if temperature is None else temperature
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        results: list[tuple[Any, str, int] | None] = [None] * len(chats)
        pending = list(range(len(chats)))
        chats = [list(chat) for chat in chats]
        for attempt in range(self.max_repairs + 1):
            texts = yield self._generate(
                [chats[i] for i in pending],
                [requests[i].persona for i in pending],
                [requests[i].turn for i in pending],
                kind,
                max_tokens=max_tokens,
                temperature=temperature,
                seeds=[requests[i].seed + seed_offset + 7919 * attempt for i in pending],
            )
            still = []
            for i, text in zip(pending, texts):
                value, error = parse(text)
                if error is None:
                    results[i] = (value, text, attempt)
                    continue
                if attempt == self.max_repairs:
                    hint = (
                        "; a model too small to write it can score options: appraisal_mode=choice"
                        if (kind == "appraisal" and self.appraisal_mode == "free")
                        else ""
                    )
                    raise SimulatorError(
                        f"the simulated user gave no valid {kind} after {attempt + 1} attempts "
                        f"(persona {requests[i].persona.id!r}, turn {requests[i].turn}): {error}{hint}",
                        raw=text,
                        attempts=attempt + 1,
                    )
                chats[i] += [
                    {"role": "assistant", "content": text},
                    prompts.repair_message(requests[i].persona.language, error, letters, kind),
                ]
                still.append(i)
            pending = still
            if not pending:
                break
        return results  # type: ignore[return-value]

    # -- reply -------------------------------------------------------------------
    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        return self._run(self._reply(requests, appraisals, emotions))

    def _reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> Steps[list[str]]:
        chats = [
            prompts.reply_messages(r, self.difficulty, a, e, plan=self.reply_plan)
            for r, a, e in zip(requests, appraisals, emotions)
        ]
        if self.reply_plan:
            results = yield from self._generate_with_repair(requests, chats, parse_reply, kind="reply", seed_offset=1)
            return [value["response"].strip() for value, _, _ in results]
        texts = yield self._generate(
            chats,
            [r.persona for r in requests],
            [r.turn for r in requests],
            "reply",
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seeds=[r.seed + 1 for r in requests],
        )
        return [text.strip() for text in texts]

    # -- asyncio -----------------------------------------------------------------
    @property
    def native_async(self) -> bool:
        """True when the backend has ``agenerate``: the async methods then await it, not a thread."""
        return callable(getattr(self.backend, "agenerate", None))

    async def aopening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        if not self.native_async:
            return await super().aopening(personas, seeds)
        return await self._arun(self._opening(personas, seeds))

    async def arespond(self, requests: Sequence[UserRequest], protocol: EmotionProtocol) -> list[UserTurn]:
        if not self.native_async:
            return await super().arespond(requests, protocol)
        plan = respond_plan(requests, protocol)
        call, turns = advance(plan)
        while call is not None:
            name, *args = call
            call, turns = advance(plan, (await self._arun(getattr(self, f"_{name}")(*args)), None))
        return turns

    # -- drivers -----------------------------------------------------------------
    def _run(self, steps: Steps[T]) -> T:
        """Run ``steps``, answering each backend call with the blocking method; a call's
        exception is thrown back into ``steps`` at the ``yield``."""
        call, value = advance(steps)
        while call is not None:
            name, args, kwargs = call
            try:
                outcome = getattr(self.backend, name)(*args, **kwargs), None
            except Exception as exc:  # noqa: BLE001 (handed back to the logic)
                outcome = None, exc
            call, value = advance(steps, outcome)
        return value

    async def _arun(self, steps: Steps[T]) -> T:
        """:meth:`_run` with the backend's ``a<name>`` twin awaited where it has one, else
        the blocking method in a worker thread."""
        call, value = advance(steps)
        while call is not None:
            name, args, kwargs = call
            native = getattr(self.backend, "a" + name, None)
            try:
                if callable(native):
                    result = await native(*args, **kwargs)
                else:
                    result = await asyncio.to_thread(getattr(self.backend, name), *args, **kwargs)
                outcome = result, None
            except Exception as exc:  # noqa: BLE001 (handed back to the logic)
                outcome = None, exc
            call, value = advance(steps, outcome)
        return value

    def close(self) -> None:
        if self.owns_backend:
            self.backend.close()
