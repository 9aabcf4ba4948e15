"""The emotion protocol: initial emotion, clamping, when a dialogue ends
(docs/environment.md#protocol).

Two presets follow their reference code: :data:`SAGE`
(arXiv 2505.02847; Tencent/digitalhuman ``SAGE/test_npc.py`` lines 88-115 and
``SAGE/simulator_response.py`` lines 150-155) and :data:`RLVER_TRAINING` (arXiv
2507.03112, its training simulator in verl's multi-turn rollout).

One env step is one agent reply that the user appraises and answers; both presets have
9 (docs/environment.md#episode-end). The final emotion, and so the Sentient score,
equals SAGE's for the same appraisals (tested against SAGE's released logs). Emotions
and changes are ints, as in both simulators' outputs.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from empathy_gym.ending import Ending

#: SAGE's goodbye rule (``test_npc.py`` line 107): the answer contains one of these.
GOODBYE_ZH: tuple[str, ...] = ("再见", "拜拜")
#: Our English equivalent (SAGE has no English personas): "goodbye", "good-bye", "bye"
#: or "bye-bye" as a word, any case. Like SAGE's substring rule it also fires on a
#: goodbye quoted inside a sentence.
GOODBYE_EN = re.compile(r"\b(?:good-?bye|bye)\b", re.IGNORECASE)


def says_goodbye(text: str, language: str | None = None) -> bool:
    """Whether a user answer says goodbye: :data:`GOODBYE_ZH` for ``language="zh"``,
    :data:`GOODBYE_EN` for ``"en"``, either for ``None``."""
    chinese = language != "en" and any(word in text for word in GOODBYE_ZH)
    english = language != "zh" and GOODBYE_EN.search(text) is not None
    return chinese or english


@dataclass(frozen=True)
class EmotionProtocol:
    """How the simulated user's emotion score moves and when a dialogue ends.

    Attributes:
        initial_emotion: emotion e_0 at reset, int in [0, 100] (SAGE 40, RLVER 30).
        min_change, max_change: bounds of one turn's change (SAGE -10, +10); ``None``
            leaves that side unclamped (RLVER training).
        success_emotion: the episode terminates with ``"success"`` when e >= this
            (SAGE 100); ``None``: never (RLVER training keeps talking at 100).
        failure_below: the episode terminates with ``"failure"`` when e < this
            (SAGE 10; RLVER's "e <= 0" is ``failure_below=1`` for integer emotions).
        max_turns: the most env steps, i.e. agent replies that the user appraises
            (SAGE 9: its 10th reply is never appraised; RLVER 9). The step that reaches
            it is truncated.
        goodbye: the episode terminates with ``"goodbye"`` when the user's answer says
            goodbye (:func:`says_goodbye`), as in SAGE and RLVER.
    """

    initial_emotion: int = 40
    min_change: int | None = -10
    max_change: int | None = 10
    success_emotion: int | None = 100
    failure_below: int = 10
    max_turns: int = 9
    goodbye: bool = True

    def __post_init__(self) -> None:
        optional = ("min_change", "max_change", "success_emotion")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "goodbye":
                if not isinstance(value, bool):
                    raise TypeError(f"goodbye must be a bool, got {value!r} ({type(value).__name__})")
                continue
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)) and not (
                value is None and field.name in optional
            ):
                raise TypeError(f"{field.name} must be an int, got {value!r} ({type(value).__name__})")
        if not 0 <= self.initial_emotion <= 100:
            raise ValueError(f"initial_emotion must be in [0, 100], got {self.initial_emotion}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.min_change is not None and self.max_change is not None and self.min_change > self.max_change:
            raise ValueError(f"min_change {self.min_change} > max_change {self.max_change}")

    def clamp_change(self, change: int) -> int:
        """The change limited to [min_change, max_change] (SAGE ``simulator_response.py``
        line 151)."""
        if self.min_change is not None:
            change = max(self.min_change, change)
        if self.max_change is not None:
            change = min(self.max_change, change)
        return int(change)

    def apply(self, emotion: int, change: int) -> int:
        """e <- clip(e + clamp(change), 0, 100). (SAGE caps at 100 and stops below 10, so
        its emotion never goes below 0; RLVER floors its reward at 0.)"""
        return int(min(100, max(0, emotion + self.clamp_change(change))))

    def termination(
        self, emotion: int, turn: int, reply: str | None = None, language: str | None = None
    ) -> tuple[bool, bool, Ending | None]:
        """``(terminated, truncated, reason)`` after agent turn ``turn`` (1-based), given
        the new emotion and the user's answer ``reply`` (in ``language``).

        In this order: success, failure, goodbye terminate; reaching ``max_turns``
        truncates (a time limit is not a terminal state of the user). Success and failure
        come first, so a dialogue is a success exactly when its final emotion reaches the
        threshold, as SAGE counts.
        """
        if self.success_emotion is not None and emotion >= self.success_emotion:
            return True, False, Ending.SUCCESS
        if emotion < self.failure_below:
            return True, False, Ending.FAILURE
        if self.goodbye and reply is not None and says_goodbye(reply, language):
            return True, False, Ending.GOODBYE
        if turn >= self.max_turns:
            return False, True, Ending.MAX_TURNS
        return False, False, None


#: SAGE evaluation (the default).
SAGE = EmotionProtocol()
#: RLVER training: start at 30, unclamped changes, no stop at 100, ends at e <= 0 or on
#: a goodbye, 9 appraised turns.
RLVER_TRAINING = EmotionProtocol(
    initial_emotion=30, min_change=None, max_change=None, success_emotion=None, failure_below=1, max_turns=9
)

PROTOCOLS: dict[str, EmotionProtocol] = {"sage": SAGE, "rlver_training": RLVER_TRAINING}


def protocol_name(protocol: EmotionProtocol) -> str | None:
    """The preset name of ``protocol`` (``"sage"``, ``"rlver_training"``) when it equals
    one, else ``None``."""
    return next((name for name, preset in PROTOCOLS.items() if preset == protocol), None)


def resolve_protocol(protocol: str | EmotionProtocol | Mapping[str, Any] | None, **overrides: Any) -> EmotionProtocol:
    """An :class:`EmotionProtocol` from a preset name, a dict of fields, or an instance,
    with keyword ``overrides`` applied (``None`` values ignored).

    Raises:
        KeyError: unknown preset name. TypeError: unknown field, or not a name, mapping or
        protocol. ValueError: bad values.
    """
    if protocol is None:
        base = SAGE
    elif isinstance(protocol, EmotionProtocol):
        base = protocol
    elif isinstance(protocol, str):
        if protocol not in PROTOCOLS:
            raise KeyError(f"unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
        base = PROTOCOLS[protocol]
    elif isinstance(protocol, Mapping):
        base = EmotionProtocol(**dict(protocol))
    else:
        raise TypeError(
            f"protocol must be a preset name {sorted(PROTOCOLS)}, a mapping of fields or an EmotionProtocol, "
            f"got {protocol!r}"
        )
    changes = {key: value for key, value in overrides.items() if value is not None}
    return dataclasses.replace(base, **changes) if changes else base


def emotion_band(emotion: int) -> str:
    """SAGE's emotion band of a score in [0, 100] (``simulator_response.py`` lines 15 and
    164-169): ``"S"`` (>= 100: thanks, goodbye), ``"A"`` (>= 70), ``"B"`` (>= 40), ``"C"``
    (>= 10), ``"F"`` (< 10: leaves)."""
    if emotion >= 100:
        return "S"
    if emotion >= 70:
        return "A"
    if emotion >= 40:
        return "B"
    if emotion >= 10:
        return "C"
    return "F"
