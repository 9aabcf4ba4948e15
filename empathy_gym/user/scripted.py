"""A scripted simulated user: emotion changes and replies given in advance.

For tests and for checking your own RL code against numbers you can work out by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from empathy_gym.personas import Persona
from empathy_gym.user.base import Appraisal, SimulatedUser, UserRequest


class ScriptedUser(SimulatedUser):
    """Proposes ``changes[turn - 1]`` at each agent turn (or ``change_fn(request)``), and
    replies ``"reply <turn> (emotion <e>)"`` (or ``reply_fn(request, emotion)``).

    Args:
        changes: proposed change per turn (ints; the protocol still clamps them). The
            last value repeats once the list runs out.
        change_fn: alternatively, a function of the :class:`UserRequest`.
        opening: the opening line for personas without one.
        reply_fn: the reply as a function of the request and the new emotion (an
            echoing user, for instance).

    Raises:
        ValueError: neither or both of ``changes`` and ``change_fn``.
    """

    deterministic = True

    def __init__(
        self,
        changes: Sequence[int] | None = None,
        *,
        change_fn: Callable[[UserRequest], int] | None = None,
        opening: str = "Hi. I need to talk.",
        reply_fn: Callable[[UserRequest, int], str] | None = None,
    ):
        if (changes is None) == (change_fn is None):
            raise ValueError("give exactly one of changes= and change_fn=")
        self.changes = list(changes) if changes is not None else None
        self.change_fn = change_fn
        self.default_opening = opening
        self.reply_fn = reply_fn
        self.calls = 0  # batched appraise() calls, for tests of batching

    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        return [p.opening_line or self.default_opening for p in personas]

    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        self.calls += 1
        out = []
        for request in requests:
            if self.change_fn is not None:
                change = self.change_fn(request)
            else:
                change = self.changes[min(request.turn, len(self.changes)) - 1]
            out.append(Appraisal(change=int(change), thoughts=f"turn {request.turn}"))
        return out

    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        if self.reply_fn is not None:
            return [self.reply_fn(r, e) for r, e in zip(requests, emotions)]
        return [f"reply {r.turn} (emotion {e})" for r, e in zip(requests, emotions)]
