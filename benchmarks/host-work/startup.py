"""One `specrt run` as a user runs it, start to exit: with the verify-cost curve measured in the process (an empty
cache) against read from specrt's cache, and plain decoding (no curve) beside them.

    python benchmarks/host-work/startup.py BUNDLE [--chat] [--prompt TEXT] [--max-new-tokens 64] [--rounds 5]
                                           [--label NAME] [--json OUT]

Each round runs the three in turn, each a fresh process (`python -m specrt.cli run ...`): `auto` (the bundle's
default method) with ``SPECRT_CACHE_DIR`` pointing at an empty folder, `auto` with a folder a first run filled,
and `--method none`. Wall seconds per run, medians over the rounds; the generation's own seconds (`--stats`'s
"in all") are left to the per-process figures. ``--json OUT`` adds this run to OUT under ``--label`` (another
checkout's, put first on ``PYTHONPATH``, can sit beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(bundle: str, prompt: str, chat: bool, max_new_tokens: int, method: str, cache: Path) -> float:
    cmd = [sys.executable, "-m", "specrt.cli", "run", *(["--chat", prompt] if chat else [prompt]),
           "--bundle", bundle, "--max-new-tokens", str(max_new_tokens), "--method", method]
    env = {**os.environ, "SPECRT_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"specrt run failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompt", default="Write a haiku about the sea.")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a chat message")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", default="current", help="this run's name in the JSON")
    ap.add_argument("--json", help="add the figures to this file (created if absent)")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"auto, curve measured": [], "auto, curve read": [], "none": []}
    with tempfile.TemporaryDirectory() as tmp:
        kept = Path(tmp) / "kept"
        run_once(args.bundle, args.prompt, args.chat, args.max_new_tokens, "auto", kept)  # fills it
        for r in range(args.rounds):
            for label, method, cache in (("auto, curve measured", "auto", Path(tmp) / f"fresh-{r}"),
                                         ("auto, curve read", "auto", kept), ("none", "none", kept)):
                times[label].append(run_once(args.bundle, args.prompt, args.chat, args.max_new_tokens, method, cache))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    result = {"bundle": Path(args.bundle).name, "prompt": args.prompt, "chat": args.chat,
              "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "seconds": times,
              "median_s": {k: statistics.median(v) for k, v in times.items()}}
    print(json.dumps(result["median_s"], indent=1))
    if args.json:
        out = Path(args.json)
        data = json.loads(out.read_text()) if out.exists() else {"runs": {}}
        data["runs"][args.label] = result
        out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
