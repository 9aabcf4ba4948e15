"""Naming a model on the command line: ``KIND:TARGET[,key=value,...]``.

One grammar serves both sides of a dialogue:

* the simulated user (``empathy-gym eval --user``, ``empathy-gym play --user``):
  ``rule``, ``transformers:PATH``, ``vllm:PATH``, ``openai:MODEL@URL``;
* the policy (``empathy-gym eval --policy``, :func:`empathy_gym.policies.make_policy`):
  ``baseline:NAME``, ``hf:PATH[,adapter=DIR]``, ``openai:MODEL@URL``,
  ``python:MODULE:ATTR``.

``key=value`` options after the target go to the backend's constructor (or, for a user,
to :class:`~empathy_gym.user.llm_user.LLMUser` when it takes that keyword); values are
read as JSON when they parse (``8`` is an int, ``true`` a bool) and as strings otherwise.

Examples::

    >>> parse_spec("openai:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1,max_concurrency=16")
    ModelSpec(kind='openai', target='Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1', options={'max_concurrency': 16})
    >>> user_env_kwargs("rule")
    {'backend': 'rule'}
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any

#: Kinds accepted by ``--user`` (``hf`` is an alias of ``transformers``).
USER_KINDS: tuple[str, ...] = ("rule", "transformers", "hf", "vllm", "openai")

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
    """Split ``KIND:TARGET[,key=value,...]`` into its parts.

    Raises:
        SpecError: an empty spec, or an option without ``=``.
    """
    if not text or not text.strip():
        raise SpecError("empty model spec; expected KIND:TARGET[,key=value,...]")
    kind, _, rest = text.strip().partition(":")
    target, *pairs = rest.split(",")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"{text!r}: option {pair!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return ModelSpec(kind.strip().lower(), target.strip(), options)


def split_openai_target(spec: ModelSpec, text: str) -> tuple[str, str]:
    """``MODEL@URL`` -> ``(model, url)``; the URL must start with ``http://`` or ``https://``.

    Raises:
        SpecError: naming ``text`` (the whole spec) and the expected form.
    """
    match = _OPENAI_TARGET.match(spec.target)
    if match is None:
        raise SpecError(f"{text!r}: expected openai:MODEL@URL, e.g. "
                        f"openai:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1")
    return match["model"], match["url"]


def _llm_user_keywords() -> set[str]:
    from empathy_gym.user.llm_user import LLMUser
    return {name for name in inspect.signature(LLMUser.__init__).parameters
            if name not in ("self", "backend", "difficulty", "protocol", "appraisal_mode",
                            "owns_backend")}


def user_env_kwargs(text: str) -> dict[str, Any]:
    """The :class:`~empathy_gym.env.EmpathyDialogueEnv` keywords for a ``--user`` spec.

    ``rule`` -> ``{"backend": "rule"}``; ``transformers:PATH`` (or ``hf:PATH``),
    ``vllm:PATH`` -> ``backend`` and ``model``; ``openai:MODEL@URL`` -> ``backend``,
    ``model`` and ``base_url``. Options that :class:`~empathy_gym.user.llm_user.LLMUser`
    takes (``temperature``, ``max_tokens``, ``max_repairs``, ...) go to ``user_kwargs``;
    the others to ``backend_kwargs`` (e.g. ``device``, ``max_concurrency``,
    ``api_key_env``).

    Raises:
        SpecError: an unknown kind or a malformed target.
    """
    spec = parse_spec(text)
    if spec.kind not in USER_KINDS:
        raise SpecError(f"{text!r}: unknown user kind {spec.kind!r}; expected one of "
                        f"rule, transformers:PATH, vllm:PATH, openai:MODEL@URL")
    if spec.kind == "rule":
        if spec.target:
            raise SpecError(f"{text!r}: the rule user takes no target; write just 'rule'")
        return {"backend": "rule", "user_kwargs": spec.options} if spec.options else {"backend": "rule"}
    if not spec.target:
        raise SpecError(f"{text!r}: {spec.kind} needs a model, e.g. {spec.kind}:PATH")
    kwargs: dict[str, Any] = {}
    if spec.kind == "openai":
        kwargs["model"], kwargs["base_url"] = split_openai_target(spec, text)
    else:
        kwargs["model"] = spec.target
    kwargs["backend"] = "transformers" if spec.kind == "hf" else spec.kind
    user_keys = _llm_user_keywords()
    user_kwargs = {k: v for k, v in spec.options.items() if k in user_keys}
    backend_kwargs = {k: v for k, v in spec.options.items() if k not in user_keys}
    if user_kwargs:
        kwargs["user_kwargs"] = user_kwargs
    if backend_kwargs:
        kwargs["backend_kwargs"] = backend_kwargs
    return kwargs
