"""Sampled vs greedy speed at a real vocabulary with the machine's drift cancelled: every prompt runs
every setting back to back (greedy, T 1.0, T 0.8 top-p 0.9, T 0.8 top-k 50; the order reversed every
other prompt), round after round, so a slow spell of this VM hits all settings alike; per setting the
summed time over all rounds, and each round's own ratio (their spread is this VM's noise).

    python benchmarks/host-work/real_vocab_ratio.py [--bundle /tmp/specrt-real-vocab/bundle] [--rounds 6]
                                                    [--json benchmarks/host-work/real-vocab-ratio-cpu.json]

The bundle is the one ``benchmarks/host-work/real_vocab.py`` exports (151,936 ids, small layers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SETTINGS = {"greedy": dict(temperature=0.0), "T1.0": dict(temperature=1.0),
            "T0.8 top-p 0.9": dict(temperature=0.8, top_p=0.9), "T0.8 top-k 50": dict(temperature=0.8, top_k=50)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=Path("/tmp/specrt-real-vocab/bundle"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=Path("benchmarks/host-work/real-vocab-ratio-cpu.json"))
    args = ap.parse_args()

    import specrt
    from specrt.data import prompts as builtin_prompts

    gen = specrt.load(args.bundle)
    prompts = builtin_prompts("code")
    gen.generate(prompts[0], max_new_tokens=8, method="none")  # warm-up
    totals = {name: {"seconds": 0.0, "tokens": 0, "host_s": 0.0, "engine_s": 0.0} for name in SETTINGS}
    per_round = {name: [] for name in SETTINGS}  # each round's tokens/s vs greedy's in the same round
    for r in range(args.rounds):
        this_round = {name: [0, 0.0] for name in SETTINGS}
        for i, prompt in enumerate(prompts):
            # Settings in turn, the order reversed every other prompt: no setting always runs first.
            for name, kw in (SETTINGS.items() if (r + i) % 2 == 0 else reversed(SETTINGS.items())):
                st = gen.generate(prompt, max_new_tokens=args.max_new_tokens, method="none", seed=r * 100 + i,
                                  **kw).stats
                t = totals[name]
                t["seconds"] += st.total_s
                t["tokens"] += st.new_tokens
                t["host_s"] += st.host_s
                t["engine_s"] += st.engine_s
                this_round[name][0] += st.new_tokens
                this_round[name][1] += st.total_s
        greedy_round = this_round["greedy"][0] / this_round["greedy"][1]
        for name, (tokens, seconds) in this_round.items():
            per_round[name].append(tokens / seconds / greedy_round)
        print(f"round {r + 1} done", file=sys.stderr)
    greedy = totals["greedy"]["tokens"] / totals["greedy"]["seconds"]
    out = {name: {"tokens_per_second": t["tokens"] / t["seconds"],
                  "vs_greedy": t["tokens"] / t["seconds"] / greedy,
                  "vs_greedy_rounds": [round(x, 4) for x in per_round[name]],
                  "host_ms_per_token": 1000 * t["host_s"] / t["tokens"],
                  "engine_ms_per_token": 1000 * t["engine_s"] / t["tokens"]} for name, t in totals.items()}
    for name, x in out.items():
        rounds = sorted(x["vs_greedy_rounds"])
        print(f"{name}: {x['tokens_per_second']:.0f} tokens/s ({x['vs_greedy']:.3f}x greedy; rounds "
              f"{rounds[0]:.2f}-{rounds[-1]:.2f}), host {x['host_ms_per_token']:.3f} ms/token, engine "
              f"{x['engine_ms_per_token']:.3f} ms/token", file=sys.stderr)
    args.json.write_text(json.dumps({"settings": out, "config": {"rounds": args.rounds, "prompts": len(prompts),
                                                                  "max_new_tokens": args.max_new_tokens}}, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
