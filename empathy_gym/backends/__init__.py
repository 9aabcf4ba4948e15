"""Chat backends for the LLM simulated user (and anything else that needs an LLM).

:func:`make_backend` builds one by name from :data:`BACKENDS`
(:func:`register_backend` adds one); heavy libraries (torch, transformers, vllm,
httpx) are imported only when that backend is built. See docs/backends.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from empathy_gym.backends.base import BackendError, ChatBackend, ChoiceScoringUnavailable, Conversation, Message


@dataclass(frozen=True)
class BackendEntry:
    """A chat backend in the registry.

    Attributes:
        target: where its class lives, ``"package.module:ClassName"`` (imported when the
            backend is first built or its options are checked).
        served: ``True`` for a backend that talks to a server: it takes ``base_url=`` and a
            spec names it ``NAME:MODEL@URL``; ``False``: ``NAME:PATH``, a model it loads.
        model_hint: what ``model=`` is, for the error that says it is missing.
        from_policy: ``True`` for a backend on the policy's own weights, which only a
            trainer can build (from its policy; its spec takes no model or URL).
    """

    target: str
    served: bool = False
    model_hint: str = "a path or hub id"
    from_policy: bool = False


#: The chat backends by name (:func:`register_backend` adds one). ``"hf"`` reads as
#: ``"transformers"`` wherever a user spec is parsed.
BACKENDS: dict[str, BackendEntry] = {
    "transformers": BackendEntry(
        "empathy_gym.backends.transformers_backend:TransformersBackend", model_hint="a path, hub id or .gguf file"
    ),
    "vllm": BackendEntry("empathy_gym.backends.vllm_backend:VLLMBackend"),
    "openai": BackendEntry("empathy_gym.backends.openai_backend:OpenAIBackend", served=True),
    "policy": BackendEntry("empathy_gym.backends.policy_backend:PolicyUserBackend", from_policy=True),
}
_RESERVED = ("rule", "distilled", "policy", "hf")


def served(name: object) -> bool:
    """Whether ``name`` is a registered backend that talks to a server (:attr:`BackendEntry.served`)."""
    return isinstance(name, str) and name in BACKENDS and BACKENDS[name].served


def from_policy(name: object) -> bool:
    """Whether ``name`` is a registered backend on the policy's own weights
    (:attr:`BackendEntry.from_policy`: ``"policy"``)."""
    return isinstance(name, str) and name in BACKENDS and BACKENDS[name].from_policy


def chat_backends() -> list[str]:
    """The registered backends a spec builds anywhere: all but those on the policy's own
    weights, which only a trainer builds (for help texts and error messages)."""
    return [name for name, entry in BACKENDS.items() if not entry.from_policy]


def register_backend(
    name: str, target: str, *, served: bool = False, model_hint: str = "a path or hub id", replace: bool = False
) -> None:
    """Make a :class:`~empathy_gym.backends.base.ChatBackend` subclass buildable by name,
    wherever a user spec is taken in this process (``user="NAME:PATH"`` in ``gym.make``
    and recipes): its class is called as ``cls(model, **options)``, or
    ``cls(base_url=URL, model=MODEL, **options)`` when ``served``. See
    :class:`BackendEntry` for the arguments; ``replace=True`` replaces a registered name.

    Raises:
        TypeError: ``name`` or ``target`` is not a string.
        ValueError: ``name`` is taken by a user kind (``rule``, ``distilled``, ``policy``,
            ``hf``) or, without ``replace``, by a backend; it is not a lower-case
            identifier; or ``target`` is not ``module:Class``.
    """
    if not isinstance(name, str) or not isinstance(target, str):
        raise TypeError(f"register_backend: name and target must be strings, got {name!r} and {target!r}")
    if not name.isidentifier() or name != name.lower() or name in _RESERVED:
        raise ValueError(f"register_backend: name {name!r} must be a lower-case identifier other than {_RESERVED}")
    if name in BACKENDS and not replace:
        raise ValueError(f"register_backend: {name!r} is registered ({BACKENDS[name].target}); pass replace=True")
    module, colon, attr = target.partition(":")
    if not (module and colon and attr.isidentifier()):
        raise ValueError(f"register_backend: target {target!r} must be 'package.module:ClassName'")
    BACKENDS[name] = BackendEntry(target, served, model_hint)


def spec_form(name: str) -> str:
    """How a spec names backend ``name``: ``"NAME:MODEL@URL"`` for a served one, ``"NAME"``
    for one on the policy's weights, else ``"NAME:PATH"`` (also for a name not in
    :data:`BACKENDS`, such as ``hf``)."""
    entry = BACKENDS.get(name)
    if entry is not None and entry.from_policy:
        return name
    return f"{name}:MODEL@URL" if entry is not None and entry.served else f"{name}:PATH"


def make_backend(name: str, *, model: Any = None, base_url: str | None = None, **kwargs: Any) -> ChatBackend:
    """Build a backend by name (:data:`BACKENDS`).

    Args:
        name: ``"transformers"``, ``"vllm"``, ``"openai"`` or a registered name.
        model: model path, hub id or GGUF file (transformers, vllm); the server's model
            name (openai). A ``transformers`` model object is accepted too.
        base_url: the server's URL, e.g. ``http://localhost:8000/v1`` (served backends only).
        **kwargs: passed to the backend's constructor.

    Raises:
        ValueError: unknown name or a missing required argument.
        ImportError: the backend's library is not installed (with the pip command).
    """
    if from_policy(name):
        raise ValueError(
            f"backend={name!r} is the policy's own base model with its LoRA adapters off: a trainer "
            f"builds it from its policy (recipe env.kwargs.user: {name}); elsewhere pass "
            "backend=PolicyUserBackend(peft_model, tokenizer) (empathy_gym.backends.policy_backend)"
        )
    if name not in BACKENDS:
        rule = "'rule' is not a chat backend" if name == "rule" else f"unknown backend {name!r}"
        raise ValueError(f"{rule}; known: {chat_backends()}; the rule-based user needs none (user='rule')")
    entry = BACKENDS[name]
    if entry.served:
        if base_url is None or model is None:
            raise ValueError(f"the {name} backend needs base_url= and model=")
        return backend_class(name)(base_url=base_url, model=model, **kwargs)
    if model is None:
        raise ValueError(f"the {name} backend needs model= ({entry.model_hint})")
    return backend_class(name)(model, **kwargs)


def backend_class(name: str) -> type[ChatBackend]:
    """The class of a backend named in :data:`BACKENDS`, imported now (vllm itself only
    when one is built).

    Raises:
        ValueError: a name not in :data:`BACKENDS`, or a target with no such class.
        ImportError: the target's module cannot be imported (naming the backend).
        TypeError: the target is not a :class:`~empathy_gym.backends.base.ChatBackend` subclass.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {list(BACKENDS)}")
    target = BACKENDS[name].target
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as error:
        raise ImportError(f"backend {name!r}: cannot import its target {target}: {error}") from error
    except AttributeError:
        raise ValueError(f"backend {name!r}: its target {target} names no class in {module}") from None
    if not (isinstance(cls, type) and issubclass(cls, ChatBackend)):
        raise TypeError(f"backend {name!r}: its target {target} is not a ChatBackend subclass")
    return cls


__all__ = [
    "BACKENDS",
    "BackendEntry",
    "backend_class",
    "chat_backends",
    "BackendError",
    "ChatBackend",
    "ChoiceScoringUnavailable",
    "Conversation",
    "Message",
    "make_backend",
    "register_backend",
    "spec_form",
]
