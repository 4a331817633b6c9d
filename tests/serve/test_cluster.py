"""`specrt serve` on Ray Serve (the cluster extra): replicas, failover, the ingress's limits, the CLI's bad input.

The test process starts a Ray instance (3 CPUs, token authentication as Ray sets it up) and stands in for an
existing cluster: `specrt serve --ray-address` joins it with 2 replicas of a copy of the demo bundle that has a chat
template, so completions and chat are both checked against `gen.generate` / `gen.chat`. HTTP stays on 127.0.0.1.
One replica is killed mid-run with ray.kill. Bounded: ~3 minutes on 2 cores, most of it Ray starting.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="needs the serve extra: pip install -e '.[serve,cluster,dev]'")
openai = pytest.importorskip("openai", reason="needs the dev extra (the OpenAI client)")
ray = pytest.importorskip("ray", reason="needs the cluster extra: pip install -e '.[serve,cluster,dev]'")

from click.testing import CliRunner  # noqa: E402
from support.servers import ROOT, Server, free_port, read_events  # noqa: E402

import specrt  # noqa: E402
from specrt.cli import main  # noqa: E402
from specrt.demo import BUNDLE  # noqa: E402

KEY = "cluster-key-1"
MODEL = "demo-chat"  # the copied bundle's folder name
AUTH = {"Authorization": f"Bearer {KEY}"}
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}" \
           "{% if add_generation_prompt %}<assistant>{% endif %}"
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
SAMPLED = dict(temperature=0.8, top_p=0.9, seed=11)


def _ray_daemons() -> set[int]:
    """Pids of every Ray instance's gcs_server and raylet on this machine."""
    pids = set()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("gcs_server", "raylet"):
                pids.add(int(comm.parent.name))
        except OSError:  # the process ended while we looked
            pass
    return pids


@pytest.fixture(scope="module")
def chat_demo(tmp_path_factory) -> Path:
    """The demo bundle with a chat template: one bundle serves both endpoints."""
    folder = tmp_path_factory.mktemp("bundles") / MODEL
    shutil.copytree(BUNDLE, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    manifest = json.loads((folder / "specrt.json").read_text())
    manifest["tokenizer"]["chat_template"] = "chat_template.jinja"
    (folder / "specrt.json").write_text(json.dumps(manifest, indent=2))
    return folder


@pytest.fixture(scope="module")
def gen(chat_demo):
    return specrt.load(chat_demo, threads=1)


@pytest.fixture(scope="module")
def cluster():
    """A Ray instance standing in for a cluster someone started: 2 replicas of 1 CPU fit, a third does not."""
    before = _ray_daemons()
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    assert _ray_daemons() <= before  # the instance went down whole


@pytest.fixture(scope="module")
def server(cluster, chat_demo, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("cluster"), "--ray-address", cluster, "--replicas", "2", "--bundle",
               str(chat_demo), "--api-key", KEY, start_timeout=240)
    yield s
    rc = s.stop()
    assert rc == 0, s.log.read_text()
    from ray import serve

    assert f"specrt-{MODEL}" not in serve.status().applications  # the joined cluster keeps running, without it


def _replicas() -> dict[str, str]:
    """{replica id: actor name} of the Serve replicas on the cluster."""
    return {a["name"].rsplit("#", 1)[-1]: a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")}


def _running(n: int) -> bool:
    from ray import serve

    app = serve.status().applications.get(f"specrt-{MODEL}")
    return app is not None and app.deployments["specrt"].replica_states.get("RUNNING", 0) == n


def _run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specrt.cli", "serve", "--threads", "1", "--log-level", "warning",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _one_line_error(res: subprocess.CompletedProcess) -> str:
    """The CLI's error: exit 1, no traceback, the last line "Error: ..." (Ray may log a warning before it)."""
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    return res.stderr.strip().splitlines()[-1]


# --- the CLI without Ray, and before Ray --------------------------------------------------------------------------

def test_replicas_without_the_cluster_extra_say_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")] + ["ray"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it raises ImportError
    res = CliRunner().invoke(main, ["serve", "--replicas", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines() == [
        "Error: replicas need the cluster extra (ray is missing): pip install 'specrt[cluster]'"]


@pytest.mark.parametrize("args,message", [
    (["--replicas", "0"], "replicas must be >= 1"),
    (["--min-replicas", "3", "--max-replicas", "2"], "1 <= min_replicas <= max_replicas"),
    (["--max-replicas", "2"], "both min_replicas and max_replicas"),
    (["--replicas", "2", "--bundle", "/nonexistent/bundle"], "bundle folder not found: /nonexistent/bundle"),
])
def test_bad_settings_fail_before_ray_starts(args, message):
    before = _ray_daemons()
    res = CliRunner().invoke(main, ["serve", *args])
    assert res.exit_code == 1 and message in res.output and res.output.count("\n") == 1, res.output
    assert _ray_daemons() == before


def test_an_unreachable_ray_address_is_one_line_at_once():
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["serve", "--ray-address", f"127.0.0.1:{free_port()}"])
    assert res.exit_code == 1 and res.output.startswith("Error: cannot reach the Ray cluster at 127.0.0.1:")
    assert res.output.count("\n") == 1 and time.monotonic() - t0 < 10  # ray.init alone would retry for minutes


def test_a_generation_that_accepts_nothing_records_into_rays_export(gen):
    """Ray's counters refuse inc(0), where prometheus_client's take it: on a replica, a request whose generation
    accepted no drafted token failed with a 500 (the soak found it)."""
    from specrt.serve.cluster import _ray_metric
    from specrt.serve.metrics import ServeMetrics

    result = gen.generate("x", max_new_tokens=1)
    assert result.stats.accepted == 0
    metrics = ServeMetrics(mirror=_ray_metric)
    metrics.record(1, result)
    assert metrics.registry.get_sample_value("specrt_accepted_tokens_total") == 0
    assert metrics.registry.get_sample_value("specrt_generated_tokens_total") == 1


# --- two replicas on the cluster -----------------------------------------------------------------------------------

def test_completions_and_chat_equal_generate(server, gen):
    client = server.client(api_key=KEY)
    prompt = "def read_lines(path):"
    expected = gen.generate(prompt, max_new_tokens=24, **SAMPLED)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, **SAMPLED)
    assert out.choices[0].text == expected.text and out.usage.completion_tokens == 24
    assert out.specrt["accepted"] == expected.stats.accepted and out.specrt["replica"] in _replicas()

    chunks = list(client.completions.create(model=MODEL, prompt="class Stack:", max_tokens=32, stream=True,
                                            temperature=0))
    assert "".join(c.choices[0].text for c in chunks) == gen.generate("class Stack:", max_new_tokens=32).text
    assert chunks[-1].specrt["replica"] in _replicas()

    chat = gen.chat(MESSAGES, max_new_tokens=12, **SAMPLED)
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, **SAMPLED)
    assert out.choices[0].message.content == chat.text and out.usage.completion_tokens == len(chat.token_ids)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
                                                 **SAMPLED))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == chat.text


def test_the_api_key_and_body_limit_hold_at_the_ingress(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").completions.create(model=MODEL, prompt="x", max_tokens=1)
    status, headers, body = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "x"})
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    status, _, body = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "x" * (1 << 20)}, AUTH)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    status, _, body = server.request("POST", "/v1/completions", b"{not json", AUTH)  # a replica's own 400
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]["message"]
    assert server.get("/health")[0] == 200  # probes need no key, as on one process
    status, _, body = server.get("/metrics")
    assert status == 404 and "Ray's metrics export" in json.loads(body)["error"]["message"]


def test_a_killed_replica_loses_no_request_and_comes_back(server, gen):
    """Eight non-streamed requests and one stream in flight over both replicas; the stream's replica is killed."""
    client = server.client(api_key=KEY)
    stream = server.connect()
    stream.request("POST", "/v1/completions", headers={"Content-Type": "application/json", **AUTH},
                   body=json.dumps({"model": MODEL, "prompt": "def fib(n):", "max_tokens": 1000, "temperature": 0,
                                    "stream": True}).encode())
    resp = stream.getresponse()
    victim = resp.getheader("x-specrt-replica")
    assert resp.status == 200 and victim in _replicas()
    assert resp.readline().startswith(b"data: ")
    prompts = [f"def step_{i}(x):" for i in range(8)]

    def one(prompt: str) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        answers = pool.map(one, prompts)
        time.sleep(1.0)  # both replicas hold queued requests now
        killed = time.monotonic()
        ray.kill(ray.get_actor(_replicas()[victim], namespace="serve"), no_restart=True)
        events = read_events(resp)  # ends: never a hung connection
        answers = list(answers)
    assert answers == [gen.generate(p, max_new_tokens=48).text for p in prompts]  # nothing lost, nothing changed
    assert events[-1]["error"]["code"] == "replica_lost" and "[DONE]" not in events
    while not (_running(2) and victim not in _replicas()):
        assert time.monotonic() - killed < 30, "the replica did not come back within 30 s"
        time.sleep(0.25)
    assert "sending the request again" in server.log.read_text()  # the victim's queued requests were resent


def test_soak_mixed_requests_with_disconnects(server, gen):
    """60 seeded requests (streamed or not, completions or chat) from 6 clients. Every 6th asks for 1000 tokens
    (~8 s) and leaves after its first chunk: its generation must stop there, or the replicas stay busy."""
    rng = random.Random(5)
    jobs = [(i, "completion" if i % 6 == 5 else rng.choice(["completion", "chat"]), i % 6 == 5 or rng.random() < 0.5,
             i % 6 == 5) for i in range(60)]
    expected = {}
    for i, kind, _, _ in jobs:
        if kind == "completion":
            expected[i] = gen.generate(f"def f{i}(x):", max_new_tokens=16, seed=i, temperature=0.7).text
        else:
            expected[i] = gen.chat([{"role": "user", "content": f"task {i}"}], max_new_tokens=16, seed=i,
                                   temperature=0.7).text

    def one(job) -> tuple[int, str | None, str | None]:
        i, kind, streamed, leaves = job
        client = server.client(api_key=KEY)
        common = dict(model=MODEL, max_tokens=16, seed=i, temperature=0.7)
        if leaves:  # greedy on this prompt runs all 1000 tokens (no EOS)
            common.update(max_tokens=1000, temperature=0)
        if kind == "completion":
            call = functools.partial(client.completions.create, prompt="def fib(n):" if leaves else f"def f{i}(x):",
                                     **common)
            text = lambda c: c.choices[0].text  # noqa: E731
        else:
            call = functools.partial(client.chat.completions.create,
                                     messages=[{"role": "user", "content": f"task {i}"}], **common)
            text = lambda c: c.choices[0].delta.content or ""  # noqa: E731
        if not streamed:
            out = call()
            return i, out.choices[0].text if kind == "completion" else out.choices[0].message.content, \
                out.specrt["replica"]
        chunks = call(stream=True)
        got, replica = [], None
        for c in chunks:
            if leaves:
                chunks.close()  # the client goes away after its first chunk
                return i, None, None
            got.append(text(c))
            replica = c.specrt["replica"] if getattr(c, "specrt", None) else replica
        return i, "".join(got), replica

    t0 = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, jobs))
    assert time.monotonic() - t0 < 120
    for i, text, _ in results:
        if text is not None:
            assert text == expected[i], i
    assert len({replica for _, _, replica in results if replica}) == 2  # both replicas served
    # The replicas are idle again: the clients that left cancelled their generations.
    seen: dict[str, bool] = {}
    deadline = time.monotonic() + 10
    while len(seen) < 2 or any(seen.values()):
        assert time.monotonic() < deadline, seen
        h = server.health()
        seen[h["replica"]] = h["busy"]


def test_metrics_per_replica_in_rays_export(server):
    """The replicas' counters reach Ray's metrics export (scraped per node), one series per replica."""
    import urllib.request

    node = next(n for n in ray.nodes() if n["Alive"])
    url = f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"
    deadline = time.monotonic() + 40  # Ray exports every few seconds
    while True:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        lines = [line for line in text.splitlines() if line.startswith("ray_specrt_generated_tokens_total{")]
        replicas = {line.split('replica="', 1)[1].split('"', 1)[0] for line in lines}
        if len(replicas & set(_replicas())) == 2:
            break
        assert time.monotonic() < deadline, f"no per-replica specrt metrics at {url}: {lines}"
        time.sleep(1)


# --- joining the cluster with bad input ------------------------------------------------------------------------------

def test_a_bundle_missing_on_the_nodes_is_one_line_and_leaves_nothing(server, cluster):
    from ray import serve

    before = set(serve.status().applications)
    res = _run_cli("--ray-address", cluster, "--replicas", "1", "--bundle", "/nonexistent/bundle",
                   "--port", str(free_port()))
    assert _one_line_error(res).startswith("Error: the replicas failed to start: bundle folder not found: "
                                           "/nonexistent/bundle (on ")
    assert set(serve.status().applications) == before and _running(2)  # the serving app is untouched


def test_more_replicas_than_the_cluster_places_is_one_line(server, cluster):
    res = _run_cli("--ray-address", cluster, "--replicas", "2", "--bundle", str(BUNDLE), "--port", str(free_port()))
    assert _one_line_error(res) == ("Error: the cluster can place 1 of the 2 replicas (1 CPU each); "
                                    "free now: 1 CPU, 0 GPU")
    assert _running(2)


# --- a local Ray instance --------------------------------------------------------------------------------------------

def test_replicas_on_a_local_ray_instance_stop_with_it(tmp_path, gen):
    """`specrt serve --replicas 1` starts its own Ray, answers, and on SIGTERM exits 0 taking that Ray down."""
    before = _ray_daemons()
    s = Server(tmp_path, "--replicas", "1", "--bundle", str(gen.bundle), start_timeout=240)
    try:
        assert len(_ray_daemons() - before) == 2  # its own gcs_server and raylet
        out = s.client().completions.create(model=MODEL, prompt="import os", max_tokens=8, temperature=0)
        assert out.choices[0].text == gen.generate("import os", max_new_tokens=8).text
        assert "a local Ray instance" in s.log.read_text()
    finally:
        rc = s.stop()
    assert rc == 0, s.log.read_text()
    assert _ray_daemons() <= before
