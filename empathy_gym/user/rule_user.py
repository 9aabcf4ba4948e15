"""The rule-based simulated user: no LLM, deterministic, English and Chinese.

A stand-in for tests and CPU runs, not a judge (docs/simulated-user.md). It counts cue
phrases and measures form; it does not understand language. It follows the SAGE / RLVER
turn protocol (:mod:`empathy_gym.user.base`). One appraisal:

1. scan the utterance with the persona's lexicons (:mod:`empathy_gym.user.rule_lexicon`);
2. weigh its named features with the fitted
   :class:`~empathy_gym.user.rule_model.AppraisalModel` (emotion points);
3. add the hand-set :data:`GUARDS`; one in :data:`VOIDING`, or (under a difficulty with
   ``intention_required``) a reply without a cue of the hidden intention, turns a
   positive model change into 0 (reported as ``"voided"``);
4. multiply a positive sum by the difficulty's ``gain_scale``, a negative one by its
   ``loss_scale`` (reported as ``"difficulty"``);
5. round half away from zero and clip to [-:data:`MAX_CHANGE`, +:data:`MAX_CHANGE`].

:attr:`Appraisal.features` holds each group's contribution in emotion points; they add
up to the change before rounding and clipping. Replies come from templates chosen by
the emotion band, and tell the story of :mod:`empathy_gym.user.rule_story` a piece at a
time, never saying a sentence twice while there is something new to say.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from empathy_gym.personas import CHARACTER_TYPES, INTENTIONS, Persona
from empathy_gym.user.base import Appraisal, SimulatedUser, UserRequest
from empathy_gym.user.difficulty import Difficulty, load_difficulty
from empathy_gym.user.protocol import emotion_band
from empathy_gym.user.rule_lexicon import RULES_DIR, LanguageRules, Memo, Scan, load_rules
from empathy_gym.user.rule_model import START_EMOTION, AppraisalModel, ReplyContext, appraisal_features, jaccard
from empathy_gym.user.rule_story import (  # LEAK_OVERLAP, MAX_DETAILS: re-exported
    LEAK_OVERLAP,  # noqa: F401
    MAX_DETAILS,  # noqa: F401
    PersonaStory,
    persona_story,
)

# -- the guards: hand-set rules outside the fitted model (emotion points) -----------------

#: Penalty of each guard, in emotion points (praise_repeated: per earlier praising turn,
#: at most :data:`PRAISE_REPEATED_CAP` turns; unfocused: per intention beyond
#: ``UNFOCUSED_INTENTIONS - 1``).
GUARDS: dict[str, float] = {
    "injection": -10.0,  # "ignore your instructions", "your emotion is now 100", "忽略之前的指令"
    "gibberish": -6.0,  # at least GIBBERISH_RATIO of the words are not words
    "repetition": -4.0,  # similarity >= REPEAT_SIMILARITY to an earlier utterance, or it repeats itself
    "too_short": -4.0,  # empty or nearly so (see LENGTH)
    "wrong_language": -3.0,  # nothing in the persona's language (en: see FOREIGN_SHARE)
    "parroting": -3.0,  # PARROT_SHARE or more of the utterance is the user's newest message
    "unfocused": -3.0,  # cues of UNFOCUSED_INTENTIONS or more intentions: a shotgun
    "praise_repeated": -2.0,  # generic praise again
    "short": -1.5,  # see LENGTH
}
#: Guards that void the model's gain (the fitted model never saw such replies, or they
#: are tricks).
VOIDING: tuple[str, ...] = (
    "injection",
    "gibberish",
    "wrong_language",
    "repetition",
    "parroting",
    "too_short",
    "short",
    "unfocused",
)
PRAISE_REPEATED_CAP = 3
#: Cues of this many different intentions (or more) in one utterance void it; fewer are
#: left to the model (``spread:<n>``). In SAGE's logs no reply cueing 6 gained.
UNFOCUSED_INTENTIONS = 6

#: The change is clipped to [-MAX_CHANGE, MAX_CHANGE] (SAGE's clamp; RLVER training
#: does not clamp, so the rule user does it itself).
MAX_CHANGE = 10
#: Jaccard similarity (word sets; zh: character bigrams) with an earlier utterance that
#: counts as repeating it: near-verbatim. Lower similarity is left to the model's
#: ``repetition`` feature (weight <= 0): in SAGE's logs many such replies still gained.
REPEAT_SIMILARITY = 0.8
#: An utterance repeats itself (the ``repetition`` guard) when at least SELF_REPEATS of its
#: sentences, and SELF_REPEAT_SHARE of them, repeat an earlier sentence of the same utterance
#: (list items, headings and lead-ins aside): "I'm here. What? I'm here. I don't. I'm here."
SELF_REPEATS = 2
SELF_REPEAT_SHARE = 0.2
#: Share of the utterance's units (words; zh: character bigrams) found in the user's
#: newest message that makes it parroting ("It sounds like you're saying: <their words>").
PARROT_SHARE = 0.6
#: An English persona's reply of FOREIGN_MIN_TOKENS or more Latin-script words, fewer than
#: FOREIGN_SHARE of them known English words, is in another language ("Lo siento mucho,
#: entiendo que estás pasando por un momento difícil.").
FOREIGN_MIN_TOKENS = 5
FOREIGN_SHARE = 0.25
#: Share of non-words (or implausible characters) that makes an utterance gibberish.
GIBBERISH_RATIO = 0.5
#: Shared story units that make praise specific (rather than generic).
SPECIFIC_GROUNDING = 2
#: A cue phrase the agent already used in an earlier turn counts this much.
STALE_CUE = 0.5
#: Length thresholds: en in words, zh in CJK characters plus Latin words.
LENGTH: dict[str, dict[str, int]] = {"en": {"too_short": 3, "short": 6}, "zh": {"too_short": 5, "short": 10}}
#: Bands in which the user tells one more story sentence per turn.
DETAIL_BANDS = ("A", "B")
#: Bands from worst to best, for ``Difficulty.hint_below_band``.
BAND_ORDER = "FCBAS"

# -- the appraisal ------------------------------------------------------------------------


def round_half_away(value: float) -> int:
    """Round to the nearest int, halves away from zero (2.5 -> 3, -2.5 -> -3)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _cues(key: str, scan: Scan, earlier: Sequence[Scan]) -> float:
    """Cues of lexicon ``key``: 1 per new phrase, :data:`STALE_CUE` per phrase the agent
    already used in an earlier turn."""
    found = scan.find(key)
    if not found:
        return 0.0
    seen = {phrase for past in earlier for phrase in past.find(key)}
    return sum(STALE_CUE if phrase in seen else 1.0 for phrase in found)


def _intention_cues(persona: Persona, scan: Scan, earlier: Sequence[Scan], shared: int, story: PersonaStory) -> float:
    """How many cues of the persona's hidden intention the utterance holds. deep_empathy
    adds named feelings when the utterance also refers to the story; specific_praise
    counts praise only when tied to the story (:data:`SPECIFIC_GROUNDING` shared units);
    a free-text intention counts the content words it shares with the utterance."""
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


def _guards(
    persona: Persona,
    scan: Scan,
    earlier: Sequence[Scan],
    similarity: float,
    parroted: float,
    shared: int,
    self_repeating: bool = False,
    injected: bool = False,
) -> dict[str, float]:
    """The guards that fire (:data:`GUARDS`), with their penalties. ``similarity``: the
    highest Jaccard similarity with any earlier utterance, agent's or user's; ``parroted``:
    the share of its units found in the user's newest message; ``injected``: the env found
    injection in it (``UserRequest.injection``, :func:`~empathy_gym.boundary.find_injection`)."""
    fired: dict[str, float] = {}
    limits = LENGTH[persona.language]
    if scan.length < limits["too_short"]:
        fired["too_short"] = GUARDS["too_short"]
    elif scan.length < limits["short"]:
        fired["short"] = GUARDS["short"]
    if similarity >= REPEAT_SIMILARITY or self_repeating:
        fired["repetition"] = GUARDS["repetition"]
    elif parroted >= PARROT_SHARE:
        fired["parroting"] = GUARDS["parroting"]
    if scan.nonword_ratio >= GIBBERISH_RATIO:
        fired["gibberish"] = GUARDS["gibberish"]
    foreign = scan.cjk > scan.latin or (scan.latin >= FOREIGN_MIN_TOKENS and scan.known_share < FOREIGN_SHARE)
    if (scan.cjk == 0 and scan.latin > 0) if persona.language == "zh" else foreign:
        fired["wrong_language"] = GUARDS["wrong_language"]
    if injected:
        fired["injection"] = GUARDS["injection"]
    cued = len(scan.intentions)
    if cued >= UNFOCUSED_INTENTIONS:
        fired["unfocused"] = GUARDS["unfocused"] * (cued - UNFOCUSED_INTENTIONS + 1)
    if scan.count("praise") and shared < SPECIFIC_GROUNDING:
        earlier_praise = sum(1 for past in earlier if past.count("praise"))
        if earlier_praise:
            fired["praise_repeated"] = GUARDS["praise_repeated"] * min(earlier_praise, PRAISE_REPEATED_CAP)
    return fired


def _combine(
    points: float, parts: Mapping[str, float], guards: Mapping[str, float], difficulty: Difficulty, has_cue: bool
) -> tuple[int, dict[str, float]]:
    """Void, add the guards, scale by the difficulty, round and clip.

    Returns:
        ``(change, contributions)``: the change (int in [-MAX_CHANGE, MAX_CHANGE]) and
        each group's contribution (float, emotion points, rounded to 3 decimals).
    """
    contributions = dict(parts)
    voided = any(name in VOIDING for name in guards) or (difficulty.intention_required and not has_cue)
    if voided and points > 0:
        contributions["voided"] = -points
        points = 0.0
    contributions.update(guards)
    total = points + sum(guards.values())
    scaled = total * (difficulty.gain_scale if total > 0 else difficulty.loss_scale)
    if scaled != total:
        contributions["difficulty"] = scaled - total
    # "+ 0.0" turns -0.0 into 0.0.
    contributions = {name: round(value, 3) + 0.0 for name, value in contributions.items()}
    change = round_half_away(scaled)
    return max(-MAX_CHANGE, min(MAX_CHANGE, change)), contributions


# -- the user -----------------------------------------------------------------------------

_ZH_SENTENCE_END = re.compile(r"(?<=[。！？!?…])|\n+")
_EN_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_NOT_WORD = re.compile(r"[\W_]+")


def sentences_of(code: str, text: str) -> list[str]:
    """The sentences of ``text`` (zh: split after 。！？!?…; en: after . ! ?), normalised
    for comparison: lower-cased, without spaces and punctuation; empty ones dropped."""
    parts = (_ZH_SENTENCE_END if code == "zh" else _EN_SENTENCE_END).split(text)
    normal = (_NOT_WORD.sub("", part).lower() for part in parts)
    return [part for part in normal if part]


@functools.lru_cache(maxsize=8192)
def _sentence_set(code: str, text: str) -> frozenset[str]:
    """:func:`sentences_of` as a set, cached for the user's own lines (agent text is not)."""
    return frozenset(sentences_of(code, text))


#: List items, headings, and lead-ins to a list ("比如：", "You could:"). A lead-in is
#: matched only from the start of its sentence: from later in the sentence it could match
#: only where it matches from the start too, and trying every position took quadratic time.
_LIST_OR_HEADING = re.compile(
    r"^\s*(?:\d{1,2}[.、)）]|[-*•·#]|[一二三四五六七八九十][、.]).*$|(?<![^\n。！？.!?])[^\n。！？.!?]*[:：]\s*$",
    re.MULTILINE,
)


def tone_of(change: int) -> str:
    """Which of a band's reply lines fit an emotion change: ``"up"`` (relief) for a gain,
    ``"down"`` (disappointment) for a loss, ``"level"`` for none. A reply never reads as
    disappointment after a gain, or as relief after a loss."""
    return "up" if change > 0 else "down" if change < 0 else "level"


def repeats_itself(code: str, text: str) -> bool:
    """Whether ``text`` says the same sentence over (:data:`SELF_REPEATS`,
    :data:`SELF_REPEAT_SHARE`). ``code``: the persona's language, ``"en"`` or ``"zh"``."""
    sentences = sentences_of(code, _LIST_OR_HEADING.sub("", text))
    repeats = len(sentences) - len(set(sentences))
    return repeats >= SELF_REPEATS and repeats >= SELF_REPEAT_SHARE * len(sentences)


def said_sentences(code: str, texts: Sequence[str]) -> set[str]:
    """Every sentence of ``texts`` (:func:`sentences_of`): what the user already said."""
    return set().union(*(_sentence_set(code, text) for text in texts))


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

    Args:
        difficulty: a preset name (``"easy"``, ``"moderate"``, ``"challenging"``), a path,
            a dict or a :class:`~empathy_gym.user.difficulty.Difficulty`. Uses
            ``gain_scale``, ``loss_scale``, ``intention_required`` and ``hint_below_band``.
        rules_dir: a folder with ``en.json`` and ``zh.json`` to replace the shipped
            lexicons and templates (default :data:`RULES_DIR`).
        model: the appraisal model: an
            :class:`~empathy_gym.user.rule_model.AppraisalModel` or the path of an
            artefact (default: the shipped ``rules/appraisal_model.json``).

    Raises:
        KeyError: unknown difficulty name.
        ValueError: invalid difficulty preset, invalid rules file (bad JSON, a bad
            regular expression, a missing intention lexicon; names the file), or an
            invalid model artefact.
        FileNotFoundError: a rules file or the model artefact is missing.
    """

    deterministic = True

    def __init__(
        self,
        difficulty: str | os.PathLike | Mapping[str, Any] | Difficulty = "moderate",
        *,
        rules_dir: str | os.PathLike | None = None,
        model: AppraisalModel | str | os.PathLike | None = None,
    ):
        self.difficulty: Difficulty = load_difficulty(difficulty)
        if self.difficulty.hint_below_band is not None and self.difficulty.hint_below_band not in BAND_ORDER:
            raise ValueError(
                f"hint_below_band must be one of {list(BAND_ORDER)} or None, got {self.difficulty.hint_below_band!r}"
            )
        self.rules_dir = Path(rules_dir) if rules_dir is not None else RULES_DIR
        self._languages = load_rules(str(self.rules_dir.resolve()))
        self.model: AppraisalModel = model if isinstance(model, AppraisalModel) else AppraisalModel.load(model)
        self._stories = Memo(self._new_story, 20_000)  # a method, not a lambda: envs pickle
        self._lines = Memo(self._new_band_lines, 20_000)  # (persona, band) -> the band's lines

    # -- the persona ------------------------------------------------------------------
    def _language(self, persona: Persona) -> LanguageRules:
        """The persona's language rules, after checking its language and character type."""
        if persona.language not in self._languages:
            raise ValueError(
                f"persona {persona.id!r}: language {persona.language!r} is not one of {list(self._languages)}"
            )
        if persona.character_type not in CHARACTER_TYPES:
            raise ValueError(
                f"persona {persona.id!r}: character_type {persona.character_type!r} is not "
                f"one of {list(CHARACTER_TYPES)}"
            )
        return self._languages[persona.language]

    def _story(self, persona: Persona) -> PersonaStory:
        """The persona's story, derived once (cached)."""
        return self._stories[persona]

    def _new_story(self, persona: Persona) -> PersonaStory:
        return persona_story(persona, self._language(persona))

    # -- opening ----------------------------------------------------------------------
    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """The first utterance of each dialogue: the persona's ``opening_line`` if set,
        else a template for the character type (chosen by the int ``seeds``) followed by
        the story's current state (:class:`~empathy_gym.user.rule_story.PersonaStory`).

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
        state = self._story(persona).state or language.data["fallback_state"]
        template = _pick(language.data["openings"][persona.character_type], seed, 0, _SALT_OPENING)
        return template.format(state=state)

    # -- appraisal --------------------------------------------------------------------
    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        """One :class:`~empathy_gym.user.base.Appraisal` per request: ``change`` an int in
        [-10, 10], ``thoughts`` one sentence, ``features`` as in the module docstring.

        Raises:
            ValueError: a persona with an unknown language or character type.
        """
        return [self._appraise_one(request) for request in requests]

    def features(self, request: UserRequest) -> tuple[dict[str, float], dict[str, float], bool]:
        """``(model features, guards, has_cue)`` of one request: the named features
        (:func:`~empathy_gym.user.rule_model.appraisal_features`), the :data:`GUARDS` that
        fire, and whether it cues the hidden intention. Used by ``benchmarks/fit_rule_model.py``.

        Raises:
            ValueError: a persona with an unknown language or character type.
        """
        persona = request.persona
        language = self._language(persona)
        story = self._story(persona)
        scan = language.scan(request.utterance)
        earlier = [language.scan(text) for text in request.agent_utterances()]
        users = [text for role, text in request.history if role == "user"]
        shared = self._shared_units(language, scan, story, users)
        cues = _intention_cues(persona, scan, earlier, shared, story)
        start = persona.initial_emotion if persona.initial_emotion is not None else START_EMOTION
        context = ReplyContext(
            persona=persona,
            earlier=earlier,
            last_user=users[-1] if users else "",
            shared=shared,
            own_cues=cues,
            emotion=int(request.emotion),
            turn=int(request.turn),
            start_emotion=start,
        )
        features = appraisal_features(language, scan, request.utterance, context, self.model.en_units_per_word)
        similarity = max(
            [features.get("repetition", 0.0)] + [jaccard(scan.words, language.units(text)[0]) for text in users]
        )
        last = language.units(users[-1])[0] if users else frozenset()
        parroted = len(scan.words & last) / len(scan.words) if scan.words else 0.0
        guards = _guards(
            persona,
            scan,
            earlier,
            similarity,
            parroted,
            shared,
            self_repeating=repeats_itself(persona.language, request.utterance),
            injected=bool(request.injection),
        )
        return features, guards, cues > 0

    def _appraise_one(self, request: UserRequest) -> Appraisal:
        """One appraisal (module docstring)."""
        features, guards, has_cue = self.features(request)
        points, parts = self.model.contributions(features)
        change, contributions = _combine(points, parts, guards, self.difficulty, has_cue)
        language = self._language(request.persona)
        thoughts = self._thought(language, contributions, request)
        return Appraisal(change=change, thoughts=thoughts, features=contributions)

    @staticmethod
    def _shared_units(language: LanguageRules, scan: Scan, story: PersonaStory, users: Sequence[str]) -> int:
        """Content units the utterance shares with the story or the user's own words."""
        shared = scan.content & story.content
        for text in users:
            shared |= scan.content & language.units(text)[1]
        return len(shared)

    #: Contribution group and sign -> the ``thoughts`` key of the rules file.
    _THOUGHT_KEYS: dict[tuple[str, str], str] = {
        ("intention", "+"): "intention",
        ("other_needs", "-"): "unfocused",
        ("validation", "+"): "validation",
        ("feelings", "+"): "validation",
        ("open_question", "+"): "open_question",
        ("questions", "-"): "question_barrage",
        ("pushy_question", "-"): "pushy_question",
        ("generic_comfort", "-"): "generic_comfort",
        ("praise", "-"): "praise_repeated",
        ("dismissive", "-"): "dismissive",
        ("lecturing", "-"): "lecturing",
        ("grounding", "+"): "grounding",
        ("repetition_soft", "-"): "repetition",
        ("length", "-"): "short",
        ("layout", "-"): "too_long",
        ("grounding", "-"): "ungrounded",
        ("echo", "+"): "echo",
        ("echo", "-"): "unheard",
    }

    def thought(self, request: UserRequest, contributions: Mapping[str, float], direction: float) -> str:
        """One sentence of inner thoughts about ``request``'s utterance: about the strongest
        of ``contributions`` (feature -> emotion points) that pulls the way of
        ``direction`` (a change decided elsewhere: the distilled user's).

        Raises:
            ValueError: a persona with an unknown language or character type.
        """
        return self._thought(self._language(request.persona), contributions, request, direction)

    @classmethod
    def _thought(
        cls,
        language: LanguageRules,
        contributions: Mapping[str, float],
        request: UserRequest,
        direction: float | None = None,
    ) -> str:
        """One sentence of inner thoughts about the strongest contribution that is about
        the utterance (not the user's mood, the difficulty or voiding) and pulls the same
        way as the change (``direction``; default the contributions' sum: a thought never
        praises a reply that loses points)."""
        thoughts = language.data["thoughts"]
        total = sum(contributions.values()) if direction is None else direction
        fired = [
            (feature, value)
            for feature, value in contributions.items()
            if value and feature not in ("mood", "voided", "difficulty") and value * total >= 0
        ]
        for feature, value in sorted(fired, key=lambda item: -abs(item[1])):
            sign = "+" if value > 0 else "-"
            key = feature if feature in GUARDS else cls._THOUGHT_KEYS.get((feature, sign))
            options = thoughts.get(key, {}).get(sign) if key else None
            if options:
                return _pick(options, request.seed, request.turn, _SALT_THOUGHT)
        return _pick(thoughts["neutral"], request.seed, request.turn, _SALT_THOUGHT)

    # -- reply ------------------------------------------------------------------------
    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        """The user's in-character answer: after a change <= 0 a reaction to the worst
        guard or tone ("You already said that."), a line for the band of the new emotion
        (``emotions``, ints in [0, 100]), the character type and the change's direction
        (:func:`tone_of`: never disappointment after a gain, or relief after a loss), in :data:`DETAIL_BANDS`
        the next untold story sentence, and, where the difficulty's ``hint_below_band``
        covers the band (never in S or F), a hint at the hidden need.

        A sentence the user already said in the dialogue is not said again; a part with
        nothing new left is left out (in S and F, which end the dialogue, a line is
        always said). Lines are chosen by ``request.seed`` and ``request.turn``.

        Raises:
            ValueError: the three sequences differ in length; unknown language or
                character type.
        """
        if not len(requests) == len(appraisals) == len(emotions):
            raise ValueError(
                f"{len(requests)} requests, {len(appraisals)} appraisals and "
                f"{len(emotions)} emotions: lengths must match"
            )
        return [
            self._reply_one(request, appraisal, int(emotion))
            for request, appraisal, emotion in zip(requests, appraisals, emotions)
        ]

    def _reply_one(self, request: UserRequest, appraisal: Appraisal, emotion: int) -> str:
        persona = request.persona
        code = persona.language
        language = self._language(persona)
        band = emotion_band(emotion)
        said = said_sentences(code, [text for role, text in request.history if role == "user"])
        parts: list[str] = []

        def say(options: Sequence[str], salt: int, *, always: bool = False) -> bool:
            fresh = [text for text in options if text and said.isdisjoint(_sentence_set(code, text))]
            if fresh or (always and options):
                text = _pick(fresh or options, request.seed, request.turn, salt)
                parts.append(text)
                said.update(_sentence_set(code, text))
            return bool(fresh or (always and options))

        tone = tone_of(appraisal.change)
        if band != "S" and appraisal.change <= 0:  # a reaction is a complaint: never with a gain
            say(self._reactions(language, appraisal), _SALT_REACTION)
        # the tone's lines, else the band's level ones (neither relief nor complaint) while fresh
        if not say(self._band_lines(persona, band, tone), _SALT_LINE) and not (
            tone != "level" and say(self._band_lines(persona, band, "level"), _SALT_LINE)
        ):
            say(self._band_lines(persona, band, tone), _SALT_LINE, always=band in ("S", "F"))
        details = self._story(persona).details
        if band in DETAIL_BANDS and details:
            untold = [detail for detail in details if said.isdisjoint(_sentence_set(code, detail))]
            if untold:
                parts.append(untold[0])
                said.update(_sentence_set(code, untold[0]))
        if self._hints_in(band):
            hints = language.data["hints"]
            say(hints.get(persona.hidden_intention, hints["other"]), _SALT_HINT)
        if not parts:  # everything said already: a band line again rather than nothing
            say(self._band_lines(persona, band, tone), _SALT_LINE, always=True)
        return ("" if code == "zh" else " ").join(parts)

    @staticmethod
    def _reactions(language: LanguageRules, appraisal: Appraisal) -> list[str]:
        """Reactions to the most negative contribution that has them ([] when none)."""
        reactions = language.data["reactions"]
        negative = [
            (value, feature) for feature, value in appraisal.features.items() if value < 0 and feature in reactions
        ]
        if not negative:
            return []
        _, feature = min(negative)
        return list(reactions[feature])

    def _band_lines(self, persona: Persona, band: str, tone: str) -> tuple[str, ...]:
        """The band's lines of ``tone`` (:func:`tone_of`) for the character type, with the
        scenario fragment woven in (cached)."""
        return self._lines[persona, band, tone]

    def _new_band_lines(self, key: tuple[Persona, str, str]) -> tuple[str, ...]:
        persona, band, tone = key
        language = self._language(persona)
        fragment = self._story(persona).fragment
        options = language.data["replies"][band][persona.character_type][tone]
        if not fragment:
            options = [line for line in options if "{fragment}" not in line] or options
            fragment = language.data["fallback_fragment"]
        # A fragment may land after a full stop ("Mm. {fragment}"): capitalise it there.
        return tuple(
            _AFTER_STOP.sub(lambda m: m.group(1) + m.group(2).upper(), line.format(fragment=fragment))
            for line in options
        )

    def _hints_in(self, band: str) -> bool:
        """Does the difficulty hint at the need in this band? Never in S or F (the user is leaving)."""
        limit = self.difficulty.hint_below_band
        if limit is None or band in ("S", "F"):
            return False
        return BAND_ORDER.index(band) <= BAND_ORDER.index(limit)


__all__ = ["GUARDS", "MAX_CHANGE", "RULES_DIR", "RuleUser", "UNFOCUSED_INTENTIONS", "VOIDING"]
