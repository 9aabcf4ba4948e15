"""A local causal LM through Hugging Face transformers, on CPU or GPU.

:class:`TransformersBackend` renders each conversation with the chat template and samples
the left-padded batch with :func:`~empathy_gym.backends.prefix_cache.sample_batch`, which
prefills only what a prompt does not share with an earlier one (the persona, scene and
history that every call of a dialogue repeats).

Seeding: each conversation samples with its own ``torch.Generator``, so its completion
depends on its seed and its own logits only, not on its batch neighbours or the global
torch RNG. Caveat: padding changes the shapes of the matrix products, so the logits can
differ in the last bits between batches of different widths, which can in rare cases
flip a token. Same seeds, batch, device and library versions: same completions.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from empathy_gym.backends.base import BackendError, ChatBackend, Conversation, Sampling, option_token_ids
from empathy_gym.backends.models import ALIASES, load_causal_lm
from empathy_gym.backends.prefix_cache import PrefixKVCache, next_token_logits, sample_batch
from empathy_gym.boundary import ChatEncoder


def _resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> str | torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else "auto"
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(
            f"TransformersBackend: unknown dtype {dtype!r}; use 'auto', 'float32', "
            "'bfloat16', 'float16' or a torch.dtype"
        )
    return resolved


class TransformersBackend(ChatBackend):
    """A causal LM run in-process with transformers (:class:`~empathy_gym.backends.base.ChatBackend`).

    Args:
        model: an alias of :mod:`empathy_gym.backends.models` (``"tiny"``, ``"smollm2"``), a
            local directory or hub id, a ``.gguf`` file (dequantised), or a loaded
            ``PreTrainedModel`` (then ``tokenizer`` is required).
        tokenizer: ``None`` (load from ``model``, GGUF included), a path or hub id, or a
            loaded tokenizer. It must have a chat template (or pass ``chat_template``).
            If it has no pad token, its eos token becomes the pad token.
        device: ``"auto"`` (CUDA when available, else CPU), or any torch device such as
            ``"cpu"``, ``"cuda:1"``. A loaded model with ``"auto"`` stays where it is.
        dtype: ``"auto"`` (float32 on CPU, the checkpoint's dtype on GPU), a name such as
            ``"bfloat16"``, or a ``torch.dtype``. A loaded model with ``"auto"`` is not cast.
        gguf_file: the GGUF file's name inside ``model`` (a directory or hub id); not
            needed when ``model`` itself ends in ``.gguf``.
        chat_template: a Jinja chat template replacing the tokenizer's.
        max_batch_size: conversations per forward batch (>= 1); larger inputs are cut
            into consecutive chunks.
        prefix_cache_tokens: the most tokens whose key/value states are kept for reuse
            (>= 0; 0 turns reuse off; memory per token: see
            :class:`~empathy_gym.backends.prefix_cache.PrefixKVCache`).
        trust_remote_code: passed to ``from_pretrained``.
        model_kwargs: more keyword arguments for ``AutoModelForCausalLM.from_pretrained``
            (e.g. ``{"attn_implementation": "sdpa"}``).

    Attributes:
        model: the ``PreTrainedModel``, in eval mode.
        tokenizer: its tokenizer.
        device: the ``torch.device`` inputs are sent to.
        prefix_cache: the :class:`~empathy_gym.backends.prefix_cache.PrefixKVCache`.

    Raises:
        BackendError: the model or tokenizer cannot be loaded (message names the source),
            or the tokenizer has no chat template.
        ValueError: a bad argument (``max_batch_size`` < 1, unknown dtype, a loaded model
            without a tokenizer).
    """

    name = "transformers"
    supports_seed = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        gguf_file: str | None = None,
        chat_template: str | None = None,
        max_batch_size: int = 16,
        trust_remote_code: bool = False,
        model_kwargs: dict[str, Any] | None = None,
        prefix_cache_tokens: int = 32768,
    ):
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"TransformersBackend: max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if not isinstance(prefix_cache_tokens, int) or prefix_cache_tokens < 0:
            raise ValueError(
                f"TransformersBackend: prefix_cache_tokens must be an int >= 0, got {prefix_cache_tokens!r}"
            )
        self.max_batch_size = max_batch_size
        self.prefix_cache = PrefixKVCache(prefix_cache_tokens)
        if isinstance(model, str) and model in ALIASES:  # "tiny", "smollm2": offline, cached
            where = _resolve_device(device)
            model, tokenizer = load_causal_lm(
                model, dtype=_resolve_dtype(dtype, where), device=where, **(model_kwargs or {})
            )
            device = dtype = "auto"
        if isinstance(model, (str, os.PathLike)):
            self.device = _resolve_device(device)
            self.model, self.tokenizer = self._load(
                os.fspath(model),
                tokenizer,
                gguf_file,
                _resolve_dtype(dtype, self.device),
                trust_remote_code,
                model_kwargs or {},
            )
        else:
            if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
                raise ValueError(
                    "TransformersBackend: with a loaded model object, pass its loaded tokenizer as tokenizer="
                )
            self.model, self.tokenizer = model, tokenizer
            if device != "auto":
                self.model.to(_resolve_device(device))
            if dtype != "auto":
                self.model.to(_resolve_dtype(dtype, self.model.device))
            self.device = self.model.device
        self.model.eval()
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
        if not getattr(self.tokenizer, "chat_template", None):
            raise BackendError(
                "TransformersBackend: the tokenizer has no chat template; pass chat_template= (a Jinja string)"
            )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._eos_ids = self._collect_eos_ids()
        self.chat = ChatEncoder(self.tokenizer)

    def _load(
        self,
        source: str,
        tokenizer: Any,
        gguf_file: str | None,
        dtype: Any,
        trust_remote_code: bool,
        model_kwargs: dict[str, Any],
    ) -> tuple[Any, Any]:
        from empathy_gym.backends.models import require_existing_path

        try:
            require_existing_path(source)
        except FileNotFoundError as exc:
            raise BackendError(f"TransformersBackend: {exc}") from None
        if gguf_file is None and source.lower().endswith(".gguf"):
            path = Path(source)
            source, gguf_file = str(path.parent), path.name
        gguf = {"gguf_file": gguf_file} if gguf_file else {}
        where = source + (f" (gguf_file={gguf_file})" if gguf_file else "")
        try:
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **gguf)
            elif isinstance(tokenizer, (str, os.PathLike)):
                tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise BackendError(f"TransformersBackend: cannot load the tokenizer of {where}: {exc}") from exc
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, trust_remote_code=trust_remote_code, **gguf, **model_kwargs
            )
        except (OSError, ValueError) as exc:
            raise BackendError(f"TransformersBackend: cannot load the model {where}: {exc}") from exc
        return model.to(self.device), tokenizer

    def _collect_eos_ids(self) -> list[int]:
        ids = [self.tokenizer.eos_token_id]
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids += configured if isinstance(configured, (list, tuple)) else [configured]
        return sorted({int(i) for i in ids if i is not None})

    def _encode(self, conversations: Sequence[Conversation]) -> list[list[int]]:
        """Chat-template and tokenize each conversation (with the generation prompt), its
        contents as data (:class:`~empathy_gym.boundary.ChatEncoder`)."""
        rows = []
        for index, conversation in enumerate(conversations):
            if not conversation:
                raise ValueError(f"TransformersBackend: conversation {index} is empty")
            rows.append(self.chat.encode(conversation))
        return rows

    @property
    def context_length(self) -> int | None:
        """``max_position_embeddings`` of the model's config, or ``None`` when it has none."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(value) if value else None

    def prompt_lengths(self, conversations: Sequence[Conversation]) -> list[int]:
        """Tokens of each conversation after the chat template with the generation prompt
        (what :meth:`generate` feeds the model)."""
        return [len(row) for row in self._encode(conversations)]

    def _chunks(self, items: Sequence[Any]) -> list[Sequence[Any]]:
        return [items[i : i + self.max_batch_size] for i in range(0, len(items), self.max_batch_size)]

    @staticmethod
    def _seed_values(seeds: Sequence[int | None]) -> list[int]:
        """Each seed, or for ``None`` one drawn from the global torch RNG."""
        return [int(torch.randint(0, 2**62, (1,)).item()) if seed is None else int(seed) for seed in seeds]

    @torch.inference_mode()
    def _generate(
        self, conversations: Sequence[Conversation], sampling: Sampling, seeds: list[int | None]
    ) -> list[str]:
        """Sample in chunks of ``max_batch_size``: ``max_tokens=None`` runs until end of turn
        or a full context; a ``None`` seed is drawn from the global torch RNG; greedy at
        temperature 0. Returns the decoded new tokens, special tokens removed (``<think>``
        stays where the tokenizer marks it non-special), whitespace stripped.

        Raises:
            ValueError: ``max_tokens=None`` on a model whose config gives no context length.
        """
        max_tokens, temperature, top_p = sampling.max_tokens, sampling.temperature, sampling.top_p
        if max_tokens is None and self.context_length is None:
            raise ValueError(
                "generate: max_tokens=None needs the model's context length, and its "
                "config has no max_position_embeddings; give max_tokens"
            )
        texts: list[str] = []
        for chunk, chunk_seeds in zip(self._chunks(conversations), self._chunks(seeds)):
            prompts = self._encode(chunk)
            budget = (
                max_tokens
                if max_tokens is not None
                else [max(1, (self.context_length or len(p) + 1) - len(p)) for p in prompts]
            )
            rows = sample_batch(
                self.model,
                prompts,
                max_new_tokens=budget,
                eos_ids=self._eos_ids,
                pad_id=self.tokenizer.pad_token_id,
                temperature=temperature,
                top_p=top_p,
                seeds=self._seed_values(chunk_seeds),
                cache=self.prefix_cache,
            )
            texts += [
                text.strip()
                for text in self.tokenizer.batch_decode([row.token_ids for row in rows], skip_special_tokens=True)
            ]
        return texts

    def option_token_ids(self, options: Sequence[str]) -> list[int]:
        """:func:`~empathy_gym.backends.base.option_token_ids` with this tokenizer."""
        return option_token_ids(self.tokenizer, options)

    @torch.inference_mode()
    def choice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        """Log-probability that the assistant's reply starts with each option: one forward
        pass over the prompts, ``log_softmax`` over the whole vocabulary in float32 at the
        last position, read at each option's first token (:meth:`option_token_ids`).

        Returns:
            float64 array (B, K): natural-log probabilities, finite, each row's
            ``exp`` summing to at most 1.

        Raises:
            ValueError: as :meth:`option_token_ids`.
        """
        option_ids = torch.tensor(self.option_token_ids(options), device=self.device)
        rows = []
        for chunk in self._chunks(conversations):
            logits = next_token_logits(
                self.model, self._encode(chunk), pad_id=self.tokenizer.pad_token_id, cache=self.prefix_cache
            )
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            rows.append(logprobs[:, option_ids].cpu().double().numpy())
        return np.concatenate(rows, axis=0) if rows else np.zeros((0, len(options)))

    def close(self) -> None:
        """Drop the model and free GPU memory; the backend is unusable afterwards."""
        if getattr(self, "model", None) is None:
            return
        self.model = None
        self.prefix_cache.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        name = getattr(getattr(self.model, "config", None), "_name_or_path", None)
        return f"TransformersBackend(model={name!r}, device={str(self.device)!r})"
