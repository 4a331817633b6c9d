"""GPU check: greedy parity and verify-step latency, CUDA graph vs eager, for the backends importable here.

    python scripts/gpu_check.py [--bundle DIR]      (default: the demo bundle)

Each backend section says SKIP with the reason when it cannot run; exit status 1 if a parity check fails.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPTS = ["def fibonacci(n):", "import os\nimport sys", "class Stack:\n    def push(self"]


def time_verify(dec, sync, past: int = 200, q_len: int = 5, reps: int = 50) -> float:
    """Median ms of one Q-token verify pass after a ``past``-token prefill (the cache is not advanced)."""
    from specrt.runtime.masks import causal_mask

    cache = dec.new_cache(512)
    dec.forward(cache, np.arange(past) % 100, np.arange(past), causal_mask(past, 0))
    cache.advance(past)
    ids, pos, mask = np.arange(q_len), np.arange(past, past + q_len), causal_mask(q_len, past)
    for _ in range(5):
        dec.forward(cache, ids, pos, mask)
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dec.forward(cache, ids, pos, mask)
        sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def parity(gen, ref, label: str) -> bool:
    ok = True
    for method in ("none", "draft", "tree"):
        same = all(gen.generate(p, max_new_tokens=48, method=method).token_ids
                   == ref.generate(p, max_new_tokens=48, method=method).token_ids for p in PROMPTS)
        ok &= same
        print(f"{'PASS' if same else 'FAIL'} greedy {method}: {label} == reference over {len(PROMPTS)} prompts")
    for method in ("none", "draft", "tree"):
        st = gen.generate(PROMPTS[0], max_new_tokens=128, method=method).stats
        print(f"{label} {method:5s}: {st.tokens_per_second:8.1f} tokens/s, {st.tokens_per_target_pass:.2f} tokens/pass")
    return ok


def torch_section(bundle: Path, ref) -> bool:
    try:
        import torch
    except ImportError:
        print("SKIP torch backend: torch is not importable")
        return True
    if not torch.cuda.is_available():
        print("SKIP torch CUDA backend: no CUDA device visible")
        return True
    import specrt
    from specrt.engines.torch_backend import TorchDecoder
    from specrt.manifest import load_manifest

    gen = specrt.load(bundle, backend="torch")
    print(f"torch backend on {torch.cuda.get_device_name(0)}")
    ok = parity(gen, ref, "torch-cuda")
    entry = load_manifest(bundle).target
    for graphs in (False, True):
        ms = time_verify(TorchDecoder(bundle, entry, use_graphs=graphs), torch.cuda.synchronize)
        print(f"torch verify step (Q=5, past 200) {'CUDA graph' if graphs else 'eager     '}: {ms:.3f} ms")
    return ok


def tensorrt_section(bundle: Path, ref) -> bool:
    from specrt.runtime.backends.tensorrt import TrtDecoder, _trt_available

    if not _trt_available():
        print("SKIP TensorRT backend: tensorrt or cuda-python is not importable")
        return True
    import specrt
    from specrt.engines.tensorrt_build import BuildOptions, build_bundle_engines
    from specrt.manifest import load_manifest

    work = Path(tempfile.mkdtemp()) / "bundle"
    shutil.copytree(bundle, work)
    t0 = time.perf_counter()
    build_bundle_engines(work, BuildOptions(max_context=512, max_prompt=256, max_verify=32))
    print(f"TensorRT engines built in {time.perf_counter() - t0:.0f} s")
    ok = parity(specrt.load(work, backend="tensorrt"), ref, "tensorrt")
    entry = load_manifest(work).target
    for graphs in (False, True):
        dec = TrtDecoder(work, entry, graphs=graphs)
        ms = time_verify(dec, dec.memory.synchronize)
        print(f"TensorRT verify step (Q=5, past 200) {'CUDA graph' if graphs else 'eager     '}: {ms:.3f} ms")
    return ok


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bundle", default=None)
    args = p.parse_args()
    import specrt

    ref = specrt.load(args.bundle, backend="onnxruntime")
    bundle = ref.bundle
    print(f"reference: onnxruntime {ref.decoders['target'].provider}, bundle {bundle}")
    ok = torch_section(bundle, ref)
    ok &= tensorrt_section(bundle, ref)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
