"""`specrt serve` on Ray Serve (the cluster extra): replicas, failover, the ingress's limits, the CLI's bad input.

The test process starts a Ray instance (3 CPUs, token authentication as Ray sets it up) and stands in for an
existing cluster: `specrt serve --ray-address` joins it with 2 replicas of a copy of the demo bundle that has a chat
template, so completions and chat are both checked against `gen.generate` / `gen.chat`. HTTP stays on 127.0.0.1.
One replica is killed mid-run with ray.kill, once in a small failover test and once in the soak of 320 requests
(tests/support/soak.py). Bounded: ~2.5 minutes on 2 cores, most of it Ray starting.
"""

from __future__ import annotations

import json
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
from support import soak  # noqa: E402
from support.servers import ROOT, Server, free_port, hide_modules, read_events  # noqa: E402

import specrt  # noqa: E402
from specrt.cli import main  # noqa: E402
from specrt.demo import BUNDLE  # noqa: E402

KEY = "cluster-key-1"
MODEL = "demo-chat"  # the copied bundle's folder name
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
NAMED = soak.METHOD  # the demo pair's auto, named: test_serve.py says why
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
    return soak.chat_demo(tmp_path_factory.mktemp("bundles") / MODEL)


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
               str(chat_demo), "--api-key", KEY, "--method", NAMED, start_timeout=240)  # named: test_serve's why
    yield s
    rc = s.stop()
    assert rc == 0, s.log.read_text()
    from ray import serve

    assert f"specrt-{MODEL}" not in serve.status().applications  # the joined cluster keeps running, without it


def _replicas() -> dict[str, str]:
    """{replica id: actor name} of the Serve replicas on the cluster."""
    return {a["name"].rsplit("#", 1)[-1]: a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")}


def _running(n: int, within: float = 30) -> bool:
    """Serve reports n replicas RUNNING within `within` s: its status lags the replicas (a health check on a busy
    2-core machine can leave one briefly in another state), so it is polled, not read once."""
    from ray import serve

    deadline = time.monotonic() + within
    while True:
        app = serve.status().applications.get(f"specrt-{MODEL}")
        if app is not None and app.deployments["specrt"].replica_states.get("RUNNING", 0) == n:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


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
    hide_modules(monkeypatch, "ray")
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
    expected = gen.generate(prompt, max_new_tokens=24, method=NAMED, **SAMPLED)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, **SAMPLED)
    assert out.choices[0].text == expected.text and out.usage.completion_tokens == 24
    assert out.specrt["accepted"] == expected.stats.accepted and out.specrt["replica"] in _replicas()

    chunks = list(client.completions.create(model=MODEL, prompt="class Stack:", max_tokens=32, stream=True,
                                            temperature=0))
    assert "".join(c.choices[0].text for c in chunks) == gen.generate("class Stack:", max_new_tokens=32).text
    assert chunks[-1].specrt["replica"] in _replicas()

    chat = gen.chat(MESSAGES, max_new_tokens=12, method=NAMED, **SAMPLED)
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
    while not (_running(2, within=0) and victim not in _replicas()):
        assert time.monotonic() - killed < 30, "the replica did not come back within 30 s"
        time.sleep(0.25)
    assert "sending the request again" in server.log.read_text()  # the victim's queued requests were resent


def _replica_pids() -> dict[str, int]:
    """{replica id: pid} of the live replicas, from the actor table in Ray's GCS: the cluster's own record, where a
    scan of process titles could find another cluster's replicas on this machine. (ray.util.state would need the
    dashboard.)"""
    from ray._private.state import actors

    pids = {a["Name"].rsplit("#", 1)[-1]: a["Pid"] for a in actors(actor_state_name="ALIVE").values()
            if a["Name"].startswith("SERVE_REPLICA::")}
    for pid in pids.values():  # the pid is the replica's worker process, not a stale or reused one
        assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ServeReplica"), pid
    return pids


def test_soak_320_mixed_requests_with_a_replica_killed(server, gen):
    """The soak of test_serve.py through the ingress, one replica killed with ray.kill at request 100 of 320: each
    request ends in its exact answer or the error it provoked, and a stream on the killed replica in replica_lost
    (non-streamed ones are resent). A new replica answers within 30 s of the kill. The survivor's RSS stays put
    (its replacement starts mid-run, so it has no like-for-like start to compare with)."""
    reference = soak.Reference(gen)
    soak.check(soak.run_soak(server, reference, MODEL, KEY, soak.plan(32, seed=1)))  # warm-up: every path, both
    pids = _replica_pids()
    assert len(pids) == 2 and _running(2)
    rss = {pid: soak.rss_bytes(pid) for pid in pids.values()}
    victim = sorted(pids)[0]
    resent = server.log.read_text().count("sending the request again")
    killed = []

    def kill() -> None:
        killed.append(time.monotonic())
        ray.kill(ray.get_actor(_replicas()[victim], namespace="serve"), no_restart=True)

    report = soak.run_soak(server, reference, MODEL, KEY, soak.plan(320, seed=2), fault=(100, kill))
    # Back: a replica that is not one of the two the soak began with has answered. Serve's status is no measure
    # of it: it reads 2 running until its controller notices the death.
    new = [o.done for o in report.outcomes if o.status == "exact" and o.replica not in pids]
    client = server.client(api_key=KEY)
    while not new and time.monotonic() - killed[0] < 30:
        out = client.completions.create(model=MODEL, prompt="x", max_tokens=1, temperature=0)
        new = [time.monotonic()] if out.specrt["replica"] not in pids else []
    soak.wait_idle(server, replicas=2)
    after = {pid: soak.rss_bytes(pid) for pid in _replica_pids().values()}
    growth = soak.rss_growth(rss, after)
    errors = [o.job.index for o in report.errors()]
    resent = server.log.read_text().count("sending the request again") - resent
    print(f"soak, 2 Ray replicas: {report.summary()}; a new replica answered {min(new) - killed[0]:.1f} s after "
          f"the kill; resends {resent}, errors {errors}; RSS of the survivor "
          + ", ".join(f"{rss[p] / 2**20:.0f} MiB {g:+.1%}" for p, g in growth.items()))
    soak.check(report, allow=lambda o: o.job.streamed and o.detail == "replica_lost" and o.replica == victim)
    assert report.count()["exact"] >= 200 and report.wall_s < 120, report.summary()
    assert resent + len(errors) > 0  # the kill caught requests in flight: a soak that missed them proves nothing
    assert new and min(new) - killed[0] < 30, "no new replica answered within 30 s of the kill"
    assert victim in {o.replica for o in report.outcomes if o.status == "exact"}  # it served before it died
    assert len(growth) == 1 and all(g < 0.10 for g in growth.values()), growth  # the survivor's, start to end


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
