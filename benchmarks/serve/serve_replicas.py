"""`specrt serve` hosted three ways under the same load: one process, 1 Ray replica, 2 Ray replicas.

    python benchmarks/serve/serve_replicas.py [--bundle B] [--clients 8] [--requests-per-client 8] [--max-tokens 64]
        [--prompts P.json] [--rounds 2] [--serve-args '--method draft'] [--json benchmarks/serve/serve-replicas-cpu.json]

Configurations: `specrt serve --threads 2` (one process, one generator), `--replicas 1 --threads 2` and
`--replicas 2 --threads 1` (a local Ray instance of this machine's cores; each replica one generator). Each is a
fresh server process on a free loopback port, ready once /health answers 200; then every client sends one
warm-up request at once (not timed: both replicas get some), then `--clients` threads each send
`--requests-per-client` streamed, greedy `/v1/completions` in turn (raw HTTP, server-sent events, one connection
per request; prompts: the shipped code prompts, or a JSON list of strings, in turn). Per request: the time to
first token (request sent to the first event carrying text), the tokens (the usage chunk's completion_tokens) and
the replica (the `specrt` object). Per run: aggregate tokens/s = all tokens / the wall time from the first request
sent to the last answer's end, and p50/p95 of the time to first token over all requests. The server then gets
SIGTERM and must exit; a Ray process of its instance that outlives it is killed by pid (never another instance's).
Each round runs the three in turn, the order rotating by round; figures are medians over rounds, and the ratios
of 2 replicas over 1 replica and over one process are taken from the medians. A failed request stops the run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# key -> (label, `specrt serve` options)
CONFIGS = {"process": ("one process, 2 threads", ["--threads", "2"]),
           "ray-1": ("Ray, 1 replica × 2 threads", ["--replicas", "1", "--threads", "2"]),
           "ray-2": ("Ray, 2 replicas × 1 thread", ["--replicas", "2", "--threads", "1"])}
GCS = re.compile(r"local Ray instance \(([^)]+)\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return {"cpu": model.group(1).strip() if model else "unknown", "cores": os.cpu_count(),
            "loadavg_at_start": list(os.getloadavg())}


# ---- processes: the server's own and its Ray instance's ----------------------------------------------------------

def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): with the pid, one process, never a reuse.
    None once it has ended (a zombie has too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def instance_processes(root: int, gcs: str | None) -> set[tuple[int, str]]:
    """(pid, start time) of every descendant of ``root`` and every process naming the Ray instance's GCS address
    (raylet, workers, agents): what this server started, and nothing of another Ray instance."""
    parent, found = {}, set()
    named = re.compile(re.escape(gcs.encode()) + rb"(?!\d)") if gcs else None
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if named and named.search((d / "cmdline").read_bytes()):
                found.add(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return {(p, t) for p in (tree | found) - {root} if (t := _start_time(p)) is not None}


def _alive(procs: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return {(p, t) for p, t in procs if _start_time(p) == t}


class Server:
    """A `specrt serve` process on a free loopback port, in a session of its own (Ctrl+C reaches this script,
    which stops it)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port, self.log, self.procs = free_port(), log, set()
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "specrt.cli", "serve", "--port", str(self.port),
                                          "--log-level", "warning", *args], cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def _snapshot(self) -> None:
        gcs = GCS.search(self.log.read_text())
        self.procs |= instance_processes(self.proc.pid, gcs.group(1) if gcs else None)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if get(self.port, "/health")[0] == 200:
                    self._snapshot()
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s:\n"
                                   f"{self.log.read_text()}")
            time.sleep(0.5)

    def stop(self, timeout: float = 120) -> list[int]:
        """SIGTERM, wait; then whatever of its Ray instance still runs is killed by pid. Returns those pids."""
        self._snapshot()
        procs = self.procs
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"the server did not stop within {timeout:.0f} s: killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 15  # ray.shutdown's children end on their own, a moment later
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        lingering = _alive(procs)
        left = lingering
        for sig in (signal.SIGTERM, signal.SIGKILL):  # `ray stop --force`, for this instance alone
            for pid, _ in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while (left := _alive(left)) and time.monotonic() < deadline:
                time.sleep(0.2)
        if left:
            raise RuntimeError(f"processes of the server's Ray instance outlived SIGKILL: {sorted(left)}")
        return sorted(p for p, _ in lingering)


# ---- the clients ----------------------------------------------------------------------------------------------------

def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stream(port: int, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed, greedy completion: {ttft_s, latency_s, tokens, replica}; raises on anything but a whole answer."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        first = tokens = replica = None
        done = False
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error event: {event['error']}")
            if first is None and any(c.get("text") for c in event.get("choices", [])):
                first = time.perf_counter() - t0
            if event.get("specrt"):
                replica = event["specrt"].get("replica")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
        latency = time.perf_counter() - t0
    finally:
        conn.close()
    if not done or tokens is None:
        raise RuntimeError("the stream ended without its usage chunk and [DONE]")
    return {"ttft_s": latency if first is None else first, "latency_s": latency, "tokens": tokens,
            "replica": replica}


def load(port: int, model: str, prompts: list[str], clients: int, per_client: int, max_tokens: int) -> dict:
    """``clients`` threads, each ``per_client`` requests in turn; prompts in turn over all requests."""
    results: list[list[dict]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        start.wait()
        try:
            for j in range(per_client):
                results[i].append(stream(port, model, prompts[(i * per_client + j) % len(prompts)], max_tokens))
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed; the first: {errors[0]}")
    done = [r for rs in results for r in rs]
    ttft = [r["ttft_s"] for r in done]
    replicas: dict[str, int] = {}
    for r in done:
        replicas[str(r["replica"])] = replicas.get(str(r["replica"]), 0) + 1
    tokens = sum(r["tokens"] for r in done)
    return {"requests": len(done), "tokens": tokens, "wall_s": wall, "tokens_per_second": tokens / wall,
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p95_s": float(np.percentile(ttft, 95)),
            "latency_p50_s": float(np.percentile([r["latency_s"] for r in done], 50)), "requests_per_replica": replicas}


def run_config(key: str, a: argparse.Namespace, prompts: list[str], logs: Path, r: int) -> dict:
    args = CONFIGS[key][1] + (["--bundle", str(a.bundle)] if a.bundle else []) + shlex.split(a.serve_args)
    t0 = time.perf_counter()
    server = Server(args, logs / f"{key}-round{r + 1}.log")
    try:
        server.wait_ready(a.start_timeout)
        startup = time.perf_counter() - t0
        model = json.loads(get(server.port, "/v1/models")[1])["data"][0]["id"]
        if a.warmup:  # every client at once, so every replica gets some
            load(server.port, model, prompts, a.clients, a.warmup, a.max_tokens)
        figures = load(server.port, model, prompts, a.clients, a.requests_per_client, a.max_tokens)
    finally:
        killed = server.stop()
    if killed:
        print(f"{key}: killed {len(killed)} leftover process(es) of its Ray instance: {killed}", file=sys.stderr)
    return {**figures, "startup_s": startup, "leftover_processes_killed": len(killed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, help="a bundle folder [default: the demo bundle]")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests-per-client", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up requests per client, not timed")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=Path, help="a JSON list of prompts [default: specrt's shipped code prompts]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve-args", default="", help="more `specrt serve` options for every configuration")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds a server gets to answer /health")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers are stopped on the way out
    if a.prompts:
        prompts = json.loads(a.prompts.read_text())
    else:
        from specrt.data import prompts as shipped

        prompts = shipped("code")
    info = machine()
    keys = list(CONFIGS)
    runs: dict[str, list[dict]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="serve-replicas-") as tmp:
        for r in range(a.rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                runs[key].append(run_config(key, a, prompts, Path(tmp), r))
                x = runs[key][-1]
                print(f"round {r + 1}: {key:8s} {x['tokens_per_second']:7.1f} tokens/s  TTFT p50 "
                      f"{x['ttft_p50_s'] * 1000:6.0f} ms  p95 {x['ttft_p95_s'] * 1000:6.0f} ms  "
                      f"({x['tokens']} tokens in {x['wall_s']:.1f} s; per replica {x['requests_per_replica']})",
                      flush=True)
    configs = {k: {"label": CONFIGS[k][0], "serve_args": CONFIGS[k][1],
                   **{f: statistics.median(x[f] for x in runs[k])
                      for f in ("tokens_per_second", "ttft_p50_s", "ttft_p95_s")},
                   "runs": runs[k]} for k in keys}
    tps = {k: c["tokens_per_second"] for k, c in configs.items()}
    ratios = {"2 replicas / 1 replica": tps["ray-2"] / tps["ray-1"],
              "2 replicas / one process": tps["ray-2"] / tps["process"]}
    print(f"\n{'configuration':30s} {'tokens/s':>9s} {'TTFT p50':>9s} {'TTFT p95':>9s}")
    for c in configs.values():
        print(f"{c['label']:30s} {c['tokens_per_second']:9.1f} {c['ttft_p50_s'] * 1000:7.0f} ms "
              f"{c['ttft_p95_s'] * 1000:7.0f} ms")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}×")
    if a.json:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "json"}
        a.json.write_text(json.dumps({"machine": info, "date": date.today().isoformat(), "options": options,
                                      "prompts": len(prompts), "configs": configs, "ratios": ratios},
                                     indent=2) + "\n")


if __name__ == "__main__":
    main()
