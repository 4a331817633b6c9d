"""A real `specrt serve` on 127.0.0.1 against clients that hold connections without finishing a request, a bundle
whose chat template never ends, and a port already taken. Every loop here is bounded and stops by itself; every
socket goes to 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,dev]'")

from click.testing import CliRunner  # noqa: E402
from support import soak  # noqa: E402
from support.servers import DEMO, Server, error_of, stopped_cleanly  # noqa: E402

from specrt.cli import main  # noqa: E402

HEADER_TIMEOUT = 1.0
CAP = 8
PARTIAL = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app"  # no blank line: never complete


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("slow"), "--header-timeout", str(HEADER_TIMEOUT),
               "--max-connections", str(CAP))
    yield s
    stopped_cleanly(s)


def _open(server: Server, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if first:
        sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (what it sends on the way is read and dropped)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


def _completion_works(server: Server) -> None:
    status, _, body = server.request("POST", "/v1/completions", {"model": DEMO, "prompt": "def fib(n):",
                                                                 "max_tokens": 4, "temperature": 0})
    assert status == 200, body


def test_idle_and_half_header_connections_are_closed(server):
    socks = [_open(server) for _ in range(3)] + [_open(server, PARTIAL) for _ in range(3)]
    trickle = _open(server, b"G")
    try:
        t0 = time.monotonic()
        for i in range(5):  # a byte now and then does not buy time: the deadline counts from the connection's start
            time.sleep(0.2)
            try:
                trickle.sendall(b"ET /health HTTP/1.1\r\n"[i:i + 1])
            except ConnectionError:
                break
        assert all(_closed_by_server(s, 3 * HEADER_TIMEOUT + 2) for s in [*socks, trickle])
        assert time.monotonic() - t0 < 3 * HEADER_TIMEOUT + 4
    finally:
        for s in [*socks, trickle]:
            s.close()
    _completion_works(server)


def test_a_kept_alive_connection_must_finish_its_next_header_too(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() and conn.sock is not None  # kept alive
        conn.sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127")  # the next request's start, never finished
        assert _closed_by_server(conn.sock, 3 * HEADER_TIMEOUT + 2)
    finally:
        conn.close()


def test_connections_past_the_cap_get_a_503_and_are_closed(server):
    held = [_open(server) for _ in range(CAP)]
    try:
        time.sleep(0.2)  # accepted by the server's loop
        extra = _open(server)
        extra.settimeout(5)
        answer = b""
        try:
            while chunk := extra.recv(65536):
                answer += chunk
        except ConnectionError:
            pass
        extra.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)  # the server's loop sees them go
    _completion_works(server)


def test_a_chat_template_that_never_ends_is_a_400_and_the_server_serves_on(tmp_path):
    bundle = soak.chat_demo(tmp_path / "bomb")
    (bundle / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}")
    server = Server(tmp_path, "--bundle", str(bundle), "--model-name", "bomb")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)  # the old server never answered
        t0 = time.monotonic()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": "bomb", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        error = error_of((resp.status, {}, resp.read()))
        assert resp.status == 400 and "chat template" in error["message"] and "longer than" in error["message"]
        assert time.monotonic() - t0 < 15
        conn.close()
        assert server.get("/health")[0] == 200
        status, _, body = server.request("POST", "/v1/completions", {"model": "bomb", "prompt": "def fib(n):",
                                                                     "max_tokens": 4})
        assert status == 200, body
    finally:
        stopped_cleanly(server)


def test_a_port_in_use_is_one_line_and_nothing_is_announced():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        res = CliRunner().invoke(main, ["serve", "--port", str(port), "--threads", "1"])
    assert res.exit_code == 1 and "serving" not in res.output and "Traceback" not in res.output, res.output
    assert res.output.strip() == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
