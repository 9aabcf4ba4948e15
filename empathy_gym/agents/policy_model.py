"""The policy's weights: the device, loading, LoRA adapters and mixed precision (what the
trainer trains, set up before it does)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from empathy_gym.agents.config import RecipeError


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (for model initialisation; steps use derived seeds)."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU.

    Raises:
        RecipeError: a CUDA device asked for where torch has none.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RecipeError(
            f"policy.device {device!r}: this torch has no CUDA device (torch {torch.__version__}); use 'cpu' or 'auto'"
        )
    return torch.device(device)


def half_precision_dtype(model: Any) -> torch.dtype | None:
    """The model's floating dtype when it is bfloat16 or float16, else ``None``."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype if parameter.dtype in (torch.bfloat16, torch.float16) else None
    return None


def keep_trainable_in_float32(model: Any) -> Any:
    """Cast the parameters that train to float32 in place; frozen ones keep their dtype.

    Mixed precision (Micikevicius et al. 2018, arXiv 1710.03740, section 3.1): an update
    of lr * 1 (Adam's first step) = 1e-6 on a bfloat16 weight of size 0.02 is far below
    half of bfloat16's spacing there (2^-13 ~ 1.2e-4) and rounds away, so full fine-tuning
    in pure bfloat16 at RLVER's learning rate would not move at all. The forward passes
    still compute in half precision under ``torch.autocast``
    (:func:`~empathy_gym.agents.tokens.forward_tokens`).
    """
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.is_floating_point() and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    return model


def load_policy(config: Any, device: torch.device) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``config.policy.model`` in ``policy.dtype`` on ``device``
    (``policy.attn_implementation`` when set); then every RNG reseeded with ``config.seed``:
    a first load converts a GGUF file, which draws from the global RNG, and what comes next
    (LoRA's initial weights) must not depend on whether the cache was warm.

    Raises:
        OSError, ValueError: as :func:`~empathy_gym.backends.models.load_causal_lm`.
    """
    from empathy_gym.backends.models import load_causal_lm

    kwargs = {}
    if config.policy.attn_implementation:
        kwargs["attn_implementation"] = config.policy.attn_implementation
    model, tokenizer = load_causal_lm(config.policy.model, dtype=config.policy.dtype, device=device, **kwargs)
    seed_everything(config.seed)
    return model, tokenizer


def wrap_policy(model: Any, policy: Any, task_type: str | None = "CAUSAL_LM") -> Any:
    """LoRA adapters (when ``policy.use_lora``), float32 trained weights, gradient
    checkpointing; ``policy``: a recipe's :class:`~empathy_gym.agents.config.PolicyConfig`;
    ``task_type=None`` for a backbone without a language-model head."""
    if policy.use_lora:
        from peft import LoraConfig, get_peft_model

        target = policy.lora_target_modules
        lora = LoraConfig(
            r=policy.lora_r,
            lora_alpha=policy.lora_alpha,
            lora_dropout=policy.lora_dropout,
            task_type=task_type,
            target_modules=list(target) if isinstance(target, (list, tuple)) else target,
        )
        model = get_peft_model(model, lora)
    keep_trainable_in_float32(model)
    if policy.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if policy.use_lora:
            model.enable_input_require_grads()
    return model
