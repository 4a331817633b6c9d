"""ONNX Runtime's default CPU session against the low-memory one: tokens/s and peak memory, interleaved.

    python scripts/low_memory_check.py demo /tmp/specrt-scale/llama-3.2-1b/bundle-float16
                                       [--rounds 2] [--tokens 32] [--methods none,draft]
                                       [--json benchmarks/scale/low-memory.json]

Each (bundle, mode) run is its own process, so its peak memory is its own: peak RSS (VmHWM) and peak
anonymous memory (sampled every 20 ms; RSS also counts the page cache of a memory-mapped file). The
modes alternate (off, on, off, on, ...) so a slow spell on a shared machine hits both. Greedy; the
token ids of both modes must agree. Not in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

PROMPTS = ["def fibonacci(n):\n    ", "import numpy as np\n\nclass Matrix:\n"]

CHILD = """
import json, sys, threading, time
import specrt
peak_anon = 0
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
def sample():
    global peak_anon
    while True:
        peak_anon = max(peak_anon, anon())
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
bundle, low, tokens, methods, prompts = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3]), sys.argv[4].split(","), json.loads(sys.argv[5])
t = time.perf_counter()
gen = specrt.load(None if bundle == "demo" else bundle, low_memory=low)
out = {"load_s": time.perf_counter() - t, "notes": gen.memory_notes}
gen.generate(prompts[0], max_new_tokens=4, method="none")  # first-run allocations
for m in methods:
    ids, t = [], time.perf_counter()
    for p in prompts:
        ids.append(gen.generate(p, max_new_tokens=tokens, method=m).token_ids)
    out[m] = {"tokens_per_second": sum(map(len, ids)) / (time.perf_counter() - t), "token_ids": ids}
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
out.update(peak_rss_bytes=hwm, peak_anon_bytes=max(peak_anon, anon()))
print(json.dumps(out))
"""


def run(bundle: str, mode: str, tokens: int, methods: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, bundle, mode, str(tokens), methods, json.dumps(PROMPTS)],
                          capture_output=True, text=True)
    if proc.returncode:
        return {"error": f"exit {proc.returncode}: " + (proc.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+", help="bundle folders, or 'demo' for the shipped one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--methods", default="none,draft")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/scale/low-memory.json"))
    args = ap.parse_args()
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    methods = args.methods.split(",")
    for bundle in args.bundles:
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for mode in runs:
                runs[mode].append(run(bundle, mode, args.tokens, args.methods))
                print(bundle, mode, json.dumps({k: v for k, v in runs[mode][-1].items() if k not in methods}),
                      {m: round(runs[mode][-1][m]["tokens_per_second"], 2) for m in methods
                       if m in runs[mode][-1]}, flush=True)
        row: dict = {"rounds": args.rounds, "tokens": args.tokens, "prompts": len(PROMPTS)}
        for mode, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            row[mode] = {"errors": [r["error"] for r in rs if "error" in r]} if len(ok) < len(rs) else {}
            if ok:
                row[mode].update({f"{m}_tokens_per_second": round(statistics.median(r[m]["tokens_per_second"]
                                                                                     for r in ok), 2)
                                  for m in methods})
                row[mode].update(peak_rss_bytes=max(r["peak_rss_bytes"] for r in ok),
                                 peak_anon_bytes=max(r["peak_anon_bytes"] for r in ok),
                                 load_s=round(statistics.median(r["load_s"] for r in ok), 1))
        done = [r for rs in runs.values() for r in rs if "error" not in r]
        row["same_tokens"] = len({json.dumps([r[m]["token_ids"] for m in methods]) for r in done}) == 1
        if all(f"{m}_tokens_per_second" in row[mode] for mode in runs for m in methods):
            row["on_over_off"] = {m: round(row["on"][f"{m}_tokens_per_second"] / row["off"][f"{m}_tokens_per_second"], 2)
                                  for m in methods}
            row["rss_on_over_off"] = round(row["on"]["peak_rss_bytes"] / row["off"]["peak_rss_bytes"], 2)
        results[bundle] = row
        print(bundle, json.dumps(row), flush=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
