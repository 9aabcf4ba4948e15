"""The LLM simulated user: an LLM plays the persona, appraises each agent utterance and
answers in character (SAGE, arXiv 2505.02847, section 2.2; RLVER, arXiv 2507.03112,
section 3.1).

Two appraisal modes:

* ``"free"`` (SAGE's): the model writes ``{"thoughts": ..., "change": <int>}``. The
  JSON is validated against :data:`APPRAISAL_SCHEMA`; an invalid answer is sent back
  with a repair instruction up to ``max_repairs`` times (counted in
  :attr:`Appraisal.repairs`), then :class:`SimulatorError` is raised with the raw text.
  It never silently scores zero. Sampled, so two runs can differ.
* ``"choice"``: the change is one of a fixed set (default -10, -5, 0, +5, +10, the
  values SAGE's logs cluster at), offered as lettered options; the chosen change is the
  option with the highest next-token log-probability (logits with transformers,
  ``logprobs`` with vLLM and OpenAI-compatible servers). It cannot fail to parse and is
  deterministic for a deterministic model, but it writes no inner thoughts (the reply
  then rests on the emotion alone) and it cannot express changes between the options.
  Where a server returns no log-probabilities (``transformers serve`` ignores the
  ``logprobs`` field), ``choice_fallback="generate"`` asks for the letter with greedy
  decoding instead (repaired and then failing like the free mode), and
  ``choice_fallback="error"`` raises :class:`ChoiceScoringUnavailable`.

The logic of each method is written once, as a generator that yields the backend calls
it needs (``("generate", args, kwargs)``) and receives their results: :meth:`LLMUser._run`
drives it with the backend's blocking methods, :meth:`LLMUser._arun` with its asyncio
twins (``agenerate``, ``achoice_logprobs``) when the backend has them, so
:meth:`LLMUser.arespond` on an OpenAI-compatible server awaits the requests without
threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import jsonschema

from empathy_gym.backends.base import ChatBackend, ChoiceScoringUnavailable
from empathy_gym.personas import Persona
from empathy_gym.user import prompts
from empathy_gym.user.base import (Appraisal, SimulatedUser, SimulatorError, UserRequest,
                                   UserTurn)
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import SAGE, EmotionProtocol

log = logging.getLogger(__name__)

#: JSON Schema of a free-text appraisal.
APPRAISAL_SCHEMA: dict = {
    "type": "object",
    "required": ["thoughts", "change"],
    "properties": {
        "thoughts": {"type": "string"},
        "change": {"type": "integer", "minimum": -100, "maximum": 100},
    },
}
_validator = jsonschema.Draft202012Validator(APPRAISAL_SCHEMA)
_decoder = json.JSONDecoder()

#: A backend call asked for by the user's logic: (method name, args, kwargs).
BackendCall = tuple[str, tuple, dict]
T = TypeVar("T")
Steps = Generator[BackendCall, Any, T]


def parse_appraisal(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Find the first JSON object in ``text`` that is a valid appraisal.

    Tolerates code fences and prose around the object.

    Returns:
        ``(appraisal, None)`` when valid, else ``(None, reason)``.
    """
    reason = "no JSON object found"
    for match in re.finditer(r"\{", text):
        try:
            value, _ = _decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        error = jsonschema.exceptions.best_match(_validator.iter_errors(value))
        if error is None:
            return value, None
        field = "/".join(str(p) for p in error.absolute_path) or "object"
        reason = f"field {field!r}: {error.message}"
    return None, reason


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
        appraisal_mode: ``"free"`` or ``"choice"`` (see the module docstring).
        choices: the emotion changes offered in choice mode (ints).
        choice_fallback: ``"generate"`` or ``"error"``, when the backend has no logprobs.
        max_repairs: repair retries for an invalid appraisal before SimulatorError.
        temperature: sampling temperature for replies and free appraisals.
        max_tokens: new-token limit for each call.
        owns_backend: close the backend in :meth:`close` (set when the user built it).

    Raises:
        ValueError: an unknown ``appraisal_mode`` or ``choice_fallback``.
    """

    def __init__(self, backend: ChatBackend, difficulty: Any = "moderate", *,
                 protocol: EmotionProtocol = SAGE, appraisal_mode: str = "free",
                 choices: Sequence[int] = (-10, -5, 0, 5, 10), choice_fallback: str = "generate",
                 max_repairs: int = 2, temperature: float = 0.7, max_tokens: int = 256,
                 owns_backend: bool = False):
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
        self.owns_backend = owns_backend
        self._warned_fallback = False

    # -- opening -----------------------------------------------------------------
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        return self._run(self._opening(personas, seeds))

    def _opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> Steps[list[str]]:
        lines: list[str | None] = [p.opening_line for p in personas]
        missing = [i for i, line in enumerate(lines) if line is None]
        if missing:
            chats = [prompts.opening_messages(
                personas[i], self.difficulty,
                personas[i].initial_emotion if personas[i].initial_emotion is not None
                else self.protocol.initial_emotion) for i in missing]
            texts = yield ("generate", (chats,), dict(max_tokens=self.max_tokens,
                                                      temperature=self.temperature,
                                                      seeds=[seeds[i] for i in missing]))
            for i, text in zip(missing, texts):
                lines[i] = text.strip()
        return [line or "" for line in lines]

    # -- appraisal ---------------------------------------------------------------
    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        return self._run(self._appraise(requests))

    def _appraise(self, requests: Sequence[UserRequest]) -> Steps[list[Appraisal]]:
        if self.appraisal_mode == "free":
            return (yield from self._appraise_free(requests))
        chats = [prompts.appraisal_messages(r, self.difficulty, self.protocol, self.choices)
                 for r in requests]
        try:
            scores = yield ("choice_logprobs", (chats, self.letters), {})
        except ChoiceScoringUnavailable:
            if self.choice_fallback == "error":
                raise
            if not self._warned_fallback:
                log.warning("backend %s returns no log-probabilities: choice appraisal falls "
                            "back to greedy generation of the option letter", self.backend.name)
                self._warned_fallback = True
            return (yield from self._appraise_choice_by_generation(requests, chats))
        appraisals = []
        for row in scores:
            best = int(max(range(len(self.choices)), key=lambda k: row[k]))
            features = {f"logprob[{c:+d}]": float(v) for c, v in zip(self.choices, row)}
            appraisals.append(Appraisal(change=self.choices[best], features=features))
        return appraisals

    def _appraise_free(self, requests: Sequence[UserRequest]) -> Steps[list[Appraisal]]:
        chats = [prompts.appraisal_messages(r, self.difficulty, self.protocol) for r in requests]
        results = yield from self._generate_with_repair(
            requests, chats, parse_appraisal, temperature=self.temperature, max_tokens=self.max_tokens,
            letters=None)
        return [Appraisal(change=int(value["change"]), thoughts=value["thoughts"].strip(),
                          raw=raw, repairs=repairs) for value, raw, repairs in results]

    def _appraise_choice_by_generation(self, requests: Sequence[UserRequest],
                                       chats: list[list[dict[str, str]]]) -> Steps[list[Appraisal]]:
        results = yield from self._generate_with_repair(
            requests, chats, lambda text: _parse_letter(text, self.letters), temperature=0.0,
            max_tokens=8, letters=self.letters)
        return [Appraisal(change=self.choices[self.letters.index(letter)], raw=raw,
                          repairs=repairs, features={"generated_choice": 1.0})
                for letter, raw, repairs in results]

    def _generate_with_repair(self, requests: Sequence[UserRequest], chats: list[list[dict[str, str]]],
                              parse: Callable[[str], tuple[Any, str | None]], *, temperature: float,
                              max_tokens: int, letters: Sequence[str] | None
                              ) -> Steps[list[tuple[Any, str, int]]]:
        """Generate for every chat; re-ask the invalid ones (batched) with a repair
        message, at most ``max_repairs`` times. Returns (parsed, raw, repairs) per chat."""
        results: list[tuple[Any, str, int] | None] = [None] * len(chats)
        pending = list(range(len(chats)))
        chats = [list(chat) for chat in chats]
        for attempt in range(self.max_repairs + 1):
            texts = yield ("generate", ([chats[i] for i in pending],), dict(
                max_tokens=max_tokens, temperature=temperature,
                seeds=[requests[i].seed + 7919 * attempt for i in pending]))
            still = []
            for i, text in zip(pending, texts):
                value, error = parse(text)
                if error is None:
                    results[i] = (value, text, attempt)
                    continue
                if attempt == self.max_repairs:
                    raise SimulatorError(
                        f"the simulated user gave no valid appraisal after {attempt + 1} attempts "
                        f"(persona {requests[i].persona.id!r}, turn {requests[i].turn}): {error}",
                        raw=text, attempts=attempt + 1)
                language = requests[i].persona.language
                chats[i] += [{"role": "assistant", "content": text},
                             prompts.repair_message(language, error, letters)]
                still.append(i)
            pending = still
            if not pending:
                break
        return results  # type: ignore[return-value]

    # -- reply -------------------------------------------------------------------
    def reply(self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal],
              emotions: Sequence[int]) -> list[str]:
        return self._run(self._reply(requests, appraisals, emotions))

    def _reply(self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal],
               emotions: Sequence[int]) -> Steps[list[str]]:
        chats = [prompts.reply_messages(r, self.difficulty, a.thoughts, e)
                 for r, a, e in zip(requests, appraisals, emotions)]
        texts = yield ("generate", (chats,), dict(max_tokens=self.max_tokens,
                                                  temperature=self.temperature,
                                                  seeds=[r.seed + 1 for r in requests]))
        return [text.strip() for text in texts]

    # -- asyncio -----------------------------------------------------------------
    @property
    def native_async(self) -> bool:
        """True when the backend has ``agenerate`` (the OpenAI-compatible backend): then
        :meth:`aopening` and :meth:`arespond` await its requests instead of running the
        blocking methods in a thread."""
        return callable(getattr(self.backend, "agenerate", None))

    async def aopening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        if not self.native_async:
            return await super().aopening(personas, seeds)
        return await self._arun(self._opening(personas, seeds))

    async def arespond(self, requests: Sequence[UserRequest],
                       protocol: EmotionProtocol) -> list[UserTurn]:
        if not self.native_async:
            return await super().arespond(requests, protocol)
        if not requests:
            return []
        appraisals = await self._arun(self._appraise(requests))
        emotions = [protocol.apply(request.emotion, appraisal.change)
                    for request, appraisal in zip(requests, appraisals)]
        replies = await self._arun(self._reply(requests, appraisals, emotions))
        return [UserTurn(a, e, r) for a, e, r in zip(appraisals, emotions, replies)]

    # -- drivers -----------------------------------------------------------------
    def _run(self, steps: Steps[T]) -> T:
        """Run ``steps``, answering each backend call with the blocking method; a call's
        exception is thrown back into ``steps`` at the ``yield``."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                name, args, kwargs = steps.throw(error) if error is not None else steps.send(result)
            except StopIteration as stop:
                return stop.value
            try:
                result, error = getattr(self.backend, name)(*args, **kwargs), None
            except Exception as exc:  # noqa: BLE001 (handed back to the logic)
                result, error = None, exc

    async def _arun(self, steps: Steps[T]) -> T:
        """:meth:`_run` with the backend's ``a<name>`` twin awaited where it has one, else
        the blocking method in a worker thread."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                name, args, kwargs = steps.throw(error) if error is not None else steps.send(result)
            except StopIteration as stop:
                return stop.value
            native = getattr(self.backend, "a" + name, None)
            try:
                if callable(native):
                    result = await native(*args, **kwargs)
                else:
                    result = await asyncio.to_thread(getattr(self.backend, name), *args, **kwargs)
                error = None
            except Exception as exc:  # noqa: BLE001 (handed back to the logic)
                result, error = None, exc

    def close(self) -> None:
        if self.owns_backend:
            self.backend.close()
