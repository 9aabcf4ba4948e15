"""Difficulty presets: how readily the simulated user reveals its need and rewards
replies. Data, not code: ``envs/difficulty/<name>.json``.

RLVER (arXiv 2507.03112, section 5.3) contrasts a *moderate* simulator with a
*challenging* one that never reveals its hidden intention and rises only when a reply
addresses it explicitly; we add an *easy* one that hints at its need.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from empathy_gym.resources import envs_dir

DIFFICULTY_SCHEMA: dict = {
    "type": "object",
    "required": ["name", "description", "prompt", "rule"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "the preset's name, as listings show it"},
        "description": {"type": "string", "description": "one line for listings"},
        "prompt": {
            "type": "object",
            "required": ["en", "zh"],
            "properties": {"en": {"type": "string"}, "zh": {"type": "string"}},
            "additionalProperties": False,
            "description": "LLM users only: instructions added to the simulated user's system prompt, per language",
        },
        "rule": {
            "type": "object",
            "additionalProperties": False,
            "description": "the rule and distilled users' knobs; an absent one is 1.0, 1.0, false and null in order",
            "properties": {
                "gain_scale": {
                    "type": "number",
                    "minimum": 0,
                    "description": "multiplies a positive change before rounding (1.0 as moderate; 0: never rises)",
                },
                "loss_scale": {
                    "type": "number",
                    "minimum": 0,
                    "description": "multiplies a negative emotion change before rounding (1.0: moderate)",
                },
                "intention_required": {
                    "type": "boolean",
                    "description": "true: a reply without a cue of the hidden intention gains nothing (its "
                    "losses stay); false: any good reply can gain",
                },
                "hint_below_band": {
                    "enum": ["S", "A", "B", "C", "F", None],
                    "description": "rule user's replies hint at the hidden need while the emotion's band is "
                    "this one or lower (F < C < B < A < S; never in S or F, where the user leaves); null: never",
                },
            },
        },
    },
}


@dataclass(frozen=True)
class Difficulty:
    """A difficulty preset.

    Attributes:
        name: e.g. ``"moderate"``.
        description: one line for listings.
        prompt: per-language instructions appended to the LLM user's system prompt.
        gain_scale: rule user: multiplies positive emotion changes (1.0 = moderate).
        loss_scale: rule user: multiplies negative emotion changes.
        intention_required: rule user: only a reply that addresses the hidden
            intention explicitly can raise the emotion (the challenging simulator).
        hint_below_band: rule user: hint at the need in replies while the emotion band
            is at or below this one (``None``: never hint). Bands as in
            :func:`~empathy_gym.user.protocol.emotion_band`.
    """

    name: str
    description: str = ""
    prompt: Mapping[str, str] = field(default_factory=lambda: {"en": "", "zh": ""})
    gain_scale: float = 1.0
    loss_scale: float = 1.0
    intention_required: bool = False
    hint_below_band: str | None = None


def difficulty_from_dict(record: Mapping[str, Any], source: str = "<dict>") -> Difficulty:
    """Validate a preset dict against :data:`DIFFICULTY_SCHEMA`.

    Raises:
        ValueError: naming ``source`` and the field.
    """
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(DIFFICULTY_SCHEMA).iter_errors(record))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "<root>"
        raise ValueError(f"{source}: field {where!r}: {error.message}")
    return Difficulty(
        name=record["name"], description=record["description"], prompt=dict(record["prompt"]), **record["rule"]
    )


def builtin_difficulties() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in (envs_dir() / "difficulty").glob("*.json"))


def load_difficulty(difficulty: str | os.PathLike | Mapping[str, Any] | Difficulty) -> Difficulty:
    """A :class:`Difficulty` from a shipped name (``"moderate"``, ``"challenging"``,
    ``"easy"``), a path to a JSON preset, a dict, or an instance.

    Raises:
        KeyError: unknown name. ValueError: invalid preset (names file and field).
        TypeError: none of these types.
    """
    if isinstance(difficulty, Difficulty):
        return difficulty
    if isinstance(difficulty, Mapping):
        return difficulty_from_dict(difficulty)
    if not isinstance(difficulty, (str, os.PathLike)):
        raise TypeError(
            f"difficulty: expected a preset name, a JSON path, a dict or a Difficulty; got {type(difficulty).__name__}"
        )
    path = Path(difficulty)
    if not path.suffix:
        path = envs_dir() / "difficulty" / f"{difficulty}.json"
        if not path.exists():
            raise KeyError(f"unknown difficulty {str(difficulty)!r}; known: {builtin_difficulties()}")
    with open(path, encoding="utf-8") as handle:
        try:
            record = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not valid UTF-8; save the file as UTF-8") from None
    return difficulty_from_dict(record, str(path))
