"""``specrt serve --replicas N``: the same app on Ray Serve replicas, behind one HTTP ingress (the ``[cluster]`` extra).

Each replica is a Ray Serve deployment replica that loads the bundle where Ray placed it and runs
:func:`~specrt.serve.app.create_app` in-process: one implementation of the API, two ways to host it. The ingress is
this process (``specrt serve``): uvicorn in front of a :class:`~ray.serve.handle.DeploymentHandle`. It checks the API
key and the body limit exactly as the app does, then relays each request's ASGI messages to one replica and its
answer back.

Why an ingress of our own and not Ray Serve's HTTP proxy: when a replica dies mid-request, Ray's proxy answers a
plain-text 500 (non-streamed) or cuts the stream without a word, and Ray's router retries only requests that no
replica has accepted yet. Here a request whose answer has not started is sent again to another replica (nothing is
lost: a seeded answer is the same on any replica), and a stream whose replica dies ends with an OpenAI-style error
event.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope, Send

from ..bundle.manifest import load_manifest
from ..demo import BUNDLE
from ..errors import ClusterError, ConfigError
from .app import ServeConfig, _sse, _until_disconnect, authorize, create_app, error_response, read_body, warm_up
from .connections import check_port, serve_http
from .metrics import ServeMetrics
from .protocol import ApiError

log = logging.getLogger("specrt.serve")

INSTALL_HINT = "pip install 'specrt[cluster]'"
# Requests at one replica (running + waiting in its queue) that Ray's autoscaler aims for: one generating and one
# waiting. The generator serves one sequence at a time, so more waiting means slower answers, not more throughput.
TARGET_ONGOING = 2
RETRY_DELAY_S = 0.5  # before sending a request again: Ray's router has marked the dead replica by then
# Ray finds a dead replica at its next health check (default every 10 s) and then starts another.
HEALTH_CHECK_S = 2.0
PROBE_TIMEOUT_S = 5.0  # ray.init on an address nobody answers retries for minutes: a TCP connect says it at once


@dataclass(frozen=True)
class ClusterConfig:
    """Where the replicas run and how many. ``min_replicas``/``max_replicas`` (both or neither) switch from a fixed
    ``replicas`` count to autoscaling on queue depth, starting at the minimum."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    address: str | None = None  # None: a local Ray instance on this machine, shut down on exit
    cpus: float = 1.0  # per replica: Ray places replicas by these, so say what --threads uses
    gpus: float = 0.0  # per replica: 1 gives each replica a device of its own
    attempts: int = 3  # sends of a non-streamed request before the ingress answers 503
    start_timeout_s: float = 600.0  # a replica loads a bundle: minutes for a large model on a small board

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both min_replicas and max_replicas")
        if self.min_replicas is not None and not 1 <= self.min_replicas <= self.max_replicas:
            raise ConfigError(f"autoscaling needs 1 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                              f"{self.max_replicas}")
        if self.cpus <= 0 or self.gpus < 0:
            raise ConfigError(f"a replica needs cpus > 0 and gpus >= 0, got {self.cpus} and {self.gpus}")
        if self.attempts < 1:
            raise ConfigError(f"attempts must be >= 1, got {self.attempts}")
        if self.address is not None and not self.address.strip():
            raise ConfigError("the Ray address must not be empty")

    @property
    def initial(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas


def _import_ray() -> tuple[Any, Any]:
    """``ray`` and ``ray.serve``, or a :class:`ClusterError` saying what to install."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        missing = (e.name or "ray").split(".")[0]
        raise ClusterError(f"replicas need the cluster extra ({missing} is missing): {INSTALL_HINT}") from None
    return ray, serve


# --- a replica ---------------------------------------------------------------------------------------------------

def _ray_metric(kind: str, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...] | None) -> Any:
    """A metric in Ray's metrics export; ray.serve's kind adds the deployment, replica and application tags."""
    from ray.serve import metrics

    if kind == "counter":
        return metrics.Counter(name, description=doc, tag_keys=labels)
    if kind == "gauge":
        return metrics.Gauge(name, description=doc, tag_keys=labels)
    return metrics.Histogram(name, description=doc, boundaries=list(buckets or ()), tag_keys=labels)


class Replica:
    """One Ray Serve replica: the bundle loaded on this node and the app of ``specrt serve`` around it."""

    async def __init__(self, bundle: str | None, load: dict[str, Any], config: ServeConfig) -> None:
        from ray import serve

        from .. import load as load_bundle

        gen = load_bundle(bundle, **load)  # resolved on this node: a BundleError here fails the deployment
        warm_up(gen, config)
        self.id = serve.get_replica_context().replica_id.unique_id
        self.app = create_app(gen, config, replica=self.id, metrics=ServeMetrics(mirror=_ray_metric))
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # the generator's worker thread

    async def __del__(self) -> None:
        if hasattr(self, "_lifespan"):  # Ray calls this after a failed __init__ too
            await self._lifespan.__aexit__(None, None, None)

    def check_health(self) -> None:
        """Ray's periodic health check: a generator stuck on one request (the app's ``/health`` answers 503 then)
        fails it, and Ray replaces this replica."""
        scheduler = self.app.state.scheduler
        if scheduler.stuck:
            raise RuntimeError("the generator is stuck: a request has held it long past --request-timeout")

    async def relay(self, scope: dict[str, Any], body: bytes) -> AsyncIterator[list[Message]]:
        """The app's answer to one request (``scope`` without its server-side objects, the whole ``body``), as
        batches of ASGI messages. Cancelling this call is the client's disconnect: the app sees it and stops."""
        sent: asyncio.Queue[Message] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":  # which replica answered, for logs and the fault test
                message = {**message, "headers": [*message.get("headers", ()), (b"x-specrt-replica", self.id.encode())]}
            sent.put_nowait(message)

        app = asyncio.ensure_future(self.app(scope, receive, send))
        got: asyncio.Future | None = None
        try:
            while True:
                got = asyncio.ensure_future(sent.get())
                await asyncio.wait({got, app}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                batch = [got.result()] if got.done() and not got.cancelled() else []
                while not sent.empty():
                    batch.append(sent.get_nowait())
                if batch:
                    yield batch
                if app.done() and sent.empty():
                    break
        finally:
            if got is not None:  # left waiting when the ingress went away: asyncio warns of a task destroyed pending
                got.cancel()
            gone.set()  # the ingress went away (this call was cancelled) or the answer is complete
            if not app.done():
                await asyncio.wait({app}, timeout=5.0)
                app.cancel()
            if app.done() and not app.cancelled() and app.exception() is not None:
                # Starlette answered the 500 already; the traceback belongs in this replica's log.
                log.error("request failed", exc_info=app.exception())


# --- the ingress -------------------------------------------------------------------------------------------------

_HOP_BY_HOP = {"app", "state", "extensions", "router", "endpoint", "path_params", "route_handler"}


def _is_event_stream(start: Message) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in start["headers"])


class Ingress:
    """The cluster's HTTP entry (an ASGI app): API key and body limit first, then one replica's answer.

    A non-streamed answer is held until its last byte, so a replica lost before then costs a resend to another
    replica, not the request. A stream is passed on as it comes; if its replica dies, it ends with an error event
    (OpenAI's clients raise it) instead of a connection left open or cut."""

    def __init__(self, handle: Any, config: ServeConfig, attempts: int, metrics_hint: str) -> None:
        self.handle, self.config, self.attempts, self.metrics_hint = handle, config, attempts, metrics_hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start: the replicas run already
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            if scope["path"] == "/metrics":
                raise ApiError(404, f"this is the cluster's ingress: {self.metrics_hint}", code="not_found")
            if scope["path"].startswith("/v1/"):
                authorize(request, self.config.api_key)
            body = await read_body(request, self.config.max_body_bytes)
        except ApiError as e:
            await send_error(send, e)
            return
        except ClientDisconnect:
            return
        wire = {k: v for k, v in scope.items() if k not in _HOP_BY_HOP}
        disconnected = asyncio.ensure_future(_until_disconnect(receive))
        try:
            for attempt in range(self.attempts):
                if attempt:
                    await asyncio.sleep(RETRY_DELAY_S)
                if await self._relay(wire, body, send, disconnected):
                    return
            await send_error(send, ApiError(503, "no replica could answer the request: retry later",
                                            code="replicas_unavailable", headers={"Retry-After": "1"}))
        finally:
            disconnected.cancel()

    async def _relay(self, wire: dict[str, Any], body: bytes, send: Send, disconnected: asyncio.Future) -> bool:
        """One send to a replica. False: its replica died before the answer started, so it may be sent again."""
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

        answer = self.handle.options(stream=True).relay.remote(wire, body)
        held: list[Message] = []
        streaming = started = ended = False
        try:
            while True:
                step = asyncio.ensure_future(answer.__anext__())
                await asyncio.wait({step, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # the client left: the replica's app sees the cancel as its disconnect
                    step.cancel()  # it ends in Ray's RequestCancelledError: taken here, not logged as unretrieved
                    step.add_done_callback(lambda f: f.cancelled() or f.exception())
                    answer.cancel()
                    return True
                try:
                    batch = step.result()
                except StopAsyncIteration:
                    break
                for message in batch:
                    if message["type"] == "http.response.start":
                        streaming = _is_event_stream(message)
                    if streaming:
                        await send(message)
                        started = True
                    else:
                        held.append(message)
                    ended = message["type"] == "http.response.body" and not message.get("more_body", False)
            for message in held:
                await send(message)
            if not ended and (started or held):  # the app broke off without a last body part
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return started or bool(held)
        except (RayActorError, ReplicaUnavailableError):  # the replica died, or Ray's router knows it gone
            if not started:
                log.warning("a replica died before answering: sending the request again")
                return False
            lost = ApiError(503, "the replica generating this stream stopped: send the request again",
                            code="replica_lost")
            await send({"type": "http.response.body", "body": _sse(lost.body()), "more_body": False})
            return True
        except DeploymentUnavailableError:  # no replica runs (they failed to start): a resend would fail alike
            await send_error(send, ApiError(503, "no replica is running: retry later", code="replicas_unavailable",
                                            headers={"Retry-After": "1"}))
            return True
        except BackPressureError:  # raised before any replica took the request
            await send_error(send, ApiError(429, "every replica's queue is full: retry later", code="queue_full",
                                            type="rate_limit_error", headers={"Retry-After": "1"}))
            return True
        except OSError:  # the client went away while we wrote to it
            answer.cancel()
            return True
        except Exception:  # one request's failure must not reach uvicorn's plain-text 500: log it, answer in kind
            log.exception("relaying a request failed")
            error = ApiError(500, "internal error while relaying the request (details are in the server log)")
            if started:
                await send({"type": "http.response.body", "body": _sse(error.body()), "more_body": False})
            else:
                await send_error(send, error)
            return True


async def send_error(send: Send, e: ApiError) -> None:
    """An error answer written to ``send`` directly (no scope/receive needed for a JSON body)."""
    response = error_response(e)
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


# --- starting, watching and stopping the replicas ----------------------------------------------------------------

def _probe(address: str) -> None:
    """A :class:`ClusterError` at once when nothing listens at ``address`` (host:port; 'auto' and ray:// pass)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def _connect(ray: Any, cluster: ClusterConfig, log_level: str) -> None:
    level = logging.getLevelName(log_level.upper())
    logging.getLogger("ray.serve").setLevel(level)
    # Replicas and Ray's own actors log to Ray's log files (`ray logs`), not here: a replica that fails to start
    # would print its traceback once per attempt before the one-line error.
    quiet = {"logging_level": level, "log_to_driver": False}
    if cluster.address is None:
        # A fresh instance of this machine's cores, even where `ray start` runs one already.
        ray.init(address="local", include_dashboard=False, **quiet)
        return
    _probe(cluster.address)
    try:
        ray.init(address=cluster.address, **quiet)
    except (ConnectionError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # A cluster with token authentication refuses a driver without the token, which Ray sends only when
        # RAY_AUTH_MODE=token (ray.init's own local instances turn it on by themselves).
        hint = (" (token authentication: set RAY_AUTH_MODE=token and put the cluster's token in ~/.ray/auth_token "
                "or RAY_AUTH_TOKEN)" if "GCS" in first or "auth" in first.lower() else "")
        raise ClusterError(f"cannot join the Ray cluster at {cluster.address}: {first}{hint}") from None


def placeable(available: dict[str, float], cpus: float, gpus: float) -> int:
    """How many replicas the cluster's free resources could hold (summed over nodes: an upper bound)."""
    fits = int(available.get("CPU", 0.0) // cpus)
    if gpus > 0:
        fits = min(fits, int(available.get("GPU", 0.0) // gpus))
    return fits


def app_name(model: str) -> str:
    """The Ray Serve application's name: the model id, recognisably specrt's."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", model)
    return name if name.startswith("specrt") else f"specrt-{name}"


_ERROR_LINE = re.compile(r"^(?:specrt\.errors\.)?(\w+Error): (.+)$", re.MULTILINE)
_NODE = re.compile(r"\bip=([0-9A-Fa-f.:]+)")


def _reason(message: str) -> str:
    """The replica's own error out of the traceback Ray's status carries: the last specrt error, and its node."""
    from .. import errors

    found = [m for m in _ERROR_LINE.finditer(message) if isinstance(getattr(errors, m.group(1), None), type)]
    node = _NODE.search(message)
    where = f" (on {node.group(1)})" if node else ""
    if found:
        return found[-1].group(2).strip() + where
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no reason given") + where


def _wait_running(serve: Any, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(name)
        status = str(getattr(app, "status", "")).rsplit(".", 1)[-1]
        if status == "RUNNING":
            return
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            # The application's message only names the deployment; the replica's traceback is in the deployment's.
            details = "\n".join([app.message, *(d.message for d in app.deployments.values())])
            raise ClusterError(f"the replicas failed to start: {_reason(details)}")
        if time.monotonic() > deadline:
            message = " ".join(app.message.split()) if app is not None else ""
            raise ClusterError(f"the replicas did not start within {timeout_s:.0f} s" + (f": {message}" if message
                                                                                          else ""))
        time.sleep(0.5)


def _metrics_hint(ray: Any) -> str:
    targets = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics" for n in ray.nodes()
               if n.get("Alive") and n.get("MetricsExportPort")]
    return ("per-replica metrics are in Ray's metrics export, labelled by replica: " + ", ".join(targets)
            if targets else "per-replica metrics are in Ray's metrics export (ray start --metrics-export-port)")


def run_cluster(bundle: str | None, load: dict[str, Any], config: ServeConfig, cluster: ClusterConfig,
                model: str, announce: Any = None) -> None:
    """Start the replicas (a local Ray instance, or ``cluster.address``), serve them over HTTP until SIGTERM or
    Ctrl+C, then remove them. Whatever fails on the way leaves no replica and, when local, no Ray behind."""
    ray, serve = _import_ray()
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import LoggingConfig

    if bundle is not None:
        bundle = os.path.abspath(bundle)  # the same path on every node: a replica's working folder is Ray's
    if cluster.address is None:
        load_manifest(bundle if bundle is not None else BUNDLE)  # replicas run here: a bad bundle fails before Ray
    check_port(config.host, config.port)  # a port in use fails now, not after the replicas have started
    _connect(ray, cluster, config.log_level)
    name, deployed = app_name(model), False
    try:
        free = placeable(ray.available_resources(), cluster.cpus, cluster.gpus)
        if free < cluster.initial:
            need = f"{cluster.cpus:g} CPU" + (f" and {cluster.gpus:g} GPU" if cluster.gpus else "")
            raise ClusterError(f"the cluster can place {free} of the {cluster.initial} replicas ({need} each); "
                               f"free now: {_resources(ray.available_resources())}")
        serve.start(proxy_location="Disabled")  # no Ray HTTP proxy: this process is the ingress
        if name in serve.status().applications:
            raise ClusterError(f"{name!r} is running on this cluster already (another `specrt serve`)")
        scaling = {} if cluster.min_replicas is None else {"autoscaling_config": AutoscalingConfig(
            min_replicas=cluster.min_replicas, max_replicas=cluster.max_replicas,
            initial_replicas=cluster.min_replicas, target_ongoing_requests=TARGET_ONGOING)}
        deployment = serve.deployment(
            Replica, name="specrt",
            num_replicas=None if scaling else cluster.replicas,
            ray_actor_options={"num_cpus": cluster.cpus, "num_gpus": cluster.gpus},
            # The app's own queue is the only one: Ray sends a replica no more than it holds, and a request
            # beyond every replica's queue gets the 429 the single server gives.
            max_ongoing_requests=config.max_queue + 1, max_queued_requests=config.max_queue,
            max_constructor_retry_count=cluster.initial,  # a missing bundle fails once per replica, then it stops
            graceful_shutdown_timeout_s=config.drain_timeout_s,
            health_check_period_s=HEALTH_CHECK_S,
            **scaling)
        deployed = True
        serve.run_many([serve.RunTarget(deployment.bind(bundle, load, config), name=name, route_prefix=None,
                                        logging_config=LoggingConfig(log_level=config.log_level.upper(),
                                                                     enable_access_log=False))],
                       wait_for_applications_running=False)
        _wait_running(serve, name, cluster.start_timeout_s)
        handle = serve.get_app_handle(name)
        hint = _metrics_hint(ray)
        gcs = ray.get_runtime_context().gcs_address
        where = f"a local Ray instance ({gcs})" if cluster.address is None else f"the Ray cluster at {gcs}"
        count = (f"{cluster.replicas} replicas" if cluster.min_replicas is None
                 else f"{cluster.min_replicas}-{cluster.max_replicas} replicas (autoscaling)")

        def listening(url: str) -> None:  # once the port is bound: a port in use is an error, not this line
            if announce is not None:
                announce(f"serving {model!r} with {count} on {where} at {url}")
                announce(hint)

        serve_http(Ingress(handle, config, cluster.attempts, hint), config, listening)
    finally:
        _stop(ray, serve, name if deployed else None, local=cluster.address is None)


def _resources(available: dict[str, float]) -> str:
    return ", ".join(f"{available.get(k, 0.0):g} {k}" for k in ("CPU", "GPU"))


def _stop(ray: Any, serve: Any, name: str | None, local: bool) -> None:
    """Remove what this process started; a cluster it joined keeps running. A local instance goes down whole (the
    ingress has drained the requests by then), so Serve needs no shutdown of its own there."""
    try:
        if not local and name is not None and name in serve.status().applications:
            serve.delete(name)
    finally:
        ray.shutdown()
