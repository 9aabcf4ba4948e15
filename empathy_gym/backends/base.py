"""The chat-backend protocol: a batch of conversations in, a batch of completions out.

A conversation is a list of chat messages ``{"role": "system"|"user"|"assistant",
"content": str}`` as in the OpenAI chat API and transformers' chat templates.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

Message = dict[str, str]
Conversation = Sequence[Message]


def option_token_ids(tokenizer: Any, options: Sequence[str]) -> list[int]:
    """The first token id of each option, tokenized alone (no special tokens, no leading
    space), as it would start the assistant's reply after the generation prompt.

    Raises:
        ValueError: no options, an option that tokenizes to nothing, or two options
            sharing their first token (they could not be told apart).
    """
    if not options:
        raise ValueError("choice_logprobs: options is empty")
    ids = []
    for option in options:
        tokens = tokenizer.encode(option, add_special_tokens=False)
        if not tokens:
            raise ValueError(f"choice_logprobs: option {option!r} tokenizes to no token")
        ids.append(int(tokens[0]))
    if len(set(ids)) != len(ids):
        names = [tokenizer.convert_ids_to_tokens(i) for i in ids]
        raise ValueError(
            f"choice_logprobs: options {list(options)} share a first token "
            f"({names}); use options that start with different tokens"
        )
    return ids


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one batch is sampled, checked once for every backend.

    Attributes:
        max_tokens: new tokens per completion, >= 1; ``None``: no cap but the model's
            context (the server's default for a remote one).
        temperature: >= 0; 0 means greedy decoding.
        top_p: nucleus sampling mass in (0, 1].

    Raises:
        ValueError: a value out of its range (the message names the field).
    """

    max_tokens: int | None = 256
    temperature: float = 0.7
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"generate: max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"generate: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"generate: top_p must be in (0, 1], got {self.top_p}")


def seed_list(conversations: Sequence[Conversation], seeds: Sequence[int | None] | None) -> list[int | None]:
    """One seed (or ``None``) per conversation: ``seeds`` as a list, or B ``None``s.

    Raises:
        ValueError: ``len(seeds)`` is not the number of conversations.
    """
    seeds = [None] * len(conversations) if seeds is None else list(seeds)
    if len(seeds) != len(conversations):
        raise ValueError(f"generate: got {len(seeds)} seeds for {len(conversations)} conversations")
    return seeds


class BackendError(RuntimeError):
    """A backend failed: bad configuration, a 4xx answer, or retries exhausted."""


class ChoiceScoringUnavailable(BackendError):
    """The backend (or the server behind it) returns no token log-probabilities, so
    :meth:`ChatBackend.choice_logprobs` cannot score options."""


class ChatBackend(abc.ABC):
    """A chat engine behind one batched interface.

    Attributes:
        name: the backend's registry name (``"transformers"``, ``"vllm"``, ``"openai"``).
        supports_seed: True when ``seeds`` make sampling reproducible.
    """

    name: str = "base"
    supports_seed: bool = False

    @property
    def context_length(self) -> int | None:
        """The model's context window in tokens (prompt plus completion), or ``None``
        where the backend cannot tell."""
        return None

    def prompt_lengths(self, conversations: Sequence[Conversation]) -> list[int] | None:
        """The prompt length in tokens of each conversation as the model sees it (chat
        template and generation prompt included), or ``None`` where the backend cannot
        count (a remote server)."""
        return None

    def generate(
        self,
        conversations: Sequence[Conversation],
        *,
        max_tokens: int | None = 256,
        temperature: float = 0.7,
        top_p: float = 1.0,
        seeds: Sequence[int | None] | None = None,
    ) -> list[str]:
        """Complete each conversation with one assistant message.

        Args:
            conversations: B conversations, each ending with a user message.
            max_tokens, temperature, top_p: see :class:`Sampling`.
            seeds: one seed per conversation (or ``None``); where ``supports_seed`` the
                same seeds give the same completions.

        Returns:
            B strings, the assistant messages without special tokens, whitespace
            stripped at both ends (``[]`` for no conversations).

        Raises:
            ValueError: a sampling value out of range, or a seeds length other than B.
            BackendError: the engine or server failed (see each backend).
        """
        sampling = Sampling(max_tokens, temperature, top_p)
        seeds = seed_list(conversations, seeds)
        return self._generate(conversations, sampling, seeds) if conversations else []

    @abc.abstractmethod
    def _generate(
        self, conversations: Sequence[Conversation], sampling: Sampling, seeds: list[int | None]
    ) -> list[str]:
        """:meth:`generate` for a checked, non-empty batch: what each backend implements."""

    @abc.abstractmethod
    def choice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        """The log-probability that the assistant's reply starts with each option, from the
        model's next-token distribution. Each option should be one token of the vocabulary
        (single letters such as ``"A"``...``"E"`` are).

        Returns:
            float64 array of shape (B, K): natural-log probabilities, ``-inf`` for an
            option the server did not report (outside its top log-probs).

        Raises:
            ChoiceScoringUnavailable: the backend or server gives no log-probabilities.
        """

    def close(self) -> None:  # noqa: B027  (a no-op by default, not abstract)
        """Release models, processes or connections. Safe to call twice."""

    def __enter__(self) -> ChatBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
