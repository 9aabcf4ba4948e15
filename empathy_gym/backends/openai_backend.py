"""Any OpenAI-compatible chat-completions server (vLLM, SGLang, transformers serve,
llama.cpp, OpenAI itself) through httpx; retries, timeouts and each server's quirks are
in docs/backends.md.

One ``POST {base_url}/chat/completions`` per conversation, at most ``max_concurrency``
in flight. 429, 5xx and connection errors are retried with backoff (or ``Retry-After``);
an answer that runs out of ``timeout`` is not: the server is hanging or overloaded, and
sending the request again would only queue it twice.

The API key goes only into the ``Authorization`` header: never into ``repr``, logs or
error messages (any echo of it in a server's message is masked). Message contents are
data: the server tokenizes its rendered chat template with special tokens parsed, so
every content is :func:`~empathy_gym.boundary.neutralise`-d before it is sent.

Seeds go into each request as ``seed``. ``transformers serve`` seeds its global RNG
when a request arrives and runs requests one by one, so its seeds reproduce only with
``max_concurrency=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import tenacity

from empathy_gym.backends.base import (
    BackendError,
    ChatBackend,
    ChoiceScoringUnavailable,
    Conversation,
    Sampling,
    seed_list,
)
from empathy_gym.boundary import ChatEncoder, neutralise

logger = logging.getLogger(__name__)

#: Longest ``Retry-After`` honoured (seconds) unless ``backoff_max`` is longer.
RETRY_AFTER_MAX = 60.0

#: Top alternatives asked for by :meth:`OpenAIBackend.choice_logprobs` (OpenAI's maximum).
TOP_LOGPROBS = 20


class TransientHTTPError(Exception):
    """A failure worth retrying: HTTP 429 or 5xx, or a connection/timeout error.

    Attributes:
        retry_after: seconds the server asked to wait (``Retry-After``), or ``None``.
        unreachable: no connection could be made (refused, or timed out connecting).
    """

    def __init__(self, message: str, retry_after: float | None = None, *, unreachable: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.unreachable = unreachable


class AnswerTimeout(BackendError):
    """The server took the request and did not answer within ``timeout``: hanging or
    overloaded. Not retried, and not taken for a missing endpoint."""


class ServerUnreachable(BackendError):
    """No connection could be made in any attempt of a request: nothing listens at the URL.
    The context probe (``/tokenize``) raises it too, so that a request's one retry budget is
    spent once, not again by the chat request that would follow."""


class WaitRetryAfter(tenacity.wait.wait_base):
    """Wait ``Retry-After`` seconds when the last error carries it (capped at
    ``maximum``), else as ``fallback`` says."""

    def __init__(self, fallback: tenacity.wait.wait_base, maximum: float):
        self.fallback, self.maximum = fallback, maximum

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, TransientHTTPError) and error.retry_after is not None:
            return min(error.retry_after, self.maximum)
        return self.fallback(retry_state)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds >= 0: a number of seconds or an HTTP date; ``None`` if
    absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def server_message(response: httpx.Response) -> str:
    """The error text of a response: OpenAI's ``error.message``, FastAPI's ``detail``, a
    ``message`` field, or else the body (first 500 characters)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for value in (error, body.get("detail"), body.get("message")):
            if value:
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)[:500]


class OpenAIBackend(ChatBackend):
    """An OpenAI-compatible chat-completions server (:class:`~empathy_gym.backends.base.ChatBackend`).

    Args:
        base_url: the API root, e.g. ``"http://localhost:8000/v1"``; requests go to
            ``{base_url}/chat/completions``.
        model: the ``model`` field of each request.
        api_key_env: name of the environment variable holding the API key, read once
            here; unset or empty means no ``Authorization`` header.
        timeout: seconds to wait for each answer (read and write); a request that runs
            out of it fails at once, without retries.
        connect_timeout: seconds to open a connection; retried like connection errors.
        max_retries: retries after each request's first attempt, for 429, 5xx,
            connection errors and connect timeouts.
        max_concurrency: requests in flight at once (>= 1).
        extra_body: fields merged into every request body (e.g. ``{"top_k": 20}`` for
            vLLM); they override the backend's own fields.
        backoff_initial: seconds before the first retry; doubles each retry, plus up to
            ``backoff_initial`` of random jitter.
        backoff_max: longest backoff between attempts (seconds). A server's
            ``Retry-After`` replaces the backoff and is honoured up to
            ``max(backoff_max, 60)`` seconds.
        tokenizer: the served model's tokenizer (a loaded one, or a local path or hub id
            loaded offline) to count prompt tokens here; ``None`` asks the server.
        context_length: the served model's context in tokens (``max_model_len``);
            ``None`` takes what the server's ``/tokenize`` reports.

    Raises:
        ValueError: ``max_retries`` < 0, ``max_concurrency`` < 1, a timeout <= 0, or a
            ``base_url`` that is not an http(s) URL with a host.
    """

    name = "openai"
    supports_seed = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 300.0,
        connect_timeout: float = 5.0,
        max_retries: int = 5,
        max_concurrency: int = 8,
        extra_body: dict[str, Any] | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        tokenizer: Any = None,
        context_length: int | None = None,
    ):
        if max_retries < 0:
            raise ValueError(f"OpenAIBackend: max_retries must be >= 0, got {max_retries}")
        if max_concurrency < 1:
            raise ValueError(f"OpenAIBackend: max_concurrency must be >= 1, got {max_concurrency}")
        if not (timeout > 0 and connect_timeout > 0):
            raise ValueError(
                f"OpenAIBackend: timeout and connect_timeout must be > 0, got {timeout} and {connect_timeout}"
            )
        try:
            url = httpx.URL(base_url)
        except (httpx.InvalidURL, TypeError):
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ValueError(
                f"OpenAIBackend: base_url must be an http:// or https:// URL with a host, "
                f"e.g. http://localhost:8000/v1; got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        self.tokenize_url = f"{root}/tokenize"
        self._context = context_length
        self._encoder = None
        if tokenizer is not None:
            if isinstance(tokenizer, (str, os.PathLike)):
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer))
            self._encoder = ChatEncoder(tokenizer)
        self._server_tokenizes: bool | None = None  # unknown until asked
        self._option_cache: dict[tuple[str, ...], list[int]] = {}
        self.model = model
        self.max_retries, self.max_concurrency = max_retries, max_concurrency
        self.extra_body = dict(extra_body or {})
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._wait = WaitRetryAfter(
            tenacity.wait_exponential_jitter(multiplier=backoff_initial, max=backoff_max, jitter=backoff_initial),
            max(backoff_max, RETRY_AFTER_MAX),
        )
        self._warned_unreachable = False
        self._api_key = os.environ.get(api_key_env) or None
        self._headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, authorized={self._api_key is not None})"
        )

    # ----- one request -----

    def _retrying(self, url: str, retrying_class: type = tenacity.Retrying) -> Any:
        return retrying_class(
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            reraise=True,
            retry=tenacity.retry_if_exception_type(TransientHTTPError),
            before_sleep=functools.partial(self._warn_unreachable, url),
        )

    def _warn_unreachable(self, url: str, retry_state: tenacity.RetryCallState) -> None:
        """Say once, at the first refused connection, what the retries wait for."""
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if self._warned_unreachable or not getattr(error, "unreachable", False):
            return
        self._warned_unreachable = True
        logger.warning(
            "POST %s: %s; retrying up to %d times (max_retries=0 in the spec fails at once); %s",
            url,
            error,
            self.max_retries,
            self.unreachable_hint(),
        )

    def _mask(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _read(self, response: httpx.Response) -> dict:
        """The JSON body of a 2xx answer; raises TransientHTTPError or BackendError."""
        status = response.status_code
        if status == 429 or status >= 500:
            raise TransientHTTPError(
                f"HTTP {status}: {self._mask(server_message(response))}",
                parse_retry_after(response.headers.get("retry-after")),
            )
        if status >= 400:
            hint = (
                "; OpenAI-compatible servers answer under /v1: does base_url end in /v1?"
                if (status == 404 and not self.base_url.endswith("/v1"))
                else ""
            )
            raise BackendError(
                f"POST {response.request.url} (model {self.model!r}) failed with HTTP {status}: "
                f"{self._mask(server_message(response))}{hint}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise BackendError(
                f"POST {response.request.url}: HTTP {status} with a body that is not JSON: "
                f"{self._mask(response.text[:200])!r}"
            ) from exc

    @contextlib.contextmanager
    def _giving_up(self, url: str, attempts: list[int]) -> Iterator[None]:
        """The retries' last error as a BackendError naming ``url`` and the attempts sent
        (``attempts[0]``); a :class:`ServerUnreachable` with :meth:`unreachable_hint` when it
        never connected."""
        try:
            yield
        except TransientHTTPError as error:
            sent = attempts[0]
            kind = ServerUnreachable if error.unreachable else BackendError
            hint = f"; {self.unreachable_hint()}" if error.unreachable else ""
            raise kind(
                f"POST {url} (model {self.model!r}): gave up after "
                f"{sent} attempt{'s' if sent != 1 else ''}; last error: {error}{hint}"
            ) from None

    def unreachable_hint(self) -> str:
        """What to check when nothing answers at ``base_url``."""
        port = httpx.URL(self.base_url).port or 8000
        return (
            f"is a server running at {self.base_url}? "
            f"Start one, e.g. `python -m vllm.entrypoints.openai.api_server --model MODEL "
            f'--host 127.0.0.1 --port {port}`, or see docs/backends.md, "Serving the simulated user"'
        )

    @contextlib.contextmanager
    def _transport_errors(self, url: str) -> Iterator[None]:
        """A transport error as a TransientHTTPError to retry; a read timeout fails at once
        (:class:`AnswerTimeout`)."""
        try:
            yield
        except httpx.ReadTimeout:
            raise AnswerTimeout(
                f"POST {url} (model {self.model!r}): no answer within "
                f"{self.timeout.read:g} s (timeout); the server is hanging or "
                f"overloaded. Not retried; raise timeout= (backend_kwargs="
                f"{{'timeout': ...}}) for long generations"
            ) from None
        except httpx.TransportError as exc:
            raise TransientHTTPError(
                f"{type(exc).__name__}: {self._mask(str(exc))}",
                unreachable=isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)),
            ) from None

    def _post(self, client: httpx.Client, payload: dict, url: str | None = None) -> dict:
        url, attempts = url or self.url, [0]

        def once() -> dict:
            attempts[0] += 1
            with self._transport_errors(url):
                response = client.post(url, json=payload)
            return self._read(response)

        with self._giving_up(url, attempts):
            return self._retrying(url)(once)

    async def _apost(self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, payload: dict) -> dict:
        attempts = [0]

        async def once() -> dict:
            attempts[0] += 1
            async with semaphore:
                with self._transport_errors(self.url):
                    response = await client.post(self.url, json=payload)
            return self._read(response)

        with self._giving_up(self.url, attempts):
            return await self._retrying(self.url, tenacity.AsyncRetrying)(once)

    # ----- batches -----

    def _post_all(self, payloads: list[dict], url: str | None = None) -> list[dict]:
        if self._client is None:  # httpx.Client is thread-safe: one pool of connections
            self._client = httpx.Client(timeout=self.timeout, headers=self._headers)
        client = self._client
        if len(payloads) <= 1 or self.max_concurrency == 1:
            return [self._post(client, payload, url) for payload in payloads]
        failed = threading.Event()

        def post(payload: dict) -> dict:
            if failed.is_set():  # a request of the batch gave up, so the batch has failed: send no more
                raise BackendError("not sent: another request of the batch failed")
            try:
                return self._post(client, payload, url)
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(payloads))) as pool:
            return list(pool.map(post, payloads))

    async def _apost_all(self, payloads: list[dict]) -> list[dict]:
        semaphore = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, headers=self._headers) as client:
            tasks = [asyncio.ensure_future(self._apost(client, semaphore, payload)) for payload in payloads]
            try:
                return list(await asyncio.gather(*tasks))
            finally:  # after a failure, the waiting requests are not sent
                for task in tasks:
                    task.cancel()

    @staticmethod
    def _messages(conversation: Conversation) -> list[dict]:
        return [
            {**message, "content": neutralise(message["content"])}
            if isinstance(message.get("content"), str)
            else dict(message)
            for message in conversation
        ]

    # ----- context -----

    def _ask_server(self, conversations: Sequence[Conversation]) -> list[dict] | None:
        """The server's ``/tokenize`` answers, or ``None`` when it has no such endpoint
        (remembered) or cannot be reached now (asked again next time).

        Raises:
            AnswerTimeout: the server took the request and did not answer (asking the
                chat endpoint next would wait as long again).
            ServerUnreachable: nothing listens at the URL (the chat request next would
                retry as long again).
        """
        if self._server_tokenizes is False or not conversations:
            return None
        payloads = [
            {"model": self.model, "messages": self._messages(c), "add_generation_prompt": True} for c in conversations
        ]
        try:
            answers = self._post_all(payloads, self.tokenize_url)
        except (AnswerTimeout, ServerUnreachable):
            raise
        except BackendError as error:
            if "failed with HTTP 4" in str(error):  # no such endpoint, or not vLLM's
                self._server_tokenizes = False
            return None
        self._server_tokenizes = all(
            isinstance(a, dict) and isinstance(a.get("count"), int) and isinstance(a.get("tokens"), list)
            for a in answers
        )
        if not self._server_tokenizes:  # something else answers there
            return None
        if self._context is None and answers and answers[0].get("max_model_len"):
            self._context = int(answers[0]["max_model_len"])
        return answers

    @property
    def context_length(self) -> int | None:
        """``context_length`` as given, else the ``max_model_len`` of the server's ``/tokenize``.

        Raises:
            AnswerTimeout, ServerUnreachable: as :meth:`prompt_lengths`.
        """
        if self._context is None:
            self._ask_server([[{"role": "user", "content": "hi"}]])
        return self._context

    def prompt_lengths(self, conversations: Sequence[Conversation]) -> list[int] | None:
        """Prompt tokens of each conversation as the server will see it (contents
        neutralised, chat template, generation prompt): counted with the local
        ``tokenizer``, else by the server's ``/tokenize``; ``None`` where neither is there.

        Raises:
            AnswerTimeout: ``/tokenize`` took the request and did not answer in ``timeout``.
            ServerUnreachable: no connection to the server in any of the request's attempts.
        """
        if self._encoder is not None:
            return [len(self._encoder.encode(self._messages(c))) for c in conversations]
        answers = self._ask_server(conversations)
        return None if answers is None else [int(answer["count"]) for answer in answers]

    def _payload(self, conversation: Conversation, **fields: Any) -> dict:
        payload = {"model": self.model, "messages": self._messages(conversation)}
        payload.update({key: value for key, value in fields.items() if value is not None})
        payload.update(self.extra_body)
        return payload

    def _generate_payloads(
        self, conversations: Sequence[Conversation], sampling: Sampling, seeds: list[int | None]
    ) -> list[dict]:
        fields = dataclasses.asdict(sampling)
        return [self._payload(conversation, **fields, seed=seed) for conversation, seed in zip(conversations, seeds)]

    def _content(self, body: dict) -> str:
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendError(
                f"POST {self.url}: the answer has no choices[0].message.content: {json.dumps(body)[:300]}"
            ) from exc
        return (content or "").strip()

    def _generate(
        self, conversations: Sequence[Conversation], sampling: Sampling, seeds: list[int | None]
    ) -> list[str]:
        """One request each, with the ``max_tokens``, ``temperature``, ``top_p`` and ``seed``
        fields (left out where ``None``: the server's default); returns each
        ``choices[0].message.content`` stripped (``""`` for null).

        Raises:
            BackendError: a 4xx other than 429 (with status and server message), a body
                without content, no answer within ``timeout``, or retries exhausted.
        """
        payloads = self._generate_payloads(conversations, sampling, seeds)
        return [self._content(body) for body in self._post_all(payloads)]

    async def agenerate(
        self, conversations: Sequence[Conversation], *, seeds: Sequence[int | None] | None = None, **sampling: Any
    ) -> list[str]:
        """:meth:`generate` for asyncio: same arguments (``sampling``: the fields of
        :class:`~empathy_gym.backends.base.Sampling`), results and errors; at most
        ``max_concurrency`` requests of this call in flight."""
        payloads = self._generate_payloads(conversations, Sampling(**sampling), seed_list(conversations, seeds))
        return [self._content(body) for body in await self._apost_all(payloads)]

    # ----- choice scoring -----

    def _option_ids(self, options: Sequence[str]) -> list[int] | None:
        """The first token id of each option from the server's ``/tokenize``, for vLLM's
        ``logprob_token_ids``; ``None`` for a server without it."""
        if self._server_tokenizes is None:
            self.context_length  # noqa: B018 - asks the server whether it tokenizes
        if not self._server_tokenizes:
            return None
        key = tuple(options)
        if key not in self._option_cache:
            answers = self._post_all(
                [{"model": self.model, "prompt": option, "add_special_tokens": False} for option in options],
                self.tokenize_url,
            )
            self._option_cache[key] = [int(answer["tokens"][0]) for answer in answers]
        return self._option_cache[key]

    def _choice_payloads(self, conversations: Sequence[Conversation], options: Sequence[str]) -> list[dict]:
        if not options:
            raise ValueError("choice_logprobs: options is empty")
        ids = self._option_ids(options)
        exact = {"logprob_token_ids": ids} if ids is not None else {}
        return [
            self._payload(
                conversation, max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=TOP_LOGPROBS, **exact
            )
            for conversation in conversations
        ]

    def _choice_row(self, body: dict, options: Sequence[str]) -> np.ndarray:
        try:
            first = body["choices"][0]["logprobs"]["content"][0]
        except (KeyError, IndexError, TypeError):
            raise ChoiceScoringUnavailable(
                f"{self.base_url} (model {self.model!r}) returned no logprobs although the "
                "request set logprobs=true: this server ignores logprobs (transformers serve "
                "does), so options cannot be scored; use a vLLM or OpenAI server, or the "
                "transformers or vllm backend"
            ) from None
        alternatives = list(first.get("top_logprobs") or []) + [first]
        row = np.full(len(options), -np.inf)
        wanted = {option.strip(): index for index, option in enumerate(options)}
        seen: set[str] = set()
        for alternative in alternatives:
            token = alternative.get("token")
            if token in seen or token is None or alternative.get("logprob") is None:
                continue
            seen.add(token)
            index = wanted.get(token.strip())
            if index is not None:  # "A" and " A" both start the reply with A: add them
                row[index] = np.logaddexp(row[index], float(alternative["logprob"]))
        return row

    def _choice_matrix(self, bodies: list[dict], options: Sequence[str]) -> np.ndarray:
        rows = [self._choice_row(body, options) for body in bodies]
        return np.array(rows, dtype=np.float64).reshape(len(bodies), len(options))

    def choice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        """Score options from the first generated token's top log-probabilities.

        Each request asks ``max_tokens=1, temperature=0, logprobs=true,
        top_logprobs=20``, and, on a server with vLLM's ``/tokenize``, names the options'
        first tokens in ``logprob_token_ids``, so vLLM reports their log-probs whatever
        their rank. The first token's alternatives (the reported ones and the sampled
        token) are matched to the options after stripping whitespace from both; tokens
        that match the same option (``"A"``, ``" A"``) have their probabilities added.

        Returns:
            float64 (B, K): natural-log probabilities; ``-inf`` where an option is not
            among the reported alternatives.

        Raises:
            ChoiceScoringUnavailable: the answer carries no logprobs (the server ignores
                the field).
            BackendError, ValueError: as :meth:`generate`; empty ``options``.
        """
        bodies = self._post_all(self._choice_payloads(conversations, options))
        return self._choice_matrix(bodies, options)

    async def achoice_logprobs(self, conversations: Sequence[Conversation], options: Sequence[str]) -> np.ndarray:
        """:meth:`choice_logprobs` for asyncio."""
        bodies = await self._apost_all(self._choice_payloads(conversations, options))
        return self._choice_matrix(bodies, options)

    def close(self) -> None:
        """Close the HTTP connections; later calls reopen them."""
        if self._client is not None:
            self._client.close()
            self._client = None


__all__ = [
    "OpenAIBackend",
    "TOP_LOGPROBS",
    "TransientHTTPError",
    "WaitRetryAfter",
    "parse_retry_after",
    "server_message",
]
