"""The rows ``empathy-gym distill`` learns from (:mod:`empathy_gym.user.distill`): every
appraised turn of the logs, and bad and fluent replies in its context, with what the base
model made of them (:meth:`empathy_gym.user.appraiser.Appraiser.features`) and the named
features; saved in shards (``.npz``) so that a rerun skips what is done.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.personas import Persona, builtin_bank, split_personas
from empathy_gym.user.appraiser import Appraiser
from empathy_gym.user.base import UserRequest
from empathy_gym.user.probes import BAD_KINDS, bad_requests

#: Row kinds besides :data:`~empathy_gym.user.probes.BAD_KINDS`: a logged reply with the
#: simulator's change, and a fluent reply without a label (the English bank's contexts).
LOGGED, FLUENT = "logged", "fluent"
#: The kinds drawn for logged turns: the first twelve (the later ones, added after a policy
#: found them, go into every opening and English context instead, so that feature shards
#: made before them stay what this code makes).
LOGGED_BAD_KINDS: tuple[str, ...] = BAD_KINDS[:12]


@dataclass(frozen=True)
class Context:
    """One appraised turn to extract: the request and, for logged turns, the label.

    Attributes:
        request: the persona, history, reply, emotion and turn.
        change: the simulator's applied change (``None``: no label).
        log, model, simulator: where the turn comes from (``model``: the tested model).
        bad_kinds: bad replies to extract in the same context.
    """

    request: UserRequest
    change: int | None
    log: str
    model: str
    simulator: str
    bad_kinds: tuple[str, ...] = ()
    kind: str = LOGGED


@dataclass
class Rows:
    """Extracted rows (logged turns, fluent and bad replies), in extraction order.

    Attributes:
        states: (n, D) float32, the language model's features.
        named: n dicts of named features.
        change: (n,) float64, the logged change (NaN without a label).
        kind: (n,) str, :data:`LOGGED`, :data:`FLUENT` or a bad kind.
        context: (n,) int64, rows with one context share it (a logged or fluent reply
            and the bad replies in its context).
        log, model, simulator, dialogue: (n,) str. turn: (n,) int64.
        reply, last_user: (n,) str, the reply and the user message it answers.
        rule_change: (n,) float64, the shipped rule user's change (for the report).
    """

    states: np.ndarray
    named: list[dict[str, float]]
    change: np.ndarray
    kind: np.ndarray
    context: np.ndarray
    log: np.ndarray
    model: np.ndarray
    simulator: np.ndarray
    dialogue: np.ndarray
    turn: np.ndarray
    reply: np.ndarray
    last_user: np.ndarray
    rule_change: np.ndarray

    @staticmethod
    def concatenate(parts: Sequence[Rows]) -> Rows:
        """One :class:`Rows` of ``parts`` in order, context ids made unique."""
        offset, contexts = 0, []
        for part in parts:
            contexts.append(part.context + offset)
            offset += int(part.context.max()) + 1 if len(part.context) else 0
        names = [f.name for f in dataclasses.fields(Rows) if f.name not in ("named", "context")]
        joined = {name: np.concatenate([getattr(part, name) for part in parts]) for name in names}
        return Rows(named=[n for part in parts for n in part.named], context=np.concatenate(contexts), **joined)


def logged_contexts(logs: Sequence[Any], *, bad_turns: int, seed: int) -> list[list[Context]]:
    """Each logged dialogue's appraised turns as :class:`Context` lists (one list a
    dialogue), ``bad_turns`` of them (drawn with a generator seeded by ``seed`` and the
    dialogue) carrying four bad kinds each.

    Args:
        logs: :class:`~empathy_gym.evaluation.replay.LogFile` objects.
    """
    from empathy_gym.evaluation.replay import turn_request

    dialogues = []
    for log in logs:
        for dialogue in log.dialogues:
            scored = [turn for turn in dialogue.turns if turn.scored]
            rng = np.random.default_rng([seed, _stable(log.name), _stable(dialogue.id)])
            chosen = set(rng.choice(len(scored), size=min(bad_turns, len(scored)), replace=False).tolist())
            dialogues.append(
                [
                    Context(
                        turn_request(turn, dialogue.persona),
                        turn.change,
                        log.name,
                        log.model,
                        log.simulator,
                        tuple(rng.choice(LOGGED_BAD_KINDS, size=4, replace=False).tolist()) if index in chosen else (),
                    )
                    for index, turn in enumerate(scored)
                ]
            )
    return [d for d in dialogues if d]


def opening_contexts(logs: Sequence[Any]) -> list[list[Context]]:
    """Each profile's first logged reply (the first log that holds it), as a :data:`FLUENT`
    row (its label is in the logged rows already) with every bad kind in its context."""
    from empathy_gym.evaluation.replay import turn_request

    seen, dialogues = set(), []
    for log in logs:
        for dialogue in log.dialogues:
            first = next((turn for turn in dialogue.turns if turn.scored), None)
            if first is None or dialogue.persona.id in seen:
                continue
            seen.add(dialogue.persona.id)
            request = turn_request(first, dialogue.persona)
            dialogues.append([Context(request, None, log.name, log.model, log.simulator, BAD_KINDS, FLUENT)])
    return dialogues


def bank_contexts(personas: Sequence[Persona], *, turns: int, seed: int) -> list[list[Context]]:
    """Dialogues of ``turns`` turns with the rule user and the scripted listener
    (:class:`~empathy_gym.evaluation.baselines.ListenerAgent`): at each turn the
    listener's reply is a :data:`FLUENT` row, with every bad kind in its context."""
    from empathy_gym.evaluation.baselines import ListenerAgent
    from empathy_gym.user.protocol import resolve_protocol
    from empathy_gym.user.rule_user import RuleUser

    user, agent, protocol = RuleUser(), ListenerAgent(), resolve_protocol("sage")
    dialogues = []
    for persona in personas:
        history = [("user", user.opening([persona], [seed])[0])]
        emotion, contexts = 40, []
        for turn in range(1, turns + 1):
            messages = [{"role": "user" if role == "user" else "assistant", "content": text} for role, text in history]
            request = UserRequest(persona, tuple(history), agent(messages), emotion, turn, seed=seed)
            contexts.append(Context(request, None, "bank", persona.language, "rule", BAD_KINDS, FLUENT))
            [answer] = user.respond([request], protocol)
            history += [("agent", request.utterance), ("user", answer.reply)]
            emotion = answer.emotion
        dialogues.append(contexts)
    return dialogues


def _stable(text: str) -> int:
    """A 32-bit hash of ``text`` that does not change between processes."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


@dataclass(frozen=True)
class Planned:
    """One row to extract: its context, kind (:data:`LOGGED`, :data:`FLUENT` or a bad
    kind), request (the bad reply in place of the context's) and context id."""

    context: Context
    kind: str
    request: UserRequest
    context_id: int


def plan_rows(dialogues: Sequence[Sequence[Context]], *, seed: int) -> list[list[Planned]]:
    """The rows of ``dialogues``, one batch per turn across them: each turn's reply, then
    its bad replies (drawn with ``numpy.random.default_rng(seed)``, in this order)."""
    rng = np.random.default_rng(seed)
    batches, context_id = [], 0
    for turn in range(max(len(d) for d in dialogues)):
        batch = []
        for dialogue in dialogues:
            if turn < len(dialogue):
                context = dialogue[turn]
                batch.append(Planned(context, context.kind, context.request, context_id))
                batch += [
                    Planned(context, kind, bad, context_id)
                    for kind, bad in bad_requests(context.request, context.bad_kinds, rng)
                ]
                context_id += 1
        batches.append(batch)
    return batches


def extract(
    appraiser: Appraiser,
    dialogues: Sequence[Sequence[Context]],
    *,
    seed: int,
    on_turns: Callable[[int], None] | None = None,
) -> Rows:
    """The rows of ``dialogues`` (:func:`plan_rows`), turn by turn across them (each
    dialogue's prefix cached; bad replies share their turn's prefix and are not cached)."""
    planned: list[Planned] = []
    states = []
    for batch in plan_rows(dialogues, seed=seed):
        keep = [row.kind in (LOGGED, FLUENT) for row in batch]
        states.append(appraiser.features([row.request for row in batch], keep=keep))
        planned += batch
        if on_turns is not None:
            on_turns(sum(keep))
    appraiser.cache.clear()
    return rows_of(planned, np.concatenate(states), appraiser.named_features)


def rows_of(planned: Sequence[Planned], states: np.ndarray, named: Callable[[UserRequest], dict[str, float]]) -> Rows:
    """:class:`Rows` of planned rows and their (n, D) states; ``named`` gives a request's
    named features. The shipped rule user's change goes in :attr:`Rows.rule_change`."""
    from empathy_gym.user.rule_user import RuleUser

    requests = [row.request for row in planned]
    rule = RuleUser().appraise(requests)
    return Rows(
        states=np.asarray(states, dtype=np.float32).reshape(len(planned), -1),
        named=[named(request) for request in requests],
        change=np.asarray(
            [
                row.context.change if row.kind == LOGGED and row.context.change is not None else np.nan
                for row in planned
            ],
            dtype=float,
        ),
        kind=np.asarray([row.kind for row in planned]),
        context=np.asarray([row.context_id for row in planned], dtype=np.int64),
        log=np.asarray([row.context.log for row in planned]),
        model=np.asarray([row.context.model for row in planned]),
        simulator=np.asarray([row.context.simulator for row in planned]),
        dialogue=np.asarray([f"{row.context.log}#{row.request.persona.id}" for row in planned]),
        turn=np.asarray([row.request.turn for row in planned], dtype=np.int64),
        reply=np.asarray([row.request.utterance for row in planned]),
        last_user=np.asarray([row.request.last_user_message() for row in planned]),
        rule_change=np.asarray([appraisal.change for appraisal in rule], dtype=float),
    )


def save_rows(path: Path, rows: Rows) -> None:
    """Write ``rows`` to ``path`` (``.npz``) atomically."""
    staging = path.with_name(path.name + ".partial.npz")
    arrays = {f.name: getattr(rows, f.name) for f in dataclasses.fields(Rows) if f.name != "named"}
    arrays["states"] = rows.states.astype(np.float16)
    arrays["named"] = np.asarray([json.dumps(n, sort_keys=True) for n in rows.named])
    np.savez(staging, **arrays)
    os.replace(staging, path)


def load_rows(path: Path) -> Rows:
    """The rows :func:`save_rows` wrote."""
    with np.load(path, allow_pickle=False) as data:
        values = {name: data[name] for name in data.files}
    values["states"] = values["states"].astype(np.float32)
    values["named"] = [json.loads(text) for text in values["named"]]
    return Rows(**values)


def english_bank_split(seed: int = 0) -> tuple[tuple[Persona, ...], tuple[Persona, ...]]:
    """The English bank split as the quick start splits it (training, held-out): the
    appraiser's English contexts come from the training personas only."""
    return split_personas(builtin_bank("en"), 0.25, seed=seed)


def subset(rows: Rows, mask: np.ndarray) -> Rows:
    """The rows where ``mask`` is True (``named`` filtered alike)."""
    values = {f.name: getattr(rows, f.name) for f in dataclasses.fields(Rows) if f.name != "named"}
    return Rows(named=[n for n, keep in zip(rows.named, mask) if keep], **{k: v[mask] for k, v in values.items()})
