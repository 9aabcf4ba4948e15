"""One line of a JSON Lines file as a record, or an error that names the file and line."""

from __future__ import annotations

import json
import os
from typing import Any


def lines(text: str) -> list[str]:
    """The lines of a JSON Lines text, blank ones included (so numbering holds): split on
    ``"\\n"`` only, not ``str.splitlines``, which also splits on U+2028, ``\\x85`` and the
    like that ``json.dumps(ensure_ascii=False)`` leaves raw inside strings."""
    return text.split("\n")


def json_object(text: str, path: str | os.PathLike, line: int, error: type[Exception]) -> dict[str, Any]:
    """``text`` (line ``line`` of ``path``) parsed as a JSON object.

    Raises:
        error: the text is not valid JSON (with the parser's message and column), or not
            an object; the message starts with ``path:line``.
    """
    try:
        record = json.loads(text.rstrip("\r\n"))  # a column past the newline would read "1"
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{line}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise error(f"{path}:{line}: expected a JSON object")
    return record
