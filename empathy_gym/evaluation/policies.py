"""Policies for evaluation and play: whatever writes the agent's next utterance.

A :class:`Policy` is batched: ``act`` takes B agent-side chats (``info["messages"]``) and B
seeds and returns B utterances. :func:`make_policy` builds one from a spec string
(``baseline:NAME``, ``hf:PATH[,adapter=DIR]``, ``openai:MODEL@URL``, ``python:MODULE:ATTR``)
or a callable.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from empathy_gym.backends import backend_class
from empathy_gym.backends.base import ChatBackend, Conversation, Sampling
from empathy_gym.evaluation.baselines import BASELINES
from empathy_gym.user.specs import SpecError, init_keywords, parse_spec, split_openai_target

#: Policy kinds accepted by :func:`make_policy` (``transformers`` is an alias of ``hf``).
POLICY_KINDS: tuple[str, ...] = ("baseline", "hf", "transformers", "openai", "python")


#: New tokens per reply of a local (``hf:``) policy unless told otherwise: without a cap a
#: small model can generate to its context limit at every turn.
LOCAL_MAX_TOKENS = 128
LOCAL_POLICY_KINDS = ("hf", "transformers")


def reply_token_cap(policy: Any, max_tokens: int | None) -> int | None:
    """The reply cap an evaluation uses: ``max_tokens`` as given, 0 meaning no cap (``None``);
    unset (``None``): :data:`LOCAL_MAX_TOKENS` for a local (``hf:``) policy spec, else no cap."""
    if max_tokens == 0:
        return None
    local = isinstance(policy, str) and policy.strip().partition(":")[0].strip().lower() in LOCAL_POLICY_KINDS
    return LOCAL_MAX_TOKENS if max_tokens is None and local else max_tokens


#: Spec options of model policies that set how they sample (``hf:PATH,temperature=0``).
SAMPLING_OPTIONS = ("temperature", "top_p")


def spec_sampling(policy: Any, temperature: float = 0.7, top_p: float = 1.0) -> dict[str, float]:
    """``{"temperature", "top_p"}`` a policy samples with: a spec string's own options
    (``openai:M@URL,temperature=0``) over the given values. Nothing loads.

    Raises:
        SpecError: a malformed spec, an unknown kind, an option the kind does not take,
            or a sampling value that is not a number in its range (naming the spec).
    """
    options: dict[str, Any] = {}
    if isinstance(policy, str):
        spec = parse_spec(policy)
        _check_options(policy, spec.kind, spec.options)
        options = spec.options
    values = {"temperature": options.get("temperature", temperature), "top_p": options.get("top_p", top_p)}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{policy!r}: {name} must be a number, got {value!r}")
    try:
        Sampling(None, **values)
    except ValueError as error:
        raise SpecError(f"{policy!r}: {str(error).removeprefix('generate: ')}") from None
    return {name: float(value) for name, value in values.items()}


def spec_think_budget(policy: Any, max_tokens: int | None) -> int | None:
    """The ``think_budget`` of a local policy spec (``hf:PATH,think_budget=48``: budget
    forcing, :mod:`~empathy_gym.agents.budget_forcing`), or ``None``. Nothing loads.

    Raises:
        SpecError: a budget that is not an int in [1, ``max_tokens``), or one without a
            reply cap (``max_tokens`` ``None``), naming the spec.
    """
    if not isinstance(policy, str):
        return None
    spec = parse_spec(policy)
    budget = spec.options.get("think_budget") if spec.kind in LOCAL_POLICY_KINDS else None
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise SpecError(f"{policy!r}: think_budget must be an int >= 1, got {budget!r}")
    if max_tokens is None or budget >= max_tokens:
        raise SpecError(
            f"{policy!r}: think_budget={budget} needs a reply cap above it (--max-tokens, now "
            f"{'no cap' if max_tokens is None else max_tokens}): the reply gets the tokens the thinking leaves"
        )
    return budget


def _check_options(policy: str, kind: str, options: dict[str, Any]) -> None:
    if kind not in POLICY_KINDS:
        raise SpecError(
            f"{policy!r}: unknown policy kind {kind!r}; expected one of "
            f"baseline:NAME, hf:PATH[,adapter=DIR], openai:MODEL@URL, python:MODULE:ATTR"
        )
    taken = {"batched"} if kind == "python" else set()
    if kind in LOCAL_POLICY_KINDS:
        taken = init_keywords(backend_class("transformers"), "model") | {"adapter", "think_budget", *SAMPLING_OPTIONS}
    elif kind == "openai":
        taken = init_keywords(backend_class("openai"), "model", "base_url") | set(SAMPLING_OPTIONS)
    unknown = sorted(set(options) - taken)
    if unknown:
        takes = ", ".join(sorted(taken)) or "no options"
        raise SpecError(f"{policy!r}: unknown option(s) {unknown}; a {kind} policy takes {takes}")


@runtime_checkable
class Policy(Protocol):
    """The batched policy protocol of :func:`empathy_gym.evaluation.benchmark.evaluate`.

    Attributes:
        name: recorded in the run configuration (a changed name prevents resuming a run
            directory with another policy).
    """

    name: str

    def act(self, conversations: Sequence[Conversation], seeds: Sequence[int]) -> list[str]:
        """One utterance per conversation (B in, B out, same order); ``seeds`` are B ints
        >= 0 for any sampling, derived from the dialogue's seed and the turn."""

    def close(self) -> None:
        """Release models or connections."""


class PolicyOutputError(TypeError):
    """A policy's callable returned something other than the utterances it owes."""


class CallablePolicy:
    """A Python callable as a :class:`Policy`.

    Args:
        fn: ``messages -> str`` (``batched=False``) or ``list of messages -> list of str``
            (``batched=True``). Seeds are not passed: a callable that samples should
            seed itself.
        batched: whether ``fn`` takes the whole batch.
        name: defaults to the callable's qualified name (its class name for an instance).

    Raises (from :meth:`act`):
        PolicyOutputError (a TypeError): ``fn`` returned something other than a ``str``
            (or a list of B ``str``).
    """

    def __init__(self, fn: Callable[..., Any], *, batched: bool = False, name: str | None = None):
        if not callable(fn):
            raise TypeError(f"CallablePolicy: expected a callable, got {type(fn).__name__}")
        self.fn, self.batched = fn, batched
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__qualname__

    def act(self, conversations: Sequence[Conversation], seeds: Sequence[int]) -> list[str]:
        if not self.batched:
            out = [self.fn(c) for c in conversations]
            wrong = sorted({type(text).__name__ for text in out if not isinstance(text, str)})
            if wrong:
                raise PolicyOutputError(
                    f"policy {self.name!r}: must return the reply as a str, returned {', '.join(wrong)}"
                )
            return out
        out = self.fn(list(conversations))
        if not (isinstance(out, list) and len(out) == len(conversations) and all(isinstance(t, str) for t in out)):
            got = f"a list of {len(out)}" if isinstance(out, list) else type(out).__name__
            raise PolicyOutputError(
                f"policy {self.name!r} (batched): must return a list of {len(conversations)} str, "
                f"one reply per conversation; returned {got}"
                + (f" ({sorted({type(t).__name__ for t in out})})" if isinstance(out, list) else "")
            )
        return out

    def close(self) -> None:
        """Nothing to release."""


class BackendPolicy:
    """A :class:`~empathy_gym.backends.base.ChatBackend` as a :class:`Policy`: one batched,
    per-chat seeded ``generate`` per call.

    Args:
        backend: the chat engine.
        max_tokens: new tokens per reply (>= 1), or ``None`` (default) for no cap but the
            model's context, as SAGE (its logged replies run 160 to 760 characters).
        temperature: sampling temperature (>= 0; 0 is greedy).
        top_p: nucleus mass in (0, 1].
        name: recorded in the run configuration; defaults to ``repr(backend)``.
        owns_backend: :meth:`close` closes the backend.
    """

    def __init__(
        self,
        backend: ChatBackend,
        *,
        max_tokens: int | None = None,
        temperature: float = 0.7,
        top_p: float = 1.0,
        name: str | None = None,
        owns_backend: bool = True,
    ):
        self.backend = backend
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        self.name = name or repr(backend)
        self.owns_backend = owns_backend

    def act(self, conversations: Sequence[Conversation], seeds: Sequence[int]) -> list[str]:
        return self.backend.generate(
            conversations, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seeds=list(seeds)
        )

    def close(self) -> None:
        if self.owns_backend:
            self.backend.close()


class GeneratorPolicy:
    """A token sampler (``generate(prompts, seeds) -> list[Sample]``: the trainer's
    :class:`~empathy_gym.agents.generation.TransformersGenerator`, or it under
    :class:`~empathy_gym.agents.budget_forcing.BudgetForcing`) as a :class:`Policy`: each
    chat rendered with the tokenizer's template, contents as data
    (:class:`~empathy_gym.agents.rollout.ChatTokens`), and each sample decoded without its
    end-of-turn token. The same seeds give the same replies from the same weights.

    Args:
        generator: the sampler.
        tokenizer: the policy's tokenizer.
        name: recorded in the run configuration.
        backend: a backend holding the model, closed by :meth:`close` (``None``: the
            caller's model).
    """

    def __init__(self, generator: Any, tokenizer: Any, *, name: str, backend: ChatBackend | None = None):
        from empathy_gym.agents.rollout import ChatTokens

        self.generator, self.tokenizer, self.name, self.backend = generator, tokenizer, name, backend
        self.chat = ChatTokens(tokenizer)

    def act(self, conversations: Sequence[Conversation], seeds: Sequence[int]) -> list[str]:
        samples = self.generator.generate([self.chat.prompt(c) for c in conversations], list(seeds))
        return [sample.text(self.tokenizer) for sample in samples]

    def close(self) -> None:
        """Close the backend given, if any."""
        if self.backend is not None:
            self.backend.close()


def _budget_forced_policy(backend: Any, think_budget: int, max_tokens: int, **generation: Any) -> GeneratorPolicy:
    """A local policy's model sampled as the trainer samples it under budget forcing (no
    key/value states kept between turns, as in the held-out evaluation: an evaluation
    never syncs, so they would pile up)."""
    from empathy_gym.agents.budget_forcing import BudgetForcing
    from empathy_gym.agents.generation import TransformersGenerator

    name = generation.pop("name")
    sampler = TransformersGenerator(
        backend.model,
        backend.tokenizer,
        max_new_tokens=max_tokens,
        max_batch_size=backend.max_batch_size,
        reuse_kv=False,
        **generation,
    )
    forced = BudgetForcing(sampler, backend.tokenizer, think_budget=think_budget, max_new_tokens=max_tokens)
    return GeneratorPolicy(forced, backend.tokenizer, name=name, backend=backend)


def load_transformers_policy(
    model: str | os.PathLike, *, adapter: str | os.PathLike | None = None, **backend_kwargs: Any
) -> ChatBackend:
    """A :class:`~empathy_gym.backends.transformers_backend.TransformersBackend` for a local
    model or hub id, with a LoRA adapter merged in. The tokenizer comes from the adapter
    directory when it holds one (a trainer may have added tokens), else from ``model``.

    Args:
        model: base model path or hub id (or ``.gguf`` file).
        adapter: the adapter directory (with ``adapter_config.json``), or ``None``.
        **backend_kwargs: ``device``, ``dtype``, ``max_batch_size``, ...

    Raises:
        FileNotFoundError: ``adapter`` has no ``adapter_config.json``.
        BackendError: the model cannot be loaded.
    """
    from empathy_gym.backends.transformers_backend import TransformersBackend

    if adapter is None:
        return TransformersBackend(model, **backend_kwargs)
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"adapter={adapter}: no adapter_config.json there (expected a "
            f"peft adapter directory, as written by save_pretrained)"
        )
    if (adapter / "tokenizer_config.json").is_file():
        backend_kwargs.setdefault("tokenizer", str(adapter))
    backend = TransformersBackend(model, **backend_kwargs)
    from peft import PeftModel

    merged = PeftModel.from_pretrained(backend.model, str(adapter)).merge_and_unload()
    backend.model = merged.eval()
    return backend


def _python_callable(policy: str, module: str, attr: str) -> Callable[..., Any]:
    """The callable a ``python:MODULE:ATTR`` spec names (a class: an instance of it)."""
    try:
        obj = importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{policy!r}: cannot import {module!r}: {error}") from error
    if not hasattr(obj, attr):
        raise SpecError(f"{policy!r}: module {module!r} has no attribute {attr!r}")
    obj = getattr(obj, attr)
    fn = obj() if isinstance(obj, type) else obj
    if not callable(fn):
        raise SpecError(f"{policy!r}: {module}.{attr} is a {type(fn).__name__}, not a callable messages -> str")
    return fn


def make_policy(
    policy: str | Policy | Callable[..., Any],
    *,
    max_tokens: int | None = None,
    temperature: float = 0.7,
    top_p: float = 1.0,
) -> Policy:
    """A :class:`Policy` from a spec string, a ready policy or a callable.

    Specs (:mod:`empathy_gym.user.specs`):

    * ``baseline:NAME``: a baseline of :data:`empathy_gym.evaluation.baselines.BASELINES`
      (``generic``, ``echo``, ``listener``, ``esconv``);
    * ``hf:PATH[,adapter=DIR][,device=cuda][,dtype=bfloat16][,max_batch_size=16]``: a
      local transformers model or hub id, with a LoRA adapter merged in
      (:func:`load_transformers_policy`); ``,think_budget=N`` samples it as the trainer
      does under ``generation.think_budget`` (budget forcing; evaluate with ``think``);
    * ``openai:MODEL@URL[,max_concurrency=16][,api_key_env=VAR]``: an OpenAI-compatible
      server (:class:`~empathy_gym.backends.openai_backend.OpenAIBackend`);
    * ``python:MODULE:ATTR[,batched=true]``: a callable (a class is instantiated with no
      arguments) taking ``messages`` (or a batch of them).

    ``max_tokens`` (``None``: no cap), ``temperature``, ``top_p`` apply to the
    model-backed kinds (``hf``, ``openai``), whose specs may set their own
    ``,temperature=`` and ``,top_p=`` (:func:`spec_sampling`).

    Raises:
        SpecError: a malformed spec or an unknown kind or baseline.
        TypeError: ``policy`` is none of the above.
        ImportError: ``python:`` names a module that cannot be imported.
        BackendError: a model cannot be loaded.
    """
    if isinstance(policy, Policy):
        return policy
    if callable(policy):
        return CallablePolicy(policy)
    if not isinstance(policy, str):
        raise TypeError(f"make_policy: expected a spec string, a Policy or a callable, got {type(policy).__name__}")
    spec = parse_spec(policy)
    generation = dict(max_tokens=max_tokens, **spec_sampling(policy, temperature, top_p), name=policy)
    backend_options = {key: value for key, value in spec.options.items() if key not in SAMPLING_OPTIONS}
    if spec.kind == "baseline":
        if spec.target not in BASELINES:
            raise SpecError(f"{policy!r}: unknown baseline {spec.target!r}; known: {', '.join(sorted(BASELINES))}")
        return CallablePolicy(BASELINES[spec.target](), name=policy)
    if spec.kind in LOCAL_POLICY_KINDS:
        if not spec.target:
            raise SpecError(f"{policy!r}: expected hf:PATH[,adapter=DIR]")
        adapter = backend_options.pop("adapter", None)
        think_budget = spec_think_budget(policy, max_tokens)
        backend_options.pop("think_budget", None)
        backend = load_transformers_policy(spec.target, adapter=adapter, **backend_options)
        if think_budget is not None:
            return _budget_forced_policy(backend, think_budget, **generation)
        return BackendPolicy(backend, **generation)
    if spec.kind == "openai":
        from empathy_gym.backends.openai_backend import OpenAIBackend

        model, url = split_openai_target(spec, policy)
        return BackendPolicy(OpenAIBackend(base_url=url, model=model, **backend_options), **generation)
    if spec.kind == "python":
        module, _, attr = spec.target.partition(":")
        if not module or not attr:
            raise SpecError(f"{policy!r}: expected python:MODULE:ATTR, e.g. python:my_agents:reply")
        fn = _python_callable(policy, module, attr)
        return CallablePolicy(fn, batched=bool(spec.options.get("batched", False)), name=policy)
    raise AssertionError(f"unreachable: {spec.kind!r} passed spec_sampling")  # pragma: no cover
