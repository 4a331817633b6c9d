"""GPU check: what specrt's GPU code does on a real NVIDIA GPU, as one JSON of results.

    python3 scripts/gpu_check.py [--json OUT.json] [--bundle DIR]

Runs from the repository root with nothing installed but the GPU image's packages (PyTorch + CUDA,
transformers, onnx, onnxruntime, cuda-bindings): specrt is imported from the tree, and the models are
built here from configs (tests/models.py; no download, no demo weights, so the tree sent to the GPU
machine can leave them out). Sections, each PASS / FAIL / SKIP with the reason:

1. environment: GPU, torch, CUDA, cuda-bindings, onnxruntime providers;
2. device KV cache (cuda-bindings): writes, a tree compaction (cudaMemcpy2DAsync) vs the host cache;
3. torch backend on CUDA, eager and CUDA graphs: greedy tokens == ONNX Runtime CPU for none/draft/tree;
   logits left on the GPU: sampled tokens == the copy-everything path, seed for seed; device-to-host
   bytes per target pass both ways;
3b. EAGLE-3 on the torch backend (a tiny target with a random head): eagle / eagle-tree greedy == ONNX
   Runtime CPU, eagerly and through CUDA graphs; sampled eagle with logits on the GPU == copied, seed for seed;
3c. EAGLE-3 training on CUDA (`eagle train --device cuda`) beside the same run on the CPU, in float32: the
   target's greedy held-out continuations and its sampled training ones (one CPU generator feeds both),
   the loss falling, held-out acceptance both ways, the GPU run's checkpoint resumed on the CPU, and a
   bfloat16 run (compute auto) on the GPU;
4. verify-pass latency (Q=5 after a 200-token prefill), CUDA graph vs eager;
4b. GPU memory bandwidth (specrt.measure.bandwidth.cuda_bandwidth: a read-sum and a device copy of 2 GiB), the roofline `bench --roofline` uses on a GPU;
5. TensorRT, when importable: engines built and greedy parity.

Exit status 1 if any check FAILED (a SKIP is not a failure).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # specrt from this tree; tests/models.py for the tiny pair

import numpy as np  # noqa: E402

PROMPTS = ["def fib(n):", "for i in range(10):\n    print(i", "class Point:\n    def __init__(self"]
SAMPLED = [dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=20), dict(temperature=1.0)]


class Report:
    def __init__(self) -> None:
        self.results: dict[str, dict] = {}

    def record(self, name: str, status: str, **details) -> None:
        self.results[name] = {"status": status, **details}
        extra = ", ".join(f"{k}={v}" for k, v in details.items())
        print(f"{status:4s} {name}" + (f": {extra}" if extra else ""), flush=True)

    def run(self, name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # every check reports, the script goes on
            self.record(name, "FAIL", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=6))
            return
        status, details = out if isinstance(out, tuple) else ("PASS", out or {})
        self.record(name, status, seconds=round(time.perf_counter() - t0, 2), **details)

    @property
    def failed(self) -> bool:
        return any(r["status"] == "FAIL" for r in self.results.values())


def environment() -> tuple[str, dict]:
    import onnxruntime as ort

    info = {"python": platform.python_version(), "onnxruntime": ort.__version__,
            "ort_providers": ort.get_available_providers()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info["torch"] = None
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        info["cuda_bindings_devices"] = count if int(err) == 0 else f"error {int(err)}"
        info["cuda_driver"] = cudart.cudaDriverGetVersion()[1]
    except ImportError:
        info["cuda_bindings_devices"] = None
    return "PASS", info


def build_pair(work: Path) -> Path:
    """The tests' tiny Llama pair (a close draft: perturbed MLP), exported fp32."""
    import torch
    from support.models import save_pair
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specrt.export.exporter import export_bundle

    target, _ = save_pair(work, "llama")
    draft = AutoModelForCausalLM.from_pretrained(target)
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in draft.model.layers:
            w = layer.mlp.down_proj.weight
            w.add_(0.5 * torch.randn_like(w) * w.std())
    draft.save_pretrained(work / "close-draft")
    AutoTokenizer.from_pretrained(target).save_pretrained(work / "close-draft")
    export_bundle(str(target), str(work / "close-draft"), work / "bundle")
    return work / "bundle"


def kv_cache_check(bundle: Path) -> dict:
    from specrt.bundle.manifest import load_manifest
    from specrt.runtime.backends.cuda import CudaMemory, DeviceKVCache
    from specrt.runtime.kvcache import KVCache

    dims = load_manifest(bundle).target.dims
    mem = CudaMemory()
    host, dev = KVCache(dims, 64, np.float16), DeviceKVCache(dims, 64, np.float16, mem)
    rng = np.random.default_rng(0)
    pairs = [*zip(host.keys, dev.key_ptrs), *zip(host.values, dev.value_ptrs)]
    for arr, ptr in pairs:
        arr[...] = rng.standard_normal(arr.shape)
        mem.to_device(ptr, arr)
    host.length = dev.length = 30
    keep = np.array([0, 2, 3, 4, 5, 6, 9])
    host.compact(20, keep)
    dev.compact(20, keep)
    for arr, ptr in pairs:
        back = np.empty_like(arr)
        mem.to_host(back, ptr)
        mem.synchronize()
        if not np.array_equal(back[:, :host.length], arr[:, :host.length]):
            raise AssertionError("device cache differs from the host cache after compaction")
    return {"rows_compared": host.length}


TORCH_DEVICE = "cuda"  # --torch-device cpu: a dry run of the torch sections on a machine without a GPU


def _sync() -> None:
    import torch

    if TORCH_DEVICE == "cuda":
        torch.cuda.synchronize()


def torch_generator(bundle: Path, **options):
    import specrt
    from specrt.export.torch_backend import TorchDecoder

    gen = specrt.load(bundle, backend="torch")
    if gen.manifest.eagle is not None:
        gen._load_eagle("eagle")  # made on first use otherwise: here now, to be replaced like the others
    for role, entry in gen.manifest.models.items():
        dec = TorchDecoder(bundle, entry, device=TORCH_DEVICE, **options)
        gen.decoders[role] = dec
        gen._models[role].decoder = dec
        gen._models[role].cache = dec.new_cache(gen.manifest.max_context)
    return gen


def greedy_parity(gen, ref) -> dict:
    out = {}
    for method in ("none", "draft", "tree"):
        got = [gen.generate(p, max_new_tokens=32, method=method).token_ids for p in PROMPTS]
        want = [ref.generate(p, max_new_tokens=32, method=method).token_ids for p in PROMPTS]
        if got != want:
            raise AssertionError(f"greedy {method}: tokens differ from ONNX Runtime CPU: {got} vs {want}")
        st = gen.generate(PROMPTS[0], max_new_tokens=64, method=method).stats
        out[method] = {"tokens_per_second": round(st.tokens_per_second, 1),
                       "tokens_per_target_pass": round(st.tokens_per_target_pass, 2),
                       "d2h_bytes_per_target_pass": round(st.d2h_bytes_per_target_pass)}
    return out


def sampled_parity(bundle: Path, runs=(dict(method="none"), dict(method="draft"))) -> dict:
    """Each of ``runs`` sampled with logits left on the GPU gives the copy-everything path's tokens, seed for
    seed; the device-to-host bytes per target pass both ways."""
    on_gpu, copied = torch_generator(bundle, use_graphs=False), torch_generator(bundle, use_graphs=False,
                                                                               device_logits=False)
    bytes_per_pass = {}
    for kw in SAMPLED:
        for run in runs:
            for seed in range(3):
                a = on_gpu.generate(PROMPTS[1], max_new_tokens=24, seed=seed, **run, **kw)
                b = copied.generate(PROMPTS[1], max_new_tokens=24, seed=seed, **run, **kw)
                if a.token_ids != b.token_ids:
                    raise AssertionError(f"{run} {kw} seed {seed}: logits on the GPU gave other tokens")
            bytes_per_pass[f"{run['method']} {kw}"] = [round(a.stats.d2h_bytes_per_target_pass),
                                                       round(b.stats.d2h_bytes_per_target_pass)]
    return {"d2h_bytes_per_target_pass [logits on GPU, copied]": bytes_per_pass}


def build_eagle_bundle(work: Path) -> Path:
    """The suite's eagle bundle (tests/conftest.py): a tiny llama target and a random EAGLE-3 head."""
    from support.models import make_tokenizer, save_eagle_head, save_model

    from specrt.export.exporter import export_bundle

    target = save_model(work / "eagle-target", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    head = save_eagle_head(work / "eagle-head", target, seed=3, draft_vocab=240, ascending=False)
    export_bundle(str(target), None, work / "eagle-bundle", eagle=str(head))
    return work / "eagle-bundle"


EAGLE_RUNS = [dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,5")]


def eagle_parity(bundle: Path, ref) -> dict:
    out = {}
    for graphs in (False, True) if TORCH_DEVICE == "cuda" else (False,):
        gen = torch_generator(bundle, use_graphs=graphs)
        for kw in EAGLE_RUNS:
            got = [gen.generate(p, max_new_tokens=32, **kw).token_ids for p in PROMPTS]
            want = [ref.generate(p, max_new_tokens=32, **kw).token_ids for p in PROMPTS]
            if got != want:
                raise AssertionError(f"greedy {kw} (graphs={graphs}): tokens differ from ONNX Runtime CPU")
            st = gen.generate(PROMPTS[0], max_new_tokens=64, **kw).stats
            out[f"{kw['method']} graphs={graphs}"] = {"tokens_per_second": round(st.tokens_per_second, 1),
                                                      "tokens_per_target_pass": round(st.tokens_per_target_pass, 2)}
        if graphs and not (gen.decoders["eagle"].graphs and gen.decoders["target"].graphs):
            raise AssertionError("no CUDA graph was captured for the head or the target")
    return {**out, **sampled_parity(bundle, runs=(dict(method="eagle", gamma=2),))}


TRAIN_PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "The quick brown fox", "import os",
                 "x = 1", "print(i)", "return n"]


def eagle_train_check(work: Path) -> dict:
    """`specrt eagle train` on TORCH_DEVICE beside the CPU: the same tiny target, prompts, seed and config in
    float32. The data should agree token for token (near-ties aside: the share is reported, >= 0.9 asked);
    both heads must learn (held-out KL falls); the device run's checkpoint resumes on the CPU."""
    import shutil
    from dataclasses import replace

    import torch
    from support.models import make_tokenizer, save_model

    from specrt.export.eagle.checkpoint import load_eagle3
    from specrt.export.eagle.train import EagleTrainConfig, train_eagle

    target = save_model(work / "train-target", "llama", seed=1, vocab=288, layers=4, hidden=64, heads=4, kv_heads=2,
                        tokenizer=make_tokenizer(vocab=280))
    cfg = EagleTrainConfig(steps=40, lr=3e-3, batch_size=4, seq_len=48, num_sequences=32, draft_vocab=64, topk=16,
                           checkpoint_every=20, heldout_fraction=0.25, compute="float32", keep_checkpoint=True,
                           init_from_target=False)  # random target: a head started as its last layer learns little
    out, caches = {}, {}
    for dev in dict.fromkeys(("cpu", TORCH_DEVICE)):
        t0 = time.perf_counter()
        r = train_eagle(target, work / f"head-{dev}", replace(cfg, device=dev), prompts=TRAIN_PROMPTS)
        caches[dev] = torch.load(work / f"head-{dev}" / ".train" / "cache.pt", weights_only=True)
        load_eagle3(work / f"head-{dev}")
        out[dev] = {"seconds": round(time.perf_counter() - t0, 2), "device": r["device"],
                    "alpha1": round(r["heldout"]["alpha1"], 3), "kl": [round(r["heldout_init"]["kl"], 4),
                                                                       round(r["heldout"]["kl"], 4)]}
        if not r["heldout"]["kl"] < r["heldout_init"]["kl"]:
            raise AssertionError(f"{dev}: the held-out KL did not fall: {out[dev]['kl']}")
    a, b = caches["cpu"], caches[TORCH_DEVICE]
    for split in ("heldout", "train"):
        same = (a[split]["tokens"] == b[split]["tokens"]).float().mean().item()
        out[f"{split} tokens equal"] = round(same, 4)
        if same < 0.9:
            raise AssertionError(f"{split} continuations differ between the CPU and {TORCH_DEVICE}: {same:.3f} equal")
    moved = work / "head-resumed"
    shutil.copytree(work / f"head-{TORCH_DEVICE}", moved)  # its checkpoint is at the last step: resume only loads
    resumed = train_eagle(target, moved, replace(cfg, device="cpu"), prompts=TRAIN_PROMPTS, resume=True)
    out["resumed on cpu from step"] = resumed["resumed_from"]
    if resumed["resumed_from"] != cfg.steps:
        raise AssertionError(f"the {TORCH_DEVICE} checkpoint did not resume on the CPU")
    bf16 = train_eagle(target, work / "head-bf16", replace(cfg, device=TORCH_DEVICE, compute="auto",
                                                           keep_checkpoint=False), prompts=TRAIN_PROMPTS)
    out["compute auto on device"] = {"compute": bf16["compute"], "alpha1": round(bf16["heldout"]["alpha1"], 3)}
    return out


def verify_latency(bundle: Path) -> dict:
    from specrt.bundle.manifest import load_manifest
    from specrt.export.torch_backend import TorchDecoder
    from specrt.runtime.masks import causal_mask

    entry = load_manifest(bundle).target
    out = {}
    for graphs in (False, True):
        if graphs and TORCH_DEVICE != "cuda":
            continue  # CUDA graphs need CUDA
        dec = TorchDecoder(bundle, entry, device=TORCH_DEVICE, use_graphs=graphs)
        cache = dec.new_cache(256)
        past, q = 200, 5
        dec.forward(cache, np.arange(past) % 100, np.arange(past), causal_mask(past, 0))
        cache.advance(past)
        ids, pos, mask = np.arange(q), np.arange(past, past + q), causal_mask(q, past)
        for _ in range(5):
            dec.forward(cache, ids, pos, mask)
        _sync()
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            dec.forward(cache, ids, pos, mask)
            _sync()
            ts.append(time.perf_counter() - t0)
        out["cuda_graph_ms" if graphs else "eager_ms"] = round(float(np.median(ts)) * 1e3, 3)
    if "cuda_graph_ms" in out:
        out["graph_speedup"] = round(out["eager_ms"] / out["cuda_graph_ms"], 2)
    return out


def gpu_bandwidth() -> dict:
    from dataclasses import asdict

    from specrt.measure.bandwidth import cuda_bandwidth

    return asdict(cuda_bandwidth(array_bytes=2 * 2**30))


def tensorrt_check(bundle: Path, ref) -> tuple[str, dict]:
    from specrt.runtime.backends.tensorrt import _trt_available

    if not _trt_available():
        return "SKIP", {"reason": "tensorrt or cuda-python is not importable"}
    import specrt
    from specrt.export.tensorrt import BuildOptions, build_bundle_engines

    work = Path(tempfile.mkdtemp()) / "bundle"
    shutil.copytree(bundle, work)
    build_bundle_engines(work, BuildOptions(max_context=256, max_prompt=64, max_verify=32))
    gen = specrt.load(work, backend="tensorrt")
    return "PASS", greedy_parity(gen, ref)


def main() -> int:
    p = argparse.ArgumentParser(description="GPU checks; one JSON of results.")
    p.add_argument("--json", type=Path, default=Path("gpu-check.json"))
    p.add_argument("--bundle", type=Path, default=None, help="[default: a tiny pair built here from configs]")
    p.add_argument("--torch-device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: dry-run the torch sections (no CUDA graphs) where there is no GPU")
    args = p.parse_args()
    global TORCH_DEVICE
    TORCH_DEVICE = args.torch_device
    report = Report()
    report.run("environment", environment)
    env = report.results["environment"]
    has_cuda = (env.get("cuda_available") or TORCH_DEVICE == "cpu") and env.get("torch")
    bundle = args.bundle
    if bundle is None:
        work = Path(tempfile.mkdtemp(prefix="specrt-gpu-check-"))
        report.run("build tiny pair", lambda: {"bundle": str(build_pair(work))})
        bundle = work / "bundle"
    if not (bundle / "specrt.json").is_file():
        report.record("bundle", "FAIL", error=f"no bundle at {bundle}")
    else:
        import specrt

        ref = specrt.load(bundle, backend="onnxruntime")
        if env.get("cuda_bindings_devices"):
            report.run("device KV cache vs host (cuda-bindings)", lambda: kv_cache_check(bundle))
        else:
            report.record("device KV cache vs host (cuda-bindings)", "SKIP", reason="no cuda-bindings or no GPU")
        if has_cuda:
            report.run("torch CUDA eager: greedy == ONNX Runtime CPU",
                       lambda: greedy_parity(torch_generator(bundle, use_graphs=False), ref))
            if TORCH_DEVICE == "cuda":
                report.run("torch CUDA graphs: greedy == ONNX Runtime CPU",
                           lambda: greedy_parity(torch_generator(bundle, use_graphs=True), ref))
            report.run("torch CUDA logits on the GPU: sampled == copied", lambda: sampled_parity(bundle))
            report.run("torch verify latency, CUDA graph vs eager", lambda: verify_latency(bundle))
            if args.bundle is None:
                report.run("torch CUDA EAGLE-3: greedy == ONNX Runtime CPU, sampled on GPU == copied",
                           lambda: eagle_parity(eagle := build_eagle_bundle(work),
                                                specrt.load(eagle, backend="onnxruntime")))
            report.run("EAGLE-3 training on CUDA: == the CPU's data, learns, resumes on the CPU",
                       lambda: eagle_train_check(work if args.bundle is None else Path(tempfile.mkdtemp())))
            if TORCH_DEVICE == "cuda":  # the roofline of `bench --roofline` on this GPU (specrt.measure.bandwidth)
                report.run("GPU memory bandwidth probe (torch CUDA)", gpu_bandwidth)
        else:
            for name in ("torch CUDA eager", "torch CUDA graphs", "torch CUDA logits on the GPU",
                         "torch verify latency", "torch CUDA EAGLE-3", "EAGLE-3 training on CUDA",
                         "GPU memory bandwidth probe"):
                report.record(name, "SKIP", reason="torch sees no CUDA device")
        report.run("TensorRT engines: greedy == ONNX Runtime CPU", lambda: tensorrt_check(bundle, ref))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report.results, indent=2, default=str))
    print(f"wrote {args.json}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
