"""The distilled appraiser: a causal language model reads the persona and the dialogue, and
a small head on its hidden states and the rule user's named features predicts the emotion
change that an LLM simulator would give the agent's newest reply (docs/simulated-user.md,
"The distilled user"; trained by :mod:`empathy_gym.user.distill`).

What the language model reads (token ids; each piece is encoded alone, as data:
``split_special_tokens=True``, and this layout's own markers are broken inside it):

    persona   "A person talks about a problem.\\nWhat they need: {intention}\\n
               Character: {type}\\nWho: {profile}\\nSituation: {scenario}\\n"
    turn t    "\\nPerson: {user message}\\nListener: {reply t}\\n{READOUT}"

A dialogue at turn t is the persona and turns 1..t (the user message of turn t is the one
that reply t answers), so every turn extends the last: with a
:class:`~empathy_gym.backends.prefix_cache.PrefixKVCache` a turn reads only its own
message and reply, never the whole dialogue again. Long pieces keep their head and tail
(:class:`Layout`).

The head: ``x = [states at the readout token and mean over the reply's tokens, at each of
the artefact's layers, standardised and clipped to +-Z_CLIP; the named features]``,
``logits = W x + b`` over :data:`BINS` (multinomial logistic regression; Cox 1966); the
distribution is ``softmax(logits)`` and the change is its mean, in emotion points.

The named features are :meth:`empathy_gym.user.rule_user.RuleUser.features` (the
reply's form, cues and the user's state: emotion, turn, momentum), the rule user's
guards that fire (``guard:<name>``), the reply checks that fire (``check:<name>``,
:func:`reply_checks`) and whether the reply cues the hidden intention (``cue``).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.boundary import clean_text
from empathy_gym.personas import Persona
from empathy_gym.user.base import UserRequest

#: The emotion changes the head predicts a distribution over (SAGE's simulators move
#: by 5 or 10 points; SAGE.md, "The appraisal"), in emotion points.
BINS: tuple[int, ...] = (-10, -5, 0, 5, 10)
#: The artefact's format version (:meth:`Appraiser.load` refuses others).
FORMAT = 1
CONFIG_NAME = "appraiser.json"
HEAD_NAME = "head.safetensors"
#: The shipped appraiser (trained by ``benchmarks/distill_appraiser.py``).
SHIPPED = Path(__file__).resolve().parent / "distilled"

#: Standardised states are clipped to this many standard deviations (:meth:`Head.standardised`).
Z_CLIP = 4.0
_WORD_RUN = {
    "en": re.compile(r"\b(\w+)(?:\W+\1\b){2,}", re.IGNORECASE),
    "zh": re.compile(r"([\u4e00-\u9fff]{2,6})\1{2,}"),
}

READOUT = "How the person feels about this reply:"
_MARKERS = ("Person:", "Listener:", READOUT, "Situation:", "What they need:")
_MARKER_PATTERN = re.compile("|".join(re.escape(marker) for marker in _MARKERS), re.IGNORECASE)


class AppraiserError(ValueError):
    """An appraiser folder that is not one (a missing file or field, another format);
    the message names the file and the field."""


@dataclass(frozen=True)
class Layout:
    """How much of each piece the language model reads, in tokens (a longer piece keeps
    its first ``n - tail`` and last ``tail`` tokens).

    Attributes:
        profile_tokens, scenario_tokens: the persona's profile (its head) and scenario
            (its head and, for ``scenario_tail`` tokens, its tail: where SAGE's scenes say
            how the person reacts and what the hidden theme is).
        user_tokens, reply_tokens: each user message and each agent reply.
        tail: the tail kept of a long user message or reply.
        depth: how many of the base model's decoder layers run (the rest are dropped:
            the head reads none of them); 0: all.
        layers: the ``hidden_states`` indices the head reads (0: the embeddings, i: after
            layer i; ``depth`` itself: after the final norm).
    """

    profile_tokens: int = 48
    scenario_tokens: int = 128
    scenario_tail: int = 96
    user_tokens: int = 64
    reply_tokens: int = 128
    tail: int = 40
    depth: int = 24
    layers: tuple[int, ...] = (8, 16, 24)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))
        for name, value in asdict(self).items():
            values = value if isinstance(value, tuple) else (value,)
            if not values or any(not isinstance(v, int) or v < 0 for v in values):
                raise AppraiserError(f"layout.{name}: expected ints >= 0, got {value!r}")
        if self.tail >= min(self.user_tokens, self.reply_tokens) or self.scenario_tail > self.scenario_tokens:
            raise AppraiserError("layout: a tail must be shorter than the piece it belongs to")
        if self.depth and max(self.layers) > self.depth:
            raise AppraiserError(f"layout.layers: {max(self.layers)} is deeper than layout.depth {self.depth}")


def reply_checks(text: str, language: str) -> list[str]:
    """What a policy found against an earlier appraiser, in a reply: ``"word_run"`` (a word,
    zh a 2-6 character unit, three times in a row), and in English the reward-hacking
    monitors' ``"repeats"`` (a sentence twice, a word bigram three times) and ``"nonwords"``
    (:mod:`empathy_gym.agents.monitors`; in Chinese their units are single characters, and
    long fluent replies repeat character pairs)."""
    from empathy_gym.agents.monitors import mostly_nonwords, repeats_itself

    found = ["word_run"] if _WORD_RUN["zh" if language == "zh" else "en"].search(text) else []
    if language != "zh":
        found += ["repeats"] * repeats_itself(text, language) + ["nonwords"] * mostly_nonwords(text, language)
    return found


def default_layout(num_layers: int) -> Layout:
    """The layout for a base model of ``num_layers`` decoder layers: the first four fifths
    of them run, and the head reads a third, two thirds and all of the way there (SmolLM2's
    30: depth 24, layers 8, 16, 24)."""
    depth = max(1, round(0.8 * num_layers))
    return Layout(depth=depth, layers=tuple(sorted({max(1, round(depth * k / 3)) for k in (1, 2, 3)})))


def as_data(text: str) -> str:
    """``text`` with control characters removed (:func:`~empathy_gym.boundary.clean_text`)
    and this layout's markers broken (``Person:`` -> ``Person :``), so that no reply or
    message forges a turn or a readout."""
    text, _ = clean_text(text)
    return _MARKER_PATTERN.sub(lambda m: m.group(0)[:-1] + " :", text)


class DialogueEncoder:
    """Token ids of a request in the appraiser's layout (module docstring).

    Args:
        tokenizer: a transformers tokenizer (its special tokens are never produced from text).
        layout: the truncation lengths.
    """

    def __init__(self, tokenizer: Any, layout: Layout):
        self.tokenizer, self.layout = tokenizer, layout
        self._encode = functools.lru_cache(maxsize=65536)(self._encode_uncached)
        self._persona = functools.lru_cache(maxsize=4096)(self._persona_uncached)

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def _piece(self, text: str, most: int, tail: int) -> tuple[int, ...]:
        ids = self._encode(as_data(text))
        if len(ids) <= most:
            return ids
        return ids[: most - tail] + self._encode(" … ") + (ids[len(ids) - tail :] if tail else ())

    def _persona_uncached(self, persona: Persona) -> tuple[int, ...]:
        layout = self.layout
        intention = persona.intention_text("en")
        return (
            self._encode("A person talks about a problem.\nWhat they need: ")
            + self._piece(intention, 64, 16)
            + self._encode(f"\nCharacter: {persona.character_type}\nWho: ")
            + self._piece(persona.profile, layout.profile_tokens, 0)
            + self._encode("\nSituation: ")
            + self._piece(persona.scenario, layout.scenario_tokens, layout.scenario_tail)
            + self._encode("\n")
        )

    def _turn(self, user: str, reply: str) -> tuple[tuple[int, ...], int, int]:
        """One turn's ids and where its reply starts and ends in them."""
        layout = self.layout
        head = self._encode("\nPerson: ") + self._piece(user, layout.user_tokens, layout.tail)
        head += self._encode("\nListener: ")
        body = self._piece(reply, layout.reply_tokens, layout.tail) or self._encode(" ")
        return head + body + self._encode("\n" + READOUT), len(head), len(head) + len(body)

    def encode(self, request: UserRequest) -> tuple[list[int], int, int]:
        """``(ids, reply_start, reply_end)``: the request's dialogue up to its readout
        (the last id), and the span of its reply's ids.

        Raises:
            ValueError: a history that does not alternate user and agent, starting with the user.
        """
        ids = list(self._persona(request.persona))
        pieces = [*request.history, ("agent", request.utterance)]
        if len(pieces) % 2 or any(role != ("user", "agent")[i % 2] for i, (role, _) in enumerate(pieces)):
            raise ValueError("appraiser: a history must alternate user and agent, starting with the user")
        start = end = 0
        for index in range(0, len(pieces), 2):
            turn, start, end = self._turn(pieces[index][1], pieces[index + 1][1])
            start, end = start + len(ids), end + len(ids)
            ids += turn
        return ids, start, end


@dataclass
class Head:
    """The head's parameters (module docstring).

    Attributes:
        vocabulary: the named features' names, in the order of their columns.
        mean, scale: (D,) float32, standardise the language model's features.
        weight: (len(BINS), D + len(vocabulary)) float32. bias: (len(BINS),) float32.
    """

    vocabulary: list[str]
    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray
    bias: np.ndarray

    def standardised(self, states: np.ndarray) -> np.ndarray:
        """(n, D) states -> z-scores, clipped to +-:data:`Z_CLIP` (text unlike any the head
        was fitted on cannot push a logit without bound)."""
        return np.clip((states - self.mean) / self.scale, -Z_CLIP, Z_CLIP)

    def logits(self, states: np.ndarray, named: np.ndarray) -> np.ndarray:
        """(n, D) states and (n, V) named features -> (n, len(BINS)) float64 logits."""
        x = np.concatenate([self.standardised(states), named], axis=1)
        return x @ self.weight.T.astype(np.float64) + self.bias

    def named_matrix(self, named: Sequence[Mapping[str, float]]) -> np.ndarray:
        """Named-feature dicts as an (n, V) float64 matrix (names outside the vocabulary dropped)."""
        index = {name: i for i, name in enumerate(self.vocabulary)}
        matrix = np.zeros((len(named), len(self.vocabulary)))
        for row, features in enumerate(named):
            for name, value in features.items():
                if name in index:
                    matrix[row, index[name]] = value
        return matrix


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (n, k) logits."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def expected_change(distribution: np.ndarray) -> np.ndarray:
    """(n, len(BINS)) probabilities -> (n,) mean change in emotion points."""
    return distribution @ np.asarray(BINS, dtype=float)


@dataclass
class AppraiserConfig:
    """What ``appraiser.json`` holds: the base model, the layout and how the head was made.

    Attributes:
        base_model: a path, hub id, ``.gguf`` file or alias (``smollm2``) for
            :func:`~empathy_gym.backends.models.load_causal_lm`.
        layout: :class:`Layout` fields.
        trained_on: free-form record of the training data, split and settings.
    """

    base_model: str
    layout: dict[str, Any]
    trained_on: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT


def read_config(folder: str | os.PathLike) -> AppraiserConfig:
    """The folder's ``appraiser.json``.

    Raises:
        AppraiserError: no such file, not JSON, another format, or a missing field
            (naming the file and the field).
    """
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise AppraiserError(
            f"{folder}: not an appraiser folder (no {CONFIG_NAME}); train one with empathy-gym distill"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AppraiserError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise AppraiserError(f"{path}: expected a JSON object")
    if data.get("format") != FORMAT:
        raise AppraiserError(f"{path}: field 'format': expected {FORMAT}, got {data.get('format')!r}")
    for name in ("base_model", "layout"):
        if name not in data:
            raise AppraiserError(f"{path}: field {name!r}: missing")
    try:
        Layout(**data["layout"])
    except TypeError as error:
        raise AppraiserError(f"{path}: field 'layout': {error}") from None
    return AppraiserConfig(data["base_model"], data["layout"], data.get("trained_on", {}), FORMAT)


def save_head(folder: str | os.PathLike, config: AppraiserConfig, head: Head) -> None:
    """Write ``appraiser.json`` and ``head.safetensors`` into ``folder`` (created)."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: torch.from_numpy(np.ascontiguousarray(getattr(head, name), dtype=np.float32))
        for name in ("mean", "scale", "weight", "bias")
    }
    save_file(tensors, str(folder / HEAD_NAME), metadata={"vocabulary": json.dumps(head.vocabulary)})
    (folder / CONFIG_NAME).write_text(json.dumps(asdict(config), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def load_head(folder: str | os.PathLike) -> Head:
    """The head saved by :func:`save_head`.

    Raises:
        AppraiserError: a missing file, tensor or metadata field, or shapes that do not fit.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(folder) / HEAD_NAME
    if not path.is_file():
        raise AppraiserError(f"{folder}: no {HEAD_NAME} beside {CONFIG_NAME}")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in ("mean", "scale", "weight", "bias")}
    except (SafetensorError, OSError) as error:
        raise AppraiserError(f"{path}: {error}") from None
    except KeyError as error:
        raise AppraiserError(f"{path}: tensor {error}: missing") from None
    if "vocabulary" not in metadata:
        raise AppraiserError(f"{path}: metadata field 'vocabulary': missing")
    head = Head(json.loads(metadata["vocabulary"]), **tensors)
    width = len(head.mean) + len(head.vocabulary)
    if (
        head.weight.shape != (len(BINS), width)
        or head.bias.shape != (len(BINS),)
        or head.scale.shape != head.mean.shape
    ):
        raise AppraiserError(f"{path}: tensor 'weight': expected shape {(len(BINS), width)}, got {head.weight.shape}")
    return head


class Appraiser:
    """A frozen causal LM and a :class:`Head`: the distribution of an LLM simulator's
    emotion change for each request.

    Args:
        model, tokenizer: the base causal LM (in eval mode) and its tokenizer.
        layout: what the model reads.
        head: ``None`` to compute features only (:meth:`features`, for training).
        cache_tokens: the most tokens whose key/value states are kept between turns
            (:class:`~empathy_gym.backends.prefix_cache.PrefixKVCache`; SmolLM2 at depth
            24 in float32 keeps 36 KiB a token).
        batch_size: requests per forward pass.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        layout: Layout,
        head: Head | None = None,
        *,
        cache_tokens: int = 16384,
        batch_size: int = 16,
    ):
        from empathy_gym.backends.prefix_cache import PrefixKVCache
        from empathy_gym.user.rule_model import AppraisalModel
        from empathy_gym.user.rule_user import RuleUser

        self.model, self.tokenizer, self.layout, self.head = truncated(model, layout.depth), tokenizer, layout, head
        self.encoder = DialogueEncoder(tokenizer, layout)
        self.cache = PrefixKVCache(cache_tokens)
        self.batch_size = batch_size
        self._named = RuleUser(model=AppraisalModel(weights={}, bias=0.0, scale=1.0))

    @classmethod
    def load(cls, folder: str | os.PathLike | None = None, *, device: str = "cpu", **options: Any) -> Appraiser:
        """The appraiser saved in ``folder`` (default: the shipped one, :data:`SHIPPED`),
        on its base model (loaded with :func:`~empathy_gym.backends.models.load_causal_lm`).

        Raises:
            AppraiserError: ``folder`` is not an appraiser (file and field named).
            FileNotFoundError, OSError: the base model cannot be found or loaded.
        """
        folder = Path(folder) if folder is not None else SHIPPED
        config = read_config(folder)
        head = load_head(folder)
        model, tokenizer = load_base_model(config.base_model, device=device)
        return cls(model, tokenizer, Layout(**config.layout), head, **options)

    def named_features(self, request: UserRequest) -> dict[str, float]:
        """The request's named features (module docstring)."""
        features, guards, has_cue = self._named.features(request)
        checks = {f"check:{name}": 1.0 for name in reply_checks(request.utterance, request.persona.language)}
        return {**features, **{f"guard:{name}": 1.0 for name in guards}, **checks, "cue": float(has_cue)}

    def features(self, requests: Sequence[UserRequest], *, keep: Sequence[bool] | None = None) -> np.ndarray:
        """The language model's features of each request: (n, D) float32, D = 2 * hidden
        * len(layers) (the readout token's states, then the reply's mean states, layer by
        layer). ``keep``: whether a request's dialogue goes on (its states are cached for
        the next turn; default all)."""
        from empathy_gym.backends.prefix_cache import suffix_hidden_states

        rows = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            encoded = [self.encoder.encode(request) for request in chunk]
            results = suffix_hidden_states(
                self.model,
                [ids for ids, _, _ in encoded],
                pad_id=self.tokenizer.pad_token_id,
                layers=self.layout.layers,
                cache=self.cache,
                reuse_limits=[reply_start for _, reply_start, _ in encoded],
                store=None if keep is None else keep[start : start + len(chunk)],
            )
            for (_, reply_start, reply_end), (reused, states) in zip(encoded, results):
                reply = states[:, reply_start - reused : reply_end - reused].mean(dim=1)
                rows.append(np.concatenate([states[:, -1].flatten().numpy(), reply.flatten().numpy()]))
        return np.asarray(rows, dtype=np.float32).reshape(len(requests), -1)

    def distribution(
        self, requests: Sequence[UserRequest], named: Sequence[Mapping[str, float]] | None = None
    ) -> np.ndarray:
        """(n, len(BINS)) float64: each request's probability of each change in :data:`BINS`.
        ``named``: the requests' :meth:`named_features`, where the caller has them already.

        Raises:
            RuntimeError: no head (an appraiser built for features only).
        """
        if self.head is None:
            raise RuntimeError("this appraiser has no head: it computes features only")
        if not requests:
            return np.zeros((0, len(BINS)))
        named = [self.named_features(request) for request in requests] if named is None else named
        return softmax(self.head.logits(self.features(requests).astype(np.float64), self.head.named_matrix(named)))


def load_base_model(name: str, *, device: str = "cpu") -> tuple[Any, Any]:
    """The base model (float32, eval mode, no gradients) and its tokenizer.

    Raises:
        FileNotFoundError, OSError: from :func:`~empathy_gym.backends.models.load_causal_lm`.
    """
    from empathy_gym.backends.models import load_causal_lm

    model, tokenizer = load_causal_lm(name, dtype="float32", device=device)
    model.eval().requires_grad_(False)
    return model, tokenizer


def truncated(model: Any, depth: int) -> Any:
    """``model`` running only its first ``depth`` decoder layers (0: all), in place; a
    model that does not keep its layers in ``model.model.layers`` (Llama, Qwen2, Mistral
    and most decoders do) runs them all.

    Raises:
        AppraiserError: ``depth`` exceeds the model's layers.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not depth or layers is None:
        return model
    if depth > len(layers):
        raise AppraiserError(f"layout.depth: {depth} is more than the model's {len(layers)} layers")
    if depth < len(layers):
        import torch

        model.model.layers = torch.nn.ModuleList(list(layers)[:depth])
        model.config.num_hidden_layers = depth
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:depth]
    return model
