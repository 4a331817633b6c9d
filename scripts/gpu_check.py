"""GPU check: greedy parity and verify-step latency, CUDA graph vs eager, for the backends importable here.

    python scripts/gpu_check.py [--bundle DIR]      (default: the demo bundle)
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bundle", default=None)
    args = p.parse_args()
    import specrt
    from specrt.manifest import load_manifest
    from specrt.runtime.masks import causal_mask

    try:
        import torch
    except ImportError:
        print("SKIP torch backend: torch is not importable")
        return 0
    if not torch.cuda.is_available():
        print("SKIP torch CUDA backend: no CUDA device visible")
        return 0
    try:
        import tensorrt  # noqa: F401
        print("NOTE tensorrt importable: engines and the TensorRT backend are checked by tests/test_gpu_backends.py")
    except ImportError:
        print("SKIP TensorRT: not importable")

    ref = specrt.load(args.bundle)  # ONNX Runtime (CPU build on the lent machine)
    gpu = specrt.load(args.bundle, backend="torch")
    print(f"backends: reference {ref.decoders['target'].provider}, gpu {gpu.decoders['target'].provider} "
          f"({torch.cuda.get_device_name(0)})")
    prompts = ["def fibonacci(n):\n", "import os\nimport sys\n", "class Stack:\n"]
    ok = True
    for method in ("none", "draft", "tree"):
        same = all(gpu.generate(pr, max_new_tokens=48, method=method).token_ids
                   == ref.generate(pr, max_new_tokens=48, method=method).token_ids for pr in prompts)
        ok &= same
        print(f"{'PASS' if same else 'FAIL'} greedy {method}: torch-cuda == onnxruntime over {len(prompts)} prompts")
    for method in ("none", "draft", "tree"):
        st = gpu.generate(prompts[0], max_new_tokens=128, method=method).stats
        print(f"torch-cuda {method:5s}: {st.tokens_per_second:8.1f} tokens/s, {st.tokens_per_target_pass:.2f} tokens/pass")

    from specrt.engines.torch_backend import TorchDecoder

    bundle = gpu.bundle
    entry = load_manifest(bundle).target
    for graphs in (False, True):
        dec = TorchDecoder(bundle, entry, use_graphs=graphs)
        cache = dec.new_cache(512)
        dec.forward(cache, np.arange(200) % 100, np.arange(200), causal_mask(200, 0))
        cache.advance(200)
        ids, pos, mask = np.arange(5), np.arange(200, 205), causal_mask(5, 200)
        for _ in range(5):
            dec.forward(cache, ids, pos, mask)
        torch.cuda.synchronize()
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            dec.forward(cache, ids, pos, mask)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        print(f"verify step (Q=5, past 200) {'CUDA graph' if graphs else 'eager    '}: {np.median(ts) * 1e3:.3f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
