"""Think-then-say: split a policy output into private thinking and the reply.

RLVER (arXiv 2507.03112, section 3.3) has the policy write ``<think>...</think>``
before its reply; only the text after ``</think>`` reaches the user, while the
thinking tokens are still trained on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

OPEN, CLOSE = "<think>", "</think>"
FormatError = Literal["missing_think", "unclosed_think"]

_BLOCK = re.compile(re.escape(OPEN) + r".*?" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ThinkSplit:
    """A policy output split into its parts.

    Attributes:
        thinking: the text inside the leading ``<think>`` block ("" when none).
        reply: what reaches the user: the text after the block, with any further
            ``<think>...</think>`` blocks and stray tags removed, stripped.
        error: ``"missing_think"`` (no leading block), ``"unclosed_think"`` (``<think>``
            without ``</think>``: nothing reaches the user) or ``None``.
    """

    thinking: str
    reply: str
    error: FormatError | None


def _clean(text: str) -> str:
    text = _BLOCK.sub("", text)
    if OPEN in text:  # an unclosed block: its text is thinking and never reaches the user
        text = text[: text.index(OPEN)]
    return text.replace(CLOSE, "").strip()


def split_think(text: str) -> ThinkSplit:
    """Split ``text`` into thinking and reply.

    Examples:
        >>> split_think("<think>she is hurt</think> That sounds painful.")
        ThinkSplit(thinking='she is hurt', reply='That sounds painful.', error=None)
        >>> split_think("<think>she is hurt").error
        'unclosed_think'
        >>> split_think("That sounds painful.")
        ThinkSplit(thinking='', reply='That sounds painful.', error='missing_think')
    """
    stripped = text.lstrip()
    if not stripped.startswith(OPEN):
        return ThinkSplit("", _clean(text), "missing_think")
    body = stripped[len(OPEN) :]
    end = body.find(CLOSE)
    if end < 0:
        return ThinkSplit(body.strip(), "", "unclosed_think")
    return ThinkSplit(body[:end].strip(), _clean(body[end + len(CLOSE) :]), None)
