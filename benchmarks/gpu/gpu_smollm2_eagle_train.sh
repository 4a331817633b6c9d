#!/bin/bash
# SmolLM2-135M-Instruct's EAGLE-3 head trained on a CUDA GPU (`specrt eagle train --device cuda`): round 4's
# seed prompts (benchmarks/prompts/eagle-seeds-r4.json, the same held-out split) with SEQ continuations
# spread over them, plus SELF prompts the target writes itself, from scratch (or INIT=a head folder: train
# that one further; a 29 MB head does not fit beside part.01 in one call's 64 MiB). On a machine that receives
# at most 64 MiB a call and sends back files of at most 16 MiB: the GGUF arrives as benchmarks/gpu/gpu_smollm2_target.sh
# says; the head comes back as OUT/head/{config.json, training.json, model.safetensors.part-0*} (join: cat
# part-0* > model.safetensors).
# LAYERS=2: a stacked head (speculators format; the CPU rounds were short of data, not of layers: on a GPU's
# data a second layer may pay, at ~1.4x a draft's cost on this CPU).
# Sized by time, not by guesses (its GPU generation rate is unmeasured): MINUTES (default 8.5, for a call of
# 10 minutes with the GGUF's setup) bounds the whole run with `--time-limit`: replies until half of it, then as
# many steps as fit, and the head saved either way; SELF (3000), SEQ (200000), STEPS (100000) are only upper
# bounds, and host memory / disk cap the data too. BS (16), LR (1e-3). train.log's last lines say what it made.
# QUICK=1: a CPU dry run here.
# Two calls of the `device` tool fit it beside the session's first check (the tree sparse-checked-out without
# the demo weights and benchmarks/heads, < 1 MiB): (1) carry .gpu/a (part.00, 49 MiB) and .gpu/c, run
# `mkdir -p /tmp/stash && cp .gpu/a/part.00 /tmp/stash/ && bash scripts/gpu_check.sh`; (2) at once, before
# the machine goes back, carry .gpu/b and .gpu/c and run `bash benchmarks/gpu/gpu_smollm2_eagle_train.sh`.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/head
. benchmarks/gpu/gpu_smollm2_target.sh  # /tmp/smollm2.gguf, from .gpu/a and .gpu/b
if [ "${QUICK:-0}" = 1 ]; then
  DEV=cpu; SELF=${SELF:-4}; SEQ=${SEQ:-24}; STEPS=${STEPS:-3}; BS=${BS:-4}; LEN=64
  python3 -c "import json; json.dump(json.load(open('benchmarks/prompts/eagle-seeds-r4.json'))[:12], open('/tmp/seeds.json', 'w'))"
  P=/tmp/seeds.json
else
  DEV=cuda; SELF=${SELF:-3000}; SEQ=${SEQ:-200000}; STEPS=${STEPS:-100000}; BS=${BS:-16}; LEN=192
  P=benchmarks/prompts/eagle-seeds-r4.json
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null
rm -rf /tmp/head
python3 -m specrt.cli eagle train /tmp/smollm2.gguf -o /tmp/head --device $DEV ${INIT:+--init $INIT} \
  --layers ${LAYERS:-1} --prompts $P --self-prompts $SELF --sequences $SEQ --seq-len $LEN --batch-size $BS \
  --ttt-steps 3 --steps $STEPS --lr ${LR:-1e-3} --time-limit ${MINUTES:-8.5} 2>&1 | tee $OUT/train.log | grep -v -E "it/s\]|Warn" | tail -20
rc=${PIPESTATUS[0]}
cp /tmp/head/config.json /tmp/head/training.json $OUT/head/ 2>/dev/null
[ -f /tmp/head/model.safetensors ] && split -b 15M -d -a 2 /tmp/head/model.safetensors $OUT/head/model.safetensors.part-
ls -la $OUT/head
exit $rc
