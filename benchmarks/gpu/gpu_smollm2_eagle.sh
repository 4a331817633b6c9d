#!/bin/bash
# SmolLM2-135M-Instruct + round 4's EAGLE-3 head on the torch backend: `specrt bench` greedy and T 0.7,
# on a GPU machine that receives at most 64 MiB a call (docs/performance/smollm2-eagle-h200.md says how it
# was sent). Expects, in .gpu/ (ignored): what benchmarks/gpu/gpu_smollm2_target.sh reads, c/head (the
# head: benchmarks/heads/smollm2-135m-instruct), c/bundle (r8-fp32's specrt.json, tokenizer.json,
# chat_template.jinja, eagle_vocab.npy and empty target.onnx / eagle.onnx: the torch backend reads the
# checkpoints). Copied to .gpu/c/run.sh, run from the repository
# root there as `bash .gpu/c/run.sh` (it reads .gpu/c beside it).
# QUICK=1: a CPU dry run (one prompt, 4 tokens).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
. benchmarks/gpu/gpu_smollm2_target.sh  # /tmp/smollm2.gguf, from .gpu/a and .gpu/b
if [ ! -f /tmp/smollm2-hf/config.json ]; then  # a plain float checkpoint, as the CPU bundles were made from
python3 - <<'PY'
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained("/tmp", gguf_file="smollm2.gguf", dtype=torch.float32)
cfg = m.config
del cfg.quantization_config
plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
print(plain.load_state_dict(m.state_dict(), strict=False))
plain.save_pretrained("/tmp/smollm2-hf")
PY
fi
rm -rf /tmp/b && cp -r $C/bundle /tmp/b
python3 - "$C/head" <<'PY'
import json, sys
m = json.load(open("/tmp/b/specrt.json"))
m["models"]["target"]["source"] = "/tmp/smollm2-hf"
m["models"]["eagle"]["source"] = sys.argv[1]
for e in m["models"].values():
    e["dtype"] = "float16"  # the GPU's precision; the bundle was exported float32
json.dump(m, open("/tmp/b/specrt.json", "w"))
PY
if [ "${QUICK:-0}" = 1 ]; then A="--max-new-tokens 4 --repeats 1 --threads 2"; P=/tmp/p1.json; echo '["Hi"]' > $P
else A="--max-new-tokens 64 --repeats 3"; P=benchmarks/prompts/chat-heldout.json; fi
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader 2>/dev/null
python3 -m specrt.cli bench --bundle /tmp/b --backend torch --chat --prompts $P $A \
  --methods none,eagle,eagle-tree,eagle@auto --json $OUT/smollm2-eagle-h200.json 2>&1 | grep -v -E "it/s\]|Warn"
python3 -m specrt.cli bench --bundle /tmp/b --backend torch --chat --prompts $P $A --temperature 0.7 \
  --methods none,eagle-tree,eagle@auto --json $OUT/smollm2-eagle-t07-h200.json 2>&1 | grep -v -E "it/s\]|Warn"
