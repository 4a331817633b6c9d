"""How often greedy speculation leaves plain decoding's tokens, per bundle and method: on an int8 target whose
kernel's numerics move with the pass's row count (``MatMulNBits``) a verify pass can rank a near-tie the other
way from a one-row step; ``--kernel integer`` computes each row's matmuls alone. Every held-out prompt
(benchmarks/common/bench_prompts.py), greedy, ``--repeats`` times (tree sizes follow measured costs, so runs differ).

    python benchmarks/integer-kernel/greedy_parity.py r8-int8 r8-i8 --methods eagle-tree,eagle \
        --json benchmarks/integer-kernel/greedy-parity-xeon-cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench_prompts.py, shared by the runners
from bench_prompts import encoded_prompts  # noqa: E402

import specrt  # noqa: E402


def parity(bundle: Path, methods: list[str], max_new_tokens: int, repeats: int, threads: int | None) -> dict:
    """Per method: generations compared, those that differ from ``none``, and where each first differed."""
    gen = specrt.load(bundle, threads=threads, shared_threads=True)
    prompts, _ = encoded_prompts(gen)
    out = {m: {"generations": 0, "differ": 0, "first_difference": []} for m in methods}

    def tokens(ids: list[int], method: str) -> list[int]:
        stream = gen.stream_ids(list(ids), max_new_tokens=max_new_tokens, method=method)
        for _ in stream:
            pass
        return stream.result.token_ids

    for ids in prompts:
        want = tokens(ids, "none")
        for method in methods:
            for _ in range(repeats):
                got = tokens(ids, method)
                row = out[method]
                row["generations"] += 1
                if got != want:
                    row["differ"] += 1
                    row["first_difference"].append(next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                                        min(len(got), len(want))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--methods", default="eagle-tree,eagle")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    results = {}
    for bundle in a.bundles:
        results[str(bundle)] = r = parity(bundle, a.methods.split(","), a.max_new_tokens, a.repeats, a.threads)
        for method, row in r.items():
            print(f"{bundle} {method}: {row['differ']} of {row['generations']} greedy generations leave `none`'s tokens",
                  flush=True)
    if a.json:
        a.json.write_text(json.dumps({"max_new_tokens": a.max_new_tokens, "repeats": a.repeats, "threads": a.threads,
                                      "bundles": results}, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
