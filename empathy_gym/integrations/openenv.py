"""The environment as an OpenEnv server (``openenv-core`` 0.3, the library OpenEnv's clients
and TRL speak to): typed action, observation and state, WebSocket sessions that share one
simulated user, and a typed client.

* :class:`EmpathyAction`: the agent's utterance. :class:`EmpathyObservation`: the user's
  line (the opening after ``reset``, the reply after ``step``), the emotion (0-100), the
  turn, the persona, why the dialogue ended, and the agent-side chat so far; ``reward``
  and ``done`` as OpenEnv defines them (``reward`` is the env's: the emotion change / 100
  under ``reward_mode="delta"``; ``done`` is ``terminated or truncated``).
  :class:`EmpathyState`: the episode id, the step count, the emotion, the persona.
* :func:`make_app`: the FastAPI app. Every WebSocket session gets its own env on one
  :class:`~empathy_gym.engine.DialogueEngine`, so the turns of concurrent sessions reach
  the simulated user together (``batch_window_ms``), as the vector env's do in-process;
  ``reset(seed=s, persona=ID)`` plays the same dialogue as ``env.reset(seed=s,
  options={"persona": ID})`` in-process. OpenEnv's plain HTTP ``/reset`` and ``/step``
  build a fresh env per request (its convention): a dialogue needs a WebSocket session.
* :class:`EmpathyEnvClient`: OpenEnv's ``EnvClient`` for this server (``.sync()`` for a
  blocking one).

Run it with ``empathy-gym serve`` (binds 127.0.0.1 by default). Needs
``pip install 'empathy-gym[openenv]'``.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field
except ImportError as error:  # pragma: no cover - the layered checks run with it
    raise ImportError(
        "empathy_gym.integrations.openenv needs openenv-core 0.3: pip install 'empathy-gym[openenv]'"
    ) from error

from empathy_gym.backends.base import BackendError
from empathy_gym.engine import DialogueEngine
from empathy_gym.evaluation.run_folder import EvaluationError, append_records
from empathy_gym.user.base import SimulatorError

log = logging.getLogger(__name__)

ENV_NAME = "empathy_dialogue"
#: uvicorn's exit code when the server cannot start (a port in use, say)
STARTUP_FAILURE = 3
#: the WebSocket close code for a message over the size limit (RFC 6455)
MESSAGE_TOO_BIG = 1009
#: the info keys an observation carries as fields of their own
NAMED = ("messages", "emotion", "turn", "persona_id", "termination_reason")


class EmpathyAction(Action):
    """One agent turn."""

    utterance: str = Field(..., description="the agent's reply to the simulated user")


class EmpathyObservation(Observation):
    """What the agent sees after ``reset`` or ``step`` (``done`` and ``reward``: OpenEnv's)."""

    text: str = Field(default="", description="the user's line: the opening after reset, else the reply")
    emotion: int = Field(default=0, ge=0, le=100, description="the user's emotion after the turn, 0-100")
    turn: int = Field(default=0, ge=0, description="agent turns played so far")
    persona_id: str = Field(default="", description="the persona's id in the server's bank")
    termination_reason: str | None = Field(default=None, description="why the dialogue ended (None: it goes on)")
    messages: list[dict[str, str]] = Field(
        default_factory=list, description="the agent-side chat so far (system prompt, user and assistant turns)"
    )
    info: dict[str, Any] = Field(
        default_factory=dict, description="the rest of the env's info (its flags, the appraisal), as JSON"
    )


class EmpathyState(State):
    """The session's dialogue: OpenEnv's episode id and step count, and ours."""

    emotion: int = 0
    persona_id: str = ""


class RequestError(Exception):
    """A request the server refuses: an HTTP status and a message naming the field or
    limit (over a WebSocket session, the message of OpenEnv's error answer)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ServerLog:
    """What :func:`make_app` counts for ``/metrics`` (thread-safe), and the finished
    dialogues it appends to ``path`` (JSON lines, fsynced as each one ends)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        if self.path is not None:
            try:
                self.path.open("ab").close()
            except OSError as error:
                raise OSError(f"--log-dialogues {self.path}: cannot append to it ({error.strerror})") from None

    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self.counts[name] += by

    def active_sessions(self) -> int:
        """Sessions open: envs built and not yet closed (expired or disconnected), less the
        plain HTTP requests in flight (OpenEnv builds an env for each, and closes it after)."""
        with self._lock:
            built = self.counts["sessions_opened"] - self.counts["sessions_closed"]
            return max(0, built - self.counts["http_requests_in_flight"])

    def finished(self, record: dict[str, Any]) -> None:
        """Count a finished dialogue and append it to ``path``; a failed write is logged
        and counted (``log_failures``), and the client's turn is answered all the same."""
        self.count("dialogues_finished")
        if self.path is not None:
            try:
                with self._lock:
                    append_records(self.path, [record])
            except (OSError, EvaluationError) as error:
                self.count("log_failures")
                log.error("a finished dialogue (%s) was not logged: %s", record.get("episode_id"), error)


class EmpathyEnvironment(Environment):
    """One session's dialogue, an env of ``engine`` (whose simulated user every session shares).

    Raises (as an OpenEnv error answer to the client): ``step`` before ``reset`` or after
    the dialogue ended (``RuntimeError``), the user's failure
    (:class:`~empathy_gym.user.base.SimulatorError`). A reply longer than the env's
    ``max_utterance_chars`` is cut there (``info["action_truncated"]``), as in-process.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, engine: DialogueEngine, *, max_action_chars: int = 8192, server_log: ServerLog | None = None):
        super().__init__()
        self.engine = engine
        self.env = engine.new_env()
        self.max_action_chars = max_action_chars
        self.server_log = server_log if server_log is not None else ServerLog()
        self.server_log.count("sessions_opened")
        self._state = EmpathyState()
        self._seed: int | None = None
        self.closed = False

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, persona: str | None = None, **kwargs: Any
    ) -> EmpathyObservation:
        """A new dialogue, without the user's lock (OpenEnv calls :meth:`reset_async`)."""
        options = self._reset_options(seed, persona, kwargs)
        return self._started(*self._refusing(lambda: self.env.reset(seed=seed, options=options)), seed, episode_id)

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, persona: str | None = None, **kwargs: Any
    ) -> EmpathyObservation:
        """A new dialogue: ``env.reset(seed=seed, options={"persona": persona})``, in a worker
        thread under the lock the turns' batches hold.

        Raises:
            RequestError: 422, a key other than ``seed``, ``episode_id`` and ``persona``, a
                persona that is not a string or not in the bank, a seed that is not an int;
                410, the session expired.
        """
        options = self._reset_options(seed, persona, kwargs)
        try:
            text, info = await self.engine.reset(self.env, seed, options)
        except Exception as error:  # noqa: BLE001  (translated, or raised as it is)
            raise self._refused(_translated(error)) from None
        return self._started(text, info, seed, episode_id)

    def _reset_options(self, seed: Any, persona: Any, unknown: dict[str, Any]) -> dict[str, Any] | None:
        self._check_open()
        if unknown:
            raise self._refused(
                RequestError(422, f"reset: unknown key(s) {sorted(unknown)}; it takes seed, episode_id and persona")
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise self._refused(RequestError(422, f"reset: seed must be an int >= 0 or null, got {seed!r}"))
        if persona is not None and not isinstance(persona, str):
            raise self._refused(RequestError(422, f"reset: persona must be a persona id (a string), got {persona!r}"))
        return {"persona": persona} if persona is not None else None

    def _check_open(self) -> None:
        if self.closed:
            raise self._refused(
                RequestError(410, "this session has expired (idle over --idle-timeout-s) or was closed; open a new one")
            )

    def _refused(self, error: Exception) -> Exception:
        """Count and log a refusal (over WebSocket too, where no HTTP handler sees it)."""
        if isinstance(error, RequestError):
            self.server_log.count(f"refused_{error.status}")
            log.warning("refused a request of session %s: %s", self._state.episode_id or "-", error)
        return error

    def _refusing(self, call: Any) -> Any:
        try:
            return call()
        except Exception as error:  # noqa: BLE001  (translated, or raised as it is)
            raise self._refused(_translated(error)) from None

    def _started(self, text: str, info: dict[str, Any], seed: int | None, episode_id: str | None) -> EmpathyObservation:
        self._seed = seed
        self._state = EmpathyState(episode_id=episode_id, step_count=0, persona_id=info["persona_id"])
        self.server_log.count("dialogues_started")
        return self._observation(text, info, reward=None, done=False)

    def step(self, action: EmpathyAction, timeout_s: float | None = None, **kwargs: Any) -> EmpathyObservation:
        """One turn without batching (OpenEnv calls :meth:`step_async`)."""
        self._check(action)
        return self._finish(self._refusing(lambda: self.env.step(action.utterance)))

    async def step_async(
        self, action: EmpathyAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EmpathyObservation:
        """One turn, batched with the other sessions' turns into one call of the user.

        Raises:
            RequestError: 413, an utterance over ``max_action_chars``; 409, no dialogue
                running; 503, the simulated user failed (the server serves on).
        """
        self._check(action)
        try:
            result = await self.engine.submit(self.env, action.utterance)
        except Exception as error:  # noqa: BLE001  (translated, or raised as it is)
            raise self._refused(_translated(error)) from None
        return self._finish(result)

    def _check(self, action: EmpathyAction) -> None:
        self._check_open()
        if len(action.utterance) > self.max_action_chars:
            raise self._refused(
                RequestError(
                    413,
                    f"action.utterance: {len(action.utterance)} characters, over this server's limit of "
                    f"{self.max_action_chars} (--max-action-chars)",
                )
            )

    def _finish(self, result: tuple[str, Any, bool, bool, dict[str, Any]]) -> EmpathyObservation:
        text, reward, terminated, truncated, info = result
        self._state.step_count += 1
        self.server_log.count("steps")
        done = bool(terminated or truncated)
        if done:
            dialogue = self.env.dialogue
            self.server_log.finished(
                {
                    "episode_id": self._state.episode_id,
                    "seed": self._seed,
                    "persona_id": dialogue.persona.id,
                    "emotions": list(dialogue.emotions),
                    "termination_reason": dialogue.done_reason,
                    "messages": [dict(message) for message in dialogue.messages],
                }
            )
        return self._observation(text, info, reward=float(reward), done=done)

    def _observation(self, text: str, info: dict[str, Any], *, reward: float | None, done: bool) -> EmpathyObservation:
        self._state.emotion = int(info["emotion"])
        return EmpathyObservation(
            text=text,
            emotion=int(info["emotion"]),
            turn=int(info["turn"]),
            persona_id=str(info["persona_id"]),
            termination_reason=info.get("termination_reason"),
            messages=[dict(message) for message in info["messages"]],
            info=json.loads(json.dumps({k: v for k, v in info.items() if k not in NAMED}, default=str)),
            reward=reward,
            done=done,
        )

    @property
    def state(self) -> EmpathyState:
        return self._state

    def close(self) -> None:
        """The session ended (closed, expired or disconnected): its slot is free, and a
        client still holding its connection is refused (410); the user belongs to the
        server's engine."""
        if not self.closed:
            self.closed = True
            self.server_log.count("sessions_closed")


def _translated(error: Exception) -> Exception:
    """The env's and the user's errors as :class:`RequestError` (others unchanged)."""
    if isinstance(error, (SimulatorError, BackendError)):
        return RequestError(503, f"the simulated user failed: {error}")
    if isinstance(error, RuntimeError):  # step before reset, or after the end
        return RequestError(409, str(error))
    if isinstance(error, KeyError):  # an unknown persona
        return RequestError(422, str(error.args[0]) if error.args else str(error))
    if isinstance(error, (TypeError, ValueError)):
        return RequestError(422, str(error))
    return error


#: routes open without the bearer token (a load balancer's or an orchestrator's probe)
OPEN_PATHS = ("/health",)
#: OpenEnv's plain HTTP routes that build an env for the request (not a session)
ENV_ROUTES = ("/reset", "/step", "/state", "/metadata", "/schema")


def make_app(
    config: Mapping[str, Any] | None = None,
    *,
    max_sessions: int = 64,
    token: str | None = None,
    max_action_chars: int = 8192,
    max_body_bytes: int = 1 << 20,
    idle_timeout_s: float | None = 600.0,
    log_dialogues: str | Path | None = None,
) -> Any:
    """The OpenEnv FastAPI app of an env config.

    Args:
        config: as for :class:`~empathy_gym.engine.DialogueEngine`: ``env_id``,
            ``batch_window_ms``, ``max_batch_size`` and any ``gym.make`` keyword
            (``user``, ``personas``, ``difficulty``, ...).
        max_sessions: concurrent WebSocket sessions (each holds one dialogue); one more
            is answered with OpenEnv's ``CAPACITY_REACHED`` error.
        token: when set, every route but ``/health`` needs ``Authorization: Bearer
            TOKEN``; others get 401 with no detail (a WebSocket is closed, code 1008).
        max_action_chars: the longest utterance taken (413 naming the limit).
        max_body_bytes: the largest request body, and WebSocket message (413 naming it).
        idle_timeout_s: a session idle this long (seconds) expires and frees its slot;
            ``None``: never.
        log_dialogues: a JSONL file that every finished dialogue is appended to as it
            ends (fsynced: a stopped server loses none).

    Returns:
        The app (``app.state.engine``: the engine, closed when the app shuts down;
        ``app.state.server_log``: the counts ``/metrics`` reports).

    Raises:
        ValueError: a limit < 1. As :class:`~empathy_gym.engine.DialogueEngine` for a bad config.
    """
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.types import ConcurrencyConfig

    for name, value in (("max_sessions", max_sessions), ("max_action_chars", max_action_chars)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if token is not None and not token.strip():
        raise ValueError(
            "token: empty (an unset secret expanded to nothing?); give a token, or none for a server without one"
        )
    engine = DialogueEngine(config or {})
    server_log = ServerLog(log_dialogues)
    app = create_app(
        lambda: EmpathyEnvironment(engine, max_action_chars=max_action_chars, server_log=server_log),
        EmpathyAction,
        EmpathyObservation,
        env_name=ENV_NAME,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s),
    )

    async def refused(request: Any, error: RequestError) -> Any:  # counted and logged where raised
        log.warning("refused %s %s from %s (%s)", request.method, request.url.path, request.client, error.status)
        return JSONResponse({"detail": str(error)}, status_code=error.status)

    @app.get("/metrics", tags=["Health"], summary="Counts of sessions, dialogues, steps, refusals and user batches")
    async def metrics() -> dict[str, int]:
        batched = {"user_batches": engine.batcher.batches, "turns_batched": engine.batcher.items}
        return {**server_log.counts, "sessions_active": server_log.active_sessions(), **batched}

    async def invalid(request: Any, error: RequestValidationError) -> Any:  # FastAPI's, JSON-safe
        server_log.count("refused_422")
        return JSONResponse({"detail": _finite(jsonable_encoder(error.errors()))}, status_code=422)

    app.add_exception_handler(RequestError, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_middleware(
        Guard, token=token, max_body_bytes=max_body_bytes, max_sessions=max_sessions, server_log=server_log
    )
    app.state.engine, app.state.server_log = engine, server_log
    app.router.add_event_handler("shutdown", engine.close)
    return app


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (a body's ``1e400`` or ``NaN``, echoed back in
    a 422) as its text: JSON has no such numbers, and FastAPI's handler failed on them (500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def run_server(app: Any, *, host: str = "127.0.0.1", port: int = 8000, max_message_bytes: int = 1 << 20) -> None:
    """Serve ``app`` with uvicorn until SIGINT or SIGTERM, with one change: a second signal
    ends the process at once (exit code 130). uvicorn's own second signal still waits for
    the turns running in worker threads, which a model user may spend minutes on and nothing
    can interrupt; the finished dialogues are on disk already (``log_dialogues``). A clean
    stop exits 0 however the server was started (the command line, ``python -m server.app``).

    Raises:
        OSError: the server did not start (a port in use, say; uvicorn logs why).
    """
    import os
    import signal

    import uvicorn

    from empathy_gym.agents.console import honour_interrupts

    honour_interrupts()  # SIGTERM as Ctrl-C: uvicorn raises it again once stopped, caught below

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                log.warning("a second %s: exiting now, without the running turns", signal.Signals(sig).name)
                os._exit(130)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="info", ws_max_size=max_message_bytes)
    try:
        Server(config).run()
    except KeyboardInterrupt:  # uvicorn raises the signal it stopped on again once it has stopped (as uvicorn.run)
        pass
    except SystemExit as stopped:
        if stopped.code != STARTUP_FAILURE:
            raise
        raise OSError(f"the server did not start on {host}:{port}: the error above says why") from None


class Guard:
    """ASGI middleware in front of the app: the bearer token (when set), the request body
    limit, and the session limit at the WebSocket handshake (429 naming it, where OpenEnv
    would accept the connection and close it); each refusal is logged with the client's
    address and counted."""

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int, max_sessions: int, server_log: ServerLog):
        self.app, self.token, self.max_body_bytes, self.server_log = app, token, max_body_bytes, server_log
        self.max_sessions = max_sessions

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if self.token is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            self.server_log.count("refused_401")
            log.warning(
                "refused %s %s from %s: no valid bearer token", scope["type"], scope["path"], scope.get("client")
            )
            return await self._refuse(scope, receive, send, 401, None, [(b"www-authenticate", b"Bearer")])
        if scope["type"] == "websocket" and self.server_log.active_sessions() >= self.max_sessions:
            self.server_log.count("refused_429")
            log.warning("refused a session from %s: %d sessions open", scope.get("client"), self.max_sessions)
            message = f"this server holds at most {self.max_sessions} sessions (--max-sessions); try again later"
            return await self._refuse(scope, receive, send, 429, message)
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._bounded_body(receive)
            if body is None:
                self.server_log.count("refused_413")
                log.warning(
                    "refused %s from %s: body over %d bytes", scope["path"], scope.get("client"), self.max_body_bytes
                )
                message = f"request body over this server's limit of {self.max_body_bytes} bytes (--max-body-bytes)"
                return await self._refuse(scope, receive, send, 413, message)
            receive = _replay(body)
        if scope["type"] == "http" and scope["path"] in ENV_ROUTES:
            self.server_log.count("http_requests_in_flight")
            try:
                return await self.app(scope, receive, send)
            finally:
                self.server_log.count("http_requests_in_flight", -1)
        if scope["type"] == "websocket":
            return await self._session(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _session(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A WebSocket session, with a log line for how it ended when the client did not
        close it: a message over ``--max-body-bytes`` (uvicorn closes with 1009), or a
        client that went away."""
        from starlette.websockets import WebSocketDisconnect

        closed: dict[str, Any] = {}

        async def watched() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                closed["code"] = message.get("code")
            return message

        try:
            await self.app(scope, watched, send)
        except WebSocketDisconnect:  # OpenEnv 0.3 closes a socket whose client is gone, its session freed by then
            if closed.get("code") != MESSAGE_TOO_BIG:
                log.warning("session from %s ended: the client went away", scope.get("client"))
        if closed.get("code") == MESSAGE_TOO_BIG:
            self.server_log.count("refused_413")
            log.warning(
                "closed the session from %s: a message over %d bytes (--max-body-bytes)",
                scope.get("client"),
                self.max_body_bytes,
            )

    async def _refuse(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        status: int,
        message: str | None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        """An HTTP answer with ``status`` and ``{"detail": message}`` (no body without a
        message), also to a WebSocket handshake where the server can answer one."""
        body = json.dumps({"detail": message}).encode() if message is not None else b""
        headers = [*headers, *([(b"content-type", b"application/json")] if message is not None else [])]
        if scope["type"] == "http":
            return await _respond(send, status, body, headers)
        await receive()  # the handshake's websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            return await send({"type": "websocket.http.response.body", "body": body})
        return await send({"type": "websocket.close", "code": 1008, "reason": message or ""})

    def _authorized(self, scope: dict[str, Any]) -> bool:
        given = dict(scope.get("headers", ())).get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self.token.encode())

    async def _bounded_body(self, receive: Any) -> bytes | None:
        """The whole body, or ``None`` once it passes the limit (the rest is not read)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class EmpathyEnvClient(EnvClient[EmpathyAction, EmpathyObservation, EmpathyState]):
    """OpenEnv's client for this server: ``reset(seed=..., persona=...)``, ``step(EmpathyAction(utterance=...))``.

    Args:
        base_url: the server's ``http://`` or ``ws://`` URL.
        token: the server's bearer token (``empathy-gym serve --token``), if it has one.
        options: more ``EnvClient`` arguments (``connect_timeout_s``, ``message_timeout_s``).

    Example:
        >>> with EmpathyEnvClient(base_url="http://127.0.0.1:8000").sync() as client:  # doctest: +SKIP
        ...     result = client.reset(seed=0)
        ...     result = client.step(EmpathyAction(utterance="That sounds hard."))
        ...     print(result.observation.emotion, result.reward, result.done)
    """

    def __init__(self, base_url: str, *, token: str | None = None, **options: Any):
        super().__init__(base_url, **options)
        self._token = token

    async def connect(self) -> EmpathyEnvClient:
        """Open the WebSocket session, with ``Authorization: Bearer TOKEN`` when a token is given.

        Raises:
            ConnectionError: the server is not there, or it refused the session (401).
        """
        from websockets.asyncio.client import connect as ws_connect

        if self._ws is not None:
            return self
        headers = {"Authorization": f"Bearer {self._token}"} if self._token is not None else None
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=headers,
            )
        except Exception as error:  # noqa: BLE001  (OpenEnv's own client says the same)
            response = getattr(error, "response", None)
            detail = getattr(response, "body", b"") or b""
            said = f" {detail.decode('utf-8', 'replace')}" if detail else ""
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {error}{said}") from error
        return self

    def _step_payload(self, action: EmpathyAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EmpathyObservation]:
        fields = {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)}
        observation = EmpathyObservation(**fields)
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> EmpathyState:
        return EmpathyState(**payload)
