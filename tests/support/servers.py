"""A `specrt serve` subprocess on 127.0.0.1 and the raw-HTTP helpers the server tests share."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = "specrt-demo"  # the demo bundle's model id
LONG_PROMPT = "def fib(n):"  # greedy on the demo runs the full 1000 tokens (no EOS): ~7-10 s on 2 cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `specrt serve` subprocess on 127.0.0.1 with one intra-op thread; ready once /health answers 200."""

    def __init__(self, tmp_path: Path, *args: str, start_timeout: float = 90) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specrt.cli", "serve", "--port", str(self.port), "--threads", "1",
                 "--log-level", "warning", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the server did not answer /health in time:\n{self.log.read_text()}")

    def client(self, api_key: str = "none", **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        conn = self.connect()
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, dict, bytes]:
        return self.request("GET", path)

    def health(self) -> dict:
        return json.loads(self.get("/health")[2])

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of /metrics as {(name, sorted labels): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self.get("/metrics")[2].decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def wait_for(self, predicate, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; health: {self.health()}")
            time.sleep(0.05)

    def terminate(self) -> None:
        """SIGTERM once: the server's graceful stop. A second one while it drains would be a forced stop."""
        if not getattr(self, "_terminated", False):
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not stop within {timeout} s:\n{self.log.read_text()}") from None


def stopped_cleanly(server: Server) -> None:
    """Stop ``server`` with SIGTERM and check that it exited 0."""
    rc = server.stop()
    assert rc == 0, f"exit code {rc}:\n{server.log.read_text()}"


def error_of(status_body: tuple[int, dict, bytes]) -> dict:
    """The ``error`` object of an answer from :meth:`Server.request`, checked to leak no traceback or path."""
    status, _, body = status_body
    text = body.decode()
    assert "Traceback" not in text and str(ROOT) not in text and "/site-packages/" not in text
    return json.loads(text)["error"]


def open_stream(server: Server, body: dict, headers: dict | None = None) -> http.client.HTTPConnection:
    """Send a streaming request and leave its answer unread (the caller reads it, or closes to disconnect)."""
    conn = server.connect()
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn


def read_events(resp: http.client.HTTPResponse) -> list:
    """The data of every server-sent event up to [DONE] (or the end of the body)."""
    events = []
    try:
        for line in resp:
            line = line.strip()
            if line.startswith(b"data: "):
                data = line[len(b"data: "):]
                if data == b"[DONE]":
                    events.append("[DONE]")
                    break
                events.append(json.loads(data))
    except (http.client.IncompleteRead, ConnectionError):  # a stream the server cut: what came is the answer
        pass
    return events


def hide_modules(monkeypatch, *packages: str) -> None:
    """Make each package (and its submodules) import as if it were not installed: importing raises ImportError."""
    for package in packages:
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")] + [package]:
            monkeypatch.setitem(sys.modules, name, None)
