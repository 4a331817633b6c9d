"""One ONNX Runtime pool for all of a bundle's models (`--thread-pool shared`) against a pool per model
(`per-model`): `specrt bench` processes alternating, as users run it, on each bundle given.

    python benchmarks/host-work/thread_pool.py LABEL=BUNDLE[:METHODS] [...] [--rounds 3] [--threads 2] \
        [--max-new-tokens 64] [--json OUT] [-- EXTRA BENCH ARGS]

Per bundle and round, one `specrt bench` process per mode (the order flips every round), every method in
it (default: none and the bundle's best), `--gamma auto`; chat bundles decode the 14 held-out chat prompts,
others the shipped code prompts. Reported per mode: medians over rounds of tokens/s, speedup over `none`
measured in the same process, and the draft (head) and target pass times; per round shared/per-model.
A pool per model is what specrt gave every run before the shared pool; the ratio that matters is each
method's speedup over `none`, measured within one process, so drift between processes cancels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # benchmarks/
HELDOUT = ROOT / "prompts" / "chat-heldout.json"
MODES = ("per-model", "shared")
FIELDS = ("tokens_per_second", "speedup_vs_none", "target_pass_ms", "draft_pass_ms", "c", "tokens_per_target_pass")


def bench(bundle: str, methods: str, mode: str, args: argparse.Namespace, extra: list[str]) -> dict:
    chat = json.loads((Path(bundle) / "specrt.json").read_text())["tokenizer"].get("chat_template") is not None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "specrt.cli", "bench", "--bundle", bundle, "--methods", methods,
               "--gamma", "auto", "--repeats", "1", "--threads", str(args.threads), "--thread-pool", mode,
               "--max-new-tokens", str(args.max_new_tokens), "--json", str(out), *extra]
        if chat:
            cmd += ["--chat", "--prompts", str(HELDOUT)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return {m: {k: r.get(k) for k in FIELDS} for m, r in json.loads(out.read_text())["methods"].items()}


def median(runs: list[dict], method: str, field: str) -> float | None:
    values = [r[method][field] for r in runs if r[method][field] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+", help="LABEL=BUNDLE or LABEL=BUNDLE:METHODS (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", help="write (or add these bundles to) this file")
    args = ap.parse_args(argv)
    out = Path(args.json) if args.json else None
    data = json.loads(out.read_text()) if out and out.exists() else {
        "threads": args.threads, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "bundles": {}}
    for spec in args.bundles:
        label, _, rest = spec.partition("=")
        bundle, _, methods = rest.partition(":")
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                runs[mode].append(bench(bundle, methods or "none,eagle", mode, args, extra))
                print(label, r, mode, {m: round(v["tokens_per_second"], 1) for m, v in runs[mode][-1].items()},
                      flush=True)
        names = list(runs["shared"][0])
        summary = {mode: {m: {f: median(runs[mode], m, f) for f in FIELDS} for m in names} for mode in MODES}
        per_round = {m: [s[m]["tokens_per_second"] / p[m]["tokens_per_second"]
                         for s, p in zip(runs["shared"], runs["per-model"])] for m in names}
        data["bundles"][label] = {"bundle": bundle, "extra_args": extra, "runs": runs, "median": summary,
                                  "shared_over_per_model": per_round}
        for m in names:
            print(f"{label} {m}: tokens/s per-model {summary['per-model'][m]['tokens_per_second']:.1f}, shared "
                  f"{summary['shared'][m]['tokens_per_second']:.1f} (per round {statistics.median(per_round[m]):.2f}x)")
    if out:
        out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
