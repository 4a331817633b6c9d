"""The OpenAI-compatible HTTP app (Starlette) and its runner (uvicorn).

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or server-sent
events), ``GET /health``, ``GET /metrics``. Generation goes through :class:`~specrt.serve.worker.Scheduler`:
one generator, arrival order, a bounded queue (429 when full). A client that goes away cancels its job,
whether it is still queued or already generating; so does the request's wall-clock limit (504).
The socket and its connection bounds: :mod:`specrt.serve.connections`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..errors import ConfigError
from ..runtime.options import DecodeOptions
from ..runtime.tree import DEFAULT_EAGLE_TREE
from . import protocol
from .connections import serve_http
from .metrics import ServeMetrics
from .protocol import ApiError, GenerationRequest
from .worker import Failed, Finished, Job, Piece, QueueFull, Scheduler, Started

log = logging.getLogger("specrt.serve")

# A body over the limit is still read (and dropped) up to this multiple of it, so the client gets its 413
# instead of a connection reset from a socket closed on unread data; beyond it the connection is dropped.
DRAIN_FACTOR = 8
# A body must arrive whole this long after its headers (a client trickling it would hold a connection for as long
# as it liked): 1 MiB at 40 KiB/s.
BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeConfig:
    """How ``specrt serve`` serves a loaded generator. ``method``/``gamma``/``tree`` apply to every request."""

    host: str = "127.0.0.1"
    port: int = 8000
    method: str = "auto"  # the best the bundle holds (SpeculativeGenerator.default_method)
    gamma: int | str = 4
    tree: str = "2,2,1,1"
    eagle_tree: str = str(DEFAULT_EAGLE_TREE)
    draft_stop: float = 0.0
    row_stable: bool = False  # no one-row target pass after the prefill (DecodeOptions.row_stable)
    # Keep the last request's context in the caches (SpeculativeGenerator.reuse_prefix): a request that re-sends
    # a conversation, as OpenAI clients do every turn, feeds only its new part.
    reuse_prefix: bool = False
    max_queue: int = 16  # requests waiting for the generator, besides the one it runs
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    model_name: str | None = None  # default: "specrt-demo", or the bundle folder's name
    drain_timeout_s: float = 30.0  # after SIGTERM, in-flight requests get this long before they are cancelled
    request_timeout_s: float = 600.0  # wall clock from arrival to the last byte of the answer, queue included
    max_connections: int = 128  # open HTTP connections; the next one gets a 503 and is closed
    header_timeout_s: float = 10.0  # a connection's request headers must be complete this long after it opens
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        for name in ("request_timeout_s", "header_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):  # NaN fails too
                raise ConfigError(f"{name} must be a positive number of seconds, got {value}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty")
        self.options  # validates method / gamma / tree before a server starts

    @property
    def options(self) -> DecodeOptions:
        """The decoding options every request shares; each request brings its own sampling, length and stops."""
        return DecodeOptions(method=self.method, gamma=self.gamma, tree=self.tree, eagle_tree=self.eagle_tree,
                             draft_stop=self.draft_stop, row_stable=self.row_stable)


def model_id(gen: Any, config: ServeConfig) -> str:
    """The id clients pass as ``model``: ``--model-name``, else the bundle folder's name."""
    return bundle_model_id(gen.bundle, config)


def bundle_model_id(bundle: str | Path | None, config: ServeConfig) -> str:
    """:func:`model_id` before the bundle is loaded (``None``: the demo bundle)."""
    if config.model_name:
        return config.model_name
    from ..demo import BUNDLE

    folder = Path(bundle if bundle is not None else BUNDLE).resolve()
    return "specrt-demo" if folder == BUNDLE.resolve() else folder.name


def authorize(request: Request, api_key: str | None) -> None:
    """Raise the 401 unless ``api_key`` is unset or the request carries it as a bearer token."""
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "invalid or missing API key: send the header 'Authorization: Bearer KEY'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, or the 413 when it is larger than ``limit`` bytes, or the 408 when it has not arrived
    ``timeout_s`` after the headers."""
    try:
        return await asyncio.wait_for(_read_body(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s",
                       code="request_timeout", headers={"Connection": "close"}) from None


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(413, f"the request body is larger than the server's limit of {limit} bytes",
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > DRAIN_FACTOR * limit:
        raise too_large
    body, size = bytearray(), 0
    async for part in request.stream():
        size += len(part)
        if size > DRAIN_FACTOR * limit:
            break
        if size <= limit:
            body += part
    if size > limit:
        raise too_large
    return bytes(body)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (once the body is read, ``receive`` only reports that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(aw: Awaitable[Any], disconnected: asyncio.Future) -> Any | None:
    """``aw``'s result, or None if the client disconnects first."""
    task = asyncio.ensure_future(aw)
    await asyncio.wait({task, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    return None


class _Disconnected(Response):
    """What a handler returns for a client that has gone: nothing is sent."""

    def __init__(self) -> None:
        super().__init__(status_code=499)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


class _EventStream(StreamingResponse):
    """Server-sent events that stop as soon as the client goes away.

    Starlette's StreamingResponse notices a disconnect only on ASGI spec < 2.4 (2.4 servers report it as
    a failed send, which uvicorn skips silently); this one races the body against the request's own
    disconnect watch whatever the server speaks, so an abandoned generation is cancelled at its next step."""

    def __init__(self, chunks: AsyncIterator[bytes], disconnected: asyncio.Future,
                 on_end: Callable[[bool], None]) -> None:
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.disconnected, self.on_end = disconnected, on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self.stream_response(send))
        completed = False
        try:
            await asyncio.wait({pump, self.disconnected}, return_when=asyncio.FIRST_COMPLETED)
            completed = pump.done() and not pump.cancelled() and pump.exception() is None
        finally:
            pump.cancel()
            self.disconnected.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await pump  # a bug in the body raises here, for the server's log
            finally:
                self.on_end(completed)


@dataclass(frozen=True)
class AppState:
    """What every handler of one app shares: the settings, the scheduler in front of the generator, the
    metrics, and the answers fixed at start (the model id, whether it can chat, when it was created)."""

    config: ServeConfig
    scheduler: Scheduler
    metrics: ServeMetrics
    model: str
    has_template: bool
    replica: str
    created: int


def create_app(gen: Any, config: ServeConfig = ServeConfig(), *, replica: str = "0",
               metrics: ServeMetrics | None = None) -> Starlette:
    """The Starlette app serving ``gen`` (a loaded :class:`~specrt.runtime.generator.SpeculativeGenerator`).

    ``replica`` names this copy of the app in every answer's ``specrt`` object and in ``/health`` (on Ray Serve:
    the replica's id; one process: "0"). The generator's worker thread starts and stops with the app's lifespan."""
    state = app_state(gen, config, replica, metrics if metrics is not None else ServeMetrics())
    api = Api(state)
    app = Starlette(routes=api.routes(), lifespan=api.lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.scheduler, app.state.metrics, app.state.model = state.scheduler, state.metrics, state.model
    return app


def prepare_generator(gen: Any, config: ServeConfig) -> None:
    """The one change serving makes to the generator it is given, before its scheduler exists."""
    gen.reuse_prefix = config.reuse_prefix  # the scheduler's one worker thread runs every request in turn


def app_state(gen: Any, config: ServeConfig, replica: str, metrics: ServeMetrics) -> AppState:
    """Set ``gen`` up for serving and put the scheduler in front of it."""
    prepare_generator(gen, config)
    scheduler = Scheduler(gen, config.max_queue, metrics, config.options)
    return AppState(config=config, scheduler=scheduler, metrics=metrics, model=model_id(gen, config),
                    has_template=gen.manifest.tokenizer.chat_template is not None, replica=replica,
                    created=int(time.time()))


Handler = Callable[[Request], Awaitable[Response]]


class Api:
    """The routes of one app over its :class:`AppState`, and the lifespan that runs its scheduler."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        models, completions, chat = (self.endpoint("models", self.models),
                                     self.endpoint("completions", self.completions), self.endpoint("chat", self.chat))
        return [
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.state.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.state.scheduler.stop)

    def endpoint(self, name: str, handler: Handler) -> Handler:
        """Authorization, OpenAI-style errors and the request metrics around ``handler``."""

        async def wrapped(request: Request) -> Response:
            request.state.arrived = time.perf_counter()
            try:
                authorize(request, self.state.config.api_key)
                response = await handler(request)
            except ApiError as e:
                response = error_response(e)
            except ClientDisconnect:
                response = _Disconnected()
            if not isinstance(response, _EventStream):  # a stream records itself when it ends
                self.record(name, request, "disconnected" if response.status_code == 499
                            else str(response.status_code), latency=name != "models")
            return response

        return wrapped

    def record(self, name: str, request: Request, status: str, latency: bool = True) -> None:
        """Count one answered request under ``status`` and, unless told not to, observe its latency."""
        metrics = self.state.metrics
        metrics.requests.labels(endpoint=name, status=status).inc()
        if latency:
            metrics.latency.labels(endpoint=name).observe(time.perf_counter() - request.state.arrived)

    async def read_json(self, request: Request) -> Any:
        body = await read_body(request, self.state.config.max_body_bytes)
        try:
            return json.loads(body)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
            raise protocol.invalid(None, "the request body is not valid JSON") from None
        except RecursionError:  # json's C parser recurses once per [ or {: 100k of them end here
            raise protocol.invalid(None, "the request body nests arrays or objects too deeply") from None

    async def completions(self, request: Request) -> Response:
        req = protocol.parse_completion(await self.read_json(request), self.state.model)
        return await self.generate(request, "completions", req)

    async def chat(self, request: Request) -> Response:
        req = protocol.parse_chat(await self.read_json(request), self.state.model)
        return await self.generate(request, "chat", req)

    async def models(self, request: Request) -> Response:
        model = self.state.model
        card = {"id": model, "object": "model", "created": self.state.created, "owned_by": "specrt"}
        wanted = request.path_params.get("model")
        if wanted is None:
            return JSONResponse({"object": "list", "data": [card]})
        if wanted != model:
            raise ApiError(404, f"the model {wanted!r} does not exist; this server serves {model!r}",
                           code="model_not_found")
        return JSONResponse(card)

    async def health(self, request: Request) -> Response:
        """200 while the generator serves; 503 once it is stuck (a request it has not let go of long after its
        --request-timeout), so a load balancer or Ray's health check takes this replica out."""
        s = self.state
        stuck = s.scheduler.stuck
        return JSONResponse({"status": "stuck" if stuck else "ok", "model": s.model,
                             "queue_depth": s.scheduler.depth, "max_queue": s.config.max_queue,
                             "busy": s.scheduler.busy, "replica": s.replica}, status_code=503 if stuck else 200)

    async def prometheus(self, request: Request) -> Response:
        body, content_type = self.state.metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    def submit(self, req: GenerationRequest) -> Job:
        """Queue ``req`` for the generator, or the 400 (chat without a template) or the 429 (queue full)."""
        s = self.state
        if req.is_chat and not s.has_template:
            raise ApiError(400, f"the model {s.model!r} has no chat template (its tokenizer had none at export): "
                                "use /v1/completions with a plain prompt", code="no_chat_template")
        job = Job(req, asyncio.get_running_loop(), timeout_s=s.config.request_timeout_s)
        try:
            s.scheduler.submit(job)
        except QueueFull:
            raise ApiError(429, f"the queue is full ({s.config.max_queue} requests waiting): retry later",
                           code="queue_full", type="rate_limit_error",
                           headers={"Retry-After": str(s.scheduler.retry_after())}) from None
        return job

    async def generate(self, request: Request, name: str, req: GenerationRequest) -> Response:
        job = self.submit(req)
        disconnected = asyncio.ensure_future(_until_disconnect(request.receive))
        streaming = False
        try:
            first = await _first(job.next_event(), disconnected)
            if first is None:
                return _Disconnected()
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            rid = protocol.new_id(req)
            if req.stream:
                streaming = True
                return self.event_stream(request, name, job, rid, first, disconnected)
            end = await _first(_finished(job), disconnected)
            if end is None:
                return _Disconnected()
            return JSONResponse(protocol.response(req, rid, self.state.model, end.result, first.prompt_tokens,
                                                  self.state.replica))
        finally:
            if not streaming:
                self.state.scheduler.cancel(job)
                disconnected.cancel()

    def event_stream(self, request: Request, name: str, job: Job, rid: str, started: Started,
                     disconnected: asyncio.Future) -> _EventStream:
        """The streamed answer: it cancels its job and records the request once it ends, however it ends."""
        outcome = {"status": "disconnected"}

        def on_end(completed: bool) -> None:
            self.state.scheduler.cancel(job)  # no-op for a finished job; stops one whose client left
            self.record(name, request, outcome["status"] if completed else "disconnected")

        return _EventStream(self.stream_events(job, rid, started, outcome), disconnected, on_end)

    async def stream_events(self, job: Job, rid: str, started: Started,
                            outcome: dict[str, str]) -> AsyncIterator[bytes]:
        req, model = job.request, self.state.model
        if req.is_chat:
            yield _sse(protocol.chunk(req, rid, model, first=True))
        while True:
            event = await job.next_event()
            if isinstance(event, Piece):
                yield _sse(protocol.chunk(req, rid, model, event.text))
            elif isinstance(event, Finished):
                for chunk in self.last_chunks(req, rid, started, event):
                    yield _sse(chunk)
                yield b"data: [DONE]\n\n"
                outcome["status"] = "200"
                return
            else:  # Failed after the 200 went out: OpenAI clients raise on an error event
                assert isinstance(event, Failed)
                yield _sse(event.error.body())
                outcome["status"] = str(event.error.status)
                return

    def last_chunks(self, req: GenerationRequest, rid: str, started: Started, end: Finished) -> list[dict]:
        """The chunk with the finish reason and the ``specrt`` object, then the usage chunk if asked for."""
        result, model = end.result, self.state.model
        last = protocol.chunk(req, rid, model, finish=protocol.FINISH[result.finish_reason])
        last["specrt"] = protocol.extension(result.stats, self.state.replica)
        if not req.include_usage:
            return [last]
        tail = protocol.chunk(req, rid, model)  # OpenAI's stream_options.include_usage: one more chunk, no choices
        tail["choices"] = []
        tail["usage"] = protocol.usage(started.prompt_tokens, len(result.token_ids), result.stats.reused_tokens)
        return [last, tail]


async def _finished(job: Job) -> Finished:
    while True:
        event = await job.next_event()
        if isinstance(event, Finished):
            return event
        if isinstance(event, Failed):
            raise event.error


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(ApiError(exc.status_code, str(exc.detail), headers=exc.headers))


async def server_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this answer, so uvicorn logs the traceback; the client gets none.
    return error_response(ApiError(500, "internal server error (details are in the server log)"))


def run(gen: Any, config: ServeConfig = ServeConfig(), announce: Callable[[str], None] | None = None) -> None:
    """Serve ``gen`` until SIGTERM or Ctrl+C; returns normally after a graceful stop. ``announce`` receives
    one line (model id, method, URL) once the warm-up generation has passed and the port is bound.

    On the signal uvicorn stops accepting, lets in-flight requests finish for ``drain_timeout_s`` and
    cancels the rest; then the app's lifespan stops the generator thread."""
    warm_up(gen, config)
    app = create_app(gen, config)
    method = gen.resolve_method(config.method)
    serve_http(app, config, None if announce is None else
               lambda url: announce(f"serving {app.state.model!r} ({method}) at {url}"))


def warm_up(gen: Any, config: ServeConfig) -> None:
    """One short generation before requests come: a method the bundle cannot run (medusa without heads, draft
    without a draft model) fails here as a one-line error, and the sessions' first-run costs are paid."""
    gen.generate("Hello", config.options, max_new_tokens=2)
