"""The simulated user served by the policy's own weights, with its LoRA adapters off:
no second copy of the weights, no server (``env.kwargs.user: policy``; see
docs/training.md, "The user on the policy's own weights").

The base weights never change during LoRA training, so the user is the same model at
every step and the key/value states it caches stay valid across steps; the policy's
calls never see the user's cached states, and the user's never see the adapters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from empathy_gym.backends.base import Conversation
from empathy_gym.backends.transformers_backend import TransformersBackend
from empathy_gym.backends.vllm_backend import VLLMBackend, import_vllm


class PolicyUserBackend(TransformersBackend):
    """A :class:`~empathy_gym.backends.transformers_backend.TransformersBackend` on a
    peft model whose adapters are switched off for every call.

    Args:
        model: the policy, a peft ``PeftModel`` with LoRA adapters.
        tokenizer: its tokenizer (with a chat template).
        compute_dtype: ``torch.bfloat16`` to run under autocast as the trainer does
            (float32 master adapters over bfloat16 weights), else ``None``.
        **kwargs: more :class:`TransformersBackend` arguments (``max_batch_size``,
            ``prefix_cache_tokens``).

    Raises:
        ValueError: a model without adapters (a fully fine-tuned policy would change the
            user at every step: use another backend for the user).
    """

    name = "policy"

    def __init__(self, model: Any, tokenizer: Any, *, compute_dtype: torch.dtype | None = None, **kwargs: Any):
        if not hasattr(model, "disable_adapter"):
            raise ValueError(
                "backend='policy' needs a policy with LoRA adapters (policy.use_lora=true): the "
                "base model under them plays the user; a fully fine-tuned policy would change the "
                "user at every step"
            )
        was_training = model.training
        super().__init__(model, tokenizer, **kwargs)
        model.train(was_training)  # the trainer owns the mode; calls switch to eval and back
        self.compute_dtype = compute_dtype

    @contextlib.contextmanager
    def adapters_off(self) -> Iterator[None]:
        """Eval mode, no adapters, autocast in the trainer's compute dtype; restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                self.model.disable_adapter(),
                torch.autocast(
                    self.device.type, dtype=self.compute_dtype or torch.float32, enabled=self.compute_dtype is not None
                ),
            ):
                yield
        finally:
            self.model.train(was_training)

    def generate(self, conversations: Sequence[Conversation], **kwargs: Any) -> list[str]:
        with self.adapters_off():
            return super().generate(conversations, **kwargs)

    def choice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        with self.adapters_off():
            return super().choice_logprobs(conversations, options)

    def close(self) -> None:
        """Forget the cached states; the model belongs to the trainer and stays."""
        self.prefix_cache.clear()

    def __repr__(self) -> str:
        return f"PolicyUserBackend(device={str(self.device)!r})"

    @classmethod
    def on_generator(cls, generator: Any, **options: Any) -> PolicyUserBackend:
        """The user on a :class:`~empathy_gym.agents.generation.TransformersGenerator`'s
        model (the policy itself), in its compute dtype; ``options``: :meth:`options`."""
        return cls(generator.model, generator.tokenizer, compute_dtype=generator.compute_dtype, **options)

    @staticmethod
    def options() -> set[str]:
        """:class:`TransformersBackend`'s keywords less what the policy fixes (its model,
        tokenizer, device, dtype and files)."""
        from empathy_gym.user.specs import init_keywords

        fixed = ("model", "tokenizer", "device", "dtype", "gguf_file", "trust_remote_code", "model_kwargs")
        return init_keywords(TransformersBackend, *fixed)


class VLLMPolicyUserBackend(VLLMBackend):
    """A :class:`~empathy_gym.backends.vllm_backend.VLLMBackend` on the policy's own vLLM
    engine whose requests name no LoRA adapter, so vLLM samples from the base weights.

    Args:
        generator: the policy's :class:`~empathy_gym.agents.generation.VLLMGenerator`
            (LoRA enabled); its ``llm`` serves the user too.
        chat_template: a Jinja chat template replacing the tokenizer's.

    Raises:
        ImportError: vLLM is not installed.
        ValueError: a generator without LoRA: the policy's full weights are synced into
            its engine every step, so there is no base left to play the user.
    """

    name = "policy"

    def __init__(self, generator: Any, *, chat_template: str | None = None):
        if not getattr(generator, "lora_rank", 0):
            raise ValueError(
                "backend='policy' with generation.engine='vllm' needs a LoRA policy "
                "(policy.use_lora=true): without LoRA the engine holds the policy's own weights"
            )
        self.llm = generator.llm  # VLLMBackend's state, on the generator's engine
        self._attach(import_vllm(), chat_template)
        self.lora_request = None  # no adapter: the base weights

    def close(self) -> None:
        """Nothing to release: the engine belongs to the policy's generator."""

    def __repr__(self) -> str:
        return "VLLMPolicyUserBackend(the policy's engine, no LoRA request)"

    @classmethod
    def on_generator(cls, generator: Any, **options: Any) -> VLLMPolicyUserBackend:
        """The user on a :class:`~empathy_gym.agents.generation.VLLMGenerator`'s engine;
        ``options``: :meth:`options`."""
        return cls(generator, **options)

    @staticmethod
    def options() -> set[str]:
        """This class's keywords but the generator."""
        from empathy_gym.user.specs import init_keywords

        return init_keywords(VLLMPolicyUserBackend, "generator")
