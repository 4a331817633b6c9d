#!/usr/bin/env bash
# GPU checks for any NVIDIA machine (run from the repo root): environment, GPU tests, parity + timing.
# Says what it skipped; exit status non-zero if a check failed.
set -uo pipefail
rc=0
python -m specrt.cli doctor || rc=1
python -m pytest -q -rs tests/test_torch_backend.py tests/test_gpu_backends.py tests/test_tensorrt_build.py || rc=1
python scripts/gpu_check.py "$@" || rc=1
exit $rc
