"""The soak both hosts of `specrt serve` go through: hundreds of mixed requests from the official OpenAI client,
each ending in its exact answer (checked against ``gen.generate`` / ``gen.chat``) or an OpenAI-style error.

A job is a good request (completion or chat, streamed or not, greedy or seeded), a client that leaves mid-answer,
a malformed JSON body (raw HTTP: the client sends only valid JSON), an oversized body or a wrong API key, in a
seeded order and mix. Each ends in one outcome:

- ``exact``: the answer equals the reference, text, token count and finish reason;
- ``refused``: a bad request got the error it provoked (400, 413, 401, in OpenAI's form);
- ``left``: the client went away, as planned;
- ``error``: a good request got an OpenAI-style error instead (the test decides which codes it allows);
- ``wrong``: an answer that differs, or a bad request answered otherwise;
- ``lost``: no answer and no OpenAI-style error (a hang past the client's timeout, a cut connection, a non-JSON
  body).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specrt.serve.protocol import FINISH

# A good request's body: variant v picks prompt, length and sampling, so answers differ while the references
# (one gen call per variant) stay few.
VARIANTS = 24
LEAVE_PROMPT = "def fib(n):"  # greedy on the demo never stops early: a client that leaves always leaves mid-answer
# ~5 s if nobody cancels it (the demo's draft method, 2 threads, a 2-core VM): a generation that outlives its
# client keeps the server busy. At 256 (~2 s) one stream in 21 finished under the full suite's load before its
# disconnect reached the event loop (2026-12-07; not seen alone): a longer answer leaves the check its margin.
LEAVE_TOKENS = 640
CLIENT_TIMEOUT_S = 30.0  # a request without an answer by then counts as lost, not as a hung test
MIX = {"answer": 70, "leave": 10, "malformed": 7, "oversized": 6, "wrong_key": 7}  # % of the jobs
MALFORMED = [b"{not json", b'{"model": "m", "prompt": "cut', b"[1, 2]", b"\xff\xfe{}"]


@dataclass(frozen=True)
class Job:
    index: int
    kind: str  # a key of MIX
    chat: bool
    streamed: bool
    variant: int


@dataclass(frozen=True)
class Outcome:
    job: Job
    status: str  # exact, refused, left, error, wrong, lost
    detail: str = ""  # the error's code, or what differed
    replica: str | None = None  # which replica answered, where the answer says
    done: float = 0.0  # time.monotonic() when it ended


def plan(n: int, seed: int) -> list[Job]:
    """``n`` jobs in a seeded random order and mix."""
    rng = random.Random(seed)
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=n)
    return [Job(i, kind, chat=kind == "answer" and rng.random() < 0.5, streamed=rng.random() < 0.5,
                variant=rng.randrange(VARIANTS)) for i, kind in enumerate(kinds)]


def params(variant: int) -> dict[str, Any]:
    """The request's generation parameters, as OpenAI names them; even variants greedy, odd ones seeded."""
    sampling = dict(temperature=0) if variant % 2 == 0 else dict(temperature=0.7, top_p=0.9, seed=variant)
    return dict(max_tokens=(4, 8, 16)[variant % 3], **sampling)


def prompt(variant: int) -> str:
    return f"def f{variant}(x):"


def messages(variant: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"task {variant}"}]


# The method the soak's servers run and its reference decodes with, named: under auto, which exact method runs a
# step follows measured time (runtime.gate), so a sampled answer is the target's in distribution but not the same
# tokens for a seed, and the soak compares tokens. The demo pair's auto is this method.
METHOD = "draft"


class Reference:
    """What each good request must answer: ``gen``'s own result with the same settings, computed once."""

    def __init__(self, gen: Any) -> None:
        self.gen, self._results = gen, {}

    def __call__(self, chat: bool, variant: int) -> Any:
        if (chat, variant) not in self._results:
            p = params(variant)
            kw = dict(max_new_tokens=p.pop("max_tokens"), method=METHOD, **p)
            self._results[chat, variant] = (self.gen.chat(messages(variant), **kw) if chat
                                            else self.gen.generate(prompt(variant), **kw))
        return self._results[chat, variant]


@dataclass
class Report:
    outcomes: list[Outcome]
    wall_s: float

    def count(self) -> Counter:
        return Counter(o.status for o in self.outcomes)

    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "error"]

    def summary(self) -> str:
        bad = [o for o in self.outcomes if o.status in ("wrong", "lost", "error")]
        return "; ".join([f"{len(self.outcomes)} requests in {self.wall_s:.1f} s: {dict(self.count())}",
                          f"kinds {dict(Counter(o.job.kind for o in self.outcomes))}",
                          *(f"#{o.job.index} {o.job.kind} chat={o.job.chat} stream={o.job.streamed}: {o.status} "
                            f"{o.detail}" for o in bad[:10])])


def run_soak(server: Any, reference: Reference, model: str, key: str, jobs: list[Job], *, concurrency: int = 8,
             fault: tuple[int, Callable[[], None]] | None = None) -> Report:
    """Send ``jobs`` to ``server`` (a :class:`~support.servers.Server`) from ``concurrency`` clients; ``fault``
    (index, action) runs the action as job ``index`` is taken up, the rest of the load still in flight."""
    import openai

    for job in jobs:  # the references first: computed while requests run, they would compete for the cores
        if job.kind == "answer":
            reference(job.chat, job.variant)
    clients = {k: openai.OpenAI(base_url=f"{server.url}/v1", api_key=k, max_retries=0, timeout=CLIENT_TIMEOUT_S)
               for k in (key, "wrong-" + key)}

    def one(job: Job) -> Outcome:
        if fault is not None and job.index == fault[0]:
            fault[1]()
        outcome = account(job)
        return dataclasses.replace(outcome, done=time.monotonic())

    def account(job: Job) -> Outcome:
        try:
            return _send(server, clients, reference, model, key, job)
        except openai.APIStatusError as e:  # an HTTP error answer: the client puts its "error" object in body
            error = _openai_error(e.body)
            detail = f"{e.status_code} {(error or {}).get('code') or (error or {}).get('type') or e.body}"
            return Outcome(job, "error" if error is not None else "lost", detail)
        except (openai.APIConnectionError, openai.APIResponseValidationError) as e:  # timeouts included
            return Outcome(job, "lost", f"{type(e).__name__}: {e}")
        except openai.APIError as e:  # an error event in a stream: its body is the error object
            error = _openai_error(e.body)
            return Outcome(job, "error" if error is not None else "lost", str((error or {}).get("code") or e.body))
        except Exception as e:  # noqa: BLE001 - anything else is a request the soak could not account for
            return Outcome(job, "lost", f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(one, jobs))
    for client in clients.values():
        client.close()
    return Report(outcomes, time.monotonic() - t0)


def _send(server: Any, clients: dict, reference: Reference, model: str, key: str, job: Job) -> Outcome:
    import openai

    client = clients[key]
    if job.kind == "malformed":  # no client sends broken JSON: raw HTTP
        path = "/v1/chat/completions" if job.variant % 2 else "/v1/completions"
        status, _, body = server.request("POST", path, MALFORMED[job.variant % len(MALFORMED)],
                                         {"Authorization": f"Bearer {key}"})
        try:
            error = _openai_error(json.loads(body).get("error"))
        except (ValueError, AttributeError):
            error = None
        ok = status == 400 and error is not None and error["type"] == "invalid_request_error"
        return Outcome(job, "refused" if ok else "wrong", f"{status} {error}")
    if job.kind == "oversized":
        try:
            client.completions.create(model=model, prompt="x" * (1 << 20), max_tokens=1)
        except openai.APIStatusError as e:
            code = (_openai_error(e.body) or {}).get("code")
            return Outcome(job, "refused" if (e.status_code, code) == (413, "request_too_large") else "wrong",
                           f"{e.status_code} {code}")
        return Outcome(job, "wrong", "answered")
    if job.kind == "wrong_key":
        try:
            clients["wrong-" + key].completions.create(model=model, prompt=prompt(job.variant), max_tokens=4)
        except openai.AuthenticationError as e:
            code = (_openai_error(e.body) or {}).get("code")
            return Outcome(job, "refused" if code == "invalid_api_key" else "wrong", f"401 {code}")
        return Outcome(job, "wrong", "answered")
    if job.kind == "leave":
        if not job.streamed:  # a client that gives up waiting, at a random point before or during generation
            conn = server.connect()
            conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {key}"},
                         body=json.dumps({"model": model, "prompt": LEAVE_PROMPT, "max_tokens": LEAVE_TOKENS,
                                          "temperature": 0}).encode())
            time.sleep(random.Random(job.index).uniform(0.0, 0.3))
            conn.close()
            return Outcome(job, "left")
        stream = client.completions.create(model=model, prompt=LEAVE_PROMPT, max_tokens=LEAVE_TOKENS, temperature=0,
                                           stream=True)
        replica = stream.response.headers.get("x-specrt-replica")
        try:
            next(iter(stream))  # the first piece: the generation runs
        except openai.APIError as e:
            return _stream_error(job, e, replica)
        stream.close()  # and the client goes away
        return Outcome(job, "left", replica=replica)

    expected = reference(job.chat, job.variant)
    finish = FINISH[expected.finish_reason]
    p = params(job.variant)
    if job.chat:
        call = functools.partial(client.chat.completions.create, model=model, messages=messages(job.variant), **p)
    else:
        call = functools.partial(client.completions.create, model=model, prompt=prompt(job.variant), **p)
    if not job.streamed:
        out = call()
        text = out.choices[0].message.content if job.chat else out.choices[0].text
        got = (text, out.usage.completion_tokens, out.choices[0].finish_reason)
        want = (expected.text, len(expected.token_ids), finish)
        return Outcome(job, "exact" if got == want else "wrong", "" if got == want else f"{got} != {want}",
                       out.specrt["replica"])
    stream = call(stream=True)
    replica = stream.response.headers.get("x-specrt-replica")  # known before the first piece: for a lost stream
    pieces, reason = [], None
    try:
        for chunk in stream:
            choice = chunk.choices[0]
            pieces.append((choice.delta.content if job.chat else choice.text) or "")
            reason = choice.finish_reason or reason
    except openai.APIError as e:
        return _stream_error(job, e, replica)
    got, want = ("".join(pieces), reason), (expected.text, finish)
    return Outcome(job, "exact" if got == want else "wrong", "" if got == want else f"{got} != {want}", replica)


def _stream_error(job: Job, e: Exception, replica: str | None) -> Outcome:
    """The outcome of a stream that ended in an error event (the client raises it as a bare APIError), with the
    replica it came from; a connection or status error goes on to the caller."""
    import openai

    if type(e) is not openai.APIError:
        raise e
    error = _openai_error(e.body)
    return Outcome(job, "error" if error is not None else "lost", str((error or {}).get("code") or e.body), replica)


def _openai_error(error: Any) -> dict | None:
    """``error`` if it is an error object in OpenAI's form (a message and a type), else None."""
    ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
    return error if ok else None


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def check(report: Report, allow: Callable[[Outcome], bool] = lambda o: False) -> None:
    """Every request accounted for: none wrong or lost, every kind of job present, and an error for a good request
    only where ``allow`` says so."""
    count = report.count()
    assert count["wrong"] == count["lost"] == 0, report.summary()
    assert all(allow(o) for o in report.errors()), report.summary()
    assert {o.job.kind for o in report.outcomes} == set(MIX), report.summary()


def rss_growth(before: dict[int, int], after: dict[int, int]) -> dict[int, float]:
    """Growth of each process present at both measurements ({pid: RSS}), as a fraction of its first RSS."""
    return {pid: after[pid] / before[pid] - 1 for pid in before.keys() & after.keys()}


def wait_idle(server: Any, replicas: int, timeout: float = 10.0) -> None:
    """Until ``replicas`` distinct replicas have answered /health idle: nothing generating, nothing queued (a
    client that left had its generation cancelled)."""
    idle: dict[str, bool] = {}
    deadline = time.monotonic() + timeout
    while len(idle) < replicas or not all(idle.values()):
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas still busy {timeout} s after the soak: {server.health()}")
        h = server.health()
        idle[h["replica"]] = not h["busy"] and h["queue_depth"] == 0
        time.sleep(0.05)


TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}" \
           "{% if add_generation_prompt %}<assistant>{% endif %}"


def chat_demo(folder: Path) -> Path:
    """A copy of the demo bundle with a chat template at ``folder``: one bundle serves both endpoints."""
    import shutil

    from specrt.demo import BUNDLE

    shutil.copytree(BUNDLE, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    manifest = json.loads((folder / "specrt.json").read_text())
    manifest["tokenizer"]["chat_template"] = "chat_template.jinja"
    (folder / "specrt.json").write_text(json.dumps(manifest, indent=2))
    return folder
