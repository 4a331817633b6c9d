"""Time to first token over the turns of a conversation, the whole history fed every turn against
``reuse_prefix`` (only what the last turn's context lacks).

    python benchmarks/serve/prefix_reuse.py BUNDLE [--turns 4] [--max-new-tokens 64] [--method none] [--threads 2]
                                            [--conversations 3] [--json OUT]

Each conversation takes ``--turns`` consecutive held-out chat prompts as its user messages; each turn
sends the history so far (user messages and the replies the model gave) plus the next message, as an
OpenAI client does. Both ways run every conversation, one after the other (reusing first, then fresh, then
the next conversation), greedy, in one process; per turn, the medians over conversations of the prompt's
length, the tokens kept, time to first token (the prefill) and the turn's whole time, and how many replies
are the fresh ones token for token (``--row-stable``: no one-row pass, so the kept reply rows are the
numbers a prefill computes).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import specrt

ROOT = Path(__file__).resolve().parents[1]  # benchmarks/


def conversation(gen, messages: list[str], max_new_tokens: int, method: str, row_stable: bool) -> list[dict]:
    history: list[dict] = []
    turns = []
    for message in messages:
        history.append({"role": "user", "content": message})
        r = gen.chat(history, max_new_tokens=max_new_tokens, method=method, row_stable=row_stable)
        history.append({"role": "assistant", "content": r.text})
        turns.append({"prompt_tokens": r.stats.prompt_tokens, "reused_tokens": r.stats.reused_tokens,
                      "first_token_ms": 1e3 * r.stats.prefill_s, "turn_s": r.stats.total_s,
                      "reply": r.token_ids})
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--method", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--row-stable", action="store_true", help="DecodeOptions.row_stable for both ways")
    ap.add_argument("--json")
    args = ap.parse_args()
    prompts = json.loads((ROOT / "prompts" / "chat-heldout.json").read_text())
    gen = specrt.load(args.bundle, threads=args.threads)
    gen.chat([{"role": "user", "content": prompts[0]}], max_new_tokens=4)  # warm-up
    runs: dict[str, list[list[dict]]] = {"reuse_prefix": [], "fresh": []}  # reusing first: its first turn
    # then shares only the system prompt with the conversation before, as a new user's would
    same = 0
    for c in range(args.conversations):
        messages = [prompts[(c * args.turns + t) % len(prompts)] for t in range(args.turns)]
        for way in runs:
            gen.reuse_prefix = way == "reuse_prefix"
            runs[way].append(conversation(gen, messages, args.max_new_tokens, args.method, args.row_stable))
        same += sum(a["reply"] == b["reply"] for a, b in zip(*(runs[w][-1] for w in runs)))
    table = {way: [{k: statistics.median(conv[t][k] for conv in convs)
                    for k in ("prompt_tokens", "reused_tokens", "first_token_ms", "turn_s")}
                   for t in range(args.turns)] for way, convs in runs.items()}
    for t in range(args.turns):
        f, r = table["fresh"][t], table["reuse_prefix"][t]
        print(f"turn {t + 1}: prompt {f['prompt_tokens']:.0f} tokens, first token {f['first_token_ms']:.0f} ms fresh, "
              f"{r['first_token_ms']:.0f} ms reusing {r['reused_tokens']:.0f}; turn {f['turn_s']:.2f} / {r['turn_s']:.2f} s")
    print(f"replies identical to the fresh ones: {same} of {args.conversations * args.turns}")
    if args.json:
        out = {"bundle": Path(args.bundle).name, "config": vars(args), "turns": table,
               "identical_replies": same, "replies": args.conversations * args.turns,
               "target": {"dtype": gen.manifest.target.dtype, "graph": gen.manifest.target.graph,
                          "bits": (gen.manifest.target.quantization or {}).get("bits")}}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
