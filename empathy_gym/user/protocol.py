"""The emotion protocol: initial emotion, clamping, thresholds, turn limit.

Numbers from SAGE (arXiv 2505.02847, section 2.2: initial emotion 40, change clamped
to [-10, 10], success at 100, failure below 10, at most 10 turns) and from RLVER's
training code (arXiv 2507.03112, section 3.1 and Tencent/digitalhuman: initial 30,
change not clamped, ends at e <= 0 or after 8 turns). Emotions and changes are
integers, as in both papers' simulator outputs.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Literal, Mapping

TerminationReason = Literal["success", "failure", "max_turns"]


@dataclass(frozen=True)
class EmotionProtocol:
    """How the simulated user's emotion score moves and when a dialogue ends.

    Attributes:
        initial_emotion: emotion e_0 at reset, int in [0, 100] (SAGE 40).
        min_change, max_change: bounds of one turn's change (SAGE -10, +10); ``None``
            leaves that side unclamped (RLVER training).
        success_emotion: the episode terminates with ``"success"`` when e >= this (100).
        failure_below: the episode terminates with ``"failure"`` when e < this
            (SAGE 10; RLVER's "e <= 0" is ``failure_below=1`` for integer emotions).
        max_turns: the episode is truncated after this many agent turns (SAGE 10).
    """

    initial_emotion: int = 40
    min_change: int | None = -10
    max_change: int | None = 10
    success_emotion: int = 100
    failure_below: int = 10
    max_turns: int = 10

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)) and not (
                    value is None and field.name in ("min_change", "max_change")):
                raise TypeError(f"{field.name} must be an int, got {value!r} ({type(value).__name__})")
        if not 0 <= self.initial_emotion <= 100:
            raise ValueError(f"initial_emotion must be in [0, 100], got {self.initial_emotion}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if (self.min_change is not None and self.max_change is not None
                and self.min_change > self.max_change):
            raise ValueError(f"min_change {self.min_change} > max_change {self.max_change}")

    def clamp_change(self, change: int) -> int:
        """The change limited to [min_change, max_change] (SAGE section 2.2)."""
        if self.min_change is not None:
            change = max(self.min_change, change)
        if self.max_change is not None:
            change = min(self.max_change, change)
        return int(change)

    def apply(self, emotion: int, change: int) -> int:
        """e <- clip(e + clamp(change), 0, 100)."""
        return int(min(100, max(0, emotion + self.clamp_change(change))))

    def termination(self, emotion: int, turn: int) -> tuple[bool, bool, TerminationReason | None]:
        """``(terminated, truncated, reason)`` after agent turn ``turn`` (1-based).

        Success and failure terminate; reaching ``max_turns`` truncates (Gymnasium's
        distinction: a time limit is not a terminal state of the user).
        """
        if emotion >= self.success_emotion:
            return True, False, "success"
        if emotion < self.failure_below:
            return True, False, "failure"
        if turn >= self.max_turns:
            return False, True, "max_turns"
        return False, False, None


#: SAGE evaluation (the default).
SAGE = EmotionProtocol()
#: RLVER training: start at 30, unclamped changes, ends at e <= 0, 8 turns.
RLVER_TRAINING = EmotionProtocol(initial_emotion=30, min_change=None, max_change=None,
                                 success_emotion=100, failure_below=1, max_turns=8)

PROTOCOLS: dict[str, EmotionProtocol] = {"sage": SAGE, "rlver_training": RLVER_TRAINING}


def resolve_protocol(protocol: str | EmotionProtocol | Mapping[str, Any] | None,
                     **overrides: Any) -> EmotionProtocol:
    """An :class:`EmotionProtocol` from a preset name, a dict of fields, or an instance,
    with keyword ``overrides`` applied (``None`` values ignored).

    Raises:
        KeyError: unknown preset name. TypeError: unknown field. ValueError: bad values.
    """
    if protocol is None:
        base = SAGE
    elif isinstance(protocol, EmotionProtocol):
        base = protocol
    elif isinstance(protocol, str):
        if protocol not in PROTOCOLS:
            raise KeyError(f"unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
        base = PROTOCOLS[protocol]
    else:
        base = EmotionProtocol(**dict(protocol))
    changes = {key: value for key, value in overrides.items() if value is not None}
    return dataclasses.replace(base, **changes) if changes else base


def emotion_band(emotion: int) -> str:
    """SAGE's emotion band of a score in [0, 100]: ``"S"`` (>= 100: thanks, goodbye),
    ``"A"`` (>= 70), ``"B"`` (>= 40), ``"C"`` (>= 10), ``"F"`` (< 10: leaves)."""
    if emotion >= 100:
        return "S"
    if emotion >= 70:
        return "A"
    if emotion >= 40:
        return "B"
    if emotion >= 10:
        return "C"
    return "F"
