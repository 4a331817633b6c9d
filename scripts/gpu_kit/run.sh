#!/usr/bin/env bash
# The GPU kit's runner (issue 63): on the GPU machine, from the repository root, with $OUT the folder whose
# files come back. It puts together what prepare.sh packed (onnxruntime-gpu's wheel, the fp16 SmolLM2 bundle
# with its EAGLE-3 head, the Q4_1 GGUF, llama.cpp's source, the head as a GGUF), installs onnxruntime-gpu
# into a temporary site, proves that a real session runs on CUDA, and measures specrt beside llama.cpp.
#
#   bash scripts/gpu_kit/run.sh STAGE...     stages, in this order when several are given:
#     stash      copy the part(s) this call carried (gpu-kit/send/pNN) into $WORK/parts, sha256 checked
#     join       extract every object whose parts have all arrived into $WORK/obj, sha256 checked
#     llama-bg   start llama.cpp's build in the background (setsid: it outlives the call) once its source is in
#     install    onnxruntime-gpu + gguf into $WORK/site (pip --no-index --target); the bundle unpacked
#     check      get_available_providers() AND a real session's get_providers()[0] == CUDAExecutionProvider
#     measure    scripts/gpu_kit/measure.py: every configuration in its own processes; JSON into $OUT
#     all        all of the above
# Each stage skips what an earlier call already did, so a rerun of `measure` redoes only the measuring.
#
# SPECRT_KIT_DRY=1 (or --dry-run first): the same stages on this CPU machine: the venv's CPU onnxruntime
# instead of the GPU wheel (the provider check opens the same session and says what it would require there),
# llama.cpp built for the CPU (nice, -j2), 2 prompts x 16 tokens; $WORK defaults to /tmp/specrt-kit-dry, $OUT
# to /tmp/specrt-kit-dry/out. Knobs (measure.py): REPEATS, LLAMA_SPEC_N, MEASURE_S, MEASURE_ONLY, LLAMA_WAIT_S;
# CUDA_ARCH and JOBS for llama.cpp's build.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--dry-run" ]; then export SPECRT_KIT_DRY=1; shift; fi
DRY=${SPECRT_KIT_DRY:-0}
if [ "$DRY" = 1 ]; then
  WORK=${KIT_WORK:-/tmp/specrt-kit-dry}; OUT=${OUT:-$WORK/out}; PY=${PY:-$PWD/.venv/bin/python}
  JOBS=${JOBS:-2}; NICE="nice -n 10"
else
  WORK=${KIT_WORK:-/tmp/kit}; OUT=${OUT:-$WORK/out}; PY=${PY:-python3}
  # The build overlaps the transfer calls and may overlap the first measurements: nice 19 and three cores
  # left free, so the measuring processes' host work is not queued behind compilers.
  JOBS=${JOBS:-$(( $(nproc) > 4 ? $(nproc) - 3 : 1 ))}; NICE="nice -n 19"
fi
SEND=${KIT_SEND:-gpu-kit/send}
mkdir -p "$WORK" "$OUT"
export OUT WORK PY DRY
# The temporary site first, then this tree: onnxruntime-gpu shadows the image's CPU onnxruntime 1.30 (the two
# share one onnxruntime/ folder, so never install one beside the other in one site).
export PYTHONPATH="$WORK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
log() { echo "[kit $(date +%H:%M:%S)] $*" | tee -a "$OUT/kit.log" >&2; }

# onnxruntime-gpu dlopens cuBLAS/cuRAND/cuDNN/cuFFT/cudart by soname; the image holds them in the nvidia-*
# wheels under site-packages/nvidia/*/lib (CUDA 13's wheels: nvidia/cu13/lib), which are not on the loader's
# path unless torch was imported first. Put every such folder on LD_LIBRARY_PATH.
cuda_libs() {
  "$PY" - <<'PY' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
dirs = set()
for root in (spec.submodule_search_locations if spec else []):
    for d, _, files in os.walk(root):
        if any(".so" in f for f in files):
            dirs.add(d)
print(":".join(sorted(dirs)))
PY
}
if [ "$DRY" != 1 ]; then
  LIBS=$(cuda_libs); export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ggml-cuda links CUDA::cublas. A toolkit assembled from pip wheels (this workplace's: /usr/local/cuda-13.0 has nvcc
# and cudart, no cuBLAS) leaves CMake without it; the image's nvidia-cublas wheel has the headers and
# libcublas.so.13 but no unversioned libcublas.so to link against. Point CMake at both through a shim folder.
cublas_flags() {
  local nvcc_dir; nvcc_dir=$(dirname "$(command -v nvcc)")
  [ -f "$nvcc_dir/../include/cublas_v2.h" ] && return 0  # a full toolkit: nothing to add
  local inc; inc=$("$PY" - <<'PY' 2>/dev/null || true
import glob, importlib.util
spec = importlib.util.find_spec("nvidia")
hits = [h for root in (spec.submodule_search_locations if spec else []) for h in glob.glob(f"{root}/*/include/cublas_v2.h")]
print(hits[0].rsplit("/", 1)[0] if hits else "")
PY
)
  if [ -z "$inc" ]; then log "llama-bg: no cublas_v2.h in the toolkit nor in an nvidia-cublas wheel: the CUDA build will fail"; return 0; fi
  local shim=$WORK/cublas-shim; mkdir -p "$shim"
  for l in cublas cublasLt; do ln -sf "$(ls "$inc"/../lib/lib$l.so.* | head -1)" "$shim/lib$l.so"; done
  # CUDA::cuda_driver (ggml's VMM pool) wants libcuda.so: the driver's libcuda.so.1 where there is one, else
  # no VMM (ggml's legacy pool: allocation only, the kernels are the same)
  local drv; drv=$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}'; \
                     ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null) | head -1)
  local vmm=""
  if [ -n "$drv" ]; then ln -sf "$drv" "$shim/libcuda.so"; else vmm="-DGGML_CUDA_NO_VMM=ON"; fi
  echo "-DCMAKE_LIBRARY_PATH=$shim -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc -DCMAKE_C_FLAGS=-I$inc $vmm"
}

stage_stash() { timeout 120 "$PY" scripts/gpu_kit/kit.py stash --send "$SEND" --work "$WORK"; }
stage_join() { timeout 180 "$PY" scripts/gpu_kit/kit.py join --work "$WORK"; }

# llama.cpp: only the targets the side-by-side runs. CUDA for the GPU's architecture alone (sm_90: H100/H200);
# GGML_NATIVE=OFF everywhere (a native build's guesses died with "Illegal instruction" on these VMs).
stage_llama_bg() {
  local src=$WORK/obj/llama.cpp-src.tar.xz
  if [ ! -f "$src" ]; then log "llama-bg: its source has not arrived yet"; return 0; fi
  if [ "$(cat "$WORK/llama-build.rc" 2>/dev/null)" = 0 ]; then log "llama-bg: already built"; return 0; fi
  if [ -f "$WORK/llama-build.pid" ] && kill -0 "$(cat "$WORK/llama-build.pid")" 2>/dev/null; then
    log "llama-bg: already building"; return 0
  fi
  [ -d "$WORK/llama.cpp" ] || "$PY" scripts/gpu_kit/kit.py untar "$src" "$WORK"
  local flags="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
  if [ "$DRY" = 1 ]; then flags="$flags -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  else flags="$flags -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} $(cublas_flags)"; fi
  local targets="llama-completion llama-speculative-simple llama-quantize"
  rm -f "$WORK/llama-build.rc"
  # setsid: the device tool kills what a call leaves running, except a process in a session of its own.
  setsid nohup bash -c "cd '$WORK' && { time ( $NICE cmake -S llama.cpp -B llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release $flags \
      && $NICE cmake --build llama-build -j $JOBS --target $targets ) ; } > llama-build.log 2>&1; echo \$? > llama-build.rc" \
      > /dev/null 2>&1 < /dev/null &
  echo $! > "$WORK/llama-build.pid"
  log "llama-bg: building $targets in the background ($WORK/llama-build.log; -j $JOBS)"
}

stage_install() {
  local obj=$WORK/obj
  if [ "$DRY" = 1 ]; then
    log "install: DRY RUN: the venv's CPU onnxruntime; the GPU wheel is only checked (sha256 at join): $(ls "$obj"/onnxruntime_gpu-*.whl 2>/dev/null)"
  elif ! ls "$WORK"/site/onnxruntime/capi/onnxruntime_pybind11_state*.so >/dev/null 2>&1; then
    timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$obj"/onnxruntime_gpu-*.whl
    log "install: onnxruntime-gpu in $WORK/site"
  fi
  # gguf: transformers reads the Q4_1 GGUF through it (the torch backend's source); not in the image.
  if ! "$PY" -c "import gguf" 2>/dev/null; then
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$obj"/gguf-*.whl
    log "install: gguf in $WORK/site"
  fi
  if [ ! -f "$WORK/bundle/specrt.json" ]; then
    rm -rf "$WORK/bundle.tmp" && mkdir -p "$WORK/bundle.tmp"
    "$PY" scripts/gpu_kit/kit.py untar "$obj/bundle.tar" "$WORK/bundle.tmp"
    mv "$WORK/bundle.tmp" "$WORK/bundle"
    log "install: bundle in $WORK/bundle ($(du -sh "$WORK/bundle" | cut -f1))"
  fi
}

stage_check() {
  # A real session, on the bundle's smallest graph (the EAGLE-3 head): get_available_providers() lists CUDA
  # even where a session then falls back to the CPU.
  local probe; probe=$(ls -S "$WORK"/bundle/*.onnx | tail -1)
  if [ "$DRY" != 1 ]; then
    local so; so=$(ls "$WORK"/site/onnxruntime/capi/libonnxruntime_providers_cuda.so 2>/dev/null || true)
    [ -n "$so" ] && { ldd "$so" | grep "not found" && log "check: libraries above are missing from LD_LIBRARY_PATH" || true; }
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$OUT/kit.log" || true
  fi
  timeout 120 "$PY" scripts/gpu_kit/kit.py providers --model "$probe" $([ "$DRY" = 1 ] && echo --dry) 2>&1 | tee -a "$OUT/kit.log"
  return "${PIPESTATUS[0]}"
}

stage_measure() {
  # MEASURE_ONLY=ort-greedy,llama: a subset of the steps (measure.py's names), e.g. to redo one that failed
  timeout "${MEASURE_S:-420}" "$PY" scripts/gpu_kit/measure.py --work "$WORK" --out "$OUT" $([ "$DRY" = 1 ] && echo --dry) \
    ${MEASURE_ONLY:+--only "$MEASURE_ONLY"} \
    2>&1 | tee -a "$OUT/kit.log"
  return "${PIPESTATUS[0]}"
}

stages=("$@")
[ "${#stages[@]}" -eq 0 ] && { sed -n 2,20p "$0"; exit 2; }
[ "${stages[*]}" = all ] && stages=(stash join llama-bg install check measure)
for s in "${stages[@]}"; do
  t0=$(date +%s)
  case $s in
    stash) stage_stash ;; join) stage_join ;; llama-bg) stage_llama_bg ;; install) stage_install ;;
    check) stage_check ;; measure) stage_measure ;;
    *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
  log "$s: done in $(( $(date +%s) - t0 )) s"
done
