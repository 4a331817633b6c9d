"""Host work per token inside the decoding loop, and what the same host code costs warm and cold.

    python benchmarks/host-work/host_work.py BUNDLE [BUNDLE ...] [--prompts FILE] [--max-new-tokens 64] [--threads 2]
                                             [--label NAME] [--json OUT]

Per bundle:
1. ``none``, greedy, over the prompts (the held-out chat prompts when the bundle has a chat template, else
   the shipped code prompts): the runtime's own ``host_ms_per_token`` and engine milliseconds per token, medians.
2. The least host work a plain step can do between two target passes, through specrt's ONNX Runtime
   decoder: build the next attention mask, bind it, take the argmax of the logits row. Timed (median of
   64) right after each of: the same work (warm, back to back); a one-row target pass; a 200 MB numpy
   sweep; a 10 ms pure-Python busy loop; a 10 ms sleep. If the cold figures are several times the warm
   one whatever ran before, the host code runs from memory, not cache, once per pass, and host work per
   token has a floor far above its warm cost.
3. The whole loop of 1. with the target's engine call skipped (its logits buffer holds one ordinary token):
   the runtime's host work per token when nothing runs between steps to evict it (warm).

``--json OUT`` adds this run to OUT under ``--label`` (another runtime's figures, e.g. an older checkout on
PYTHONPATH, can sit beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

import specrt
from specrt.bundle import contract as C
from specrt.runtime.masks import speculation_mask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench_prompts.py, shared by the runners
from bench_prompts import bundle_prompts  # noqa: E402

SWEEP = np.ones(200_000_000 // 8)


def _busy(seconds: float = 0.01) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def loop_figures(gen, prompts: list[str], max_new_tokens: int) -> dict:
    chat = gen.manifest.tokenizer.chat_template is not None
    host, engine = [], []
    for prompt in prompts:
        opts = dict(max_new_tokens=max_new_tokens, method="none")
        r = gen.chat([{"role": "user", "content": prompt}], **opts) if chat else gen.generate(prompt, **opts)
        host.append(r.stats.host_ms_per_token)
        engine.append(1e3 * r.stats.engine_s / r.stats.new_tokens)
    return {"prompts": len(prompts), "chat": chat, "host_ms_per_token": statistics.median(host),
            "engine_ms_per_token": statistics.median(engine)}


def warm_loop_figures(gen, prompts: list[str], max_new_tokens: int) -> dict:
    decoder = gen._models["target"].decoder
    session = decoder.session
    real = session.run_with_iobinding
    token = next(t for t in range(1000, 2000) if t not in gen.manifest.tokenizer.eos_token_ids)

    decoder._logits[:] = 0.0  # every row, once: each pass then "returns" a fixed, ordinary token
    decoder._logits[..., token] = 1.0
    session.run_with_iobinding = lambda binding: None
    try:
        return loop_figures(gen, prompts, max_new_tokens)
    finally:
        session.run_with_iobinding = real


def floor_figures(gen, reps: int = 64) -> dict[str, float]:
    """Microseconds of mask + bind + argmax after each kind of preceding work (medians of ``reps``)."""
    model = gen._models["target"]
    decoder, cache = model.decoder, model.cache
    greedy = specrt.DecodeOptions().sampling
    model.reset()
    model.feed(list(range(1, 33)), greedy)
    model.feed([5], greedy)  # the decoder's one-row buffers now exist and are bound
    binding = getattr(decoder.binding, "binding", decoder.binding)  # runtimes before the _Binder: the IOBinding
    run = lambda: decoder.session.run_with_iobinding(binding)  # noqa: E731

    def minimal_step() -> None:  # the last pass again (its past as bound), so any graph can run after it
        mask, _ = speculation_mask(cache.length - 1, 1)
        decoder._bind(C.ATTENTION_MASK, mask)
        int(decoder._logits[0, 0].argmax())

    def timed(before: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            before()
            t0 = time.perf_counter()
            minimal_step()
            times.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(times)

    out = {"warm (back to back)": timed(lambda: None), "after a one-row target pass": timed(run),
           "after a 200 MB numpy sweep": timed(SWEEP.sum), "after a 10 ms Python busy loop": timed(_busy),
           "after a 10 ms sleep": timed(lambda: time.sleep(0.01))}
    model.reset()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--prompts", help="a JSON list of prompts [default: chat-heldout.json or the code prompts]")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="current", help="this run's name in the JSON")
    ap.add_argument("--json", help="add the figures to this file (created if absent)")
    args = ap.parse_args()
    results = {}
    for bundle in args.bundles:
        gen = specrt.load(bundle, threads=args.threads)
        prompts, _ = bundle_prompts(gen, args.prompts)
        loop_figures(gen, prompts[:1], args.max_new_tokens)  # warm-up
        results[bundle] = {"graph": gen.manifest.target.graph, "dtype": gen.manifest.target.dtype,
                           "loop": loop_figures(gen, prompts, args.max_new_tokens),
                           "minimal_step_us": floor_figures(gen),
                           "loop_engine_skipped": warm_loop_figures(gen, prompts, args.max_new_tokens)}
        print(bundle, json.dumps(results[bundle], indent=1))
    if args.json:
        out = Path(args.json)
        data = json.loads(out.read_text()) if out.exists() else {"threads": args.threads,
                                                                  "max_new_tokens": args.max_new_tokens, "runs": {}}
        data["runs"][args.label] = results
        out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
