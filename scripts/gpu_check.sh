#!/usr/bin/env bash
# GPU checks for an NVIDIA machine, from the repository root, with nothing installed beyond the
# machine's own packages (specrt is imported from this tree; its tiny models are built here).
# Writes $OUT/gpu-check.json, $OUT/verify-cost-gpu.json (benchmarks/gpu/verify_cost_gpu.py: verify cost at real
# dimensions) and $OUT/pytest.txt (OUT defaults to ./gpu-check-out); exit status non-zero if a check failed.
#
# Sending it to a machine that receives at most 64 MiB (the `device` tool): the demo weights are
# ~128 MiB and not needed here, so leave them out of the working tree first and restore them after:
#   git sparse-checkout set --no-cone '/*' '!/specrt/demo/bundle/' '!/demo/hf/'   # tree < 1 MiB
#   ... run: bash scripts/gpu_check.sh ...
#   git sparse-checkout disable
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
timeout 480 "$PY" scripts/gpu_check.py --json "$OUT/gpu-check.json" "$@" || rc=1
# verify cost at real dimensions (SmolLM2-135M, Llama-3.2-1B; random weights) on the GPU path
timeout 300 "$PY" benchmarks/gpu/verify_cost_gpu.py --json "$OUT/verify-cost-gpu.json" || rc=1
if "$PY" -c "import pytest, click, rich" 2>/dev/null; then  # the GPU tests of the suite, where pytest exists
  timeout 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_backends.py tests/export/test_torch_backend.py \
    -k "gpu or cuda or graph or device" > "$OUT/pytest.txt" 2>&1 || rc=1
  tail -5 "$OUT/pytest.txt"
else
  echo "SKIP the suite's GPU tests: pytest/click/rich not installed here" | tee "$OUT/pytest.txt"
fi
exit $rc
