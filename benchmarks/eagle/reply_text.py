"""The target's own greedy replies to chat prompts, as plain text: what `specrt eagle prune --text` counts draft ids
in when a head records no counts of its own (one trained before 2026-12-05, or a published one).

    python benchmarks/eagle/reply_text.py BUNDLE --prompts benchmarks/prompts/eagle-seeds-r4.json --count 420 \
        --exclude benchmarks/prompts/chat-heldout.json --max-new-tokens 48 -o replies.txt

``--count`` prompts drawn with a fixed seed from ``--prompts`` (less any in ``--exclude``: the prompts a
measurement holds out), each answered by the bundle's target (``method="none"``), one reply per paragraph.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import specrt
from specrt.measure.bench import read_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--prompts", required=True)
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--count", type=int, default=420)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    excluded = {q for f in args.exclude for q in read_prompts(f)}
    prompts = [q for q in read_prompts(args.prompts) if q not in excluded]
    random.Random(args.seed).shuffle(prompts)
    prompts = prompts[:args.count]
    gen = specrt.load(args.bundle, shared_threads=True)
    t0, replies, tokens = time.perf_counter(), [], 0
    for i, prompt in enumerate(prompts):
        result = gen.stream_chat([{"role": "user", "content": prompt}], method="none",
                                 max_new_tokens=args.max_new_tokens).result
        replies.append(result.text.strip())
        tokens += len(result.token_ids)
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(prompts)} replies, {time.perf_counter() - t0:.0f} s", flush=True)
    Path(args.output).write_text("\n\n".join(replies) + "\n")
    print(json.dumps({"replies": len(replies), "tokens": tokens, "seconds": round(time.perf_counter() - t0, 1),
                      "output": args.output}))


if __name__ == "__main__":
    main()
