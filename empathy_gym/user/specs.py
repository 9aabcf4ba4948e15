"""Naming a model: ``KIND:TARGET[,key=value,...]`` (:func:`parse_spec`), and the simulated
user: :class:`UserSpec` (docs/backends.md).

One grammar serves the simulated user (``rule``, ``distilled[:PATH]``, ``transformers:PATH``
or ``hf:PATH``, ``vllm:PATH``, ``openai:MODEL@URL``, ``policy``) and the policy of ``empathy-gym eval
--policy`` (``baseline:NAME``, ``hf:PATH[,adapter=DIR]``, ``openai:MODEL@URL``,
``python:MODULE:ATTR``). Option values are read as JSON when they parse (``8`` is an
int, ``true`` a bool) and as strings otherwise.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from empathy_gym.user import SimulatedUser

APPRAISAL_MODES: tuple[str, ...] = ("free", "choice")
#: Options that the rule-based user takes (:class:`~empathy_gym.user.rule_user.RuleUser`).
RULE_USER_KEYWORDS: tuple[str, ...] = ("model", "rules_dir", "difficulty")
#: Options that the distilled user takes (:class:`~empathy_gym.user.distilled_user.DistilledUser`;
#: its appraiser's folder is the spec's target, :attr:`UserSpec.model`).
DISTILLED_USER_KEYWORDS: tuple[str, ...] = ("difficulty", "device", "batch_size", "pessimistic")
#: Users that run in-process without a chat backend, and the options each takes.
LOCAL_USERS: dict[str, tuple[str, ...]] = {"rule": RULE_USER_KEYWORDS, "distilled": DISTILLED_USER_KEYWORDS}


def user_backends() -> tuple[str, ...]:
    """:attr:`UserSpec.backend` names: the local users and the chat backends of the
    registry (:data:`empathy_gym.backends.BACKENDS`: ``policy`` and registered ones
    included); a ready ``ChatBackend`` object is accepted too. ``--user`` also reads ``hf``
    as ``transformers``."""
    from empathy_gym.backends import BACKENDS

    return (*LOCAL_USERS, *BACKENDS)


def _served(backend: Any) -> bool:
    """Whether ``backend`` names a registered backend that talks to a server (takes a URL)."""
    from empathy_gym.backends import served

    return served(backend)


def _llm_backends_text() -> str:
    """``"'transformers', 'vllm' or 'openai'"``: the chat backends a spec builds (not those
    on the policy's weights), for error messages."""
    from empathy_gym.backends import chat_backends

    names = [repr(name) for name in chat_backends()]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def _spec_forms() -> str:
    """The ``--user`` forms, for the error on an unknown kind."""
    from empathy_gym.backends import BACKENDS, spec_form

    return ", ".join(["rule", "distilled[:PATH]", *map(spec_form, BACKENDS)])


_OPENAI_TARGET = re.compile(r"^(?P<model>.+?)@(?P<url>https?://\S+)$")


class SpecError(ValueError):
    """A model spec that does not follow the grammar; the message names the spec and
    shows the expected form."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``KIND:TARGET[,key=value,...]``.

    Attributes:
        kind: the part before the first ``:`` (lower-cased), e.g. ``"openai"``.
        target: the rest up to the first ``,`` ("" for a bare kind such as ``rule``).
        options: the ``key=value`` pairs, values decoded as JSON when possible.
    """

    kind: str
    target: str
    options: dict[str, Any] = field(default_factory=dict)


def parse_spec(text: str) -> ModelSpec:
    """Split ``KIND[:TARGET][,key=value,...]`` into its parts.

    Raises:
        SpecError: an empty spec, or an option without ``=``.
    """
    if not text or not text.strip():
        raise SpecError("empty model spec; expected KIND:TARGET[,key=value,...]")
    head, comma, tail = text.strip().partition(",")
    kind, _, target = head.partition(":")  # a bare kind may take options: "rule,key=value"
    pairs = tail.split(",") if comma else []
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"{text!r}: option {pair!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value.strip()
    return ModelSpec(kind.strip().lower(), target.strip(), options)


def split_openai_target(spec: ModelSpec, text: str) -> tuple[str, str]:
    """``MODEL@URL`` -> ``(model, url)``; the URL must start with ``http://`` or ``https://``.

    Raises:
        SpecError: naming ``text`` (the whole spec) and the expected form.
    """
    match = _OPENAI_TARGET.match(spec.target)
    if match is None:
        raise SpecError(
            f"{text!r}: expected {spec.kind}:MODEL@URL, e.g. {spec.kind}:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1"
        )
    return match["model"], match["url"]


def chat_backend_target(spec: ModelSpec, text: str) -> dict[str, str]:
    """The ``model`` (and, for a served backend, ``base_url``) that a chat backend's spec
    names: ``NAME:PATH``, or ``NAME:MODEL@URL`` for one that talks to a server
    (:data:`empathy_gym.backends.BACKENDS`).

    Raises:
        SpecError: no target, or a served backend's target that is not ``MODEL@URL``
            (naming ``text``, the whole spec).
    """
    if not spec.target:
        from empathy_gym.backends import spec_form

        raise SpecError(f"{text!r}: {spec.kind} needs a model, e.g. {spec_form(spec.kind)}")
    if _served(spec.kind):
        model, url = split_openai_target(spec, text)
        return {"model": model, "base_url": url}
    return {"model": spec.target}


def init_keywords(cls: type, *excluded: str) -> set[str]:
    """The arguments ``cls(...)`` names, less ``excluded``: the options a spec may give it
    (a ``**kwargs`` catch-all is not one: a typo must not reach an expensive constructor)."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = (p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind not in variadic)
    return set(named) - {"self", *excluded}


def _llm_user_keywords() -> set[str]:
    from empathy_gym.user.llm_user import LLMUser

    return init_keywords(LLMUser, "backend", "protocol", "appraisal_mode", "owns_backend")


def _is_chat_backend(value: Any) -> bool:
    from empathy_gym.backends.base import ChatBackend

    return isinstance(value, ChatBackend)


@dataclass(frozen=True)
class UserSpec:
    """Which simulated user (``user=``, ``--user``): a string (:meth:`parse`), a mapping
    of these fields or a ``UserSpec`` (:func:`as_user_spec`); :meth:`build` makes it.

    Attributes:
        backend: one of :func:`user_backends` (``"hf"`` is read as ``"transformers"``;
            only a trainer can build ``"policy"``), or a ready
            :class:`~empathy_gym.backends.base.ChatBackend` (not closed by the user).
        model: the LLM user's model: a path, hub id or GGUF file (transformers, vllm),
            or the server's model name (openai, required there); for ``distilled``, the
            folder of an appraiser (``None``: the shipped one). ``None`` for ``rule``,
            ``policy`` and a ready backend.
        base_url: the OpenAI-compatible server's URL, ``http(s)://HOST[:PORT]/v1``
            (openai only, required there).
        appraisal_mode: ``"free"`` (default: JSON with the user's thoughts, SAGE) or
            ``"choice"`` (scored options); LLM users only, ignored by the rule user.
        backend_kwargs: more backend constructor arguments (``device``, ``dtype``,
            ``max_concurrency``, ``api_key_env``, ...; for ``policy`` those of
            :class:`~empathy_gym.backends.policy_backend.PolicyUserBackend`:
            ``max_batch_size``, ``prefix_cache_tokens``). Not with ``rule`` or a ready backend.
        user_kwargs: more :class:`~empathy_gym.user.llm_user.LLMUser` arguments
            (``temperature``, ``max_tokens``, ...), or for ``rule`` those of
            :class:`~empathy_gym.user.rule_user.RuleUser` (``model``, ``rules_dir``), or
            for ``distilled`` those of :data:`DISTILLED_USER_KEYWORDS`. Every user takes
            ``difficulty``, its own over the env's (``"rule,difficulty=challenging"``,
            ``"openai:MODEL@URL,difficulty=challenging"``): one env can then be judged by
            one user at several difficulties.

    Raises:
        SpecError (a ``ValueError``): a bad field, named as ``user.FIELD``: an unknown
            backend or appraisal mode, a missing ``model``/``base_url``, options the
            backend does not take (``model`` with ``rule``...), a non-mapping
            ``backend_kwargs``/``user_kwargs``.
    """

    backend: Any = "rule"
    model: Any = None
    base_url: str | None = None
    appraisal_mode: str = "free"
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)
    user_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        backend = self.backend
        if isinstance(backend, str):
            backend = "transformers" if backend.strip().lower() == "hf" else backend.strip().lower()
            if backend not in user_backends():
                raise SpecError(
                    f"user.backend: unknown backend {self.backend!r}; expected one of "
                    f"{', '.join(map(repr, user_backends()))} or a ChatBackend object"
                )
        elif not _is_chat_backend(backend):
            raise SpecError(
                f"user.backend: expected a backend name ({', '.join(map(repr, user_backends()))}) "
                f"or a ChatBackend object, got {type(backend).__name__}"
            )
        object.__setattr__(self, "backend", backend)
        if self.appraisal_mode not in APPRAISAL_MODES:
            raise SpecError(f"user.appraisal_mode must be 'free' or 'choice', got {self.appraisal_mode!r}")
        for name in ("backend_kwargs", "user_kwargs"):
            value = getattr(self, name)
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise SpecError(f"user.{name}: expected a mapping of keyword arguments, got {type(value).__name__}")
            object.__setattr__(self, name, {str(k): v for k, v in value.items()})
        if self.base_url is not None and not isinstance(self.base_url, str):
            raise SpecError(f"user.base_url: expected a URL string, got {type(self.base_url).__name__}")
        self._check_fields()

    def _check_fields(self) -> None:
        backend = self.backend
        set_fields = [name for name in ("model", "base_url", "backend_kwargs") if getattr(self, name)]
        if backend == "distilled":
            self._check_distilled(set_fields)
            return
        if backend == "rule":
            if set_fields:
                raise SpecError(
                    f"user: {', '.join(set_fields)} given, but backend='rule' (the rule-based "
                    f"user uses no LLM); set backend={_llm_backends_text()}"
                )
            unknown = sorted(set(self.user_kwargs) - set(RULE_USER_KEYWORDS))
            strange = sorted(set(unknown) - _llm_user_keywords())
            if strange:  # no user's option: say so, not "use an LLM user"
                raise SpecError(
                    f"user: unknown option(s) {strange}; the rule user takes "
                    f"{', '.join(RULE_USER_KEYWORDS)}, LLM users {', '.join(sorted(_llm_user_keywords()))}"
                )
            if unknown:
                raise SpecError(
                    f"user.user_kwargs {unknown} given, but backend='rule' takes only 'model' "
                    "(an appraisal model artefact), 'rules_dir' and 'difficulty' (its own, over "
                    "the env's); the others are LLM-user "
                    f"options: set backend={_llm_backends_text()}"
                )
            return
        unknown = sorted(set(self.user_kwargs) - _llm_user_keywords())
        if unknown:
            raise SpecError(
                f"user.user_kwargs: {unknown} are not LLMUser options; known: {sorted(_llm_user_keywords())}"
            )
        self._check_backend_options()
        if not isinstance(backend, str):
            if set_fields:
                raise SpecError(
                    f"user: {', '.join(set_fields)} given, but backend is a ready "
                    f"{type(backend).__name__}, which is already configured; drop them"
                )
        elif self.on_policy:
            for name in ("model", "base_url"):
                if getattr(self, name) is not None:
                    raise SpecError(
                        f"user.{name}: backend {backend!r} is served by the policy's own model; drop {name}"
                    )
        elif self.model is None:
            from empathy_gym.backends import spec_form

            raise SpecError(f"user.model: the {backend} backend needs a model (e.g. {spec_form(backend)})")
        elif _served(backend) and self.base_url is None:
            raise SpecError(
                f"user.base_url: the {backend} backend needs the server's URL, e.g. "
                f"{backend}:MODEL@http://localhost:8000/v1"
            )
        elif not _served(backend) and self.base_url is not None:
            from empathy_gym.backends import BACKENDS

            served = [name for name, entry in BACKENDS.items() if entry.served]
            which = f"the {served[0]} backend takes" if len(served) == 1 else f"the {', '.join(served)} backends take"
            raise SpecError(f"user.base_url: only {which} a URL, not backend={backend!r}")

    def _check_distilled(self, set_fields: list[str]) -> None:
        wrong = [name for name in set_fields if name != "model"]
        if wrong:
            raise SpecError(
                f"user: {', '.join(wrong)} given, but backend='distilled' runs its appraiser in-process; "
                "drop them (its folder is user.model, e.g. distilled:runs/appraiser)"
            )
        if self.model is not None and not isinstance(self.model, (str, os.PathLike)):
            raise SpecError(
                f"user.model: the distilled user takes an appraiser folder, got {type(self.model).__name__}"
            )
        unknown = sorted(set(self.user_kwargs) - set(DISTILLED_USER_KEYWORDS))
        if unknown:
            raise SpecError(
                f"user: unknown option(s) {unknown}; the distilled user takes {', '.join(DISTILLED_USER_KEYWORDS)}"
            )

    def _check_backend_options(self) -> None:
        """A typo in an option would reach the backend as a TypeError when it is built."""
        from empathy_gym.backends import BACKENDS, backend_class

        if self.backend not in BACKENDS or self.on_policy:  # the trainer builds it, with its own options
            return
        try:
            cls = backend_class(self.backend)
        except ImportError:  # its library (httpx, torch) is not here: building it will say so
            return
        except (ValueError, TypeError) as error:  # a registered target that is no ChatBackend class
            raise SpecError(f"user.backend: {error}") from None
        taken = init_keywords(cls, "model", "base_url")
        unknown = sorted(set(self.backend_kwargs) - taken)
        if unknown:
            raise SpecError(
                f"user: unknown option(s) {unknown}; the {self.backend} user takes appraisal_mode, "
                f"{', '.join(sorted(_llm_user_keywords()))} (the user) and {', '.join(sorted(taken))} (its backend)"
            )

    @classmethod
    def parse(cls, text: str) -> UserSpec:
        """Read the ``--user`` grammar. Of the ``,key=value`` options, ``appraisal_mode``
        sets :attr:`appraisal_mode`, those :class:`~empathy_gym.user.llm_user.LLMUser`
        takes go to :attr:`user_kwargs`, the others to :attr:`backend_kwargs`; for
        ``rule`` all go to :attr:`user_kwargs`.

        Raises:
            SpecError: an empty spec, an unknown kind, a malformed target or option, or a
                field the kind does not take (naming the spec).
        """
        from empathy_gym.backends import from_policy

        spec = parse_spec(text)
        if spec.kind not in (*user_backends(), "hf"):
            raise SpecError(f"{text!r}: unknown user kind {spec.kind!r}; expected one of {_spec_forms()}")
        options = dict(spec.options)
        values: dict[str, Any] = {"appraisal_mode": options.pop("appraisal_mode", "free")}
        if spec.kind == "rule" or from_policy(spec.kind):
            if spec.target:
                raise SpecError(f"{text!r}: the {spec.kind} user takes no target; write just '{spec.kind}'")
        elif spec.kind == "distilled":
            values["model"] = spec.target or None
        else:
            values.update(chat_backend_target(spec, text))
        if spec.kind in LOCAL_USERS:
            values["user_kwargs"] = options
        else:
            user_keys = _llm_user_keywords()
            values["user_kwargs"] = {k: v for k, v in options.items() if k in user_keys}
            values["backend_kwargs"] = {k: v for k, v in options.items() if k not in user_keys}
        try:
            return cls("transformers" if spec.kind == "hf" else spec.kind, **values)
        except SpecError as error:
            raise SpecError(f"{text!r}: {error}") from None

    def __str__(self) -> str:
        """The spec in the ``--user`` grammar (:meth:`parse` reads it back when the options
        are JSON values); a ready backend shows as ``<TypeName>``, which does not parse."""
        kind = self.backend if isinstance(self.backend, str) else f"<{type(self.backend).__name__}>"
        text = kind
        if _served(self.backend):
            text = f"{kind}:{self.model}@{self.base_url}"
        elif self.model is not None:
            text = f"{kind}:{self.model}"
        options = {
            **({"appraisal_mode": self.appraisal_mode} if self.appraisal_mode != "free" else {}),
            **self.backend_kwargs,
            **self.user_kwargs,
        }
        return text + "".join(
            f",{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in options.items()
        )

    @property
    def on_policy(self) -> bool:
        """The user runs on the policy's own weights (``policy``: a registry entry with
        :attr:`~empathy_gym.backends.BackendEntry.from_policy`), so only a trainer builds it."""
        from empathy_gym.backends import from_policy

        return from_policy(self.backend)

    @property
    def deterministic(self) -> bool:
        """The same requests and seeds always give the same turns (the rule and distilled users)."""
        return self.backend in LOCAL_USERS

    def build(self, difficulty: Any = "moderate", protocol: Any = "sage") -> SimulatedUser:
        """The simulated user this spec names: the only place a spec becomes a user.

        Args:
            difficulty: preset name, path, dict or :class:`~empathy_gym.user.Difficulty`;
                the spec's own ``difficulty`` option, where given, wins.
            protocol: ``"sage"``, ``"rlver_training"``, a dict or an
                :class:`~empathy_gym.user.EmotionProtocol` (tells the LLM user the
                allowed change range).

        Returns:
            a :class:`~empathy_gym.user.rule_user.RuleUser`, a
            :class:`~empathy_gym.user.distilled_user.DistilledUser` or an
            :class:`~empathy_gym.user.llm_user.LLMUser`, which closes a backend it built.

        Raises:
            SpecError: ``backend="policy"`` (a trainer builds that user from its policy).
            ValueError, ImportError: from the backend (a bad URL, a missing library).
            AppraiserError (a ``ValueError``), OSError: a distilled user's folder or base model.
        """
        from empathy_gym.user import resolve_protocol

        protocol = resolve_protocol(protocol)
        kwargs = {"difficulty": difficulty, **self.user_kwargs}  # rule,difficulty=... over the env's
        if self.backend == "rule":
            from empathy_gym.user.rule_user import RuleUser

            return RuleUser(**kwargs)
        if self.backend == "distilled":
            from empathy_gym.user.distilled_user import DistilledUser

            return DistilledUser(**kwargs, appraiser=self.model)
        if self.on_policy:
            raise SpecError(
                f"user.backend {self.backend!r} is the policy's own base model with its LoRA adapters "
                f"off: a trainer builds it from its policy (recipe env.kwargs.user: {self.backend}); "
                "elsewhere pass user={'backend': PolicyUserBackend(peft_model, tokenizer)} "
                "(empathy_gym.backends.policy_backend)"
            )
        from empathy_gym.user.llm_user import LLMUser

        backend, owns = self.backend, isinstance(self.backend, str)
        if owns:
            from empathy_gym.backends import make_backend

            backend = make_backend(backend, model=self.model, base_url=self.base_url, **self.backend_kwargs)
        return LLMUser(backend, **kwargs, protocol=protocol, appraisal_mode=self.appraisal_mode, owns_backend=owns)


#: The removed ``EmpathyDialogueEnv`` keywords that :class:`UserSpec` fields replaced.
USER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(UserSpec))


def as_user_spec(value: str | Mapping[str, Any] | UserSpec | None) -> UserSpec:
    """Any way of naming the simulated user, as a :class:`UserSpec`: a ``--user`` string
    (:meth:`UserSpec.parse`), a mapping of :class:`UserSpec` fields (``{"backend":
    "openai", "model": ..., "base_url": ...}``), a ``UserSpec`` (returned as is) or
    ``None`` (the rule user).

    Raises:
        SpecError (a ``ValueError``): a malformed string, an unknown field in a mapping,
            or a bad field value (named as ``user.FIELD``).
        TypeError: any other type (a ready :class:`~empathy_gym.user.SimulatedUser` is
            not a spec: the env takes it as it is).
    """
    if value is None:
        return UserSpec()
    if isinstance(value, UserSpec):
        return value
    if isinstance(value, str):
        return UserSpec.parse(value)
    if isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - set(USER_FIELDS))
        if unknown:
            raise SpecError(f"user: unknown field(s) {unknown}; a user mapping takes {', '.join(USER_FIELDS)}")
        return UserSpec(**{str(k): v for k, v in value.items()})
    raise TypeError(
        f"user: expected a spec string ('rule', 'openai:MODEL@URL', ...), a mapping of "
        f"UserSpec fields, a UserSpec or a SimulatedUser, got {type(value).__name__}"
    )
