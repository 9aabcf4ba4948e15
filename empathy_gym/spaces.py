"""A text space that accepts real sentences.

Gymnasium's :class:`gymnasium.spaces.Text` accepts only its charset's characters, so
sentences fail ``contains`` and ``check_env``. ``AsyncVectorEnv``'s shared memory, which
stores text as charset indices, is refused for :class:`AnyText` with a message saying
what to use instead.
"""

from __future__ import annotations

from typing import Any

from gymnasium.spaces import Text
from gymnasium.vector.utils.shared_memory import create_shared_memory


class AnyText(Text):
    """Any Python ``str`` of ``min_length`` to ``max_length`` characters (Unicode code
    points, so one Chinese character counts as one); samples, like its parent, from the
    charset.

    Example:
        >>> space = AnyText(max_length=100, min_length=0)
        >>> space.contains("I hear you. That sounds exhausting!")
        True
        >>> space.contains(b"bytes")
        False
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, AnyText) and self.min_length == other.min_length and self.max_length == other.max_length
        )


@create_shared_memory.register(AnyText)
def _refuse_shared_memory(space: AnyText, n: int = 1, ctx: Any = None) -> Any:
    raise TypeError(
        "AnyText observations (real sentences) cannot go through AsyncVectorEnv's shared memory, "
        "which encodes text as charset indices. Use gym.make_vec(id, num_envs=N) with the default "
        "vectorization_mode (one process, the N user turns batched into one call: "
        "empathy_gym.vector.EmpathyDialogueVectorEnv), or, for one process per env, "
        "vectorization_mode='async' with vector_kwargs={'shared_memory': False}."
    )
