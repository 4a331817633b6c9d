#!/usr/bin/env bash
# Prompt lookup with and without runtime.loop.DraftGate: `specrt bench --methods none,ngram` at T 0.7, 1.0 and 0 on
# one bundle, this checkout ("new") against another checkout ("old", e.g. a worktree of the commit before the
# gate), each in its own process, alternating. Then the JSON the docs page reads.
#   benchmarks/auto-gamma/ngram_gate.sh BUNDLE OLD_CHECKOUT PROMPTS.json OUT.json
set -euo pipefail
bundle=$1 old=$2 prompts=$3 out=$4
work=$(mktemp -d)
for T in 0.7 1.0 0; do
  for who in new old; do
    path=$([ "$who" = old ] && echo "$old" || echo "$(cd "$(dirname "$0")/../.." && pwd)")
    PYTHONPATH=$path python -m specrt.cli bench --bundle "$bundle" --chat --prompts "$prompts" --methods none,ngram \
      --max-new-tokens 96 --repeats 2 --temperature "$T" --json "$work/$who-T$T.json" > /dev/null
  done
done
python - "$work" "$out" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1:]
keep = ("tokens_per_second", "speedup_vs_none", "tokens_per_target_pass", "verify_cost", "acceptance_rate",
        "alpha_estimate", "mean_gamma", "vs_greedy_none")
runs = {os.path.basename(f)[:-5]: (lambda r: {"config": r["config"], "methods": {
    m: {k: v for k, v in row.items() if k in keep} for m, row in r["methods"].items()}})(json.load(open(f)))
        for f in sorted(glob.glob(f"{work}/*.json"))}
json.dump({"runs": runs}, open(out, "w"), indent=1)
PY
