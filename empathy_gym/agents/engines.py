"""The policy's sampler engines (``generation.engine``): what the trainer, the recipe check,
the memory plan and the sampler-mismatch correction read of each, in one table.

A new engine is one :class:`SamplerEngine` in :data:`ENGINES`: its generator class (with
``from_trainer``) and the class of the simulated user that runs on the policy's own base
weights through it (with ``on_generator`` and ``options``). Imports nothing heavy: the
classes are named by import path and loaded when used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplerEngine:
    """One ``generation.engine``.

    Attributes:
        generator: ``"module:Class"`` of its generator; ``Class.from_trainer(trainer)``
            builds it (:mod:`empathy_gym.agents.generation`).
        policy_user: ``"module:Class"`` of the ``policy`` user's backend on it;
            ``Class.on_generator(generator, **options)`` builds it and ``Class.options()``
            names the options a ``policy,KEY=VALUE`` spec may give
            (:mod:`empathy_gym.backends.policy_backend`).
        tis_cap: the truncated importance sampling cap when the recipe's ``tis_cap`` is
            ``None`` (:func:`~empathy_gym.agents.mismatch.resolve_tis_cap`): 0 (off) where
            generation and training run the same model code, Yao et al.'s 2.0 otherwise.
        several_processes: whether several training processes can each hold one.
        kv_in_process: whether its key/value cache lives in the training process's memory
            (the memory plan counts it, and the ``policy`` user's); otherwise the engine
            takes a share of the device (``generation.vllm_gpu_memory_utilization``).
    """

    generator: str
    policy_user: str
    tis_cap: float
    several_processes: bool
    kv_in_process: bool

    def generator_class(self) -> type:
        return _load(self.generator)

    def policy_user_class(self) -> type:
        return _load(self.policy_user)


ENGINES: dict[str, SamplerEngine] = {
    "transformers": SamplerEngine(
        "empathy_gym.agents.generation:TransformersGenerator",
        "empathy_gym.backends.policy_backend:PolicyUserBackend",
        tis_cap=0.0,
        several_processes=True,
        kv_in_process=True,
    ),
    "vllm": SamplerEngine(
        "empathy_gym.agents.generation:VLLMGenerator",
        "empathy_gym.backends.policy_backend:VLLMPolicyUserBackend",
        tis_cap=2.0,
        several_processes=False,
        kv_in_process=False,
    ),
}


def sampler_engine(name: str) -> SamplerEngine:
    """The :class:`SamplerEngine` named ``name`` (a ``generation.engine`` value).

    Raises:
        ValueError: no such engine (the message lists them).
    """
    try:
        return ENGINES[str(name)]
    except KeyError:
        raise ValueError(f"generation.engine: unknown engine {name!r}; known: {', '.join(ENGINES)}") from None


def policy_user_options(engine: str) -> set[str]:
    """The options a ``policy`` user spec may give its backend when the policy generates
    with ``engine`` (``policy,KEY=VALUE``)."""
    return set(sampler_engine(engine).policy_user_class().options())


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
