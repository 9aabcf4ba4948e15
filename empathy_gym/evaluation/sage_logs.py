"""Reading SAGE's released dialogue logs, turn by turn.

SAGE (arXiv 2505.02847; code: Tencent/digitalhuman, folder ``SAGE/``, MIT) publishes
its benchmark runs as ``<simulator>_based_simulator/<model>_result.jsonl``: one
dialogue per line with ``id, emo_point`` (final emotion), ``emo_state``, ``player``,
``scene``, ``character``, ``topic``, ``task`` and ``history``. ``history`` (a list, or
a JSON string, or a Python literal of one) starts with the user's opening
(``emotion-point`` 40), then alternates the tested model (``assistant``) and the
simulated user; each later user message carries ``emotion-point`` (after appraising
the assistant message before it), ``planning`` (the appraisal: ``content``,
``TargetCompletion``, ``activity``, ``analyse``, ``change``) and ``thinking`` (the
reply planning).

This module turns each agent reply of a log into a :class:`LoggedTurn`: the history and
emotion before it, and what SAGE's simulator made of it.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from empathy_gym.evaluation.jsonl import json_object
from empathy_gym.personas import Persona, PersonaError, persona_from_rlver


class SageLogError(ValueError):
    """A SAGE log line could not be read; the message names the file, the line and the field."""


@dataclass(frozen=True)
class LoggedTurn:
    """One agent reply of a logged dialogue and SAGE's appraisal of it.

    Attributes:
        dialogue_id: the profile id of the dialogue.
        turn: 1-based index of the agent reply in the dialogue.
        history: what came before the reply, as the env keeps it:
            ``(("user", opening), ("agent", a1), ("user", u1), ...)``.
        utterance: the agent's reply (``assistant`` content, as logged).
        emotion_before: the user's emotion before the reply, int.
        emotion_after: the emotion after SAGE appraised it, int; ``None`` when the reply
            was never appraised (the last reply of a dialogue that ran out of turns).
        proposed_change: the appraisal's ``change`` field as logged (int, before any
            cap at 100); ``None`` when unappraised or missing.
        appraisal: the logged ``planning`` dict (``None`` when unappraised).
        reply: the user's answer to this reply (``None`` when there was none).
    """

    dialogue_id: str
    turn: int
    history: tuple[tuple[str, str], ...]
    utterance: str
    emotion_before: int
    emotion_after: int | None
    proposed_change: int | None
    appraisal: dict[str, Any] | None
    reply: str | None

    @property
    def scored(self) -> bool:
        """True when SAGE appraised this reply."""
        return self.emotion_after is not None

    @property
    def change(self) -> int | None:
        """The applied change, ``emotion_after - emotion_before`` (``None`` when unscored)."""
        return None if self.emotion_after is None else self.emotion_after - self.emotion_before


@dataclass(frozen=True)
class LoggedDialogue:
    """One line of a SAGE result log.

    Attributes:
        path: the log file. line: its 1-based line.
        persona: the profile as a :class:`~empathy_gym.personas.Persona` (its opening
            line is the logged first user message).
        final_emotion: ``emo_point``, the dialogue's final emotion (int).
        emotions: the emotion after each user message, starting with the opening's.
        turns: one :class:`LoggedTurn` per agent reply, in order.
        messages: the logged history as dicts, unchanged.
        dialogue_id: the dialogue's id where a persona plays several dialogues in one log
            (our own logs); ``None``: the persona's id.
    """

    path: str
    line: int
    persona: Persona
    final_emotion: int
    emotions: tuple[int, ...]
    turns: tuple[LoggedTurn, ...]
    messages: tuple[dict[str, Any], ...] = field(repr=False)
    dialogue_id: str | None = None

    @property
    def id(self) -> str:
        return self.dialogue_id or self.persona.id


def log_names(path: str | os.PathLike) -> tuple[str, str]:
    """``(simulator, model)`` from a log path ``.../<simulator>_based_simulator/<model>_result.jsonl``;
    the folder or file name itself where it does not follow that pattern."""
    path = Path(path)
    return re.sub(r"_based_simulator$", "", path.parent.name), re.sub(r"_result$", "", path.stem)


def _history(value: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError) as error:
                raise SageLogError(f"{where}: field 'history': neither JSON nor a Python literal ({error})") from None
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise SageLogError(f"{where}: field 'history': expected a non-empty list of messages")
    return value


def _int(value: Any, where: str, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SageLogError(f"{where}: field {name!r}: expected a number, got {value!r}") from None
    if number != int(number):
        raise SageLogError(f"{where}: field {name!r}: expected an integer, got {value!r}")
    return int(number)


def _proposed_change(planning: Any) -> int | None:
    if not isinstance(planning, dict) or planning.get("change") is None:
        return None
    match = re.search(r"[-+]?\d+", str(planning["change"]))
    return int(match.group()) if match else None


def parse_dialogue(record: dict[str, Any], *, path: str = "<record>", line: int = 1) -> LoggedDialogue:
    """One log record as a :class:`LoggedDialogue`.

    Raises:
        SageLogError: a missing or malformed field, naming ``path``, ``line`` and the field.
    """
    where = f"{path}:{line}"
    for name in ("id", "emo_point", "player", "scene", "task", "history"):
        if name not in record:
            raise SageLogError(f"{where}: field {name!r}: missing")
    messages = _history(record["history"], where)
    if messages[0].get("role") != "user":
        raise SageLogError(f"{where}: field 'history/0/role': the dialogue must open with the user")
    profile = {
        "id": str(record["id"]),
        "player": record["player"],
        "scene": record["scene"],
        "main_cha": record.get("character") or record.get("main_cha") or "",
        "cha_group": list(record.get("cha_group") or []),
        "task": record["task"],
        "first_talk": str(messages[0].get("content", "")),
    }
    try:
        persona = persona_from_rlver(profile, path=path, line=line)
    except PersonaError as error:
        raise SageLogError(str(error)) from None
    turns, emotions = _logged_turns(messages, persona.id, where)
    return LoggedDialogue(
        path=path,
        line=line,
        persona=persona,
        final_emotion=_int(record["emo_point"], where, "emo_point"),
        emotions=tuple(emotions),
        turns=tuple(turns),
        messages=tuple(messages),
    )


def _logged_turns(messages: list[dict[str, Any]], dialogue_id: str, where: str) -> tuple[list[LoggedTurn], list[int]]:
    """The agent turns of a logged history and the emotion after each user message."""
    emotion = _int(messages[0].get("emotion-point", 40), where, "history/0/emotion-point")
    emotions = [emotion]
    history: list[tuple[str, str]] = [("user", str(messages[0].get("content", "")))]
    turns: list[LoggedTurn] = []
    for index in range(1, len(messages), 2):
        utterance = str(_message(messages, index, "assistant", where).get("content", ""))
        after = reply = planning = None
        if index + 1 < len(messages):
            answer = _message(messages, index + 1, "user", where)
            after = _int(answer.get("emotion-point"), where, f"history/{index + 1}/emotion-point")
            reply, planning = str(answer.get("content", "")), answer.get("planning")
        turns.append(
            LoggedTurn(
                dialogue_id=dialogue_id,
                turn=len(turns) + 1,
                history=tuple(history),
                utterance=utterance,
                emotion_before=emotion,
                emotion_after=after,
                proposed_change=_proposed_change(planning),
                appraisal=planning if isinstance(planning, dict) else None,
                reply=reply,
            )
        )
        history.append(("agent", utterance))
        if reply is not None:
            history.append(("user", reply))
            emotion = after
            emotions.append(after)
    return turns, emotions


def _message(messages: list[dict[str, Any]], index: int, role: str, where: str) -> dict[str, Any]:
    message = messages[index]
    if message.get("role") != role:
        raise SageLogError(f"{where}: field 'history/{index}/role': expected {role!r}, got {message.get('role')!r}")
    return message


def read_sage_log(path: str | os.PathLike, limit: int | None = None) -> list[LoggedDialogue]:
    """Every dialogue of one SAGE result log (JSON Lines), in file order.

    Args:
        path: a ``*_result.jsonl`` file.
        limit: read at most this many dialogues (``None``: all).

    Raises:
        SageLogError: a line that is not JSON or lacks a field (file, line and field named).
        FileNotFoundError: ``path`` does not exist.
    """
    dialogues = []
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if limit is not None and len(dialogues) >= limit:
                break
            if not text.strip():
                continue
            record = json_object(text, path, number, SageLogError)
            dialogues.append(parse_dialogue(record, path=str(path), line=number))
    return dialogues


def leaderboard(dialogues: Sequence[LoggedDialogue]) -> dict[str, float]:
    """SAGE's leaderboard numbers of a log (SAGE.md, "Score"): ``score`` the mean final
    emotion, ``success`` the count ending at >= 100, ``failure`` the count ending below
    10, ``dialogues`` the count.

    Raises:
        ValueError: no dialogues.
    """
    if not dialogues:
        raise ValueError("no dialogues")
    finals = [d.final_emotion for d in dialogues]
    return {
        "score": sum(finals) / len(finals),
        "success": sum(e >= 100 for e in finals),
        "failure": sum(e < 10 for e in finals),
        "dialogues": len(finals),
    }
