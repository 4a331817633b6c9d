"""`--gamma auto` against fixed chains and against its earlier α estimate, in one process per bundle.

    python benchmarks/auto-gamma/auto_gamma.py BUNDLE[=METHOD] [...] [--gammas 1,2,3,4] [--weights 0.1]
        [--growth one,free] [--rounds 3] [--json OUT]

Per round, every entry decodes every prompt (chat prompts where the bundle has a chat template, the shipped
code prompts otherwise), greedy, the entries alternating: `none`, each fixed γ, `auto` as the runtime does
it, and `auto (step means)`: the same AutoGamma with α̂ an EMA of each step's mean Σmin(p, q), as before
the estimator pooled positions. A step's positions stop at its first rejection, so that mean is biased low
whenever γ > 1. All on one ONNX Runtime pool (``shared_threads``), the verify-cost curve measured once
before the rounds. Reported per entry: the median over rounds of its tokens/s over `none`'s in the same
round, tokens per target pass, and for the auto entries how often each γ was chosen. ``--weights`` adds
auto entries whose α̂ and ĉ average with another EMA weight (the runtime's: 0.3 a step), ``--growth`` ones
whose γ grows otherwise than the runtime's (at most doubling, to 2γ + 1, a step).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import numpy as np

import specrt
from specrt import theory
from specrt.runtime import loop
from specrt.runtime.stats import StepRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench_prompts.py, shared by the runners
from bench_prompts import encoded_prompts  # noqa: E402

GROWTH = {"one": "auto (grows one draft a step at most)", "free": "auto (no growth cap)"}
CURRENT = loop.AutoGamma.update


def step_mean_update(self: loop.AutoGamma, step: StepRecord) -> int:
    """AutoGamma.update as it was: α̂ an EMA of each step's mean beta."""
    alpha = getattr(self, "step_mean_alpha", None)  # its own α̂ beside the pooled one the class keeps
    if step.betas:
        alpha = self.step_mean_alpha = theory.moving_average(alpha, float(np.mean(step.betas)), self.weight)
    if step.verify_s > 0:
        t_draft_pass = step.draft_s / step.draft_passes if step.draft_passes else 0.0
        one_row = step.verify_s / theory.verify_cost_at(self.verify_costs, step.proposed + 1)
        self.c = theory.moving_average(self.c, t_draft_pass / one_row, self.weight)
    if alpha is not None:
        self.gamma = theory.optimal_gamma(min(alpha, 0.999), self.c or 0.0, self.max_gamma, self.verify_costs)
    return self.gamma


def measure(bundle: str, method: str | None, gammas: list[int], weights: list[float], growth: list[str],
            rounds: int, n: int, threads: int) -> dict:
    gen = specrt.load(bundle, threads=threads, shared_threads=True)
    method = method or gen.default_method
    encoded, chat = encoded_prompts(gen)
    entries = ["none", *(str(g) for g in gammas), "auto", *(f"auto (weight {w:g})" for w in weights),
               *(GROWTH[g] for g in growth), "auto (step means)"]
    chosen: dict[str, collections.Counter] = {e: collections.Counter() for e in entries if e.startswith("auto")}

    def run(entry: str) -> tuple[int, int, float]:
        update = step_mean_update if entry == "auto (step means)" else CURRENT

        def counted(self: loop.AutoGamma, step: StepRecord) -> int:
            if entry.startswith("auto (weight"):
                self.weight = float(entry.split()[-1].rstrip(")"))
            if entry == GROWTH["one"]:  # update caps γ at 2 * self.gamma + 1
                self.gamma = self.gamma / 2
            elif entry == GROWTH["free"]:
                self.gamma = self.max_gamma
            gamma = self.gamma = int(update(self, step))
            chosen[entry][gamma] += 1
            return gamma

        loop.AutoGamma.update = counted
        try:
            gamma = "auto" if entry.startswith("auto") else int(entry) if entry != "none" else 1
            tokens = passes = 0
            seconds = 0.0
            for ids in encoded:
                stats = gen.stream_ids(ids, max_new_tokens=n, method="none" if entry == "none" else method,
                                       gamma=gamma).result.stats
                tokens += stats.new_tokens
                passes += stats.target_passes - 1
                seconds += stats.total_s - stats.prefill_s
            return tokens, passes, seconds
        finally:
            loop.AutoGamma.update = CURRENT

    gen.verify_costs()
    for entry in entries:  # warm-up: sessions, buffers per row count
        run(entry)
    for counter in chosen.values():
        counter.clear()
    results: dict[str, list[tuple[int, int, float]]] = {e: [] for e in entries}
    for r in range(rounds):
        for entry in entries[r % len(entries):] + entries[:r % len(entries)]:
            results[entry].append(run(entry))
    plain = [t / s for t, _, s in results["none"]]
    out = {"method": method, "chat": chat, "prompts": len(encoded), "verify_costs": list(gen.verify_costs()),
           "entries": {}}
    for entry, rows in results.items():
        speed = [t / s / p for (t, _, s), p in zip(rows, plain)]
        out["entries"][entry] = {
            "speedup": statistics.median(speed), "per_round": speed,
            "tokens_per_s": statistics.median(t / s for t, _, s in rows),
            "tokens_per_pass": statistics.median(t / max(k, 1) for t, k, _ in rows),
            **({"gamma_chosen": dict(sorted(chosen[entry].items()))} if entry in chosen else {})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+", help="BUNDLE or BUNDLE=METHOD (default: the bundle's own auto method)")
    ap.add_argument("--gammas", default="1,2,3,4")
    ap.add_argument("--weights", default="", help="further EMA weights for auto's α̂ and ĉ to compare (the "
                    "runtime's is 0.3), e.g. 0.15,0.1")
    ap.add_argument("--growth", default="", help="auto entries whose γ grows otherwise than the runtime's (to "
                    "2γ + 1 at most a step): one (one draft a step), free (no cap), e.g. one,free")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    gammas = [int(g) for g in args.gammas.split(",") if g]
    weights = [float(w) for w in args.weights.split(",") if w]
    growth = [g for g in args.growth.split(",") if g]
    if set(growth) - set(GROWTH):
        ap.error(f"--growth takes {', '.join(GROWTH)}")
    data = {"threads": args.threads, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "bundles": {}}
    for spec in args.bundles:
        bundle, _, method = spec.partition("=")
        shipped = Path(bundle).resolve() == Path(specrt.__file__).parent / "demo" / "bundle"
        name = "demo" if shipped else Path(bundle).name
        data["bundles"][name] = r = measure(bundle, method or None, gammas, weights, growth, args.rounds,
                                            args.max_new_tokens, args.threads)
        print(name, json.dumps({e: round(v["speedup"], 3) for e, v in r["entries"].items()}), flush=True)
        if args.json:  # after each bundle: a long run keeps what it measured
            Path(args.json).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
