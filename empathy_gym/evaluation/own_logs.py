"""Our own finished dialogues (eval's ``transcripts.jsonl``, training's ``episodes.jsonl``)
as :class:`~empathy_gym.evaluation.sage_logs.LoggedDialogue`, so that
:func:`~empathy_gym.evaluation.replay.replay_logs` can re-judge them with another user.

A record names its persona by id only; the persona comes from a bank: the one given, else
the one the run's ``run.json`` names, else ``personas.jsonl`` beside the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from empathy_gym.evaluation.jsonl import json_object
from empathy_gym.evaluation.sage_logs import LoggedDialogue, LoggedTurn, SageLogError
from empathy_gym.personas import Persona, load_personas
from empathy_gym.think import OPEN as OPEN_THINK
from empathy_gym.think import split_think

#: The file names our runs write dialogues to (eval, training).
OWN_LOG_NAMES = ("transcripts.jsonl", "episodes.jsonl")


def is_own_log(path: str | os.PathLike) -> bool:
    """True for a file named as our runs name theirs (:data:`OWN_LOG_NAMES`, empty or not: an
    eval that has finished nothing yet) or whose first record has ``persona_id`` and
    ``emotions``; False for a SAGE log or another empty file."""
    if Path(path).name in OWN_LOG_NAMES:
        return True
    with open(path, encoding="utf-8") as handle:
        for text in handle:
            if text.strip():
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    return False
                return isinstance(record, dict) and "persona_id" in record and "emotions" in record
    return False


def run_record(path: str | os.PathLike) -> dict[str, Any]:
    """The ``run.json`` that ``eval`` wrote beside ``path`` (``{}`` where there is none)."""
    run = Path(path).parent / "run.json"
    return json.loads(run.read_text(encoding="utf-8")) if run.exists() else {}


def read_own_log(path: str | os.PathLike, personas: Any = None, limit: int | None = None) -> list[LoggedDialogue]:
    """Every dialogue of one of our ``transcripts.jsonl`` or ``episodes.jsonl`` files.

    Args:
        personas: the bank the dialogues were played with (anything
            :func:`~empathy_gym.personas.load_personas` takes); ``None``: the one that
            ``run.json`` beside the file names, else ``personas.jsonl`` beside it.
        limit: read at most this many dialogues.

    Returns:
        One :class:`~empathy_gym.evaluation.sage_logs.LoggedDialogue` per line; its id is
        ``"<persona id>@<line>"`` (a persona may have played many dialogues).

    Raises:
        SageLogError: a line that is not JSON, lacks a field, or names a persona that is
            not in the bank (file, line and field named); no bank given and none
            beside the file.
    """
    if personas is None:
        named, beside = run_record(path).get("personas"), Path(path).parent / "personas.jsonl"
        if isinstance(named, str):
            personas = named
        elif beside.exists():
            personas = beside
        else:
            raise SageLogError(
                f"{path}: which personas played these dialogues? no run.json or personas.jsonl beside it names "
                f"them; pass the bank the run used (--personas en, rlver, a JSONL path, ...)"
            )
    bank = {persona.id: persona for persona in load_personas(personas)}
    dialogues = []
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if limit is not None and len(dialogues) >= limit:
                break
            if text.strip():
                record = json_object(text, path, number, SageLogError)
                dialogues.append(own_dialogue(record, bank, path=str(path), line=number))
    return dialogues


def own_dialogue(
    record: Mapping[str, Any], bank: Mapping[str, Persona], *, path: str = "<record>", line: int = 1
) -> LoggedDialogue:
    """One of our dialogue records as a :class:`~empathy_gym.evaluation.sage_logs.LoggedDialogue`.

    The agent's replies are the ``steps``' utterances (``transcripts.jsonl``: what reached
    the user) or the chat's assistant messages with any thinking removed
    (``episodes.jsonl``); the proposed changes are the steps' ``change`` (unknown for
    training episodes); the user's replies are the chat's user messages after the opening.

    Raises:
        SageLogError: a missing field or an unknown persona (file, line and field named).
    """
    where = f"{path}:{line}"
    for name in ("persona_id", "emotions", "messages"):
        if name not in record:
            raise SageLogError(f"{where}: field {name!r}: missing")
    persona = bank.get(str(record["persona_id"]))
    if persona is None:
        raise SageLogError(
            f"{where}: field 'persona_id': {record['persona_id']!r} is not in the persona bank; "
            f"pass the bank the run used (--personas)"
        )
    users = [str(m["content"]) for m in record["messages"] if m.get("role") == "user"]
    steps = record.get("steps")
    if steps is not None:
        replies, proposed = [str(s["utterance"]) for s in steps], [s.get("change") for s in steps]
    else:
        replies = [_reply(str(m["content"])) for m in record["messages"] if m.get("role") == "assistant"]
        proposed = [None] * len(replies)
    emotions = record["emotions"]
    if not isinstance(emotions, list) or not emotions or not all(isinstance(e, int) for e in emotions):
        raise SageLogError(f"{where}: field 'emotions': expected a non-empty list of ints (e_0 first)")
    dialogue_id = f"{persona.id}@{line}"
    turns, history = [], [("user", users[0] if users else "")]
    for index, utterance in enumerate(replies[: len(emotions) - 1], start=1):
        reply = users[index] if index < len(users) else None
        turns.append(
            LoggedTurn(
                dialogue_id=dialogue_id,
                turn=index,
                history=tuple(history),
                utterance=utterance,
                emotion_before=emotions[index - 1],
                emotion_after=emotions[index],
                proposed_change=proposed[index - 1],
                appraisal=None,
                reply=reply,
            )
        )
        history += [("agent", utterance)] + ([("user", reply)] if reply is not None else [])
    return LoggedDialogue(
        path=path,
        line=line,
        persona=persona,
        final_emotion=emotions[-1],
        emotions=tuple(emotions),
        turns=tuple(turns),
        messages=tuple(record["messages"]),
        dialogue_id=dialogue_id,
    )


def _reply(content: str) -> str:
    """What reached the user of an assistant message (its thinking removed)."""
    return split_think(content).reply if OPEN_THINK in content else content


def own_log_names(path: str | os.PathLike) -> tuple[str, str]:
    """``(user, run)`` for one of our files: the user that ``run.json`` beside it names (an
    eval run), else the training user of the newest checkpoint beside it (``env.kwargs.user``
    of its config; ``"rule"``, the env's default, where unset), else ``"played"``; and the run
    folder's name."""
    path = Path(path)
    user = run_record(path).get("user") or _training_user(path.parent)
    return (str(user) if user else "played", path.parent.name or path.stem)


def _training_user(folder: Path) -> str | None:
    states = sorted(folder.glob("checkpoints/step-*/state.json"))
    if not states:
        return None
    from empathy_gym.user.specs import as_user_spec

    config = json.loads(states[-1].read_text(encoding="utf-8")).get("config") or {}
    return str(as_user_spec(((config.get("env") or {}).get("kwargs") or {}).get("user") or "rule"))
