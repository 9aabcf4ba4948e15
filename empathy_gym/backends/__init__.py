"""Chat backends for the LLM simulated user (and anything else that needs an LLM).

:func:`make_backend` builds one by name; heavy libraries (torch, transformers, vllm,
httpx) are imported only when that backend is built. See docs/backends.md.
"""

from __future__ import annotations

from typing import Any

from empathy_gym.backends.base import BackendError, ChatBackend, ChoiceScoringUnavailable, Conversation, Message

BACKENDS = ("transformers", "vllm", "openai")


def make_backend(name: str, *, model: Any = None, base_url: str | None = None, **kwargs: Any) -> ChatBackend:
    """Build a backend by name.

    Args:
        name: ``"transformers"``, ``"vllm"`` or ``"openai"``.
        model: model path, hub id or GGUF file (transformers, vllm); the server's model
            name (openai). A ``transformers`` model object is accepted too.
        base_url: the server's URL, e.g. ``http://localhost:8000/v1`` (openai only).
        **kwargs: passed to the backend's constructor.

    Raises:
        ValueError: unknown name or a missing required argument.
        ImportError: the backend's library is not installed (with the pip command).
    """
    if name == "transformers":
        if model is None:
            raise ValueError("the transformers backend needs model= (a path, hub id or .gguf file)")
        return backend_class(name)(model, **kwargs)
    if name == "vllm":
        if model is None:
            raise ValueError("the vllm backend needs model= (a path or hub id)")
        return backend_class(name)(model, **kwargs)
    if name == "openai":
        if base_url is None or model is None:
            raise ValueError("the openai backend needs base_url= and model=")
        return backend_class(name)(base_url=base_url, model=model, **kwargs)
    if name == "policy":
        raise ValueError(
            "backend='policy' is the policy's own base model with its LoRA adapters off: a trainer "
            "builds it from its policy (recipe env.kwargs.user: policy); elsewhere pass "
            "backend=PolicyUserBackend(peft_model, tokenizer) (empathy_gym.backends.policy_backend)"
        )
    raise ValueError(f"unknown backend {name!r}; known: {list(BACKENDS)} (or 'rule' for no LLM)")


def backend_class(name: str) -> type[ChatBackend]:
    """The class of a backend named in :data:`BACKENDS`, imported now (vllm itself only
    when one is built).

    Raises:
        ValueError: a name not in :data:`BACKENDS`.
    """
    if name == "transformers":
        from empathy_gym.backends.transformers_backend import TransformersBackend

        return TransformersBackend
    if name == "vllm":
        from empathy_gym.backends.vllm_backend import VLLMBackend

        return VLLMBackend
    if name == "openai":
        from empathy_gym.backends.openai_backend import OpenAIBackend

        return OpenAIBackend
    raise ValueError(f"unknown backend {name!r}; known: {list(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "backend_class",
    "BackendError",
    "ChatBackend",
    "ChoiceScoringUnavailable",
    "Conversation",
    "Message",
    "make_backend",
]
