"""The rule-based simulated user: no LLM, deterministic, fast, English and Chinese.

**A stand-in for tests and CPU runs, not a judge.** It makes
``gym.make("EmpathyDialogue-v0")`` work on a fresh machine without a model, and it is
good enough that reinforcement learning against it learns sensible things (serve the
hidden need, stay on the user's story, do not lecture or brush off) and cannot be
gamed by the cheap tricks that inflate LLM judges (generic praise, prompt injection,
random strings, repeating oneself). It does not understand language: it counts cue
phrases. Use an LLM user (:mod:`empathy_gym.user.llm_user`) for real evaluation.

It follows the SAGE / RLVER turn protocol (SAGE, arXiv 2505.02847, section 2.2; RLVER,
arXiv 2507.03112, section 3.1): for each agent utterance the user *appraises* it (a
signed emotion change, int, and one sentence of inner thoughts), the
:class:`~empathy_gym.user.protocol.EmotionProtocol` moves the emotion (an int in
[0, 100]), and the user *replies* in character from templates chosen by the emotion
band (S >= 100, A >= 70, B >= 40, C >= 10, F < 10).

How one change is computed (every number is in the tables below):

1. The utterance is scanned once with the persona's language lexicons
   (``rules/en.json``, ``rules/zh.json``: cue phrases as regular expressions).
2. Each feature of :data:`WEIGHTS` contributes ``weight x count``, the count capped by
   :data:`CAPS`; :data:`INTENTION_WEIGHTS` overrides a weight for one hidden intention
   (advice hurts a user who wants to vent).
3. Injection, gibberish, the wrong language or repeating an earlier utterance
   (:data:`VOIDING`) void every gain of that utterance.
4. Without a cue of the hidden intention the gains together are capped at
   :data:`UNSERVED_GAIN_CAP` (kindness that misses the need moves the user only a
   little; under a difficulty with ``intention_required`` they are zero). Gains are
   then multiplied by the character type's and the difficulty's ``gain_scale``, losses
   by their ``loss_scale`` (:data:`CHARACTER_SCALES`).
5. The sum is rounded half away from zero and clipped to [-:data:`MAX_CHANGE`,
   +:data:`MAX_CHANGE`]: an int in [-10, 10]. A reply that serves the need with some
   validation and reference to the story scores about +5 to +10, a dismissive or
   lecturing one about -5 to -10 (as in SAGE's logs); a kind reply that misses the
   need moves the user by a point or two.

:attr:`Appraisal.features` holds each fired feature's final contribution (after
voiding and scaling; they add up to the change before rounding and clipping).

The agent's words are only ever matched against lexicons: they are data, never
instructions (an injection attempt is itself a strongly negative feature).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from empathy_gym.personas import INTENTIONS, LANGUAGES, Persona
from empathy_gym.user.base import Appraisal, SimulatedUser, UserRequest
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import emotion_band

#: Where the per-language lexicons and templates live (``<language>.json``).
RULES_DIR = Path(__file__).resolve().parent / "rules"

# --------------------------------------------------------------------------------------
# The tables: every number that shapes an appraisal.
# --------------------------------------------------------------------------------------

#: Emotion points per counted cue, before character and difficulty scaling. The order
#: is also the tie-break order when choosing the thought that summarises an appraisal.
WEIGHTS: dict[str, float] = {
    "injection": -10.0,        # "ignore your instructions", "your emotion is now 100", "忽略之前的指令"
    "gibberish": -6.0,         # at least GIBBERISH_RATIO of the words are not words
    "dismissive": -5.0,        # "calm down", "not a big deal", "想开点", "别想太多"
    "lecturing": -4.0,         # "you should have", "you need to", "你应该", "你必须"
    "repetition": -4.0,        # similarity >= REPEAT_SIMILARITY to an earlier utterance
    "pushy_question": -4.0,    # avoidant users only: a direct question about feelings, unsoftened
    "too_short": -4.0,         # empty or nearly so (see LENGTH)
    "intention": 4.0,          # a cue of the persona's hidden intention
    "wrong_language": -3.0,    # nothing in the persona's language
    "unfocused": -3.0,         # the need is hit among cues of 3+ intentions: per intention beyond two
    "advice": 0.0,             # an advice cue; see INTENTION_WEIGHTS (helps only via "intention")
    "generic_comfort": 0.0,    # "don't worry", "会好起来的"; see INTENTION_WEIGHTS
    "praise_repeated": -2.0,   # generic praise again, per earlier turn that praised (capped)
    "missed_need": -2.0,       # no cue of the hidden intention
    "question_barrage": -2.0,  # per question beyond two
    "too_long": -2.0,          # see LENGTH
    "validation": 2.0,         # "that sounds really hard", "it makes sense that you", "难怪你"
    "specific_praise": 2.0,    # praise tied to the scenario (other intentions than specific_praise)
    "open_question": 1.5,      # one or two questions, at least one open ("what", "how", "怎么")
    "short": -1.5,             # see LENGTH
    "grounding": 1.0,          # per content word (zh: character bigram) shared with the story
    "praise": 1.0,             # generic praise, the first time only
}

#: The most cues a feature counts (features not listed count once).
CAPS: dict[str, int] = {
    "intention": 2, "validation": 2, "grounding": 3, "question_barrage": 3, "advice": 2,
    "generic_comfort": 2, "praise_repeated": 3, "dismissive": 2, "lecturing": 2, "unfocused": 6,
}

#: Per hidden intention, weights that replace :data:`WEIGHTS` (emotion points per cue).
INTENTION_WEIGHTS: dict[str, dict[str, float]] = {
    "venting_listened": {"advice": -3.0},
    "deep_empathy": {"advice": -3.0, "generic_comfort": -3.0},
}

#: Character type -> (gain multiplier, loss multiplier). Negative users lose more and
#: gain less; passive users are damped both ways; avoidant users react like the
#: default but dislike pushy questions about their feelings ("pushy_question").
CHARACTER_SCALES: dict[str, tuple[float, float]] = {
    "negative": (0.7, 1.3),
    "passive": (0.6, 0.6),
    "avoidant": (1.0, 1.0),
}

#: Without a cue of the hidden intention, all gains together are capped at this many
#: points (before scaling): kindness that misses the need moves the user only a little.
UNSERVED_GAIN_CAP = 3.0
#: Features that void every gain of the utterance they fire on.
VOIDING: tuple[str, ...] = ("injection", "gibberish", "wrong_language", "repetition")

#: The change is clipped to [-MAX_CHANGE, MAX_CHANGE] (SAGE's clamp; RLVER training
#: does not clamp, so the rule user does it itself).
MAX_CHANGE = 10
#: Jaccard similarity (word sets; zh: character bigrams) that counts as repeating an
#: earlier agent utterance, or parroting a user utterance.
REPEAT_SIMILARITY = 0.7
#: Share of non-words (or implausible characters) that makes an utterance gibberish.
GIBBERISH_RATIO = 0.5
#: Shared story units that make praise specific (rather than generic).
SPECIFIC_GROUNDING = 2
#: A cue phrase the agent already used in an earlier turn counts this much.
STALE_CUE = 0.5
#: Cues of this many different intentions (or more) in one utterance are "unfocused".
UNFOCUSED_INTENTIONS = 3
#: Length thresholds: en in words, zh in CJK characters plus Latin words.
LENGTH: dict[str, dict[str, int]] = {
    "en": {"too_short": 3, "short": 6, "too_long": 120},
    "zh": {"too_short": 5, "short": 10, "too_long": 250},
}
#: At most this many story sentences are kept for the user to tell, one per turn.
MAX_DETAILS = 12
#: Bands in which the user tells one more story sentence per turn.
DETAIL_BANDS = ("A", "B")
#: Bands from worst to best, for ``Difficulty.hint_below_band``.
BAND_ORDER = "FCBAS"

_SALT_OPENING, _SALT_THOUGHT, _SALT_REACTION, _SALT_LINE, _SALT_HINT = range(1, 6)

# --------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------

_CJK = re.compile(r"[\u4e00-\u9fff]")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9']+")
_EN_WORD = re.compile(r"[a-z][a-z']*")
_VOWELS = frozenset("aeiouy")
_MASH = re.compile(r"(.)\1\1|qwer|wert|erty|asdf|sdfg|dfgh|fghj|ghjk|hjkl|zxcv|xcvb|cvbn|vbnm|uiop")
_CONSONANT_RUN = re.compile(r"[^aeiouy']{5,}")
_MASK64 = (1 << 64) - 1


def _normalise(text: str) -> str:
    """Lower-cased, with curly apostrophes made straight (as the lexicons are written)."""
    if "\u2019" in text or "\u2018" in text:
        text = text.replace("\u2019", "'").replace("\u2018", "'")
    return text.lower()


def _mix(*values: int) -> int:
    """A deterministic 64-bit hash of ints (splitmix64 steps): no global RNG, no
    Python string hashing (which is salted per process)."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & _MASK64
        state ^= state >> 31
    return state


def _pick(options: Sequence[str], *key: int) -> str:
    """One of ``options``, chosen by the hash of ``key`` (seed, turn, salt)."""
    return options[_mix(*key) % len(options)]


def _round_half_away(value: float) -> int:
    """Round to the nearest int, halves away from zero (2.5 -> 3, -2.5 -> -3)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _jaccard(a: frozenset, b: frozenset) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def _letter_bigrams(word: str) -> Iterable[str]:
    padded = f"^{word}$"
    return (padded[i:i + 2] for i in range(len(padded) - 1))


class _WordCheck:
    """Is an ASCII token an English word? Known words pass; unknown ones must look like
    English (a vowel, no long consonant run, no keyboard mash, no digits mixed with
    letters, no internal capitals, and only letter pairs seen in the known words)."""

    def __init__(self, known: Iterable[str]):
        self.known = frozenset(word for word in known if word)
        self.bigrams = frozenset(pair for word in self.known if word.isalpha()
                                 for pair in _letter_bigrams(word))
        self._cache: dict[str, bool] = {}

    def is_nonword(self, token: str) -> bool:
        cached = self._cache.get(token)
        if cached is None:
            if len(self._cache) > 200_000:
                self._cache.clear()
            cached = self._cache[token] = self._judge(token)
        return cached

    def _judge(self, token: str) -> bool:
        low = token.lower().strip("'")
        if not low or low in self.known:
            return False
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


# --------------------------------------------------------------------------------------
# One language's compiled rules, and the scan of one utterance
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Scan:
    """Everything the appraisal needs from one utterance, computed once and cached.

    Lexicon matches are computed on first use (:meth:`find`): a persona needs only some
    lexicons, and most utterances are appraised once.

    Attributes:
        low: the normalised (lower-cased) text the lexicons match against.
        patterns: lexicon key -> compiled pattern (intention lexicons are keyed
            ``"intention:<id>"``).
        words: all units (en: lower-cased words; zh: CJK bigrams and Latin words), for
            repetition.
        content: content units (en: 6-letter stems of non-stopwords; zh: bigrams without
            function characters), for grounding.
        length: en: words; zh: CJK characters plus Latin words.
        questions: number of question marks.
        nonword_ratio: share of units that are not words, in [0, 1].
        cjk: number of CJK characters. latin: number of Latin words.
    """

    low: str
    patterns: Mapping[str, re.Pattern]
    words: frozenset[str]
    content: frozenset[str]
    length: int
    questions: int
    nonword_ratio: float
    cjk: int
    latin: int
    _found: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    def find(self, key: str) -> tuple[str, ...]:
        """The phrases of lexicon ``key`` in the utterance (cached)."""
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = tuple(self.patterns[key].findall(self.low))
        return found

    def count(self, key: str) -> int:
        return len(self.find(key))


class _Language:
    """The compiled lexicons, word lists and templates of one language, with a cache of
    utterance scans (texts recur: the history is rescanned every turn)."""

    _MAX_CACHE = 100_000

    def __init__(self, data: Mapping[str, Any], injection: Sequence[str], words: _WordCheck,
                 source: str):
        self.code: str = data["language"]
        self.data = data
        self.words = words
        lexicons = data["lexicons"]
        patterns = {f"intention:{key}": value for key, value in lexicons["intention"].items()}
        patterns.update({key: value for key, value in lexicons.items() if key != "intention"})
        patterns["injection"] = list(injection)
        missing = [f"intention:{key}" for key in INTENTIONS if f"intention:{key}" not in patterns]
        if missing:
            raise ValueError(f"{source}: lexicons lack {missing}")
        self.patterns = {key: self._compile(key, value, source) for key, value in patterns.items()}
        self.stopwords = frozenset(data.get("stopwords", ()))
        self.stopchars = frozenset(data.get("stopchars", ""))
        self.stop_bigrams = frozenset(data.get("stop_bigrams", ()))
        self.common_chars = frozenset(data.get("common_chars", ""))
        self._scans: dict[str, _Scan] = {}
        self._units: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def _compile(self, key: str, patterns: Sequence[str], source: str) -> re.Pattern:
        body = "|".join(f"(?:{pattern})" for pattern in patterns) or r"(?!x)x"
        # English cues must not start or end inside a word (a cue that ends with a symbol,
        # like "<|im_start|>", may touch the next word); Chinese has no word edges.
        text = body if self.code == "zh" and key != "injection" else (
            rf"(?<![a-z0-9])(?:{body})(?:(?<![a-z0-9])|(?![a-z0-9]))")
        try:
            compiled = re.compile(text)
        except re.error as error:
            raise ValueError(f"{source}: lexicon {key!r}: bad pattern: {error}") from None
        if compiled.groups:
            raise ValueError(f"{source}: lexicon {key!r}: use non-capturing groups (?:...)")
        return compiled

    # -- units -----------------------------------------------------------------------
    def units(self, text: str) -> tuple[frozenset[str], frozenset[str]]:
        """``(all units, content units)`` of ``text`` (see :class:`_Scan`)."""
        cached = self._units.get(text)
        if cached is None:
            if len(self._units) > self._MAX_CACHE:
                self._units.clear()
            cached = self._units[text] = self._compute_units(_normalise(text))
        return cached

    def _compute_units(self, low: str) -> tuple[frozenset[str], frozenset[str]]:
        latin = _EN_WORD.findall(low)
        content = {word[:6] for word in latin if len(word) >= 4 and word not in self.stopwords}
        if self.code == "en":
            return frozenset(latin), frozenset(content)
        bigrams = [run[i:i + 2] for run in _CJK_RUN.findall(low) for i in range(len(run) - 1)]
        content.update(pair for pair in bigrams if pair not in self.stop_bigrams
                       and pair[0] not in self.stopchars and pair[1] not in self.stopchars)
        return frozenset(bigrams).union(latin), frozenset(content)

    # -- scan ------------------------------------------------------------------------
    def scan(self, text: str) -> _Scan:
        """The :class:`_Scan` of an utterance (cached by text)."""
        cached = self._scans.get(text)
        if cached is None:
            if len(self._scans) > self._MAX_CACHE:
                self._scans.clear()
            cached = self._scans[text] = self._compute_scan(text)
        return cached

    def _compute_scan(self, text: str) -> _Scan:
        low = _normalise(text)
        words, content = self.units(text)
        tokens = _ASCII_TOKEN.findall(text)
        cjk_chars = _CJK.findall(text)
        latin = len(tokens)
        length = latin if self.code == "en" else latin + len(cjk_chars)
        return _Scan(low=low, patterns=self.patterns, words=words, content=content, length=length,
                     questions=text.count("?") + text.count("？"),
                     nonword_ratio=self._nonword_ratio(tokens, cjk_chars),
                     cjk=len(cjk_chars), latin=latin)

    def _nonword_ratio(self, tokens: Sequence[str], cjk_chars: Sequence[str]) -> float:
        units = len(tokens) + len(cjk_chars)
        if not units:
            return 0.0
        flagged = sum(1 for token in tokens if self.words.is_nonword(token))
        if len(cjk_chars) >= 6 and self.common_chars:
            common = sum(1 for ch in cjk_chars if ch in self.common_chars)
            if common / len(cjk_chars) < 0.3:
                flagged += len(cjk_chars)
        return flagged / units


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None


@functools.lru_cache(maxsize=8)
def _load_languages(rules_dir: str) -> dict[str, _Language]:
    """Both languages' rules from ``rules_dir`` (compiled once per directory).

    Injection cues of every language apply to every persona: an attack can come in
    either language. The English word list also judges Latin words in Chinese text.
    """
    folder = Path(rules_dir)
    data = {code: _read_json(folder / f"{code}.json") for code in LANGUAGES}
    injection = [pattern for code in LANGUAGES for pattern in data[code]["lexicons"]["injection"]]
    english = data["en"]
    known = set(english.get("common_words", ())) | set(english.get("stopwords", ()))
    for code in LANGUAGES:
        for value in data[code]["lexicons"].values():
            for pattern in (value.values() if isinstance(value, Mapping) else [value]):
                known.update(re.findall(r"[a-z]{2,}", " ".join(pattern)))
    words = _WordCheck(known | set("ai"))
    return {code: _Language(data[code], injection, words, str(folder / f"{code}.json"))
            for code in LANGUAGES}


# --------------------------------------------------------------------------------------
# Per-persona features of the scenario (cached): what the user can say about its story
# --------------------------------------------------------------------------------------

_ZH_REACTIONS_HEADING = re.compile(
    r"(?i)不同.{0,6}(?:状态|情绪|emotion)|可能的?反应|emotion|情绪反应|角色反应|角色可能|NPC.{0,6}回复")
_ZH_SECTIONS = (re.compile(r"事件的?当前状态|当前状态"), re.compile(r"当前面[对临]的问题"))
_ZH_META = ("NPC", "npc", "倾诉", "对话", "交流", "咨询", "聊天", "谈话", "玩家", "隐藏")
_ZH_HEADING_LINE = re.compile(r"^\s*(?:#|(?:[-*]\s*|\d+\.\s*)?\*{1,2}[^*]{1,30}\*{1,2}[：:]?\s*$)")
_ZH_LABEL = re.compile(r"\*{1,2}[^*\n]{1,20}\*{1,2}[：:]?")
_ZH_SENTENCE = re.compile(r"[^。！？!?\n]+[。！？!?]?")
_ZH_CONNECTIVES = ("但是|而且|并且|于是|所以|因此|因为|虽然|尽管|如果|只是|同时|现在|如今|目前|最近|后来|"
                   "当时|那天|今天|昨天|上午|下午|晚上|但|而|却|也|还|就|又|才|便|可")
_ZH_TIME_WORD = re.compile(r"^(?:目前|当前|现在|如今|此时|眼下|最近)[，,]\s*")
#: A sentence that voices what the user wants from the listener gives the need away.
_ZH_WISH = re.compile(r"希望.{0,6}(?:有人|对方|能有人|找到一个|得到一个)|渴望.{0,4}(?:有人|获得|得到)|"
                      r"而(?:不是|非|不仅仅是)(?:简单|单纯|一味|直接)|隐藏主题|(?i:emotion|validation)")
_EN_WISH = re.compile(r"(?i)\b(?:wants?|wishes|hopes?|longs?|needs?) (?:someone|somebody|a listener|"
                      r"the listener|people|others|them|him|her) to\b|hidden (?:need|intention)")
#: Shared units with the intention's own sentence that count as giving it away.
LEAK_OVERLAP = {"zh": 4, "en": 3}


def _cjk_bigrams(text: str) -> frozenset[str]:
    return frozenset(run[i:i + 2] for run in _CJK_RUN.findall(text) for i in range(len(run) - 1))


class _LeakCheck:
    """Does a scenario sentence give the hidden intention away? It does when it voices
    a wish aimed at the listener, or shares :data:`LEAK_OVERLAP` units with the
    intention's own sentence (zh: character bigrams; en: content stems)."""

    def __init__(self, persona: Persona, language: _Language):
        self.code = persona.language
        text = persona.intention_text(self.code)
        self.units = _cjk_bigrams(text) if self.code == "zh" else language.units(text)[1]
        self.language = language

    def __call__(self, sentence: str) -> bool:
        if self.code == "zh":
            shared = _cjk_bigrams(sentence) & self.units
            return bool(_ZH_WISH.search(sentence)) or len(shared) >= LEAK_OVERLAP["zh"]
        shared = self.language.units(sentence)[1] & self.units
        return bool(_EN_WISH.search(sentence)) or len(shared) >= LEAK_OVERLAP["en"]


def _zh_story(scenario: str) -> str:
    """The narrative part of an RLVER scene: cut before the sections on how the user
    reacts (they describe the hidden intention) and before any ``隐藏主题`` tail."""
    scenario = scenario.split("####隐藏主题")[0]
    offset = 0
    for line in scenario.splitlines(keepends=True):
        if offset > 0 and len(line.strip()) < 50 and _ZH_REACTIONS_HEADING.search(line):
            return scenario[:offset]
        offset += len(line)
    return scenario


def _zh_plain(text: str) -> str:
    """Text without markdown headings and bold labels, one sentence stream."""
    lines = [line.strip(" -*#\t") for line in _ZH_LABEL.sub("", text).splitlines()
             if line.strip() and not _ZH_HEADING_LINE.match(line) and not line.lstrip().startswith("#")]
    return "".join(line if line.endswith(("。", "！", "？", "!", "?")) else line + "。"
                   for line in lines if line)


def _zh_section(story: str, pattern: re.Pattern) -> str:
    """The text under the last heading that matches ``pattern`` ("" when none)."""
    found = list(pattern.finditer(story))
    if not found:
        return ""
    lines: list[str] = []
    for line in story[found[-1].end():].lstrip("*：: \t）)").splitlines():
        if not line.strip():
            if lines:
                break
            continue
        if lines and _ZH_HEADING_LINE.match(line):
            break
        lines.append(line)
    return _zh_plain("\n".join(lines))


def _zh_pronoun(persona: Persona) -> str | None:
    """她 or 他: from the profile's 性别 (gender) line, else the first of them after the
    name in the profile (then the scenario); ``None`` when neither tells."""
    gender = re.search(r"性别[：:]\s*\**\s*(男|女)", persona.profile)
    if gender:
        return {"男": "他", "女": "她"}[gender.group(1)]
    for text in (persona.profile, persona.scenario):
        start = text.find(persona.name) if persona.name else 0
        found = re.search(r"(?<!其)[她他](?![们人])", text[max(start, 0):])
        if found:
            return found.group(0)
    return None


def _zh_first_person(sentence: str, name: str | None, pronoun: str | None,
                     about_them: bool) -> str:
    """Replace the persona's name by 我, and their pronoun too when ``about_them`` (the
    sentence names them, or the text has been about them since it last did)."""
    if name:
        sentence = sentence.replace(name, "我")
        if len(name) == 3:
            sentence = sentence.replace(name[1:], "我")
    if pronoun and (about_them or sentence.startswith(pronoun)):
        # A pronoun is safely the persona when it starts a clause ("她回家后", "，但她又")
        # or when the persona is already the clause's subject ("我对……的热情让她");
        # elsewhere it may be someone else ("婆婆……还说她以前").
        clauses = re.split(r"([，,；;：:])", sentence)
        for index in range(0, len(clauses), 2):
            clause = clauses[index]
            starts = re.match(rf"\s*[“\"]?(?:{_ZH_CONNECTIVES})?{pronoun}(?![们人])", clause)
            if starts or ("我" in clause and clause.index("我") < clause.find(pronoun)):
                clauses[index] = re.sub(rf"(?<!其){pronoun}(?![们人])", "我", clause)
        sentence = "".join(clauses)
    return sentence.replace("我我", "我")


def _zh_sentences(text: str, persona: Persona, leaks: _LeakCheck) -> list[str]:
    """The sentences of ``text`` in the first person, without those about the
    conversation itself or that give the hidden intention away."""
    pronoun = _zh_pronoun(persona)
    result, topic = [], False      # topic: the persona is who the text is about
    for sentence in _ZH_SENTENCE.findall(text):
        sentence = _ZH_TIME_WORD.sub("", sentence.strip())
        named = bool(persona.name) and persona.name in sentence
        first_person = _zh_first_person(sentence, persona.name, pronoun, named or topic)
        topic = named or (topic and bool(pronoun) and pronoun in sentence)
        if not _CJK.search(sentence) or any(word in sentence for word in _ZH_META):
            continue
        if leaks(sentence):
            first_person = _zh_clean_prefix(first_person, leaks)
        if first_person:
            result.append(first_person if first_person[-1] in "。！？!?" else first_person + "。")
    return result


def _zh_clean_prefix(sentence: str, leaks: _LeakCheck) -> str:
    """The clauses of a sentence before the first one that gives the intention away
    ("" when fewer than 6 characters remain)."""
    kept = []
    for clause in re.split(r"[，,；;]", sentence.rstrip("。！？!?")):
        if leaks(clause) or any(word in clause for word in _ZH_META):
            break
        kept.append(clause)
    prefix = "，".join(kept)
    return prefix if len(prefix) >= 6 else ""


def _zh_state(persona: Persona, leaks: _LeakCheck) -> list[str]:
    """One or two sentences of the current state (``事件当前状态``, else
    ``当前面对的问题``, else the story's last paragraph), at most about 90 characters."""
    story = _zh_story(persona.scenario)
    sources = [_zh_section(story, pattern) for pattern in _ZH_SECTIONS]
    sources.append(_zh_plain(re.split(r"\n\s*\n", story.strip())[-1]))
    for source in sources:
        sentences = _zh_sentences(source, persona, leaks)
        if sentences:
            chosen = sentences[:1]
            if len(sentences) > 1 and len(chosen[0]) + len(sentences[1]) <= 90:
                chosen.append(sentences[1])
            return chosen
    return []


def _zh_fragment(state: Sequence[str]) -> str:
    """The first clause of the state, 4 to 24 characters ("" otherwise)."""
    if not state:
        return ""
    clause = re.split(r"[，,；;。！？!?]", state[0], maxsplit=1)[0].strip()
    return clause if 4 <= len(clause) <= 24 else ""


def _zh_details(persona: Persona, leaks: _LeakCheck, state: Sequence[str]) -> tuple[str, ...]:
    """Story sentences of 8 to 60 characters in story order (not the state's)."""
    story = _zh_plain(_zh_story(persona.scenario))
    details = [s for s in dict.fromkeys(_zh_sentences(story, persona, leaks))
               if 8 <= len(s) <= 60 and s not in state]
    return tuple(details[:MAX_DETAILS])


_EN_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")
_EN_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Prof|Jr|Sr|vs|etc|e\.g|i\.e)|\b[A-Z])\.$")


def _en_split(text: str) -> list[str]:
    """Sentences of ``text``; no split after "Mr.", "Dr.", initials and the like."""
    sentences: list[str] = []
    for piece in _EN_SENTENCE.split(text.strip()):
        if sentences and _EN_ABBREVIATION.search(sentences[-1]):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return [sentence.strip() for sentence in sentences if sentence.strip()]


_SUBJECT_CONTEXT = frozenset(
    "and but so because that when while since after before if as until though although "
    "where now then".split())
_OBJECT_NEXT = frozenset(
    "that to and about in on at for with from the a an again too off up down out back away "
    "as like into over or but so when because feel know see how what why this it more less "
    "most enough anymore everywhere all alone once twice there here now then yet today "
    "tonight if until while after before since though either completely".split())
#: Words after which an -s word is taken for a verb (in :func:`_en_coordinated_verbs`).
_VERB_NEXT = frozenset(
    "the a an my his her their your me him them it every any all no this that at to on in "
    "through about with for into up down out awake off over back home as been".split())
_ADVERBS = ("now|still|often|always|never|also|just|really|barely|rarely|sometimes|usually|"
            "constantly|increasingly|secretly|quietly|only|even|finally|already|mostly|simply|"
            "honestly|hardly|myself")
_BASE_FORMS = {"is": "am", "isn't": "am not", "has": "have", "hasn't": "haven't", "does": "do",
               "doesn't": "don't", "are": "am", "aren't": "am not", "were": "was",
               "weren't": "wasn't", "lies": "lie", "dies": "die", "ties": "tie"}
_NOT_VERBS = frozenset("always sometimes perhaps thus this its yes less unless towards "
                       "afterwards nevertheless regardless across was as".split())


def _base_form(verb: str) -> str:
    """The first-person form of a third-person present verb ("avoids" -> "avoid")."""
    low = verb.lower()
    if low in _BASE_FORMS:
        return _BASE_FORMS[low]
    if low in _NOT_VERBS or len(low) <= 3 or not low.endswith("s") or low.endswith(("ss", "us", "is")):
        return verb
    if low.endswith("ies"):
        return verb[:-3] + "y"
    if low.endswith(("ches", "shes", "sses", "xes", "zes", "oes")):
        return verb[:-2]
    return verb[:-1]


def _subject_position(before: str) -> bool:
    """Does a noun phrase after ``before`` start a clause (so it is a subject)?"""
    before = before.rstrip()
    if not before or before[-1] in ".!?;:,(\"-":
        return True
    last = re.search(r"[A-Za-z']+$", before)
    return bool(last) and last.group(0).lower() in _SUBJECT_CONTEXT


def _keep_case(original: str, replacement: str) -> str:
    if replacement == "I" or replacement.startswith("I'"):
        return replacement
    return replacement.capitalize() if original[:1].isupper() else replacement


def _en_pronoun(persona: Persona) -> str | None:
    """The persona's pronoun ("she", "he"; ``None`` when unknown or "they")."""
    for text in (persona.profile, persona.scenario):
        found = re.search(r"\b(she|he|they)\b", text, re.I)
        if found:
            word = found.group(1).lower()
            return None if word == "they" else word
    return None


def _en_first_person(sentence: str, name: str | None, pronoun: str | None,
                     second_person: bool) -> str:
    """Turn a third-person (or second-person) sentence about the persona into the first
    person: the name and the persona's pronoun become I / me / my, and the verb after
    "I" loses its third-person -s. A heuristic: right for the plain sentences scenarios
    are written in, not for every English sentence."""
    def subject_or_object(match: re.Match) -> str:
        return "I" if _subject_position(match.string[:match.start()]) else "me"

    if name:
        for variant in dict.fromkeys((name, name.split()[0])):
            sentence = re.sub(rf"\b{re.escape(variant)}'s\b", "my", sentence)
            sentence = re.sub(rf"\b{re.escape(variant)}\b", subject_or_object, sentence)
    forms = {"she": ("she", "her", "her", "herself"), "he": ("he", "him", "his", "himself")}
    if pronoun in forms:
        subject, obj, possessive, reflexive = forms[pronoun]

        def object_or_possessive(match: re.Match) -> str:
            word = match.group(0).lower()
            if word == obj and word == possessive:   # "her": decided by the next word
                following = re.match(r"\s*([A-Za-z']+)", match.string[match.end():])
                is_object = following is None or following.group(1).lower() in _OBJECT_NEXT
            else:
                is_object = word == obj
            return _keep_case(match.group(0), "me" if is_object else "my")

        sentence = re.sub(rf"(?i)\b{reflexive}\b", "myself", sentence)
        sentence = re.sub(rf"(?i)\b{subject}'s been\b", "I've been", sentence)
        sentence = re.sub(rf"(?i)\b{subject}'s\b", "I'm", sentence)
        sentence = re.sub(rf"(?i)\b{subject}\b", "I", sentence)
        sentence = re.sub(rf"(?i)\b(?:{obj}|{possessive})\b", object_or_possessive, sentence)
    if second_person:
        for pattern, replacement in (("you're", "I'm"), ("you've", "I've"), ("you'll", "I'll"),
                                     ("you'd", "I'd"), ("yourself", "myself"), ("yours", "mine"),
                                     ("your", "my")):
            sentence = re.sub(rf"(?i)\b{pattern}\b", lambda m, r=replacement: _keep_case(m.group(0), r),
                              sentence)
        sentence = re.sub(r"(?i)\byou\b", subject_or_object, sentence)
    sentence = re.sub(rf"\bI((?:\s+(?:{_ADVERBS}))?)\s+([A-Za-z']+)",
                      lambda m: f"I{m.group(1)} {_base_form(m.group(2))}", sentence)
    sentence = _en_coordinated_verbs(sentence)
    return sentence[:1].upper() + sentence[1:]


def _en_coordinated_verbs(sentence: str) -> str:
    """After a clause with the subject "I", verbs listed with "and" or commas share it:
    "I avoid the office, skips lunch and lies awake" -> "..., skip lunch and lie awake".
    A word counts as such a verb when it is is/has/does; or ends in -s and, after a
    comma, is followed by a lower-case word other than and/or ("nights and weekends"
    stay), or, after "and", by a determiner, a preposition or a pronoun."""
    start = re.search(r"\bI\b", sentence)
    if start is None:
        return sentence

    def fix(match: re.Match) -> str:
        word, following = match.group(2), match.group(3)
        after_comma = match.group(1).lstrip().startswith(",")
        if (word.lower() in _BASE_FORMS or following.lower() in _VERB_NEXT or following.endswith("ing")
                or (after_comma and following.islower() and following not in ("and", "or"))):
            return match.group(1) + _base_form(word)
        return match.group(1) + word

    head, tail = sentence[:start.end()], sentence[start.end():]
    tail = re.sub(r"((?:,\s+(?:and\s+)?|\s+and\s+))([a-z]+s|hasn't|doesn't|isn't)(?=\s+([A-Za-z']+))",
                  fix, tail)
    return head + tail


def _en_sentences(persona: Persona, leaks: _LeakCheck) -> list[str]:
    """The scenario's sentences of 4 to 30 words in the first person, without those that
    give the hidden intention away."""
    second_person = bool(re.match(r"\s*you\b", persona.scenario, re.I))
    pronoun = _en_pronoun(persona)
    result = []
    for sentence in _en_split(persona.scenario):
        if 4 <= len(sentence.split()) <= 30 and not leaks(sentence):
            sentence = _en_first_person(sentence, persona.name, pronoun, second_person)
            result.append(sentence if sentence[-1] in ".!?" else sentence + ".")
    return list(dict.fromkeys(result))


def _en_fragment(state: Sequence[str]) -> str:
    """The state's first clause, 3 to 12 words, lower-cased unless it starts with "I"."""
    if not state:
        return ""
    clause = re.split(r",|;|\s+but\s+|\s+and\s+|\s+because\s+", state[0].rstrip(".!?"), maxsplit=1)[0].strip()
    if not 3 <= len(clause.split()) <= 12:
        return ""
    return clause if clause.startswith(("I ", "I'")) else clause[:1].lower() + clause[1:]


@dataclass(frozen=True)
class _PersonaInfo:
    """What the rule user derives once from a persona.

    Attributes:
        content: content units of the story (see :class:`_Scan`), for grounding.
        intention_content: content units of a free-text hidden intention (empty for the
            eight standard ones, which have lexicons).
        state: the opening's sentence(s), in the first person ("" when none).
        fragment: a short first-person clause for ``{fragment}`` slots ("" when none).
        details: story sentences in the first person, told one per turn in
            :data:`DETAIL_BANDS` so the agent learns more as the dialogue goes on.

    No sentence here voices the hidden intention (see :class:`_LeakCheck`).
    """

    content: frozenset[str]
    intention_content: frozenset[str]
    state: str
    fragment: str
    details: tuple[str, ...]


def _persona_info(persona: Persona, language: _Language) -> _PersonaInfo:
    """Build a persona's :class:`_PersonaInfo`."""
    leaks = _LeakCheck(persona, language)
    if persona.language == "zh":
        story = _zh_plain(_zh_story(persona.scenario))
        state = _zh_state(persona, leaks)
        fragment, details = _zh_fragment(state), _zh_details(persona, leaks, state)
        joiner = ""
    else:
        story = persona.scenario
        sentences = _en_sentences(persona, leaks)
        state = sentences[-1:]                 # the last sentence: the current state
        fragment, details = _en_fragment(state), tuple(sentences[:-1][:MAX_DETAILS])
        joiner = " "
    intention_content = (frozenset() if persona.intention_is_standard
                         else language.units(persona.hidden_intention)[1])
    return _PersonaInfo(content=language.units(story)[1], intention_content=intention_content,
                        state=joiner.join(state), fragment=fragment, details=details)


# --------------------------------------------------------------------------------------
# Features: one function per group, each returning raw contributions (emotion points)
# --------------------------------------------------------------------------------------


def _weight(feature: str, intention: str) -> float:
    return INTENTION_WEIGHTS.get(intention, {}).get(feature, WEIGHTS[feature])


def _capped(feature: str, count: float) -> float:
    return min(count, CAPS.get(feature, 1))


def _cues(key: str, scan: _Scan, earlier: Sequence[_Scan]) -> float:
    """Cues of lexicon ``key``: 1 per new phrase, :data:`STALE_CUE` per phrase the agent
    already used in an earlier turn."""
    found = scan.find(key)
    if not found:
        return 0.0
    seen = {phrase for past in earlier for phrase in past.find(key)}
    return sum(STALE_CUE if phrase in seen else 1.0 for phrase in found)


def _intention_cues(persona: Persona, scan: _Scan, earlier: Sequence[_Scan], shared: int,
                    info: _PersonaInfo) -> float:
    """How many cues of the persona's hidden intention the utterance holds.

    deep_empathy adds named feelings when the utterance also refers to the story;
    specific_praise counts praise only when it is tied to the story
    (:data:`SPECIFIC_GROUNDING` shared units); a free-text intention counts the content
    words it shares with the utterance.
    """
    intention = persona.hidden_intention
    if intention not in INTENTIONS:
        return float(len(scan.content & info.intention_content))
    if intention == "specific_praise":
        if shared < SPECIFIC_GROUNDING:
            return 0.0
        return _cues("intention:specific_praise", scan, earlier) + _cues("praise", scan, earlier)
    count = _cues(f"intention:{intention}", scan, earlier)
    if intention == "deep_empathy" and shared >= 1:
        count += _cues("feelings", scan, earlier)
    return count


def _need_features(persona: Persona, cues: float, scan: _Scan) -> dict[str, float]:
    """intention, missed_need, unfocused: how the utterance serves the hidden need.

    A reply that hits the need among cues of :data:`UNFOCUSED_INTENTIONS` (3) or more
    different intentions is a shotgun: its intention gain is divided by (intentions - 1)
    and "unfocused" costs one weight per intention beyond two, so stuffing every
    intention's cue phrases into one reply does not pay. Two at once are fine.
    """
    if cues <= 0:
        return {"missed_need": WEIGHTS["missed_need"]}
    hit = sum(1 for key in INTENTIONS if scan.count(f"intention:{key}"))
    if hit < UNFOCUSED_INTENTIONS:
        return {"intention": WEIGHTS["intention"] * _capped("intention", cues)}
    return {"intention": WEIGHTS["intention"] * _capped("intention", cues) / (hit - 1),
            "unfocused": WEIGHTS["unfocused"] * _capped("unfocused", hit - 2)}


def _listening_features(persona: Persona, scan: _Scan, earlier: Sequence[_Scan],
                        shared: int) -> dict[str, float]:
    """validation, grounding, open_question, question_barrage, pushy_question."""
    raw: dict[str, float] = {}
    validation = _cues("validation", scan, earlier)
    if validation:
        raw["validation"] = WEIGHTS["validation"] * _capped("validation", validation)
    if shared:
        raw["grounding"] = WEIGHTS["grounding"] * _capped("grounding", shared)
    if 1 <= scan.questions <= 2 and scan.count("open_question"):
        raw["open_question"] = WEIGHTS["open_question"]
    if scan.questions > 2:
        extra = _capped("question_barrage", scan.questions - 2)
        raw["question_barrage"] = WEIGHTS["question_barrage"] * extra
    if (persona.character_type == "avoidant" and scan.count("pushy_question")
            and not scan.count("softener")):
        raw["pushy_question"] = WEIGHTS["pushy_question"]
    return raw


def _stance_features(persona: Persona, scan: _Scan, earlier: Sequence[_Scan],
                     shared: int) -> dict[str, float]:
    """advice, generic_comfort, praise, praise_repeated, specific_praise, dismissive,
    lecturing: what the utterance does besides listening."""
    intention = persona.hidden_intention
    raw: dict[str, float] = {}
    for feature, key in (("advice", "intention:practical_advice"), ("generic_comfort", "generic_comfort"),
                         ("dismissive", "dismissive"), ("lecturing", "lecturing")):
        weight = _weight(feature, intention)
        if weight and scan.count(key):
            raw[feature] = weight * _capped(feature, scan.count(key))
    praised = scan.count("praise") > 0
    if praised and shared < SPECIFIC_GROUNDING:
        earlier_praise = sum(1 for past in earlier if past.count("praise"))
        if earlier_praise:
            raw["praise_repeated"] = WEIGHTS["praise_repeated"] * _capped("praise_repeated", earlier_praise)
        else:
            raw["praise"] = WEIGHTS["praise"]
    elif ((praised or scan.count("intention:specific_praise")) and shared >= SPECIFIC_GROUNDING
          and intention != "specific_praise"):
        raw["specific_praise"] = WEIGHTS["specific_praise"]
    return raw


def _form_features(persona: Persona, scan: _Scan, history: Sequence[frozenset[str]]) -> dict[str, float]:
    """too_short, short, too_long, repetition, gibberish, wrong_language, injection:
    the form of the utterance, whatever it says. ``history`` holds the units of every
    earlier utterance (agent and user: repeating oneself or parroting the user)."""
    raw: dict[str, float] = {}
    limits = LENGTH[persona.language]
    if scan.length < limits["too_short"]:
        raw["too_short"] = WEIGHTS["too_short"]
    elif scan.length < limits["short"]:
        raw["short"] = WEIGHTS["short"]
    elif scan.length > limits["too_long"]:
        raw["too_long"] = WEIGHTS["too_long"]
    if any(_jaccard(scan.words, past) >= REPEAT_SIMILARITY for past in history):
        raw["repetition"] = WEIGHTS["repetition"]
    if scan.nonword_ratio >= GIBBERISH_RATIO:
        raw["gibberish"] = WEIGHTS["gibberish"]
    if persona.language == "zh":
        foreign = scan.cjk == 0 and scan.latin > 0
    else:
        foreign = scan.cjk > scan.latin
    if foreign:
        raw["wrong_language"] = WEIGHTS["wrong_language"]
    if scan.count("injection"):
        raw["injection"] = WEIGHTS["injection"]
    return raw


def _combine(raw: Mapping[str, float], persona: Persona, difficulty: Difficulty,
             has_cue: bool) -> tuple[int, dict[str, float]]:
    """Void, scale, sum, round and clip the raw contributions.

    Returns:
        ``(change, contributions)``: the change (int in [-MAX_CHANGE, MAX_CHANGE]) and
        each feature's final contribution (float, emotion points).
    """
    char_gain, char_loss = CHARACTER_SCALES[persona.character_type]
    gain = char_gain * difficulty.gain_scale
    loss = char_loss * difficulty.loss_scale
    if any(feature in raw for feature in VOIDING):
        gain = 0.0
    if difficulty.intention_required and not has_cue:
        gain = 0.0
    gains = sum(value for value in raw.values() if value > 0)
    if not has_cue and gains > UNSERVED_GAIN_CAP:
        gain *= UNSERVED_GAIN_CAP / gains
    ordered = [feature for feature in WEIGHTS if feature in raw]
    contributions = {feature: round(raw[feature] * (gain if raw[feature] > 0 else loss), 3) + 0.0
                     for feature in ordered}
    change = _round_half_away(sum(contributions.values()))
    return max(-MAX_CHANGE, min(MAX_CHANGE, change)), contributions


# --------------------------------------------------------------------------------------
# The user
# --------------------------------------------------------------------------------------


class RuleUser(SimulatedUser):
    """A deterministic simulated user driven by cue lexicons and templates (no LLM).

    A stand-in for tests and CPU runs, not a judge: see the module docstring for how an
    appraisal is computed and :data:`WEIGHTS` for every feature's weight.

    Args:
        difficulty: a preset name (``"easy"``, ``"moderate"``, ``"challenging"``), a path,
            a dict or a :class:`~empathy_gym.user.difficulty.Difficulty`. Uses
            ``gain_scale``, ``loss_scale``, ``intention_required`` and ``hint_below_band``.
        rules_dir: a folder with ``en.json`` and ``zh.json`` to replace the shipped
            lexicons and templates (default :data:`RULES_DIR`).

    Raises:
        KeyError: unknown difficulty name.
        ValueError: invalid difficulty preset, or invalid rules file (bad JSON, a bad
            regular expression, a missing intention lexicon; names the file).
        FileNotFoundError: a rules file is missing.

    Example:
        >>> from empathy_gym.personas import load_personas
        >>> from empathy_gym.user.protocol import SAGE
        >>> user = RuleUser("moderate")
        >>> persona = load_personas("rlver")[0]
        >>> opening, = user.opening([persona], [0])
        >>> request = UserRequest(persona, (("user", opening),), "听起来你真的很累。", 40, 1)
        >>> turn, = user.respond([request], SAGE)
        >>> isinstance(turn.appraisal.change, int) and 0 <= turn.emotion <= 100
        True
    """

    deterministic = True

    def __init__(self, difficulty: str | os.PathLike | Mapping[str, Any] | Difficulty = "moderate",
                 *, rules_dir: str | os.PathLike | None = None):
        self.difficulty: Difficulty = load_difficulty(difficulty)
        if self.difficulty.hint_below_band is not None and self.difficulty.hint_below_band not in BAND_ORDER:
            raise ValueError(f"hint_below_band must be one of {list(BAND_ORDER)} or None, "
                             f"got {self.difficulty.hint_below_band!r}")
        self.rules_dir = Path(rules_dir) if rules_dir is not None else RULES_DIR
        self._languages = _load_languages(str(self.rules_dir.resolve()))
        self._personas: dict[Persona, _PersonaInfo] = {}

    # -- persona features -------------------------------------------------------------
    def _language(self, persona: Persona) -> _Language:
        if persona.language not in self._languages:
            raise ValueError(f"persona {persona.id!r}: language {persona.language!r} is not one of "
                             f"{list(self._languages)}")
        if persona.character_type not in CHARACTER_SCALES:
            raise ValueError(f"persona {persona.id!r}: character_type {persona.character_type!r} is not "
                             f"one of {list(CHARACTER_SCALES)}")
        return self._languages[persona.language]

    def _info(self, persona: Persona) -> _PersonaInfo:
        """The persona's cached scenario features."""
        info = self._personas.get(persona)
        if info is None:
            if len(self._personas) > 20_000:
                self._personas.clear()
            info = self._personas[persona] = _persona_info(persona, self._language(persona))
        return info

    # -- opening ----------------------------------------------------------------------
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """The first utterance of each dialogue: the persona's ``opening_line`` if set;
        otherwise a template for the character type followed by the scenario's current
        state in the first person (en: the last sentence; zh RLVER profiles: one or two
        sentences of ``事件当前状态``, else ``当前面对的问题``).

        Raises:
            ValueError: ``personas`` and ``seeds`` differ in length; unknown language or
                character type.
        """
        if len(personas) != len(seeds):
            raise ValueError(f"{len(personas)} personas but {len(seeds)} seeds")
        return [self._opening_one(persona, int(seed)) for persona, seed in zip(personas, seeds)]

    def _opening_one(self, persona: Persona, seed: int) -> str:
        if persona.opening_line:
            return persona.opening_line
        language = self._language(persona)
        state = self._info(persona).state or language.data["fallback_state"]
        template = _pick(language.data["openings"][persona.character_type], seed, 0, _SALT_OPENING)
        return template.format(state=state)

    # -- appraisal --------------------------------------------------------------------
    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        """One :class:`~empathy_gym.user.base.Appraisal` per request: ``change`` an int in
        [-10, 10], ``thoughts`` one sentence in the persona's language, ``features`` each
        fired feature's contribution in emotion points (see :data:`WEIGHTS`).

        Raises:
            ValueError: a persona with an unknown language or character type.
        """
        return [self._appraise_one(request) for request in requests]

    def _appraise_one(self, request: UserRequest) -> Appraisal:
        persona = request.persona
        language = self._language(persona)
        info = self._info(persona)
        scan = language.scan(request.utterance)
        earlier = [language.scan(text) for role, text in request.history if role == "agent"]
        users = [text for role, text in request.history if role == "user"]
        shared = self._shared_units(language, scan, info, users)
        cues = _intention_cues(persona, scan, earlier, shared, info)
        raw = _need_features(persona, cues, scan)
        raw.update(_listening_features(persona, scan, earlier, shared))
        raw.update(_stance_features(persona, scan, earlier, shared))
        past = [past_scan.words for past_scan in earlier] + [language.units(text)[0] for text in users]
        raw.update(_form_features(persona, scan, past))
        change, contributions = _combine(raw, persona, self.difficulty, has_cue=cues > 0)
        thoughts = self._thought(language, contributions, request)
        return Appraisal(change=change, thoughts=thoughts, features=contributions)

    @staticmethod
    def _shared_units(language: _Language, scan: _Scan, info: _PersonaInfo,
                      users: Sequence[str]) -> int:
        """Content units the utterance shares with the story or the user's own words."""
        shared = scan.content & info.content
        for text in users:
            shared |= scan.content & language.units(text)[1]
        return len(shared)

    @staticmethod
    def _thought(language: _Language, contributions: Mapping[str, float],
                 request: UserRequest) -> str:
        """One sentence of inner thoughts about the strongest feature."""
        thoughts = language.data["thoughts"]
        fired = [(feature, value) for feature, value in contributions.items() if value]
        if fired:
            feature, value = max(fired, key=lambda item: abs(item[1]))
            options = thoughts.get(feature, {}).get("+" if value > 0 else "-")
            if options:
                return _pick(options, request.seed, request.turn, _SALT_THOUGHT)
        return _pick(thoughts["neutral"], request.seed, request.turn, _SALT_THOUGHT)

    # -- reply ------------------------------------------------------------------------
    def reply(self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal],
              emotions: Sequence[int]) -> list[str]:
        """The user's in-character answer: an optional reaction to the worst feature
        (e.g. "You already said that."), a line for the emotion band and character type
        (S: thanks and goodbye; F: gives up and leaves), in bands A and B one more
        sentence of the story (in order, one per turn), and, when the difficulty's
        ``hint_below_band`` covers the band (never in S or F), a hint at the hidden need
        in the user's own words.

        Raises:
            ValueError: the three sequences differ in length; unknown language or
                character type.
        """
        if not len(requests) == len(appraisals) == len(emotions):
            raise ValueError(f"{len(requests)} requests, {len(appraisals)} appraisals and "
                             f"{len(emotions)} emotions: lengths must match")
        return [self._reply_one(request, appraisal, int(emotion))
                for request, appraisal, emotion in zip(requests, appraisals, emotions)]

    def _reply_one(self, request: UserRequest, appraisal: Appraisal, emotion: int) -> str:
        persona = request.persona
        language = self._language(persona)
        band = emotion_band(emotion)
        parts = []
        reaction = self._reaction(language, appraisal, request) if band != "S" else ""
        if reaction:
            parts.append(reaction)
        parts.append(self._band_line(language, persona, band, request))
        details = self._info(persona).details
        if band in DETAIL_BANDS and details:
            parts.append(details[(request.turn - 1) % len(details)])
        if self._hints_in(band):
            hints = language.data["hints"]
            options = hints.get(persona.hidden_intention, hints["other"])
            parts.append(_pick(options, request.seed, request.turn, _SALT_HINT))
        return ("" if persona.language == "zh" else " ").join(parts)

    @staticmethod
    def _reaction(language: _Language, appraisal: Appraisal, request: UserRequest) -> str:
        """A short reaction to the most negative feature that has one ("" when none)."""
        reactions = language.data["reactions"]
        negative = [(value, feature) for feature, value in appraisal.features.items()
                    if value < 0 and feature in reactions]
        if not negative:
            return ""
        _, feature = min(negative)
        return _pick(reactions[feature], request.seed, request.turn, _SALT_REACTION)

    def _band_line(self, language: _Language, persona: Persona, band: str,
                   request: UserRequest) -> str:
        """The band's line for the character type, with the scenario fragment woven in."""
        fragment = self._info(persona).fragment
        options = language.data["replies"][band][persona.character_type]
        if not fragment:
            options = [line for line in options if "{fragment}" not in line] or options
            fragment = language.data["fallback_fragment"]
        line = _pick(options, request.seed, request.turn, _SALT_LINE).format(fragment=fragment)
        # A fragment may land after a full stop ("Mm. {fragment}"): capitalise it there.
        return re.sub(r"([.!?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), line)

    def _hints_in(self, band: str) -> bool:
        """Does the difficulty hint at the need in this band? Never in S or F (the user
        is leaving)."""
        limit = self.difficulty.hint_below_band
        if limit is None or band in ("S", "F"):
            return False
        return BAND_ORDER.index(band) <= BAND_ORDER.index(limit)


__all__ = ["CAPS", "CHARACTER_SCALES", "INTENTION_WEIGHTS", "MAX_CHANGE", "RULES_DIR", "RuleUser",
           "UNSERVED_GAIN_CAP", "VOIDING", "WEIGHTS"]
