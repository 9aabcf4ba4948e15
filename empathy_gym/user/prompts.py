"""Prompts of the LLM simulated user, rendered from per-language template files in
``empathy_gym/user/prompts/<language>/``.

The design follows SAGE's simulator (Tencent/digitalhuman
``SAGE/simulator_response.py``) in our own words: the appraisal sees the emotion as a number and
works through :data:`APPRAISAL_STEPS`; the reply sees only the emotion band and the
appraisal, and plans before it answers (:data:`REPLY_STEPS`). See
docs/simulated-user.md#the-llm-users-prompts.

The agent's words enter a prompt only as JSON (``json.dumps``), and the system prompt
tells the model they are data, not instructions (:mod:`empathy_gym.boundary`).
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from empathy_gym.personas import LANGUAGES, Persona
from empathy_gym.user.base import Appraisal, UserRequest, Utterance
from empathy_gym.user.difficulty import Difficulty
from empathy_gym.user.protocol import EmotionProtocol, emotion_band

_DIR = Path(__file__).resolve().parent / "prompts"
_TEMPLATES = ("system", "appraisal", "appraisal_choice", "reply", "opening", "repair", "repair_choice")

#: The appraisal's fields, one per analysis step, in the order the model writes them.
APPRAISAL_STEPS: tuple[str, ...] = ("content", "goal_fit", "inner_thoughts", "feeling", "change")
#: The planned reply's fields, in order; ``response`` is the message the agent sees.
REPLY_STEPS: tuple[str, ...] = ("attitude", "goal", "tone", "content", "draft", "response")

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class PromptSet:
    """The templates and words of one language."""

    templates: dict[str, string.Template]
    bands: dict[str, str]
    words: dict


@functools.cache
def prompt_set(language: str) -> PromptSet:
    """The prompts of ``language`` (``"en"`` or ``"zh"``).

    Raises:
        ValueError: unknown language.
    """
    if language not in LANGUAGES:
        raise ValueError(f"no prompts for language {language!r}; known: {list(LANGUAGES)}")
    folder = _DIR / language
    templates = {
        name: string.Template((folder / f"{name}.txt").read_text(encoding="utf-8").strip()) for name in _TEMPLATES
    }
    bands = json.loads((folder / "bands.json").read_text(encoding="utf-8"))
    words = json.loads((folder / "words.json").read_text(encoding="utf-8"))
    return PromptSet(templates, bands, words)


def _history_json(history: Sequence[Utterance]) -> str:
    turns = [{"me" if role == "user" else "listener": text} for role, text in history]
    return json.dumps(turns, ensure_ascii=False, indent=1)


def system_prompt(persona: Persona, difficulty: Difficulty) -> str:
    """The simulator's system prompt: persona, scenario, hidden intention, difficulty."""
    prompts = prompt_set(persona.language)
    words = prompts.words
    return prompts.templates["system"].substitute(
        profile=persona.profile,
        scenario=persona.scenario,
        character_type=words["character_types"][persona.character_type],
        traits=words["trait_separator"].join(persona.traits) or "-",
        intention=persona.intention_text(),
        difficulty=difficulty.prompt.get(persona.language, ""),
    )


def _change_range(language: str, protocol: EmotionProtocol) -> str:
    words = prompt_set(language).words
    if protocol.min_change is None or protocol.max_change is None:
        return words["change_range_open"]
    return string.Template(words["change_range"]).substitute(
        low=f"{protocol.min_change:+d}", high=f"{protocol.max_change:+d}"
    )


def option_letters(count: int) -> list[str]:
    """``count`` option labels: ``["A", "B", ...]`` (at most 26)."""
    if not 1 <= count <= 26:
        raise ValueError(f"between 1 and 26 options are supported, got {count}")
    return list(string.ascii_uppercase[:count])


def appraisal_messages(
    request: UserRequest, difficulty: Difficulty, protocol: EmotionProtocol, choices: Sequence[int] | None = None
) -> Messages:
    """The chat for one appraisal: free-text JSON (``choices is None``) or a lettered
    multiple choice over the emotion changes in ``choices``."""
    persona = request.persona
    prompts = prompt_set(persona.language)
    fields = dict(
        history=_history_json(request.history),
        utterance=json.dumps(request.utterance, ensure_ascii=False),
        emotion=request.emotion,
    )
    if choices is None:
        body = prompts.templates["appraisal"].substitute(
            change_range=_change_range(persona.language, protocol), **fields
        )
    else:
        option = string.Template(prompts.words["option"])
        options = "\n".join(
            option.substitute(letter=letter, change=f"{change:+d}")
            for letter, change in zip(option_letters(len(choices)), choices)
        )
        body = prompts.templates["appraisal_choice"].substitute(options=options, **fields)
    return [{"role": "system", "content": system_prompt(persona, difficulty)}, {"role": "user", "content": body}]


def repair_message(
    language: str, error: str | None = None, letters: Sequence[str] | None = None, kind: str = "appraisal"
) -> dict[str, str]:
    """The user-turn message that asks the model to answer again in the right format:
    one of ``letters`` (choice mode), or the JSON object of ``kind`` (``"appraisal"`` or
    ``"reply"``), naming the ``error``."""
    prompts = prompt_set(language)
    if letters is not None:
        text = prompts.templates["repair_choice"].substitute(letters=", ".join(letters))
    else:
        text = prompts.templates["repair"].substitute(error=error or "invalid", format=prompts.words[f"{kind}_format"])
    return {"role": "user", "content": text}


def band_text(language: str, emotion: int) -> str:
    """The description of ``emotion``'s band (S/A/B/C/F, :func:`emotion_band`) that the
    reply and opening prompts show instead of the number."""
    return prompt_set(language).bands[emotion_band(emotion)]


def reply_messages(
    request: UserRequest, difficulty: Difficulty, appraisal: Appraisal, emotion: int, *, plan: bool = True
) -> Messages:
    """The chat for the in-character reply at the new ``emotion`` (0-100; shown as its
    band only), given the ``appraisal`` (``goal_fit`` as the objective part, thoughts and
    feeling as the subjective part). ``plan``: ask for the planned JSON answer
    (:data:`REPLY_STEPS`), else for the bare message."""
    persona = request.persona
    prompts = prompt_set(persona.language)
    words = prompts.words
    subjective = " ".join(
        part for part in (appraisal.thoughts.strip(), appraisal.analysis.get("feeling", "").strip()) if part
    )
    body = prompts.templates["reply"].substitute(
        history=_history_json(request.history),
        utterance=json.dumps(request.utterance, ensure_ascii=False),
        goal_fit=appraisal.analysis.get("goal_fit", "").strip() or words["none"],
        thoughts=subjective or words["none"],
        band=band_text(persona.language, emotion),
        passive=words["passive_rule"] if persona.character_type == "passive" else "",
        output=words["reply_output_plan" if plan else "reply_output_plain"],
    )
    return [{"role": "system", "content": system_prompt(persona, difficulty)}, {"role": "user", "content": body}]


def opening_messages(persona: Persona, difficulty: Difficulty, emotion: int) -> Messages:
    """The chat that asks for the user's first utterance, at ``emotion`` (shown as its band)."""
    body = prompt_set(persona.language).templates["opening"].substitute(band=band_text(persona.language, emotion))
    return [{"role": "system", "content": system_prompt(persona, difficulty)}, {"role": "user", "content": body}]
