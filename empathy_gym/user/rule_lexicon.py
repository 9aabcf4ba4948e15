"""The rule user's lexicons: load ``rules/<language>.json``, compile the cue phrases, and
scan an utterance once for everything the appraisal counts (:class:`Scan`). Nothing here
weighs anything (:mod:`empathy_gym.user.rule_model` does).

Example:
    >>> rules = load_rules(str(RULES_DIR))["en"]
    >>> scan = rules.scan("That sounds really hard. What happened next?")
    >>> scan.length, scan.questions, scan.find("validation")
    (7, 1, ('that sounds really hard',))
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from empathy_gym.personas import CHARACTER_TYPES, INTENTIONS, LANGUAGES

#: Where the per-language lexicons and templates live (``<language>.json``).
RULES_DIR = Path(__file__).resolve().parent / "rules"
#: Below this share of common characters, 6 or more CJK characters count as non-words.
COMMON_CHAR_SHARE = 0.3

CJK = re.compile(r"[\u4e00-\u9fff]")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9']+")
_EN_WORD = re.compile(r"[a-z][a-z']*")
_VOWELS = frozenset("aeiouy")
_MASH = re.compile(r"(.)\1\1|qwer|wert|erty|asdf|sdfg|dfgh|fghj|ghjk|hjkl|zxcv|xcvb|cvbn|vbnm|uiop")
_CONSONANT_RUN = re.compile(r"[^aeiouy']{5,}")
_INTENTION_LEXICONS = tuple((key, f"intention:{key}") for key in INTENTIONS)


class Memo(dict):
    """A dict that computes a missing value with ``compute(key)`` and stores it; it
    empties itself once it holds more than ``limit`` entries (bounded memory)."""

    def __init__(self, compute: Callable[[Any], Any], limit: int):
        super().__init__()
        self.compute, self.limit = compute, limit

    def __missing__(self, key: Any) -> Any:
        if len(self) > self.limit:
            self.clear()
        value = self[key] = self.compute(key)
        return value


def normalise(text: str) -> str:
    """Lower-cased, with curly apostrophes made straight (as the lexicons are written)."""
    if "\u2019" in text or "\u2018" in text:
        text = text.replace("\u2019", "'").replace("\u2018", "'")
    return text.lower()


def cjk_bigrams(text: str) -> list[str]:
    """The character bigrams of each run of CJK characters, in order ("我很累" -> 我很, 很累)."""
    return [run[i : i + 2] for run in _CJK_RUN.findall(text) for i in range(len(run) - 1)]


def _letter_bigrams(word: str) -> Iterable[str]:
    """Letter pairs of ``word`` with ``^`` and ``$`` at its edges ("ok" -> ^o, ok, k$)."""
    padded = f"^{word}$"
    return (padded[i : i + 2] for i in range(len(padded) - 1))


class _WordCheck:
    """Is an ASCII token an English word? Known words pass; unknown ones must look like
    English (a vowel, no long consonant run, no keyboard mash, no digits mixed with
    letters, no internal capitals, and only letter pairs seen in the known words)."""

    #: The verdicts: a known word, an unknown word that looks English, not a word.
    KNOWN, PLAUSIBLE, NONWORD = 0, 1, 2

    def __init__(self, known: Iterable[str]):
        self.known = frozenset(word for word in known if word)
        self.bigrams = frozenset(pair for word in self.known if word.isalpha() for pair in _letter_bigrams(word))
        #: token (an ASCII token, any case, quotes at its edges ignored) -> verdict (cached)
        self.verdicts = Memo(self._verdict, 200_000)

    def _verdict(self, token: str) -> int:
        """:attr:`KNOWN`, :attr:`NONWORD` or :attr:`PLAUSIBLE` (neither), uncached."""
        low = token.lower().strip("'")
        if low in self.known:
            return self.KNOWN
        if not low:
            return self.PLAUSIBLE
        return self.NONWORD if self._looks_wrong(token, low) else self.PLAUSIBLE

    def _looks_wrong(self, token: str, low: str) -> bool:
        """Does the unknown ``token`` (``low``: lower-cased, edge quotes stripped) not look English?"""
        if any(ch.isdigit() for ch in low):
            return not low.isdigit() or len(low) >= 5
        if len(token) > 2 and any(ch.isupper() for ch in token[1:]) and any(ch.islower() for ch in token):
            return True
        letters = low.replace("'", "")
        if len(letters) > 20 or not _VOWELS.intersection(letters):
            return True
        if _MASH.search(letters) or _CONSONANT_RUN.search(letters):
            return True
        return any(pair not in self.bigrams for pair in _letter_bigrams(letters))


@dataclass(frozen=True, eq=False)
class Scan:
    """Everything the appraisal needs from one utterance, computed once and cached.

    Attributes:
        low: the normalised (lower-cased) text the lexicons match against.
        found: lexicon key -> the lexicon's phrases in the text, in order (intention
            lexicons are keyed ``"intention:<id>"``). Every lexicon is matched: each
            appraisal reads them all (tone features, the cued intentions).
        words: all units (en: lower-cased words; zh: CJK bigrams and Latin words), for
            repetition.
        content: content units (en: 6-letter stems of non-stopwords of 4+ letters; zh:
            also bigrams without function characters), for grounding.
        length: en: ASCII tokens; zh: CJK characters plus ASCII tokens (an int >= 0).
        questions: number of question marks, ``?`` and ``？`` (an int >= 0).
        nonword_ratio: share of units (ASCII tokens and CJK characters) that are not
            words, a float in [0, 1].
        cjk: number of CJK characters. latin: number of ASCII tokens.
        known_share: share of the ASCII tokens that are known English words (the word
            list of :func:`load_rules`), a float in [0, 1]; 1.0 without ASCII tokens.
    """

    low: str
    found: Mapping[str, tuple[str, ...]]
    words: frozenset[str]
    content: frozenset[str]
    length: int
    questions: int
    nonword_ratio: float
    cjk: int
    latin: int
    known_share: float = 1.0

    def find(self, key: str) -> tuple[str, ...]:
        """The phrases of lexicon ``key`` in the utterance, in order."""
        return self.found[key]

    def count(self, key: str) -> int:
        """How many phrases of lexicon ``key`` the utterance holds (an int >= 0)."""
        return len(self.found[key])

    @functools.cached_property
    def intentions(self) -> tuple[str, ...]:
        """The standard intentions whose cue lexicons fire, in
        :data:`~empathy_gym.personas.INTENTIONS` order (cached)."""
        return tuple(key for key, lexicon in _INTENTION_LEXICONS if self.find(lexicon))


#: Reply lines: ``replies[band][character type][tone]``, a tone for each direction of the change.
REPLY_TONES: tuple[str, ...] = ("up", "level", "down")


def _check_replies(replies: Any, source: str) -> None:
    """Every band and character type has non-empty lists of lines for each of :data:`REPLY_TONES`.

    Raises:
        ValueError: naming ``source`` and the field (``replies/B/negative/up``).
    """
    for band in "SABCF":
        for character in CHARACTER_TYPES:
            lines = ((replies or {}).get(band) or {}).get(character)
            for tone in REPLY_TONES:
                found = lines.get(tone) if isinstance(lines, Mapping) else None
                if not isinstance(found, list) or not found or not all(isinstance(line, str) for line in found):
                    raise ValueError(
                        f"{source}: field 'replies/{band}/{character}/{tone}': expected a non-empty list of lines"
                    )


class LanguageRules:
    """The compiled lexicons, word lists and templates of one language, with caches of
    utterance scans and units (texts recur: the history is rescanned every turn).

    Args:
        data: the parsed ``<language>.json``; templates stay there (``data["replies"]``...).
        words: the English word check, shared by both languages.
        source: the file's path, for error messages.

    Raises:
        ValueError: a bad regular expression, a capturing group, or a missing
            intention lexicon (names ``source``).
    """

    _MAX_CACHE = 100_000

    def __init__(self, data: Mapping[str, Any], words: _WordCheck, source: str):
        self.code: str = data["language"]
        self.data = data
        self.words = words
        lexicons = data["lexicons"]
        patterns = {f"intention:{key}": value for key, value in lexicons["intention"].items()}
        patterns.update({key: value for key, value in lexicons.items() if key != "intention"})
        missing = [f"intention:{key}" for key in INTENTIONS if f"intention:{key}" not in patterns]
        if missing:
            raise ValueError(f"{source}: lexicons lack {missing}")
        _check_replies(data.get("replies"), source)
        self.patterns = {key: self._compile(key, value, source) for key, value in patterns.items()}
        self.stopwords = frozenset(data.get("stopwords", ()))
        self.stopchars = frozenset(data.get("stopchars", ""))
        self.stop_bigrams = frozenset(data.get("stop_bigrams", ()))
        self.common_chars = frozenset(data.get("common_chars", ""))
        self._scans = Memo(self._compute_scan, self._MAX_CACHE)
        self._units = Memo(self._compute_normalised_units, self._MAX_CACHE)  # a method: envs pickle

    def _compile(self, key: str, patterns: Sequence[str], source: str) -> re.Pattern:
        """One lexicon's patterns as one alternation (never matching when empty)."""
        body = "|".join(f"(?:{pattern})" for pattern in patterns) or r"(?!x)x"
        # English cues must not start or end inside a word; Chinese has no word edges.
        text = body if self.code == "zh" else rf"(?<![a-z0-9])(?:{body})(?:(?<![a-z0-9])|(?![a-z0-9]))"
        try:
            compiled = re.compile(text)
        except re.error as error:
            raise ValueError(f"{source}: lexicon {key!r}: bad pattern: {error}") from None
        if compiled.groups:
            raise ValueError(f"{source}: lexicon {key!r}: use non-capturing groups (?:...)")
        return compiled

    def units(self, text: str) -> tuple[frozenset[str], frozenset[str]]:
        """``(all units, content units)`` of ``text`` (see :class:`Scan`; cached)."""
        return self._units[text]

    def _compute_normalised_units(self, text: str) -> tuple[frozenset[str], frozenset[str]]:
        return self._compute_units(normalise(text))

    def _compute_units(self, low: str) -> tuple[frozenset[str], frozenset[str]]:
        """The uncached :meth:`units` of the normalised text ``low``."""
        latin = _EN_WORD.findall(low)
        content = {word[:6] for word in latin if len(word) >= 4 and word not in self.stopwords}
        if self.code == "en":
            return frozenset(latin), frozenset(content)
        bigrams = cjk_bigrams(low)
        content.update(
            pair
            for pair in bigrams
            if pair not in self.stop_bigrams and pair[0] not in self.stopchars and pair[1] not in self.stopchars
        )
        return frozenset(bigrams).union(latin), frozenset(content)

    def scan(self, text: str) -> Scan:
        """The :class:`Scan` of an utterance (cached by text)."""
        return self._scans[text]

    def _compute_scan(self, text: str) -> Scan:
        words, content = self.units(text)
        tokens = _ASCII_TOKEN.findall(text)
        cjk_chars = CJK.findall(text)
        latin = len(tokens)
        length = latin if self.code == "en" else latin + len(cjk_chars)
        known_share, nonwords = self._word_counts(tokens)
        low = normalise(text)
        return Scan(
            low=low,
            found={key: tuple(pattern.findall(low)) for key, pattern in self.patterns.items()},
            words=words,
            content=content,
            length=length,
            questions=text.count("?") + text.count("？"),
            nonword_ratio=self._nonword_ratio(nonwords, tokens, cjk_chars),
            cjk=len(cjk_chars),
            latin=latin,
            known_share=known_share,
        )

    def _word_counts(self, tokens: Sequence[str]) -> tuple[float, int]:
        """``(share of tokens that are known words (1.0 without tokens), non-word tokens)``."""
        if not tokens:
            return 1.0, 0
        verdicts = [self.words.verdicts[token] for token in tokens]
        return verdicts.count(_WordCheck.KNOWN) / len(tokens), verdicts.count(_WordCheck.NONWORD)

    def _nonword_ratio(self, flagged: int, tokens: Sequence[str], cjk_chars: Sequence[str]) -> float:
        """Non-words per unit: ``flagged`` unknown-looking ASCII tokens, plus every CJK
        character when 6 or more of them hold too few common characters (random characters)."""
        units = len(tokens) + len(cjk_chars)
        if not units:
            return 0.0
        if len(cjk_chars) >= 6 and self.common_chars:
            common = sum(1 for ch in cjk_chars if ch in self.common_chars)
            if common / len(cjk_chars) < COMMON_CHAR_SHARE:
                flagged += len(cjk_chars)
        return flagged / units


def _read_json(path: Path) -> dict:
    """The parsed JSON file; bad JSON raises ValueError naming the file and line."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None


@functools.lru_cache(maxsize=8)
def load_rules(rules_dir: str) -> dict[str, LanguageRules]:
    """Every language's rules from ``rules_dir`` (``<code>.json`` per code in
    :data:`~empathy_gym.personas.LANGUAGES`), compiled once per directory. The English word
    list (``common_words``, ``stopwords`` and the words in every lexicon) also judges Latin
    words in Chinese text. Injection is not a lexicon here: the user reads what
    :func:`empathy_gym.boundary.find_injection` found (``UserRequest.injection``).

    Raises:
        FileNotFoundError: a rules file is missing.
        ValueError: bad JSON, a bad pattern or a missing intention lexicon (names the file).
    """
    folder = Path(rules_dir)
    data = {code: _read_json(folder / f"{code}.json") for code in LANGUAGES}
    english = data["en"]
    known = set(english.get("common_words", ())) | set(english.get("stopwords", ()))
    for code in LANGUAGES:
        for value in data[code]["lexicons"].values():
            for pattern in value.values() if isinstance(value, Mapping) else [value]:
                known.update(re.findall(r"[a-z]{2,}", " ".join(pattern)))
    words = _WordCheck(known | set("ai"))
    return {code: LanguageRules(data[code], words, str(folder / f"{code}.json")) for code in LANGUAGES}
