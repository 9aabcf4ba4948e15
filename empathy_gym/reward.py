"""How emotion scores become rewards: one :class:`Reward` that the env pays turn by turn,
the trainer completes for dialogues it cut, and the TRL, verl and verifiers adapters read.

The emotion e is an int in [0, 100]; rewards are emotion points / 100.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

REWARD_MODES = ("delta", "final")

#: Why ``advantage: reward_to_go`` is refused under a reward with no per-turn credit.
REWARD_TO_GO_FINAL = (
    "advantage 'reward_to_go' with env reward_mode 'final' and no reward_shaping has no meaning: "
    "every turn's return-to-go is then the final reward, which is advantage 'episode'; use "
    "advantage=episode (or env.kwargs.reward_mode=delta, or env.kwargs.reward_shaping > 0)"
)


@dataclass(frozen=True)
class Reward:
    """What a turn of a dialogue is paid.

    ``mode="delta"``: r_t = (e_t - e_{t-1}) / 100, in [-1, 1]; the undiscounted return
    telescopes to (e_T - e_0) / 100, RLVER's objective minus a per-persona constant.
    ``mode="final"``: 0 until the dialogue ends, then e_T / 100 (RLVER, section 3.1), plus
    ``shaping * (e_t - e_{t-1}) / 100`` on every turn: potential-based shaping with
    potential e / 100 (Ng, Harada and Russell, ICML 1999). It gives each turn credit for its
    own change; the return becomes (1 + shaping) e_T / 100 - shaping e_0 / 100, still
    increasing in e_T and shifted by a per-persona constant, so the best policy is unchanged.

    A dialogue cut before its end is scored as if it had ended where it was cut
    (:meth:`at_end`).

    Attributes:
        mode: ``"delta"`` or ``"final"``.
        shaping: the per-turn term's weight, a finite float >= 0; only with ``"final"``
            (with ``"delta"`` it would only rescale the reward).

    Raises:
        ValueError: an unknown ``mode``, a ``shaping`` that is not a finite number >= 0, or
            ``shaping > 0`` with ``mode="delta"``; each message names ``reward_mode`` or
            ``reward_shaping``, the env's keywords.
    """

    mode: Literal["delta", "final"] = "delta"
    shaping: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be 'delta' or 'final', got {self.mode!r}")
        shaping = self.shaping
        try:  # float() overflows on a huge int, gives inf for a huge long double
            value = float(shaping) if isinstance(shaping, numbers.Real) and not isinstance(shaping, bool) else None
        except OverflowError:
            value = None
        if value is None or not math.isfinite(value) or value < 0:
            raise ValueError(f"reward_shaping must be a finite number >= 0, got {shaping!r}")
        if value and self.mode == "delta":
            raise ValueError(
                f"reward_shaping={shaping} needs reward_mode 'final' (reward_mode is 'delta', the default "
                "when none is given): it adds a per-turn emotion change on top of the final reward, which "
                "'delta' already pays; set reward_mode='final' beside it"
            )
        object.__setattr__(self, "shaping", value + 0.0)  # -0.0 reads as 0.0

    @property
    def per_turn(self) -> bool:
        """Whether turns are paid before the end, so a turn's return-to-go differs from the
        dialogue's return (``advantage="reward_to_go"`` needs it)."""
        return self.mode == "delta" or self.shaping > 0

    def turn(self, previous: int, emotion: int, ended: bool) -> float:
        """The reward of one appraised turn.

        Args:
            previous, emotion: e_{t-1} and e_t, ints in [0, 100].
            ended: the dialogue ended on this turn (terminated or truncated).

        Returns:
            A float in [-1, 1] (``"delta"``) or [-shaping, 1 + shaping] (``"final"``).
        """
        change = (emotion - previous) / 100.0
        if self.mode == "delta":
            return change
        return (self.at_end(emotion) if ended else 0.0) + (self.shaping * change if self.shaping else 0.0)

    def at_end(self, emotion: int) -> float:
        """What the last turn is paid for ending the dialogue, on top of its change: e_T / 100
        under ``"final"``, 0 under ``"delta"``. ``emotion``: e_T, an int in [0, 100].

        A dialogue cut before its end (the trainer's context limit, verl's response length)
        adds it to its last turn, so that it is scored as if it had ended there."""
        return emotion / 100.0 if self.mode == "final" else 0.0

    def episode(self, emotions: Sequence[int]) -> float:
        """The return of a dialogue with emotions e_0..e_T (T >= 1 turns), scored as ended:
        the sum of :meth:`turn` (no format penalties). Raises ValueError under 2 emotions."""
        if len(emotions) < 2:
            raise ValueError(f"a dialogue's return needs e_0 and at least one turn, got emotions {list(emotions)}")
        last = len(emotions) - 1
        return sum(self.turn(emotions[t - 1], emotions[t], t == last) for t in range(1, last + 1))

    def check_advantage(self, advantage: str) -> None:
        """Refuse ``advantage="reward_to_go"`` without per-turn credit (:attr:`per_turn`):
        every turn's return-to-go would be the final reward, ``advantage="episode"``.

        Raises:
            ValueError: that combination (:data:`REWARD_TO_GO_FINAL`).
        """
        if advantage == "reward_to_go" and not self.per_turn:
            raise ValueError(REWARD_TO_GO_FINAL)


#: RLVER's reward (section 3.1): e_T / 100 at the end of the dialogue, nothing before.
RLVER_REWARD = Reward("final")
