"""The listening socket and the HTTP connections uvicorn serves on it, with the bounds a public port needs.

uvicorn alone holds a connection that never sends a complete request header forever (it arms its keep-alive
timeout only after a response), and accepts as many as clients open. Here the socket is bound before anything is
announced (a port in use is one line, not a "serving" line and then a traceback), the number of open connections
is capped (the one past the cap gets a 503 and is closed at once), and a connection that has not sent a complete
header ``header_timeout_s`` after it opened, or after its last request's first byte, is closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import socket
from typing import Any, Callable

from ..errors import ConfigError

log = logging.getLogger("specrt.serve")


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket listening on ``host:port`` (IPv4 or IPv6 as ``host`` resolves), or a one-line :class:`ConfigError`."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as e:  # socket.gaierror included: an unknown host name
        # create_server appends the address to strerror; the plain words for the errno say it once
        reason = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else (e.strerror or str(e))
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from None


def check_port(host: str, port: int) -> None:
    """The :class:`ConfigError` :func:`listen` would raise, before a long start (a warm-up, Ray's replicas) rather
    than after it. The port is let go again: held through the start, it would keep clients waiting in its backlog
    instead of refused."""
    listen(host, port).close()


def _refusal(max_connections: int) -> bytes:
    body = json.dumps({"error": {"message": f"the server has its limit of {max_connections} open connections: "
                                            "retry later", "type": "server_error", "param": None,
                                 "code": "too_many_connections"}}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "retry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def bounded_protocol(base: type[asyncio.Protocol], max_connections: int, header_timeout_s: float) -> type:
    """``base`` (uvicorn's h11 or httptools protocol) with the connection cap and the header deadline.

    Both protocols keep the open connections in ``self.connections`` and start a ``self.cycle`` when a request's
    headers are complete: that is all this relies on."""
    refusal = _refusal(max_connections)

    class BoundedHttp(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections:
                self._refused = True
                transport.write(refusal)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if not self._refused:  # a refused connection never set up the state uvicorn's handler tears down
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            before = self.cycle
            if (before is None or before.response_complete) and self._header_timer is None:
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self.cycle is not before:  # a request's headers are complete: its body and answer take over
                self._disarm()

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                log.debug("closing a connection that sent no complete header within %g s", header_timeout_s)
                self.transport.close()

    return BoundedHttp


def _absorb(signum: int, frame: Any) -> None:
    """Stands in for the default action of SIGTERM/SIGINT while uvicorn runs (see :func:`serve_http`)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(host: str, port: int) -> str:
    """The API's URL on ``host`` and ``port``."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def serve_http(app: Any, config: Any, on_listening: Callable[[str], None] | None = None) -> None:
    """Run the ASGI ``app`` on ``config.host:config.port`` (a :class:`~specrt.serve.app.ServeConfig`) until SIGTERM
    or Ctrl+C. ``on_listening`` gets the base URL once the port is bound, before the first request is read.

    On the signal uvicorn stops accepting, lets in-flight requests finish for ``drain_timeout_s`` and cancels the
    rest; then the app's lifespan stops what it started."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    if not is_loopback(config.host) and config.api_key is None:
        log.warning("serving on %s without --api-key: anyone who reaches this address can use the model",
                    config.host)
    sock = listen(config.host, config.port)
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    protocol = bounded_protocol(AutoHTTPProtocol, config.max_connections, config.header_timeout_s)
    # uvicorn answers its own 503 once len(connections) >= limit_concurrency: one above our cap leaves that to the
    # protocol above (it refuses the connection past the cap), and still bounds uvicorn's tasks.
    server = uvicorn.Server(uvicorn.Config(
        app, http=protocol, ws="none", log_level=config.log_level, lifespan="on",
        limit_concurrency=config.max_connections + 1, timeout_keep_alive=max(1, round(config.header_timeout_s)),
        timeout_graceful_shutdown=config.drain_timeout_s))
    if on_listening is not None:
        on_listening(base_url(config.host, port))
    # After its graceful shutdown uvicorn re-raises the signal it caught, with the handler it found at start:
    # a handler that does nothing makes that a no-op, so a stopped server exits 0 (systemd and Docker read
    # death-by-signal as a failure).
    previous = {sig: signal.signal(sig, _absorb) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
