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
   (``rules/en.json``, ``rules/zh.json``: cue phrases as regular expressions; see
   :mod:`empathy_gym.user.rule_lexicon`).
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

What the user says about itself (the opening's state, the ``{fragment}`` of replies, the
story sentences it tells) comes from :mod:`empathy_gym.user.rule_story`; this module holds
the tables, the appraisal and the replies.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from empathy_gym.personas import INTENTIONS, Persona
from empathy_gym.user.base import Appraisal, SimulatedUser, UserRequest
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import emotion_band
from empathy_gym.user.rule_lexicon import RULES_DIR, LanguageRules, Memo, Scan, load_rules
from empathy_gym.user.rule_story import (  # LEAK_OVERLAP, MAX_DETAILS: re-exported
    LEAK_OVERLAP,  # noqa: F401
    MAX_DETAILS,  # noqa: F401
    PersonaStory,
    persona_story,
)

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
#: Bands in which the user tells one more story sentence per turn.
DETAIL_BANDS = ("A", "B")
#: Bands from worst to best, for ``Difficulty.hint_below_band``.
BAND_ORDER = "FCBAS"

# --------------------------------------------------------------------------------------
# The appraisal: one function per group of features, each returning raw contributions
# (emotion points), then _combine
# --------------------------------------------------------------------------------------


def _round_half_away(value: float) -> int:
    """Round to the nearest int, halves away from zero (2.5 -> 3, -2.5 -> -3)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _jaccard(a: frozenset, b: frozenset) -> float:
    """Jaccard similarity of two sets, in [0, 1] (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def _weight(feature: str, intention: str) -> float:
    """The feature's weight for a hidden intention (emotion points per cue)."""
    return INTENTION_WEIGHTS.get(intention, {}).get(feature, WEIGHTS[feature])


def _capped(feature: str, count: float) -> float:
    """``count`` capped by :data:`CAPS` (1 for features not listed)."""
    return min(count, CAPS.get(feature, 1))


def _cues(key: str, scan: Scan, earlier: Sequence[Scan]) -> float:
    """Cues of lexicon ``key``: 1 per new phrase, :data:`STALE_CUE` per phrase the agent
    already used in an earlier turn."""
    found = scan.find(key)
    if not found:
        return 0.0
    seen = {phrase for past in earlier for phrase in past.find(key)}
    return sum(STALE_CUE if phrase in seen else 1.0 for phrase in found)


def _intention_cues(persona: Persona, scan: Scan, earlier: Sequence[Scan], shared: int,
                    story: PersonaStory) -> float:
    """How many cues of the persona's hidden intention the utterance holds.

    deep_empathy adds named feelings when the utterance also refers to the story;
    specific_praise counts praise only when it is tied to the story
    (:data:`SPECIFIC_GROUNDING` shared units); a free-text intention counts the content
    words it shares with the utterance.
    """
    intention = persona.hidden_intention
    if intention not in INTENTIONS:
        return float(len(scan.content & story.intention_content))
    if intention == "specific_praise":
        if shared < SPECIFIC_GROUNDING:
            return 0.0
        return _cues("intention:specific_praise", scan, earlier) + _cues("praise", scan, earlier)
    count = _cues(f"intention:{intention}", scan, earlier)
    if intention == "deep_empathy" and shared >= 1:
        count += _cues("feelings", scan, earlier)
    return count


def _need_features(cues: float, scan: Scan) -> dict[str, float]:
    """intention, missed_need, unfocused: how the utterance serves the hidden need.

    A reply that hits the need among cues of :data:`UNFOCUSED_INTENTIONS` (3) or more
    different intentions is a shotgun: its intention gain is divided by (intentions - 1)
    and "unfocused" costs one weight per intention beyond two, so stuffing every
    intention's cue phrases into one reply does not pay. Two at once are fine.
    """
    if cues <= 0:
        return {"missed_need": WEIGHTS["missed_need"]}
    gain = WEIGHTS["intention"] * _capped("intention", cues)
    hit = sum(1 for key in INTENTIONS if scan.count(f"intention:{key}"))
    if hit < UNFOCUSED_INTENTIONS:
        return {"intention": gain}
    return {"intention": gain / (hit - 1), "unfocused": WEIGHTS["unfocused"] * _capped("unfocused", hit - 2)}


def _listening_features(persona: Persona, scan: Scan, earlier: Sequence[Scan],
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


def _stance_features(persona: Persona, scan: Scan, earlier: Sequence[Scan],
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


def _form_features(persona: Persona, scan: Scan, history: Sequence[frozenset[str]]) -> dict[str, float]:
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
    if (scan.cjk == 0 and scan.latin > 0) if persona.language == "zh" else scan.cjk > scan.latin:
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
    if any(feature in raw for feature in VOIDING) or (difficulty.intention_required and not has_cue):
        gain = 0.0
    gains = sum(value for value in raw.values() if value > 0)
    if not has_cue and gains > UNSERVED_GAIN_CAP:
        gain *= UNSERVED_GAIN_CAP / gains
    # In WEIGHTS order; "+ 0.0" turns -0.0 (a zero loss_scale) into 0.0.
    contributions = {feature: round(raw[feature] * (gain if raw[feature] > 0 else loss), 3) + 0.0
                     for feature in WEIGHTS if feature in raw}
    change = _round_half_away(sum(contributions.values()))
    return max(-MAX_CHANGE, min(MAX_CHANGE, change)), contributions


# --------------------------------------------------------------------------------------
# The user
# --------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
#: Salts that keep the seeded choices of one turn apart (see :func:`_pick`).
_SALT_OPENING, _SALT_THOUGHT, _SALT_REACTION, _SALT_LINE, _SALT_HINT = range(1, 6)
#: A lower-case letter after a full stop, in a reply line (the fragment slot's start).
_AFTER_STOP = re.compile(r"([.!?]\s+)([a-z])")


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
        self._languages = load_rules(str(self.rules_dir.resolve()))
        self._stories = Memo(lambda persona: persona_story(persona, self._language(persona)), 20_000)

    # -- the persona ------------------------------------------------------------------
    def _language(self, persona: Persona) -> LanguageRules:
        """The persona's language rules, after checking its language and character type."""
        if persona.language not in self._languages:
            raise ValueError(f"persona {persona.id!r}: language {persona.language!r} is not one of "
                             f"{list(self._languages)}")
        if persona.character_type not in CHARACTER_SCALES:
            raise ValueError(f"persona {persona.id!r}: character_type {persona.character_type!r} is not "
                             f"one of {list(CHARACTER_SCALES)}")
        return self._languages[persona.language]

    def _story(self, persona: Persona) -> PersonaStory:
        """The persona's story, derived once (cached)."""
        return self._stories[persona]

    # -- opening ----------------------------------------------------------------------
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """The first utterance of each dialogue: the persona's ``opening_line`` if set;
        otherwise a template for the character type followed by the scenario's current
        state in the first person (en: the last sentence; zh RLVER profiles: one or two
        sentences of ``事件当前状态``, else ``当前面对的问题``). ``seeds`` (ints, one per
        persona) choose the template; the same seed gives the same opening.

        Raises:
            ValueError: ``personas`` and ``seeds`` differ in length; unknown language or
                character type.
        """
        if len(personas) != len(seeds):
            raise ValueError(f"{len(personas)} personas but {len(seeds)} seeds")
        return [self._opening_one(persona, int(seed)) for persona, seed in zip(personas, seeds)]

    def _opening_one(self, persona: Persona, seed: int) -> str:
        """One opening (see :meth:`opening`)."""
        if persona.opening_line:
            return persona.opening_line
        language = self._language(persona)
        state = self._story(persona).state or language.data["fallback_state"]
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
        """One appraisal: scan, compute every feature group, combine (module docstring)."""
        persona = request.persona
        language = self._language(persona)
        story = self._story(persona)
        scan = language.scan(request.utterance)
        earlier = [language.scan(text) for role, text in request.history if role == "agent"]
        users = [text for role, text in request.history if role == "user"]
        shared = self._shared_units(language, scan, story, users)
        cues = _intention_cues(persona, scan, earlier, shared, story)
        raw = _need_features(cues, scan)
        raw.update(_listening_features(persona, scan, earlier, shared))
        raw.update(_stance_features(persona, scan, earlier, shared))
        past = [past_scan.words for past_scan in earlier] + [language.units(text)[0] for text in users]
        raw.update(_form_features(persona, scan, past))
        change, contributions = _combine(raw, persona, self.difficulty, has_cue=cues > 0)
        thoughts = self._thought(language, contributions, request)
        return Appraisal(change=change, thoughts=thoughts, features=contributions)

    @staticmethod
    def _shared_units(language: LanguageRules, scan: Scan, story: PersonaStory,
                      users: Sequence[str]) -> int:
        """Content units the utterance shares with the story or the user's own words."""
        shared = scan.content & story.content
        for text in users:
            shared |= scan.content & language.units(text)[1]
        return len(shared)

    @staticmethod
    def _thought(language: LanguageRules, contributions: Mapping[str, float],
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
        (S: thanks and goodbye; F: gives up and leaves), in bands A and B a sentence of
        the story (sentence ``(turn - 1) % n`` of the ``n`` kept: story order, one per
        turn), and, when the difficulty's ``hint_below_band`` covers the band (never in
        S or F), a hint at the hidden need in the user's own words.

        ``emotions`` are the emotions after the appraisals (ints in [0, 100]); they pick
        the band. Lines are chosen by ``request.seed`` and ``request.turn``: the same
        request gives the same reply.

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
        """One reply (see :meth:`reply`)."""
        persona = request.persona
        language = self._language(persona)
        band = emotion_band(emotion)
        parts = []
        reaction = self._reaction(language, appraisal, request) if band != "S" else ""
        if reaction:
            parts.append(reaction)
        parts.append(self._band_line(language, persona, band, request))
        details = self._story(persona).details
        if band in DETAIL_BANDS and details:
            parts.append(details[(request.turn - 1) % len(details)])
        if self._hints_in(band):
            hints = language.data["hints"]
            options = hints.get(persona.hidden_intention, hints["other"])
            parts.append(_pick(options, request.seed, request.turn, _SALT_HINT))
        return ("" if persona.language == "zh" else " ").join(parts)

    @staticmethod
    def _reaction(language: LanguageRules, appraisal: Appraisal, request: UserRequest) -> str:
        """A short reaction to the most negative feature that has one ("" when none)."""
        reactions = language.data["reactions"]
        negative = [(value, feature) for feature, value in appraisal.features.items()
                    if value < 0 and feature in reactions]
        if not negative:
            return ""
        _, feature = min(negative)
        return _pick(reactions[feature], request.seed, request.turn, _SALT_REACTION)

    def _band_line(self, language: LanguageRules, persona: Persona, band: str,
                   request: UserRequest) -> str:
        """The band's line for the character type, with the scenario fragment woven in."""
        fragment = self._story(persona).fragment
        options = language.data["replies"][band][persona.character_type]
        if not fragment:
            options = [line for line in options if "{fragment}" not in line] or options
            fragment = language.data["fallback_fragment"]
        line = _pick(options, request.seed, request.turn, _SALT_LINE).format(fragment=fragment)
        # A fragment may land after a full stop ("Mm. {fragment}"): capitalise it there.
        return _AFTER_STOP.sub(lambda m: m.group(1) + m.group(2).upper(), line)

    def _hints_in(self, band: str) -> bool:
        """Does the difficulty hint at the need in this band? Never in S or F (the user
        is leaving)."""
        limit = self.difficulty.hint_below_band
        if limit is None or band in ("S", "F"):
            return False
        return BAND_ORDER.index(band) <= BAND_ORDER.index(limit)


__all__ = ["CAPS", "CHARACTER_SCALES", "INTENTION_WEIGHTS", "MAX_CHANGE", "RULES_DIR", "RuleUser",
           "UNSERVED_GAIN_CAP", "VOIDING", "WEIGHTS"]
