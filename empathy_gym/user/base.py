"""The simulated-user protocol shared by the LLM user and the rule-based user: appraise,
update the emotion, reply (SAGE, arXiv 2505.02847, section 2.2; RLVER, arXiv
2507.03112, section 3.1; docs/simulated-user.md).

Every method is batched: a list of requests in, a list of results out, in the same
order. Each request carries its own seed, so a dialogue's outcome never depends on
which other dialogues share the batch.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from empathy_gym.boundary import find_injection, without_injection
from empathy_gym.personas import Persona
from empathy_gym.user.protocol import EmotionProtocol

#: A history entry: ``("user", text)`` for the simulated user, ``("agent", text)`` for
#: the policy (only the part that reached the user: thinking is stripped).
Utterance = tuple[str, str]


class SimulatorError(RuntimeError):
    """The simulated user could not produce a valid appraisal or reply.

    Attributes:
        raw: the last raw text the model returned (``None`` when there was none).
        attempts: how many generations were tried.
    """

    def __init__(self, message: str, *, raw: str | None = None, attempts: int = 0):
        super().__init__(message if raw is None else f"{message}\n--- last raw output ---\n{raw}")
        self.raw, self.attempts = raw, attempts


@dataclass(frozen=True)
class UserRequest:
    """One dialogue's state when the agent has just spoken.

    Attributes:
        persona: who the user is.
        history: the dialogue before ``utterance``, starting with the user's opening
            line: ``(("user", opening), ("agent", a1), ("user", u1), ...)``.
        utterance: the agent's newest utterance (thinking already removed).
        emotion: the user's emotion before this turn, int in [0, 100].
        turn: 1-based index of this agent turn.
        seed: seed for any sampling this turn needs (int, >= 0).
        injection: the kinds of injection found in ``utterance``
            (:func:`empathy_gym.boundary.find_injection`; see :meth:`SimulatedUser.respond`);
            looked for when not given (``None``).
    """

    persona: Persona
    history: tuple[Utterance, ...]
    utterance: str
    emotion: int
    turn: int
    seed: int = 0
    injection: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.injection is None:
            object.__setattr__(self, "injection", find_injection(self.utterance))

    def agent_utterances(self) -> list[str]:
        """The agent's earlier utterances, oldest first (not including ``utterance``)."""
        return [text for role, text in self.history if role == "agent"]

    def last_user_message(self) -> str:
        """The user's newest message in ``history`` (``""`` where there is none)."""
        return next((text for role, text in reversed(self.history) if role == "user"), "")


@dataclass(frozen=True)
class Appraisal:
    """The user's private reaction to one agent utterance.

    Privileged: for analysis and logging, never for the policy's observation.

    Attributes:
        change: the proposed emotion change (int, before the protocol clamps it).
        thoughts: the user's inner thoughts ("" when the mode produces none).
        raw: the model's raw output for the appraisal (``None`` for the rule user).
        repairs: how many repair retries it took (0 when the first output was valid).
        features: named scores behind the change (rule user) or option log-probs
            (choice mode); empty when not applicable.
        analysis: the LLM user's analysis steps by name (free mode: ``content``,
            ``goal_fit``, ``inner_thoughts``, ``feeling``; see
            :mod:`empathy_gym.user.prompts`); empty when not applicable.
    """

    change: int
    thoughts: str = ""
    raw: str | None = None
    repairs: int = 0
    features: dict[str, float] = field(default_factory=dict)
    analysis: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``features`` and ``analysis`` copied); what
        ``dataclasses.asdict`` gives, without its deep copy of every value."""
        return {
            "change": self.change,
            "thoughts": self.thoughts,
            "raw": self.raw,
            "repairs": self.repairs,
            "features": dict(self.features),
            "analysis": dict(self.analysis),
        }


@dataclass(frozen=True)
class UserTurn:
    """The outcome of one agent turn: the appraisal, the new emotion and the reply."""

    appraisal: Appraisal
    emotion: int
    reply: str


def _injection_free(requests: Sequence[UserRequest]) -> list[tuple[int, UserRequest]]:
    """``(index, request without its injection)`` for each request that has one."""
    return [
        (index, dataclasses.replace(request, utterance=without_injection(request.utterance), injection=()))
        for index, request in enumerate(requests)
        if request.injection
    ]


def _lower_change(
    appraisals: Sequence[Appraisal], plain: Sequence[tuple[int, UserRequest]], plain_appraisals: Sequence[Appraisal]
) -> list[Appraisal]:
    """``appraisals`` with each injected request's appraisal replaced by its
    injection-free twin's where that one's change is lower (ties keep the original)."""
    kept = list(appraisals)
    for (index, _), appraisal in zip(plain, plain_appraisals):
        if appraisal.change < kept[index].change:
            kept[index] = appraisal
    return kept


#: What :func:`respond_plan` asks its driver for: ``("appraise", requests)`` -> a list
#: of :class:`Appraisal`; ``("reply", requests, appraisals, emotions)`` -> a list of str.
RespondPlan = Generator[tuple, list, "list[UserTurn]"]


def advance(plan: Generator, outcome: tuple[Any, BaseException | None] = (None, None)) -> tuple[Any, Any]:
    """Send the last call's ``(result, exception)`` into the generator ``plan`` (the
    exception is raised at its ``yield``): ``(its next call, None)``, or ``(None, value)``
    once it returns. The caller's own calls stay outside, so a ``StopIteration`` they
    raise is not taken for the plan's end."""
    result, error = outcome
    try:
        return (plan.throw(error) if error is not None else plan.send(result)), None
    except StopIteration as stop:
        return None, stop.value


def respond_plan(requests: Sequence[UserRequest], protocol: EmotionProtocol) -> RespondPlan:
    """One batched turn of the user, in the order every user follows: appraise, update the
    emotion with ``protocol``, reply. A request with ``injection`` is appraised twice, as
    it is and without its injection, and the lower change is kept: injection never raises
    the emotion. A generator, so that blocking and asyncio drivers
    (:meth:`SimulatedUser.respond`, ``LLMUser.arespond``) share this one sequence: it
    yields each call it needs (:data:`RespondPlan`) and returns the list of
    :class:`UserTurn`, one per request."""
    if not requests:
        return []
    plain = _injection_free(requests)
    appraisals = yield ("appraise", requests)
    if plain:
        appraisals = _lower_change(appraisals, plain, (yield ("appraise", [request for _, request in plain])))
    emotions = [protocol.apply(request.emotion, appraisal.change) for request, appraisal in zip(requests, appraisals)]
    replies = yield ("reply", requests, appraisals, emotions)
    return [UserTurn(a, e, r) for a, e, r in zip(appraisals, emotions, replies)]


class SimulatedUser(abc.ABC):
    """Base class of simulated users. Subclasses implement :meth:`opening`,
    :meth:`appraise` and :meth:`reply`; :meth:`respond` ties them together.

    Attributes:
        deterministic: True when the same requests and seeds always give the same
            results (the rule user; an LLM backend at temperature 0 may still vary).
    """

    deterministic: bool = False

    @abc.abstractmethod
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """The first utterance of each dialogue: the persona's ``opening_line`` when it
        has one, otherwise generated (LLM) or drawn from the scenario (rules)."""

    @abc.abstractmethod
    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        """One :class:`Appraisal` per request.

        Raises:
            SimulatorError: when a valid appraisal could not be obtained.
        """

    @abc.abstractmethod
    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        """The user's in-character answer to each request, given its appraisal and the
        new emotion (int in [0, 100])."""

    def respond(self, requests: Sequence[UserRequest], protocol: EmotionProtocol) -> list[UserTurn]:
        """Appraise, update the emotion with ``protocol``, and reply, for a batch
        (:func:`respond_plan`: an injected request's lower appraisal is kept)."""
        plan = respond_plan(requests, protocol)
        call, turns = advance(plan)
        while call is not None:
            name, *args = call
            call, turns = advance(plan, (getattr(self, name)(*args), None))
        return turns

    async def aopening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """:meth:`opening` for asyncio: same arguments, results and errors. By default
        :meth:`opening` in a worker thread; concurrent calls do not share a batch (gather
        dialogues into one with :func:`empathy_gym.env.step_many` or the vector env)."""
        return await asyncio.to_thread(self.opening, personas, seeds)

    async def arespond(self, requests: Sequence[UserRequest], protocol: EmotionProtocol) -> list[UserTurn]:
        """:meth:`respond` for asyncio: same arguments, results and errors (by default
        :meth:`respond` in a worker thread; see :meth:`aopening`)."""
        return await asyncio.to_thread(self.respond, requests, protocol)

    def close(self) -> None:  # noqa: B027  (a no-op by default, not abstract)
        """Release resources (servers, models). Safe to call twice."""
