"""Is an EAGLE head's confidence honest? The probability it gave each node of its `eagle-tree` trees against how
often the target kept that node, binned by probability and by depth.

    python benchmarks/eagle/tree_calibration.py BUNDLE [BUNDLE ...] [--max-new-tokens 64]
                                                [--eagle-tree 3,3,auto] [--threads 2] [--json OUT]

Greedy `eagle-tree` over the prompts (the held-out chat prompts when the bundle has a chat template, else the
shipped code prompts), every tree recorded (specrt.measure.calibration). A tree sized by cost
(`--eagle-tree T,D,auto`, the default) reads a node's probability as the chance the target keeps it: where the
kept share sits above the probability the head is under-confident and its trees stop short; below, it verifies
rows that do not pay. ``--json OUT`` adds each bundle's figures to OUT under the bundle's folder name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import specrt
from specrt.errors import SpecrtError
from specrt.measure.calibration import calibration, recorded_trees

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench_prompts.py, shared by the runners
from bench_prompts import encoded_prompts  # noqa: E402


def measure(bundle: str, max_new_tokens: int, eagle_tree: str, threads: int) -> dict:
    gen = specrt.load(bundle, threads=threads, shared_threads=True)  # one pool, as the CLI runs
    prompts, chat = encoded_prompts(gen)
    opts = dict(method="eagle-tree", eagle_tree=eagle_tree, max_new_tokens=max_new_tokens)
    gen.stream_ids(prompts[0], **opts).result  # warm-up: the sizing's verify-cost curve is measured once
    new = passes = 0
    with recorded_trees() as trees:
        for ids in prompts:
            stats = gen.stream_ids(ids, **opts).result.stats
            new, passes = new + stats.new_tokens - 1, passes + stats.target_passes - 1  # after the prefill
    head = gen.manifest.eagle
    return {"bundle": Path(bundle).name, "eagle_tree": eagle_tree, "prompts": len(prompts), "chat": chat,
            "max_new_tokens": max_new_tokens, "draft_vocab": head.dims.vocab_size if head else None,
            "tokens_per_target_pass": new / max(1, passes), "calibration": calibration(trees)}


def show(result: dict) -> None:
    cal = result["calibration"]
    print(f"{result['bundle']} ({result['draft_vocab']} draft ids, --eagle-tree {result['eagle_tree']}): "
          f"{cal['trees']} trees, {cal['nodes'] / cal['trees']:.2f} nodes each; tokens kept per tree "
          f"{cal['kept_per_tree']:.3f} against {cal['predicted_per_tree']:.3f} expected; "
          f"{result['tokens_per_target_pass']:.2f} tokens per target pass")
    for b in cal["bins"]:
        print(f"  p in [{b['low']:.2f}, {b['high']:.2f}): {b['nodes']:5d} nodes, mean p {b['predicted']:.3f}, "
              f"kept {b['kept']:.3f}")
    for d in cal["depths"]:
        print(f"  depth {d['depth']}: {d['nodes']:5d} nodes, mean p {d['predicted']:.3f}, kept {d['kept']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+", help="bundles with an EAGLE-3 head")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--eagle-tree", default="3,3,auto", help="the tree's shape, as `specrt run --eagle-tree`")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="add each bundle's figures to this file (created if absent)")
    args = ap.parse_args()
    results = {}
    for bundle in args.bundles:
        try:
            results[Path(bundle).name] = result = measure(bundle, args.max_new_tokens, args.eagle_tree, args.threads)
        except (SpecrtError, ValueError) as e:
            raise SystemExit(f"{bundle}: {e}") from None
        show(result)
    if args.json:
        out = Path(args.json)
        data = json.loads(out.read_text()) if out.exists() else {"threads": args.threads, "runs": {}}
        data["runs"].update(results)
        out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
