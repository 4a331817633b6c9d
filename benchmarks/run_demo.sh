#!/usr/bin/env bash
# Reproduce benchmarks/demo-cpu.json: the shipped demo bundle on this machine's CPU, every method in one
# run (greedy, 128 new tokens, the 8 shipped code prompts, median of 3), plus Hugging Face generate and
# assisted generation on the same checkpoints (run from the repo root: the bundle records their paths
# relative to it).
set -euo pipefail
cd "$(dirname "$0")/.."
specrt bench --methods none,draft,tree,medusa,ngram --max-new-tokens 128 --repeats 3 \
  --compare hf --json benchmarks/demo-cpu.json "$@"
