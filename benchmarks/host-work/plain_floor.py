"""specrt's plain decoding against the least a Python loop can do over the same graph: how much of a token the
runtime itself costs, as users run it (whole greedy generations, prefill included).

    python benchmarks/host-work/plain_floor.py BUNDLE [BUNDLE ...] [--rounds 2] [--max-new-tokens 64] [--threads 2]
                                               [--json OUT]

The minimal loop binds the gqa graph's cache buffers once, then per token writes the id and position in
place, binds the growing mask, runs, and takes the argmax: no sampling machinery, no statistics, no
detokenising. Both run on the process's one ONNX Runtime pool (``shared_threads``). Per prompt the two run
back to back, the order flipping every pair, so the machine's drift
cancels in each pair's ratio; reported: the median of those ratios over prompts × rounds, and each side's
median milliseconds per token. Both must produce the same tokens (checked first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.runtime.backends.onnxruntime import session_options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench_prompts.py, shared by the runners
from bench_prompts import encoded_prompts  # noqa: E402


class MinimalLoop:
    """Greedy decoding of a gqa bundle's target graph with nothing around the engine but an argmax."""

    def __init__(self, bundle: str) -> None:
        import onnxruntime as ort

        self.manifest = load_manifest(Path(bundle))
        entry = self.manifest.target
        if entry.graph != "gqa":
            raise SystemExit(f"{bundle}: the minimal loop drives gqa graphs (one cache buffer per layer)")
        opts = session_options()  # the process's one pool, specrt's too: two spinning pools would fight
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(Path(bundle) / entry.file), opts, providers=["CPUExecutionProvider"])
        d, cap = entry.dims, self.manifest.max_context
        self.shape = [1, d.num_kv_heads, cap, d.head_dim]
        self.kv = [np.zeros(self.shape, np.float32) for _ in range(2 * d.num_layers)]
        self.layers, self.vocab = d.num_layers, d.vocab_size
        self.logits = np.zeros((1, 1, d.vocab_size), np.float32)
        self.extra = {o.name: np.zeros((1, cap, o.shape[-1]), np.float32) for o in self.session.get_outputs()
                      if o.name != "logits" and not o.name.startswith("present")}
        self.ones = np.ones((1, 1, 1, cap), bool)
        self.stop = set(self.manifest.tokenizer.eos_token_ids)

    def generate(self, prompt: list[int], n: int) -> list[int]:
        b, q = self.session.io_binding(), len(prompt)
        for i in range(self.layers):
            for j, kind in enumerate(("key", "value")):
                ptr = self.kv[2 * i + j].ctypes.data
                b.bind_input(f"past_{kind}.{i}", "cpu", 0, np.float32, self.shape, ptr)
                b.bind_output(f"present_{kind}.{i}", "cpu", 0, np.float32, self.shape, ptr)
        ids, pos, index = np.array([prompt], np.int64), np.arange(q, dtype=np.int64)[None], np.array([q - 1])
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("position_ids", pos)
        b.bind_cpu_input("attention_mask", np.tril(np.ones((q, q), bool))[None, None])
        b.bind_cpu_input("logits_index", index)
        b.bind_output("logits", "cpu", 0, np.float32, [1, 1, self.vocab], self.logits.ctypes.data)
        for name, buf in self.extra.items():
            b.bind_output(name, "cpu", 0, np.float32, [1, q, buf.shape[-1]], buf.ctypes.data)
        self.session.run_with_iobinding(b)
        token, out, length = int(self.logits[0, 0].argmax()), [], q
        ids, pos, index = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64), np.zeros(1, np.int64)
        for name, arr in (("input_ids", ids), ("position_ids", pos), ("logits_index", index)):
            b.bind_input(name, "cpu", 0, np.int64, list(arr.shape), arr.ctypes.data)
        for name, buf in self.extra.items():
            b.bind_output(name, "cpu", 0, np.float32, [1, 1, buf.shape[-1]], buf.ctypes.data)
        while token not in self.stop:
            out.append(token)
            if len(out) == n:
                break
            ids[0, 0], pos[0, 0] = token, length
            b.bind_input("attention_mask", "cpu", 0, np.bool_, [1, 1, 1, length + 1], self.ones.ctypes.data)
            self.session.run_with_iobinding(b)
            token, length = int(self.logits[0, 0].argmax()), length + 1
        return out


def measure(bundle: str, rounds: int, n: int, threads: int) -> dict:
    gen = specrt.load(bundle, threads=threads, shared_threads=True)
    loop = MinimalLoop(bundle)
    encoded, chat = encoded_prompts(gen)

    def runtime(i: int) -> list[int]:
        return list(gen.stream_ids(encoded[i], max_new_tokens=n, method="none").result.token_ids)

    same = sum(runtime(i) == loop.generate(encoded[i], n) for i in range(len(encoded)))
    ratios, ms = [], {"specrt": [], "minimal": []}
    for r in range(rounds):
        for i in range(len(encoded)):
            pair = {}
            for side in (("specrt", "minimal") if (r + i) % 2 == 0 else ("minimal", "specrt")):
                t0 = time.perf_counter()
                tokens = len(runtime(i) if side == "specrt" else loop.generate(encoded[i], n))
                pair[side] = (time.perf_counter() - t0) * 1000 / max(tokens, 1)
                ms[side].append(pair[side])
            ratios.append(pair["minimal"] / pair["specrt"])
    return {"graph": gen.manifest.target.graph, "prompts": len(encoded), "chat": chat, "same_tokens": same,
            "pairs": len(ratios), "specrt_over_minimal_speed": statistics.median(ratios),
            "quartiles": [float(np.quantile(ratios, 0.25)), float(np.quantile(ratios, 0.75))],
            "ms_per_token": {k: statistics.median(v) for k, v in ms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    data = {"threads": args.threads, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "bundles": {}}
    for bundle in args.bundles:
        data["bundles"][Path(bundle).name] = r = measure(bundle, args.rounds, args.max_new_tokens, args.threads)
        print(Path(bundle).name, json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
