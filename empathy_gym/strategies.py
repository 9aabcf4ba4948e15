"""The eight support strategies of ESConv and the utterance templates that realise them.

ESConv (Liu et al., 2021, "Towards Emotional Support Dialog Systems", ACL, section 3.3 and
table 2) annotates every supporter turn with one of eight strategies; the ids here follow
its names (:data:`STRATEGY_NAMES`) and :data:`STRATEGY_DEFINITIONS` paraphrases its
definitions. The templates are data, one JSON file per language in
``empathy_gym/strategy_templates/``: several variants per strategy, with the
placeholders ``{words}`` (a clause quoted from the user's newest utterance,
:func:`user_words`) and ``{name}`` (the persona's name), and the cue word lists of the
strategy env's observation (``cues``).
"""

from __future__ import annotations

import functools
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

#: The ESConv strategies, in the order of the action index (``Discrete(8)``).
STRATEGIES: tuple[str, ...] = (
    "question",
    "restatement_or_paraphrasing",
    "reflection_of_feelings",
    "self_disclosure",
    "affirmation_and_reassurance",
    "providing_suggestions",
    "information",
    "others",
)

#: id -> the strategy's name in ESConv.
STRATEGY_NAMES: dict[str, str] = {
    "question": "Question",
    "restatement_or_paraphrasing": "Restatement or Paraphrasing",
    "reflection_of_feelings": "Reflection of Feelings",
    "self_disclosure": "Self-disclosure",
    "affirmation_and_reassurance": "Affirmation and Reassurance",
    "providing_suggestions": "Providing Suggestions",
    "information": "Information",
    "others": "Others",
}

#: id -> a one-sentence definition (paraphrasing ESConv's table 2), used to ask an LLM
#: to write a reply with that strategy.
STRATEGY_DEFINITIONS: dict[str, str] = {
    "question": "ask one open question that helps them put into words what they are facing",
    "restatement_or_paraphrasing": "briefly restate what they said in your own words, so they "
    "see their situation more clearly",
    "reflection_of_feelings": "name and describe the feelings they seem to have",
    "self_disclosure": "share a similar experience or feeling of your own, to show you understand",
    "affirmation_and_reassurance": "affirm their strengths, effort and worth, and reassure them",
    "providing_suggestions": "suggest a possible way forward, without telling them what they must do",
    "information": "offer useful information or another perspective on the situation, e.g. how "
    "the other people involved may see it",
    "others": "a short pleasantry, such as thanking them for sharing",
}

#: Where the template files live (``<language>.json``).
TEMPLATES_DIR = Path(__file__).resolve().parent / "strategy_templates"
PLACEHOLDERS = frozenset({"words", "name"})

_CLAUSE_SPLIT = re.compile(r"[.!?;\n。！？；…]+|(?<=,)\s|，")
_STRIP = " \t\"'“”‘’,，.。:：-—"


class TemplateError(ValueError):
    """A template file is missing, not valid JSON, or breaks the expected layout; the
    message names the file and the field."""


@dataclass(frozen=True)
class StrategyTemplates:
    """One language's templates and cue lists.

    Attributes:
        language: ``"en"`` or ``"zh"``.
        templates: strategy id -> the variants (``tuple[str, ...]``, at least one).
        negative_cues, positive_cues: compiled patterns; ``findall`` counts the cues.
        path: the file they came from.
    """

    language: str
    templates: dict[str, tuple[str, ...]]
    negative_cues: re.Pattern
    positive_cues: re.Pattern
    path: str

    def variants(self, strategy: str, *, words: str, name: str | None) -> list[str]:
        """The filled variants of ``strategy`` that can be filled: a template with
        ``{words}`` needs non-empty ``words``, one with ``{name}`` a name.

        Raises:
            KeyError: an unknown strategy id.
        """
        if strategy not in self.templates:
            raise KeyError(f"unknown strategy {strategy!r}; known: {list(STRATEGIES)}")
        out = []
        for template in self.templates[strategy]:
            fields = _placeholders(template)
            if ("words" in fields and not words) or ("name" in fields and not name):
                continue
            out.append(template.format(words=words, name=name or ""))
        return out


def _placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


@functools.lru_cache(maxsize=8)
def load_templates(language: str, directory: str | None = None) -> StrategyTemplates:
    """Load and check ``<directory>/<language>.json`` (default: the shipped templates).

    Raises:
        TemplateError: a missing file, bad JSON, a missing strategy, an empty or
            non-string template, an unknown placeholder, or bad cue patterns, naming the
            file and the field (e.g. ``en.json: field 'strategies/question/2': unknown
            placeholder {topic}``).
    """
    path = Path(directory or TEMPLATES_DIR) / f"{language}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TemplateError(f"{path}: no strategy templates for language {language!r}") from None
    except json.JSONDecodeError as error:
        raise TemplateError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None

    def fail(field: str, message: str) -> TemplateError:
        return TemplateError(f"{path}: field {field!r}: {message}")

    strategies = data.get("strategies")
    if not isinstance(strategies, dict):
        raise fail("strategies", "missing or not an object")
    templates: dict[str, tuple[str, ...]] = {}
    for strategy in STRATEGIES:
        variants = strategies.get(strategy)
        if not isinstance(variants, list) or not variants:
            raise fail(f"strategies/{strategy}", "missing or not a non-empty list")
        for index, template in enumerate(variants):
            field = f"strategies/{strategy}/{index}"
            if not isinstance(template, str) or not template.strip():
                raise fail(field, "must be a non-empty string")
            try:
                unknown = _placeholders(template) - PLACEHOLDERS
            except ValueError as error:
                raise fail(field, f"bad placeholder syntax: {error}") from None
            if unknown:
                raise fail(field, f"unknown placeholder {{{sorted(unknown)[0]}}}; use {sorted(PLACEHOLDERS)}")
        if all(_placeholders(t) for t in variants):
            raise fail(f"strategies/{strategy}", "needs at least one template without placeholders")
        templates[strategy] = tuple(variants)
    extra = sorted(set(strategies) - set(STRATEGIES))
    if extra:
        raise fail(f"strategies/{extra[0]}", f"unknown strategy; known: {list(STRATEGIES)}")
    cues = data.get("cues", {})
    patterns = {}
    for kind in ("negative", "positive"):
        words = cues.get(kind)
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise fail(f"cues/{kind}", "must be a list of non-empty strings")
        edge = r"\b" if language == "en" else ""
        try:
            patterns[kind] = re.compile("|".join(f"{edge}(?:{w}){edge}" for w in words))
        except re.error as error:
            raise fail(f"cues/{kind}", f"bad regular expression: {error}") from None
    return StrategyTemplates(language, templates, patterns["negative"], patterns["positive"], str(path))


def user_words(utterance: str, max_chars: int = 60) -> str:
    """A short clause to quote from the user's utterance: its longest clause (split at
    sentence ends, semicolons and commas), quotes and end punctuation stripped, cut at a
    word boundary to at most ``max_chars`` characters. ``""`` when nothing is left.

    Example:
        >>> user_words("Ugh. Everyone acts like this is on me, and I don't think it is.")
        'Everyone acts like this is on me'
    """
    clauses = [c.strip(_STRIP) for c in _CLAUSE_SPLIT.split(utterance)]
    best = max(clauses, key=len, default="")
    if len(best) > max_chars:
        cut = best[:max_chars]
        best = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return best.strip(_STRIP)
