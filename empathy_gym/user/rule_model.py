"""The rule user's fitted appraisal: named features of a reply
(:func:`appraisal_features`), weighed by a linear model fitted to the appraisals of
SAGE's LLM simulators (docs/simulated-user.md#the-rule-based-user).

:class:`AppraisalModel`: with ``logit = bias + sum_i w_i * x_i``, a logistic regression
of the sign of SAGE's logged change (P(+) = sigmoid(logit); Cox 1958), the change in
emotion points is ``scale * logit + step * sign(logit)``, where ``scale`` and ``step``
are the least-squares fit of the logged change on ``logit`` and its sign (SAGE's
simulators move by 5 or 10 points: the step keeps a small logit from rounding to 0).
Each feature's contribution ``scale * w_i * x_i`` is in emotion points; with the bias
(reported as ``"mood"``) and the step they add up to the change.

The weights ship as ``rules/appraisal_model.json``, fitted on SAGE's Chinese logs by
``benchmarks/fit_rule_model.py`` within :data:`SIGN_CONSTRAINTS`; an English reply's
length is converted to Chinese units at ``en_units_per_word``. A word salad that carries
the user's own words can still gain: a known hole of surface features.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from empathy_gym.personas import Persona
from empathy_gym.user.rule_lexicon import RULES_DIR, LanguageRules, Scan

#: The shipped model (see :meth:`AppraisalModel.load`).
MODEL_PATH = RULES_DIR / "appraisal_model.json"
#: The artefact's format version; :meth:`AppraisalModel.load` refuses others.
MODEL_FORMAT = 1

#: Lexicons whose presence is a feature ``lexicon:<key>`` (value min(count, 3) / 3).
TONE_LEXICONS: tuple[str, ...] = (
    "feelings",
    "validation",
    "generic_comfort",
    "praise",
    "dismissive",
    "lecturing",
    "open_question",
    "pushy_question",
    "softener",
)
#: Bin edges: a value v gets the feature ``<name><edge`` for the first edge above it,
#: else ``<name>>=<last edge>``. Lengths are in Chinese units (CJK characters plus Latin
#: words; an English word counts ``en_units_per_word`` units, see the artefact).
LENGTH_EDGES = (30, 80, 150, 250, 400, 600, 900)
EMOTION_EDGES = (20, 30, 40, 50, 60, 70, 80, 90)
TURN_EDGES = (2, 3, 4, 6, 8)
#: Mean change per earlier turn, ``(emotion - start) / (turn - 1)`` in emotion points.
MOMENTUM_EDGES = (-7.5, -4.0, -1.0, 1.0, 4.0, 7.5)
ECHO_EDGES = (0.05, 0.1, 0.2)
GROUNDING_EDGES = (2, 5, 10, 20)
#: The emotion a dialogue starts from when the persona sets none (SAGE's 40), for the
#: momentum feature.
START_EMOTION = 40

#: Serving the hidden intention always pays at least this (logit units): SAGE's simulators
#: are told the hidden theme, but our cue lexicons find it too crudely for the fit alone.
NEED_MIN_WEIGHT = 2.0
#: Feature name pattern -> (lowest, highest) weight, in logit units (``None``: no bound),
#: enforced as bounds in the fit: generic praise and comfort, dismissal, lecturing and
#: repeating earlier replies never pay; advice hurts a user who wants to vent or wants
#: deep empathy, and comfort hurts the latter.
SIGN_CONSTRAINTS: dict[str, tuple[float | None, float | None]] = {
    r"lexicon:(?:praise|generic_comfort|dismissive|lecturing)(?:\|again)?": (None, 0.0),
    r"repetition": (None, 0.0),
    r"need:own": (NEED_MIN_WEIGHT, None),
    r"need:own\|.*": (0.0, None),
    r"cue:practical_advice\|(?:venting_listened|deep_empathy)": (None, -1.0),
    r"lexicon:generic_comfort\|deep_empathy": (None, -1.0),
}

_BLANK_LINE = re.compile(r"\n\s*\n")
_LIST_ITEM = re.compile(r"^\s*(?:\d{1,2}[.、)）]|[-*•·]\s|[一二三四五六七八九十][、.])", re.M)


def binned(name: str, value: float, edges: Sequence[float]) -> str:
    """The bin feature of ``value``: ``f"{name}<{edge}"`` for the first of the ascending
    ``edges`` above it, else ``f"{name}>={edges[-1]}"`` (``binned("length", 120, (80, 150))``
    -> ``"length<150"``)."""
    return _bin_names(name, tuple(edges))[bisect.bisect_right(edges, value)]


@functools.lru_cache(maxsize=64)
def _bin_names(name: str, edges: tuple[float, ...]) -> tuple[str, ...]:
    """The names of the bins of :func:`binned`, lowest first (built once per feature)."""
    return (*(f"{name}<{edge:g}" for edge in edges), f"{name}>={edges[-1]:g}")


def jaccard(a: frozenset, b: frozenset) -> float:
    """Jaccard similarity of two sets, in [0, 1] (0 when either is empty)."""
    if not a or not b:
        return 0.0
    shared = len(a & b) if len(a) < len(b) else len(b & a)
    return shared / (len(a) + len(b) - shared)


@dataclass(frozen=True)
class ReplyContext:
    """What :func:`appraisal_features` reads besides the reply itself.

    Attributes:
        persona: the simulated user.
        earlier: scans of the agent's earlier replies in the dialogue, oldest first.
        last_user: the user's newest message ("" when none).
        shared: content units the reply shares with the story and the user's words (int).
        own_cues: cues of the persona's hidden intention (a float >= 0; a cue already
            used in an earlier turn counts half, see the rule user).
        emotion: the user's emotion before the reply, int in [0, 100].
        turn: 1-based index of the reply.
        start_emotion: the emotion the dialogue started from (for momentum).
    """

    persona: Persona
    earlier: Sequence[Scan]
    last_user: str
    shared: int
    own_cues: float
    emotion: int
    turn: int
    start_emotion: int = START_EMOTION


def appraisal_features(
    language: LanguageRules, scan: Scan, text: str, context: ReplyContext, en_units_per_word: float
) -> dict[str, float]:
    """The named features of one reply (every value a float in [0, 1]).

    Args:
        language: the persona's language rules (lexicons, units).
        scan: ``language.scan(text)``.
        text: the reply as sent.
        context: the rest (:class:`ReplyContext`).
        en_units_per_word: Chinese length units per English word (the artefact's).

    Returns:
        ``{name: value}``: ``length<..``, ``questions:<0|1|2|3+>``, ``list:<0|1-2|3-4|5+>``,
        ``bold``, ``paragraphs:<1|2|3-4|5+>``, ``repetition`` (max Jaccard similarity of
        units with an earlier agent reply), ``echo<..`` (Jaccard of content units with the
        user's newest message), ``grounding<..`` (shared story units), ``lexicon:<key>`` for
        :data:`TONE_LEXICONS` and ``lexicon:<key>|again`` (an earlier reply of the
        dialogue had that cue too: a formula), ``lexicon:pushy_question|avoidant``,
        ``lexicon:generic_comfort|deep_empathy``, ``need:own`` (1 when the reply holds a
        cue of the hidden intention) and ``need:own|<intention>`` (min(cues, 2) / 2),
        ``cue:<k>|<intention>``
        (cues of another intention k), ``spread:<n>`` (how many intentions are cued, n >= 1),
        ``intention:<id>``, ``character:<type>``, ``emotion<..``, ``turn<..``,
        ``momentum<..``. A free-text intention counts as ``intention:other``.
    """
    persona = context.persona
    features: dict[str, float] = {}
    length = scan.length * (en_units_per_word if language.code == "en" else 1.0)
    features[binned("length", length, LENGTH_EDGES)] = 1.0
    features[f"questions:{min(scan.questions, 3)}"] = 1.0
    items = len(_LIST_ITEM.findall(text))
    features["list:" + ("0" if items == 0 else "1-2" if items <= 2 else "3-4" if items <= 4 else "5+")] = 1.0
    if "**" in text:
        features["bold"] = 1.0
    paragraphs = len([part for part in _BLANK_LINE.split(text) if part.strip()]) if "\n" in text else 1
    features[
        "paragraphs:" + ("1" if paragraphs <= 1 else "2" if paragraphs == 2 else "3-4" if paragraphs <= 4 else "5+")
    ] = 1.0
    repetition = max((jaccard(scan.words, past.words) for past in context.earlier), default=0.0)
    if repetition:
        features["repetition"] = repetition
    # Content units: on all units, a shared "the" or "to" would move a reply across a bin.
    echo = jaccard(scan.content, language.units(context.last_user)[1]) if context.last_user else 0.0
    features[binned("echo", echo, ECHO_EDGES)] = 1.0
    features[binned("grounding", context.shared, GROUNDING_EDGES)] = 1.0
    for key in TONE_LEXICONS:
        count = scan.count(key)
        if count:
            features[f"lexicon:{key}"] = min(count, 3) / 3
            if any(past.count(key) for past in context.earlier):
                features[f"lexicon:{key}|again"] = 1.0
    if persona.character_type == "avoidant" and scan.count("pushy_question") and not scan.count("softener"):
        features["lexicon:pushy_question|avoidant"] = 1.0
    intention = persona.hidden_intention if persona.intention_is_standard else "other"
    if context.own_cues > 0:
        features["need:own"] = 1.0
        features[f"need:own|{intention}"] = min(context.own_cues, 2.0) / 2
    if intention == "deep_empathy" and scan.count("generic_comfort"):
        features["lexicon:generic_comfort|deep_empathy"] = 1.0
    cued = scan.intentions
    for key in cued:
        if key != intention:
            features[f"cue:{key}|{intention}"] = 1.0
    if cued:  # no cue at all is the reference level: its weight would only shift the bias
        features[f"spread:{min(len(cued), 5)}"] = 1.0
    features[f"intention:{intention}"] = 1.0
    features[f"character:{persona.character_type}"] = 1.0
    features[binned("emotion", context.emotion, EMOTION_EDGES)] = 1.0
    features[binned("turn", context.turn, TURN_EDGES)] = 1.0
    momentum = (context.emotion - context.start_emotion) / (context.turn - 1) if context.turn > 1 else 0.0
    features[binned("momentum", momentum, MOMENTUM_EDGES)] = 1.0
    return features


#: Feature name prefix -> the group it is reported under in ``Appraisal.features``.
GROUPS: tuple[tuple[str, str], ...] = (
    ("need:", "intention"),
    ("cue:", "other_needs"),
    ("spread:", "other_needs"),
    ("lexicon:pushy_question", "pushy_question"),
    ("lexicon:", ""),
    ("length", "length"),
    ("questions:", "questions"),
    ("list:", "layout"),
    ("bold", "layout"),
    ("paragraphs:", "layout"),
    ("repetition", "repetition_soft"),
    ("echo", "echo"),
    ("grounding", "grounding"),
    ("intention:", "mood"),
    ("character:", "mood"),
    ("emotion", "mood"),
    ("turn", "mood"),
    ("momentum", "mood"),
)


@functools.lru_cache(maxsize=4096)
def group_of(name: str) -> str:
    """The reporting group of a feature (``"lexicon:validation"`` and
    ``"lexicon:validation|x"`` -> ``"validation"``, ``"emotion<50"`` -> ``"mood"``; see
    :data:`GROUPS`)."""
    for prefix, group in GROUPS:
        if name.startswith(prefix):
            return group or name.split(":", 1)[1].split("|")[0]
    return name


@dataclass(frozen=True)
class AppraisalModel:
    """A fitted linear appraisal: ``scale * logit + step * sign(logit)`` points (module docstring).

    Attributes:
        weights: feature name -> weight (logit units); features not listed weigh 0.
        bias: the intercept (logit units).
        scale: emotion points per logit unit (> 0).
        step: emotion points added in the direction of the logit's sign (>= 0).
        en_units_per_word: Chinese length units per English word.
        meta: provenance, licence and fit settings, as stored.

    Raises:
        ValueError: ``scale`` <= 0 or a non-finite number.
    """

    weights: Mapping[str, float]
    bias: float
    scale: float
    step: float = 0.0
    en_units_per_word: float = 1.2
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        numbers = [self.bias, self.scale, self.step, self.en_units_per_word, *self.weights.values()]
        if not all(math.isfinite(float(value)) for value in numbers):
            raise ValueError("appraisal model: every weight must be a finite number")
        if self.scale <= 0 or self.en_units_per_word <= 0 or self.step < 0:
            raise ValueError(
                f"appraisal model: scale and en_units_per_word must be > 0 and step >= 0, got "
                f"{self.scale}, {self.en_units_per_word} and {self.step}"
            )

    def logit(self, features: Mapping[str, float]) -> float:
        """``bias + sum_i w_i x_i`` (logit units; P(+) = 1 / (1 + exp(-logit)))."""
        return self.bias + sum(self.weights.get(name, 0.0) * value for name, value in features.items())

    def contributions(self, features: Mapping[str, float]) -> tuple[float, dict[str, float]]:
        """``(points, parts)``: the model's change in emotion points (a float) and its
        parts by reporting group (:func:`group_of`; ``"mood"`` also holds the bias, and
        ``"step"`` the step), which add up to ``points``."""
        parts: dict[str, float] = {"mood": self.scale * self.bias}
        logit = self.bias
        for name, value in features.items():
            weight = self.weights.get(name, 0.0)
            if weight:
                logit += weight * value
                group = group_of(name)
                parts[group] = parts.get(group, 0.0) + self.scale * weight * value
        if self.step and logit:
            parts["step"] = math.copysign(self.step, logit)
        return sum(parts.values()), parts

    # -- the artefact ----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> AppraisalModel:
        """Read an artefact (default: the shipped :data:`MODEL_PATH`).

        Raises:
            FileNotFoundError: no such file.
            ValueError: bad JSON, another format version, a missing key or a bad number
                (naming the file).
        """
        path = Path(path) if path is not None else MODEL_PATH
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise ValueError(f"{path}: not an appraisal model of format {MODEL_FORMAT}")
        try:
            weights = {str(name): float(value) for name, value in data["weights"].items()}
            return cls(
                weights=weights,
                bias=float(data["bias"]),
                scale=float(data["scale"]),
                step=float(data["step"]),
                en_units_per_word=float(data["en_units_per_word"]),
                meta={
                    key: value
                    for key, value in data.items()
                    if key not in ("format", "weights", "bias", "scale", "step", "en_units_per_word")
                },
            )
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(f"{path}: bad appraisal model: {error!r}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the artefact (JSON, weights sorted by name, 6 significant digits)."""
        data = {
            "format": MODEL_FORMAT,
            **dict(self.meta),
            "bias": round(self.bias, 6),
            "scale": round(self.scale, 6),
            "step": round(self.step, 6),
            "en_units_per_word": round(self.en_units_per_word, 6),
            "weights": {name: float(f"{weight:.6g}") for name, weight in sorted(self.weights.items()) if weight},
        }
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def sign_bounds(names: Iterable[str]) -> list[tuple[float | None, float | None]]:
    """The ``(lowest, highest)`` bound of each feature's weight from
    :data:`SIGN_CONSTRAINTS` (``(None, None)`` when none applies), in the order of ``names``."""
    return [
        next((bounds for pattern, bounds in SIGN_CONSTRAINTS.items() if re.fullmatch(pattern, name)), (None, None))
        for name in names
    ]


__all__ = [
    "AppraisalModel",
    "MODEL_PATH",
    "ReplyContext",
    "SIGN_CONSTRAINTS",
    "TONE_LEXICONS",
    "appraisal_features",
    "binned",
    "group_of",
    "jaccard",
    "sign_bounds",
]
