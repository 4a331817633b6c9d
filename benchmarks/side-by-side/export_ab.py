"""Two exports of one model, alternating in one process: what a change to the exported graph buys (first
computing logits only for the rows a pass reads, contract.LOGITS_INDEX; then one node for each residual Add
and its norm, export/graph/skip_norm.py).

    python benchmarks/side-by-side/export_ab.py OLD NEW --label L [--lengths 32,128,512] [--step-rows 1,3] [--reps 9] \
        [--gen-reps 3] [--method eagle] [--shared-pool] [--json OUT]   # OUT gains runs[L], keeping the runs it holds

Per prompt length: the target's prefill pass (what the time to the first token is made of), timed alone;
the decode step alone (a q-row target pass after ``--past`` cached positions, ``--step-rows``); then whole
greedy generations of the 14 held-out chat prompts × 64 tokens with ``--method`` (as plain text where the
bundle has no chat template), whose tokens/s includes the prefills and, for ``eagle``, the head's catch-up
passes. Medians over ``--reps`` (prefills, steps) and ``--gen-reps`` (generations; default a third of
``--reps``) alternations; the ratio NEW / OLD per alternation, then its median, cancels the machine's drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import specrt
from specrt.runtime.sampling import SamplingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # verify_rows.py, shared by the runners
from verify_rows import decoder_ms  # noqa: E402

PROMPTS = Path(__file__).resolve().parents[1] / "prompts" / "chat-heldout.json"


def prefill_ms(gen, ids: list[int]) -> float:
    model = gen._models["target"]
    model.reset()
    t0 = time.perf_counter()
    model.feed(ids, SamplingConfig(temperature=0.0)).top(0, 1)  # the first token, as a prefill reads it
    return (time.perf_counter() - t0) * 1000


def generation_tps(gen, prompts: list[str], method: str) -> float:
    tokens, seconds = 0, 0.0
    chat = bool(gen.manifest.tokenizer.chat_template)  # a bundle without a template continues the text
    for p in prompts:
        opts = dict(max_new_tokens=64, method=method, gamma="auto")
        out = gen.chat([{"role": "user", "content": p}], **opts) if chat else gen.generate(p, **opts)
        tokens, seconds = tokens + len(out.token_ids), seconds + out.stats.total_s
    return tokens / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--lengths", default="32,128,512", help="prompt lengths of the prefill timings ('': none)")
    ap.add_argument("--step-rows", default="1,3", help="row counts of the decode-step timings ('': none)")
    ap.add_argument("--past", type=int, default=100, help="cached positions before each decode step")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--gen-reps", type=int, help="alternations of whole generations (0: none) [default: --reps // 3]")
    ap.add_argument("--method", default="eagle")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shared-pool", action="store_true",
                    help="every session on one ONNX Runtime pool, as the CLI runs them (a head's passes on the "
                         "target's workers)")
    ap.add_argument("--label", required=True, help="this run's name in the JSON file")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    share = {"shared_threads": True} if a.shared_pool else {}
    gens = {k: specrt.load(path, threads=a.threads, **share) for k, path in (("old", a.old), ("new", a.new))}
    flags = {k: g.manifest.target.logits_index for k, g in gens.items()}
    prompts = json.loads(PROMPTS.read_text())
    text = " ".join(prompts) * 8
    result: dict = {"bundles": {"old": Path(a.old).name, "new": Path(a.new).name}, "logits_index": flags,
                    "method": a.method, "reps": a.reps, "threads": a.threads, "shared_pool": a.shared_pool}
    for n in (int(x) for x in a.lengths.split(",") if x):
        ids = gens["old"].encode(text)[:n]
        for g in gens.values():
            prefill_ms(g, ids)  # warm-up: the session's first pass of this width
        runs = [{k: prefill_ms(g, ids) for k, g in gens.items()} for _ in range(a.reps)]
        result.setdefault("prefill_ms", {})[n] = summary(runs)
        print(f"prefill {n:4d} tokens: {result['prefill_ms'][n]}", flush=True)
    rows = [int(x) for x in a.step_rows.split(",") if x]
    if rows:  # the engine's decode step alone: a q-row target pass after --past positions
        decoders = {k: g._models["target"].decoder for k, g in gens.items()}
        runs = [{k: decoder_ms(d, rows, a.past) for k, d in decoders.items()} for _ in range(a.reps)]
        result["past"] = a.past
        result["step_ms"] = {q: summary([{k: r[k][q] for k in r} for r in runs]) for q in rows}
        print(f"decode step at {a.past} cached: {result['step_ms']}", flush=True)
    gen_reps = max(a.reps // 3, 1) if a.gen_reps is None else a.gen_reps
    if gen_reps:
        for g in gens.values():
            generation_tps(g, prompts[:2], a.method)
        runs = [{k: generation_tps(g, prompts, a.method) for k, g in gens.items()} for _ in range(gen_reps)]
        result["tokens_per_second"] = summary(runs)
        print(f"{a.method} tokens/s: {result['tokens_per_second']}", flush=True)
    if a.json:
        data = json.loads(a.json.read_text()) if a.json.exists() else {"runs": {}}
        data["runs"].setdefault(a.label, {}).update(result)  # a later run of one label adds its sections
        a.json.write_text(json.dumps(data, indent=2) + "\n")


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Medians of each side and of the per-run ratio new / old."""
    return {"old": statistics.median(r["old"] for r in runs), "new": statistics.median(r["new"] for r in runs),
            "new_over_old": statistics.median(r["new"] / r["old"] for r in runs), "runs": len(runs)}


if __name__ == "__main__":
    main()
