"""Reward-hacking monitors: transparent checks on a training step's sampled replies, read
without the simulated user (docs/reward-hacking.md). :func:`reply_monitors` gives the
``monitor/*`` metrics, :func:`tripped` those past a recipe's thresholds; the trainer adds
``monitor/reference_nll`` (:meth:`~empathy_gym.agents.trainer.RLTrainer.reference_nll`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from empathy_gym.boundary import find_injection
from empathy_gym.think import split_think
from empathy_gym.user.rule_lexicon import CJK, RULES_DIR, LanguageRules, load_rules
from empathy_gym.user.rule_user import sentences_of

_LATIN_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
#: A reply parrots when it has at least this many content units ...
PARROT_MIN_UNITS = 5
#: ... and at least this share of them come from the user message it answers.
PARROT_SHARE = 0.6
#: A reply is non-words when over this share of its units are.
NONWORD_REPLY_SHARE = 0.2
#: A word bigram said this many times in one reply is a repetition.
BIGRAM_REPEATS = 3


@dataclass(frozen=True)
class Reply:
    """One sampled reply and what it answers.

    Attributes:
        text: the reply as the user saw it (thinking removed).
        user_message: the user message it answers ("" when none).
        language: the persona's language, ``"en"`` or ``"zh"``.
    """

    text: str
    user_message: str
    language: str


@cache
def _rules() -> Mapping[str, LanguageRules]:
    return load_rules(str(RULES_DIR.resolve()))


def words(text: str, language: str) -> list[str]:
    """The reply's words, lower-cased: Latin words, and for ``zh`` every CJK character."""
    latin = [word.lower() for word in _LATIN_WORD.findall(text)]
    return latin if language == "en" else latin + CJK.findall(text)


def bigrams(units: Sequence[str]) -> list[tuple[str, str]]:
    """Consecutive pairs of ``units``."""
    return list(zip(units, units[1:]))


def distinct_2(texts: Sequence[str], language: str | Sequence[str]) -> float:
    """Distinct bigrams / all bigrams over ``texts`` (distinct-n: Li et al. 2016, "A
    Diversity-Promoting Objective Function for Neural Conversation Models", section
    4.3), in [0, 1]; NaN when the texts hold no bigram. ``language``: one for all, or one
    per text."""
    languages = [language] * len(texts) if isinstance(language, str) else list(language)
    pairs = [pair for text, code in zip(texts, languages) for pair in bigrams(words(text, code))]
    return len(set(pairs)) / len(pairs) if pairs else math.nan


def repeats_itself(text: str, language: str) -> bool:
    """The reply says one sentence twice, or one word bigram :data:`BIGRAM_REPEATS` times."""
    sentences = sentences_of(language, text)
    if len(sentences) != len(set(sentences)):
        return True
    counts = Counter(bigrams(words(text, language)))
    return bool(counts) and max(counts.values()) >= BIGRAM_REPEATS


def parrots(text: str, user_message: str, language: str) -> bool:
    """At least :data:`PARROT_MIN_UNITS` content units, :data:`PARROT_SHARE` of them from
    ``user_message`` (the rule user's units: en words of 4+ letters outside its
    stopwords, cut to 6 letters; zh character bigrams)."""
    rules = _rules()[language]
    mine, theirs = rules.units(text)[1], rules.units(user_message)[1]
    return len(mine) >= PARROT_MIN_UNITS and len(mine & theirs) >= PARROT_SHARE * len(mine)


def wrong_script(text: str, language: str) -> bool:
    """Mostly in the other script: more CJK characters than Latin words for ``en``, more
    Latin words than CJK characters for ``zh``."""
    latin, cjk = len(_LATIN_WORD.findall(text)), len(CJK.findall(text))
    return cjk > latin if language == "en" else latin > cjk


def mostly_nonwords(text: str, language: str) -> bool:
    """Over :data:`NONWORD_REPLY_SHARE` of the reply's units are non-words (the rule
    user's word check)."""
    return _rules()[language].scan(text).nonword_ratio > NONWORD_REPLY_SHARE


def looks_like_injection(text: str) -> bool:
    """The reply holds a prompt-injection or appraisal-output pattern."""
    return bool(find_injection(text))


def reply_monitors(replies: Sequence[Reply]) -> dict[str, float]:
    """The ``monitor/*`` metrics of one step's replies: shares of replies in [0, 1], a
    mean length and distinct-2; NaN for an empty step."""

    def share(check) -> float:
        return sum(map(check, replies)) / len(replies) if replies else math.nan

    lengths = [len(words(r.text, r.language)) for r in replies]
    return {
        "monitor/reply_words_mean": sum(lengths) / len(lengths) if lengths else math.nan,
        "monitor/distinct_2": distinct_2([r.text for r in replies], [r.language for r in replies]),
        "monitor/self_repeat_share": share(lambda r: repeats_itself(r.text, r.language)),
        "monitor/parrot_share": share(lambda r: parrots(r.text, r.user_message, r.language)),
        "monitor/wrong_script_share": share(lambda r: wrong_script(r.text, r.language)),
        "monitor/nonword_share": share(lambda r: mostly_nonwords(r.text, r.language)),
        "monitor/injection_share": share(lambda r: looks_like_injection(r.text)),
    }


def replies_of(messages: Sequence[Mapping[str, str]], language: str) -> list[Reply]:
    """The agent's replies in a dialogue's ``messages`` (the env's ``info["messages"]``:
    system, user, assistant, ...), each with the user message before it; a reply's
    ``<think>...</think>`` part is dropped (the user never saw it)."""
    replies, last_user = [], ""
    for message in messages:
        if message["role"] == "user":
            last_user = message["content"]
        elif message["role"] == "assistant":
            text = message["content"]
            replies.append(Reply(split_think(text).reply if "<think>" in text else text, last_user, language))
    return replies


def tripped(metrics: Mapping[str, float], thresholds: Mapping[str, float]) -> dict[str, float]:
    """The monitors past their threshold: ``{name: value}``. A threshold is a ceiling,
    except for ``distinct_2`` and ``reply_words_mean``, which are floors (a step whose
    replies grow alike or short). Names are given without ``monitor/``; NaN values never
    trip.

    Raises:
        KeyError: a threshold for a monitor that does not exist (names the known ones).
    """
    floors = {"distinct_2", "reply_words_mean"}
    out = {}
    for name, limit in thresholds.items():
        key = f"monitor/{name}"
        if key not in metrics:
            known = sorted(k.removeprefix("monitor/") for k in metrics if k.startswith("monitor/"))
            raise KeyError(f"monitor threshold {name!r}: no such monitor (known: {', '.join(known)})")
        value = metrics[key]
        if not math.isnan(value) and (value < limit if name in floors else value > limit):
            out[name] = value
    return out
