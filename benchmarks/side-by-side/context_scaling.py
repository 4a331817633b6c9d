"""Plain decoding's step time against the context it reads: specrt bundles and llama.cpp, one process.

A decode step reads every weight once and the whole KV cache once; how much more it costs at 1024 cached
positions than at 64 is what a long chat or a long document pays per token. Each engine gets the same
text (this repository's docs, cut to N tokens of its tokenizer) as its prompt and decodes ``--new-tokens``
greedily; the figure is the median time of one decode step, prefill excluded:
- specrt: ``specrt.load(bundle).stream_ids(ids, method="none")``, the target passes after the prefill
  (``GenerationStats.verify_s`` / steps), the runtime's host work included;
- llama.cpp (llama-cpp-python, ``--gguf``): ``Llama.generate`` from an empty cache, timed from its first
  token (the prefill's) on, so each later token is one decode step and its sampling.
Engines and context lengths are interleaved within each repeat, so a slower minute hits all of them.

    python benchmarks/side-by-side/context_scaling.py --bundle fused=B1 --bundle gqa=B2 --gguf llama.cpp=G \\
        --contexts 64,256,1024,2048 --threads 2 --json benchmarks/side-by-side/context-scaling-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def context_text() -> str:
    """Long, plain English and markdown that ships with the repository: its docs, in a fixed order."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md")))


def specrt_step_ms(gen, ids: list[int], new_tokens: int) -> tuple[float, int]:
    """(ms per decode step after the prefill, steps timed)."""
    stats = gen.stream_ids(ids, method="none", max_new_tokens=new_tokens + 1).result.stats
    steps = stats.target_passes - 1
    return (1000 * stats.verify_s / steps if steps else float("nan")), steps


class LlamaCpp:
    """llama.cpp through llama-cpp-python, with a context for the longest prompt plus the new tokens."""

    def __init__(self, gguf: str, contexts: list[int], new_tokens: int, threads: int | None) -> None:
        import os

        import llama_cpp

        threads = threads or os.cpu_count() or 1
        self.llm = llama_cpp.Llama(gguf, n_ctx=max(contexts) + new_tokens + 8, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.description = f"llama-cpp-python {llama_cpp.__version__}, {self.llm._model.desc()}, {threads} threads"

    def encode(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=True, special=True)

    def step_ms(self, ids: list[int], new_tokens: int) -> tuple[float, int]:
        """Greedy; the clock starts at the first token (the prefill's), each later one is one decode step."""
        from specrt.measure.peers.llamacpp import sampling_kwargs
        from specrt.runtime.sampling import SamplingConfig

        self.llm.reset()
        tokens = self.llm.generate(list(ids), reset=True, **sampling_kwargs(SamplingConfig(temperature=0.0)))
        next(tokens)
        t0, steps = time.perf_counter(), 0
        for _ in tokens:
            steps += 1
            if steps == new_tokens:
                break
        return 1000 * (time.perf_counter() - t0) / steps, steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", action="append", default=[], metavar="LABEL=DIR", help="a specrt bundle (repeatable)")
    ap.add_argument("--gguf", action="append", default=[], metavar="LABEL=FILE",
                    help="a GGUF for llama.cpp, plain decoding (repeatable)")
    ap.add_argument("--contexts", default="64,256,1024,2048", help="prompt lengths in tokens")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import specrt
    from specrt.bundle.manifest import load_manifest

    contexts = [int(c) for c in args.contexts.split(",")]
    text = context_text()
    engines, details = {}, {}
    for spec in args.bundle:
        label, _, folder = spec.partition("=")
        gen = specrt.load(folder, threads=args.threads)
        ids = gen.encode(text)
        if len(ids) < max(contexts):
            raise SystemExit(f"the docs are {len(ids)} tokens for {label}, fewer than {max(contexts)}")
        entry = load_manifest(folder).target
        q = entry.quantization or {}
        engines[label] = (lambda ids, n, g=gen: specrt_step_ms(g, ids, n), ids)
        details[label] = {"engine": "specrt", "bundle": folder, "graph": entry.graph,
                          "precision": f"int{q['bits']}" if q else entry.dtype, "format": q.get("format")}
    for spec in args.gguf:
        label, _, file = spec.partition("=")
        llama = LlamaCpp(file, contexts, args.new_tokens, args.threads)
        engines[label] = (llama.step_ms, llama.encode(text))
        details[label] = {"engine": "llama.cpp", "gguf": file, "description": llama.description}
    times = {label: {n: [] for n in contexts} for label in engines}
    steps = {label: {n: 0 for n in contexts} for label in engines}
    for _ in range(args.repeats):
        for n in contexts:
            for label, (run, ids) in engines.items():
                ms, k = run(ids[:n], args.new_tokens)
                times[label][n].append(ms)
                steps[label][n] = k
    out = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
           "threads": args.threads, "new_tokens": args.new_tokens, "repeats": args.repeats, "contexts": contexts,
           "engines": {label: {**details[label],
                               "step_ms": {str(n): statistics.median(times[label][n]) for n in contexts},
                               "steps_timed": {str(n): steps[label][n] for n in contexts}}
                       for label in engines}}
    for label, e in out["engines"].items():
        print(f"{label:24s}", "  ".join(f"{n}: {e['step_ms'][str(n)]:6.2f} ms" for n in contexts))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
