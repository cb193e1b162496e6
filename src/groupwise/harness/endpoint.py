"""The OpenAI-compatible HTTP endpoint: a Starlette app served by uvicorn on a thread of its own.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``. Every request must carry a live
session's key (``Authorization: Bearer <key>``): the key says which session, and so which sample, a request is
recorded into; a request with another key, or with the key of a session that has ended, is refused (401) and can
neither read nor change any session. Bodies are read up to ``max_body_bytes`` (413 past it). A request the endpoint
cannot serve gets OpenAI's error body with a 4xx status; anything unexpected while serving one is a 500 with the
error's message, never the end of the server.

The server binds ``127.0.0.1`` unless ``episode.endpoint.host`` says otherwise, on a free port unless
``episode.endpoint.port`` names one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from groupwise.episodes.tool_formats import ToolFormat
from groupwise.harness.live import LiveSession, Prepared
from groupwise.harness.responses import (
    Answer,
    chat_body,
    chat_chunks,
    completion_body,
    completion_chunks,
    server_sent_events,
)
from groupwise.harness.wire import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    WireError,
    read_chat_request,
    read_completion_request,
)
from groupwise.types import Completion, GenerationRequest, SamplingParams

if TYPE_CHECKING:  # starlette is imported when the endpoint starts, not with the package
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)
T = TypeVar("T")

INLINE_BODY_BYTES = 65_536
"""A request up to this size is rendered and matched on the endpoint's event loop (under a millisecond: a hop to a
worker thread would cost more than the work); a larger one on a worker thread, so a long conversation's rendering
never holds up the other sessions' requests."""


class TurnSampler(Protocol):
    """Samples one prepared request's choices for the endpoint (awaited on the endpoint's event loop)."""

    @property
    def version(self) -> int: ...

    @property
    def sampling(self) -> SamplingParams: ...

    async def sample(self, request: GenerationRequest) -> list[Completion]: ...


@dataclass
class _Registered:
    session: LiveSession
    sampler: TurnSampler
    in_flight: int = 0


class SessionRegistry:
    """The live sessions by key, with the sampler each one's requests go to (thread-safe)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Registered] = {}
        self._lock = threading.Lock()

    def add(self, session: LiveSession, sampler: TurnSampler) -> None:
        with self._lock:
            self._sessions[session.key] = _Registered(session, sampler)

    def remove(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def get(self, key: str) -> _Registered | None:
        with self._lock:
            return self._sessions.get(key)

    def in_flight(self, sampler: TurnSampler) -> tuple[int, int, int]:
        """For the sessions served by ``sampler``: how many there are, how many have a request in flight, and
        the requests in flight."""
        with self._lock:
            mine = [r for r in self._sessions.values() if r.sampler is sampler]
        return len(mine), sum(r.in_flight > 0 for r in mine), sum(r.in_flight for r in mine)


@dataclass(frozen=True)
class EndpointSettings:
    """``episode.endpoint``: where the endpoint listens and how much one request may send."""

    host: str = "127.0.0.1"
    port: int = 0
    max_body_bytes: int = 1_000_000
    model_name: str = "policy"


class Endpoint:
    """The running HTTP endpoint (:meth:`start` once, :meth:`close` at the end of the run)."""

    def __init__(self, settings: EndpointSettings, tool_format: ToolFormat) -> None:
        self.settings = settings
        self.tool_format = tool_format
        self.registry = SessionRegistry()
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}/v1"

    def start(self) -> None:
        """Bind the socket and serve on a daemon thread; returns once the server accepts connections."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.settings.host, self.settings.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_until_complete(self._server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, name="groupwise-endpoint", daemon=True)
        self._thread.start()
        started.wait(30)
        deadline = time.monotonic() + 30
        while not self._server.started and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"the harness endpoint could not start on {self.settings.host}:{self.port}")

    def close(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
            ]
        )

    async def _models(self, request: Request) -> Response:
        if (refusal := self._check_key(request)) is not None:
            return refusal
        return _json(
            {
                "object": "list",
                "data": [{"id": self.settings.model_name, "object": "model", "created": 0, "owned_by": "groupwise"}],
            }
        )

    async def _chat(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def _serve(self, request: Request, chat: bool) -> Response:
        try:
            registered = self._session(request)
            body, size = await _read_json(request, self.settings.max_body_bytes)
            asked = read_chat_request(body) if chat else read_completion_request(body)
            registered.in_flight += 1
            try:
                return await self._answer(registered, asked, offload=size > INLINE_BODY_BYTES)
            finally:
                registered.in_flight -= 1
        except WireError as error:
            return _json(error.body(), error.status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server never dies of a request; the message says what failed
            logger.warning("harness endpoint: a request failed: %s: %s", type(exc).__name__, exc)
            return _json(
                WireError(f"the request failed: {type(exc).__name__}: {exc}", status=500, kind="server_error").body(),
                500,
            )

    async def _answer(self, registered: _Registered, asked: ChatRequest | CompletionRequest, offload: bool) -> Response:
        session, sampler = registered.session, registered.sampler
        version = sampler.version
        run = _off_the_loop if offload else _on_the_loop
        if isinstance(asked, ChatRequest):
            prepared = await run(session.prepare_chat, asked, version)
        else:
            prepared = await run(session.prepare_tokens, asked, version)
        completions = await self._sample(session, sampler, prepared)
        read_calls = self.tool_format if isinstance(asked, ChatRequest) and asked.tool_choice != "none" else None
        record = _asked_data(asked)
        choices = await run(session.serve, prepared, completions, asked.sampling, read_calls, record)
        response_id = f"{'chatcmpl' if isinstance(asked, ChatRequest) else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        prompt_tokens = len(prepared.request.prompt_token_ids) if prepared.request is not None else 0
        extension = _extension(sampler.sampling, asked.sampling, choices)
        answer = Answer(
            response_id,
            int(time.time()),
            self.settings.model_name,
            choices,
            prompt_tokens,
            asked.sampling.logprobs,
            extension,
        )
        if isinstance(asked, ChatRequest):
            if asked.sampling.stream:
                return _stream(chat_chunks(answer, include_usage=asked.sampling.include_usage))
            return _json(chat_body(answer))
        if asked.sampling.stream:
            return _stream(completion_chunks(answer, include_usage=asked.sampling.include_usage))
        return _json(completion_body(answer))

    async def _sample(self, session: LiveSession, sampler: TurnSampler, prepared: Prepared) -> list[Completion]:
        if prepared.request is None:
            return []
        try:
            return await sampler.sample(prepared.request)
        except BaseException:
            session.abandon(prepared)
            raise

    def _session(self, request: Request) -> _Registered:
        key = _bearer(request)
        registered = self.registry.get(key) if key else None
        if registered is None:
            raise WireError(
                "the API key is not a live session's key (each sample's session has its own, valid "
                "while its harness runs)",
                status=401,
                code="invalid_api_key",
            )
        return registered

    def _check_key(self, request: Request) -> Response | None:
        try:
            self._session(request)
        except WireError as error:
            return _json(error.body(), error.status)
        return None


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def _on_the_loop(function: Callable[..., T], *args: Any) -> T:
    return function(*args)


async def _off_the_loop(function: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(function, *args)


async def _read_json(request: Request, limit: int) -> tuple[Any, int]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise WireError(f"the request body is over {limit:,} bytes (episode.endpoint.max_body_bytes)", status=413)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise WireError(f"the request body is over {limit:,} bytes (episode.endpoint.max_body_bytes)", status=413)
    try:
        return json.loads(bytes(data)), len(data)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"the request body is not valid JSON ({exc})") from exc


def _asked_data(asked: ChatRequest | CompletionRequest) -> dict[str, Any]:
    """The request as its session's log keeps it (what ``audit --replay-sessions`` renders again)."""
    if isinstance(asked, ChatRequest):
        return {
            "messages": [asdict(m) for m in asked.messages],
            "tools": list(asked.tools),
            "tool_choice": asked.tool_choice,
            "n": asked.sampling.n,
            "stop": list(asked.sampling.stop),
        }
    prompt = asked.prompt
    return {
        "prompt_ids" if isinstance(prompt, tuple) else "prompt": list(prompt) if isinstance(prompt, tuple) else prompt,
        "n": asked.sampling.n,
        "stop": list(asked.sampling.stop),
    }


def _extension(used: SamplingParams, asked: Sampling, choices: list[Any]) -> dict[str, Any]:
    """The ``groupwise`` object of a response: the sampling the run used, what of the request it overrode or
    ignored, and each choice's token ids."""
    run = {"temperature": used.temperature, "top_p": used.top_p}
    requested = {"temperature": asked.temperature, "top_p": asked.top_p}
    overridden = {k: v for k, v in requested.items() if v is not None and v != run[k]}
    return {
        **run,
        "overridden": overridden,
        "ignored": list(asked.ignored),
        "token_ids": [list(c.token_ids) for c in choices],
    }


def _json(data: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(data, status_code=status)


def _stream(chunks: list[dict[str, Any]]) -> Response:
    from starlette.responses import StreamingResponse

    async def events(lines: Iterator[str]) -> AsyncIterator[str]:
        for line in lines:
            yield line

    return StreamingResponse(events(server_sent_events(chunks)), media_type="text/event-stream")
