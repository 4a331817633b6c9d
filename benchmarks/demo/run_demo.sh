#!/usr/bin/env bash
# Reproduce benchmarks/demo/demo-cpu.json: the shipped demo bundle on this machine's CPU, every method in one
# run (greedy, 128 new tokens, the 8 shipped code prompts, median of 3), interleaved with the peers on
# the same checkpoints: Hugging Face generate and assisted generation, and ONNX Runtime GenAI plain
# decoding (its own builder; fp32, its CPU builder has no fp16); the host's read bandwidth is probed
# first for the roofline columns (run from the repo root: the bundle records the checkpoints' paths
# relative to it).
set -euo pipefail
cd "$(dirname "$0")/../.."
specrt bench --methods none,draft,tree,medusa,ngram --max-new-tokens 128 --repeats 3 \
  --compare hf,ortgenai --roofline --json benchmarks/demo/demo-cpu.json "$@"
