"""GPU backends: device KV cache, TensorRT backend, ORT with device-resident caches.

The bookkeeping (profiles, addresses, in-place K/V, compaction copies) runs on every machine through
host stand-ins for CUDA memory and a TensorRT context (tests/fake_device.py); the tests at the end run
the real thing and skip, with the reason, where no GPU/TensorRT/onnxruntime-gpu is present.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.fake_device import ORT_TYPES, HostMemory, OrtEngineContext, view

import specrt
from specrt.bundle.contract import SUMMARY_TOP_K, summary_graph_path
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError, ContextLengthError, SpecrtError
from specrt.runtime.backends import base
from specrt.runtime.backends.cuda import DeviceKVCache, compaction_copies
from specrt.runtime.backends.onnxruntime import OrtDecoder, OrtHeads, _session
from specrt.runtime.backends.tensorrt import TrtDecoder, TrtHeads, _trt_available, check_engine, engine_record, role_of
from specrt.runtime.backends.tensorrt_io import PREFILL, VERIFY, EngineLimits, choose_profile, tensor_plan
from specrt.runtime.kvcache import KVCache
from specrt.runtime.masks import causal_mask

PROMPTS = ["def fib(n):", "class Point:\n    def __init__(self"]
LIMITS = EngineLimits(max_context=256, max_prompt=64, max_verify=16)


def test_compaction_copies_group_runs_without_overlap():
    assert compaction_copies(10, np.array([0, 1, 2])) == []  # already in place
    assert compaction_copies(10, np.array([0, 1, 2, 5, 6])) == [(15, 13, 2)]
    # a run of 6 shifted by 2: chunks of 2, so no copy reads what it writes
    assert compaction_copies(0, np.array([2, 3, 4, 5, 6, 7])) == [(2, 0, 2), (4, 2, 2), (6, 4, 2)]
    assert compaction_copies(3, np.array([1, 4, 5])) == [(4, 3, 1), (7, 4, 2)]


@pytest.mark.parametrize("heads_major", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_device_cache_compaction_equals_host_compaction(llama_bundle, seed, heads_major):
    dims = load_manifest(llama_bundle).target.dims
    rng = np.random.default_rng(seed)
    host, mem = KVCache(dims, 40, np.float32, heads_major=heads_major), HostMemory()
    dev = DeviceKVCache(dims, 40, np.float32, mem, heads_major=heads_major)
    shape = host.keys[0].shape
    for i in range(dims.num_layers):
        for arr, ptr in ((host.keys[i], dev.key_ptrs[i]), (host.values[i], dev.value_ptrs[i])):
            arr[...] = rng.standard_normal(shape)
            view(ptr, shape, np.float32)[...] = arr
    start = int(rng.integers(0, 10))
    nodes = int(rng.integers(1, 20))
    keep = np.sort(rng.choice(nodes, size=int(rng.integers(1, nodes + 1)), replace=False))
    host.length = dev.length = start + nodes
    host.compact(start, keep)
    dev.compact(start, keep)
    assert dev.length == host.length == start + keep.size
    for i in range(dims.num_layers):
        for arr, ptr in ((host.keys[i], dev.key_ptrs[i]), (host.values[i], dev.value_ptrs[i])):
            got, want = view(ptr, shape, np.float32), arr
            if heads_major:
                got, want = got.transpose(0, 2, 1, 3), want.transpose(0, 2, 1, 3)
            np.testing.assert_array_equal(got[:, :host.length], want[:, :host.length])


def test_a_heads_major_device_cache_is_one_dense_buffer_per_layer(llama_bundle):
    """What a GroupQueryAttention graph reads as past_key.N: [1, H_kv, max_context, D], no pad between heads."""
    dims = load_manifest(llama_bundle).target.dims
    cache = DeviceKVCache(dims, 37, np.float16, HostMemory(), heads_major=True)
    layer = dims.num_kv_heads * 37 * dims.head_dim * 2
    starts = [p for pair in zip(cache.key_ptrs, cache.value_ptrs) for p in pair]
    assert all(b - a == layer for a, b in zip(starts, starts[1:]))
    assert cache.planes * cache.plane_bytes == 2 * dims.num_layers * layer


def test_profile_choice_and_its_errors():
    assert choose_profile(0, 64, LIMITS) == PREFILL
    assert choose_profile(0, 5, LIMITS) == PREFILL
    assert choose_profile(30, 5, LIMITS) == VERIFY
    assert choose_profile(240, 16, LIMITS) == VERIFY
    with pytest.raises(ContextLengthError, match="max prompt of 64"):
        choose_profile(0, 65, LIMITS)
    with pytest.raises(ContextLengthError, match="--max-verify"):
        choose_profile(30, 17, LIMITS)
    with pytest.raises(ContextLengthError, match="max context"):
        choose_profile(241, 4, LIMITS)


def test_tensor_plan_writes_new_kv_in_place_after_the_past(llama_bundle):
    dims = load_manifest(llama_bundle).target.dims
    cache = DeviceKVCache(dims, 32, np.float16, HostMemory())
    io = {name: 1000 * (i + 1) for i, name in enumerate(["input_ids", "position_ids", "attention_mask", "logits",
                                                           "hidden"])}
    plan = tensor_plan(7, 3, cache, io, dims)
    assert "logits_index" not in plan
    assert tensor_plan(7, 3, cache, {**io, "logits_index": 6000}, dims)["logits_index"] == ((3,), 6000)
    assert plan["attention_mask"] == ((1, 1, 3, 10), io["attention_mask"])
    assert plan["logits"] == ((1, 3, dims.vocab_size), io["logits"])
    kv = (dims.num_kv_heads, dims.head_dim)
    for i in range(dims.num_layers):
        assert plan[f"past_key.{i}"] == ((1, 7, *kv), cache.key_ptrs[i])
        assert plan[f"new_key.{i}"] == ((1, 3, *kv), cache.key_ptrs[i] + 7 * cache.row_bytes)
        assert plan[f"new_value.{i}"] == ((1, 3, *kv), cache.value_ptrs[i] + 7 * cache.row_bytes)
    # every plane is its own region of one allocation: keys and values never alias
    starts = sorted([*cache.key_ptrs, *cache.value_ptrs])
    assert all(b - a == cache.plane_bytes for a, b in zip(starts, starts[1:]))


def _fake_trt(integrated: bool = False, summary: bool = False, **options):
    def factory(bundle_dir, entry, threads=None, role="target", low_memory=None):
        session = _session(bundle_dir / entry.file, 1)
        summary_context = OrtEngineContext(_session(summary_graph_path(), 1)) if summary else None
        return TrtDecoder(bundle_dir, entry, context_factory=lambda profile: OrtEngineContext(session),
                          memory=HostMemory(integrated), limits=LIMITS, summary_context=summary_context, **options)

    return factory


def _ort_on_device_memory(bundle_dir, entry, threads=None, role="target", low_memory=None):
    return OrtDecoder(bundle_dir, entry, threads=1, role=role, memory=HostMemory())


def _ort_device_logits(bundle_dir, entry, threads=None, role="target", low_memory=None):
    return OrtDecoder(bundle_dir, entry, threads=1, role=role, memory=HostMemory(), device_logits=True)


DEVICE_BACKENDS = {"trt-graphs": _fake_trt(), "trt-eager": _fake_trt(graphs=False),
                   "trt-small-buckets": _fake_trt(buckets=(1, 2, 4)), "trt-jetson": _fake_trt(integrated=True),
                   "trt-summary": _fake_trt(summary=True), "trt-summary-eager": _fake_trt(summary=True, graphs=False),
                   "trt-summary-jetson": _fake_trt(summary=True, integrated=True),
                   "ort-device": _ort_on_device_memory, "ort-device-logits": _ort_device_logits}


@pytest.fixture
def fake_backends(monkeypatch):
    for name, factory in DEVICE_BACKENDS.items():
        monkeypatch.setitem(base._BACKENDS, name, base.BackendInfo(name, lambda: True, factory, OrtHeads))


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_device_backends_give_the_tokens_of_onnxruntime(close_bundle, fake_backends, backend):
    """Prefill, chains that are accepted, cut and rolled back, and trees with compaction, through the
    device-cache path (eager, graph replay, or graphs with a fallback for trees wider than every
    bucket): the same greedy tokens as the host ONNX Runtime backend."""
    reference = specrt.load(close_bundle, threads=1)
    gen = specrt.load(close_bundle, backend=backend)
    dims = gen.manifest.target.dims
    for prompt in PROMPTS:
        for method, extra in (("none", {}), ("draft", {"gamma": 4}), ("tree", {"tree": "2,2,1"})):
            want = reference.generate(prompt, max_new_tokens=24, method=method, **extra).token_ids
            out = gen.generate(prompt, max_new_tokens=24, method=method, **extra)
            assert out.token_ids == want, (prompt, method)
            # What a pass brings up from the GPU: every logits row and hidden row, unless host-mapped;
            # with the logits summarised on the device, the summary of the rows the step reads.
            copied = gen._models["target"].copied_bytes
            row = 4 * dims.vocab_size + np.dtype(gen.manifest.target.dtype).itemsize * dims.hidden_size
            rows = len(gen.encode(prompt)) + out.stats.drafted + out.stats.target_passes - 1
            read = 1 + out.stats.drafted + out.stats.target_passes - 1  # prefill's last row, then all
            summary = read * (8 * SUMMARY_TOP_K + 4)
            hidden = np.dtype(gen.manifest.target.dtype).itemsize * dims.hidden_size * rows
            if backend == "ort-device-logits":  # CPU stand-in: ORT's host outputs are not copies
                assert copied == summary, (prompt, method)
            elif backend in ("trt-summary", "trt-summary-eager"):  # hidden rows + the summary
                assert copied == hidden + summary, (prompt, method)
            else:
                assert copied == (0 if backend in ("trt-jetson", "trt-summary-jetson", "ort-device") else row * rows)
    if backend.startswith("trt"):
        decoder = gen._models["target"].decoder
        prefill, verify = decoder.contexts
        assert prefill.runs == len(PROMPTS) * 3  # one prefill per generation
        widths = {g.bucket for g in decoder.graphs.values()}
        if backend in ("trt-graphs", "trt-summary"):  # decode (1), chains of 5 (bucket 8), trees of 11 (16): replayed
            assert {1, 8, 16} <= widths and verify.runs == 0
        elif backend == "trt-small-buckets":  # trees and chains leave the buckets and run eagerly
            assert 1 in widths and widths <= {1, 2, 4} and verify.runs > 0
        elif backend in ("trt-eager", "trt-summary-eager"):
            assert not decoder.graphs and verify.runs > 0
        elif backend.endswith("jetson"):  # integrated GPU: outputs in host-mapped memory, nothing copied back
            assert decoder.memory.host_copies == 0 and decoder.graphs and decoder.summary is None


@pytest.mark.parametrize("sampling", [dict(temperature=0.8, top_p=0.9), dict(temperature=0.7, top_k=20),
                                      dict(temperature=1.0), dict(temperature=1.2, top_k=80)])
@pytest.mark.parametrize("backend", ["ort-device-logits", "trt-summary"])
def test_logits_left_on_the_device_sample_as_host_logits(close_bundle, fake_backends, sampling, backend):
    """Sampling through the summary graph (and the rows it cannot decide, copied up one at a time; a
    top-k wider than its K reads rows) draws the host backend's tokens for the same seed."""
    reference = specrt.load(close_bundle, threads=1)
    gen = specrt.load(close_bundle, backend=backend)
    for method, extra in (("none", {}), ("draft", {"gamma": 4}), ("tree", {"tree": "2,2,1"})):
        for seed in range(2):
            kwargs = dict(max_new_tokens=20, method=method, seed=seed, **sampling, **extra)
            assert gen.generate(PROMPTS[1], **kwargs).token_ids == reference.generate(PROMPTS[1], **kwargs).token_ids


@pytest.mark.parametrize("backend", ["trt-graphs", "trt-eager", "trt-small-buckets", "trt-summary", "trt-jetson",
                                     "ort-device"])
def test_eagle_heads_on_device_backends_give_the_tokens_of_onnxruntime(eagle_bundle, fake_backends, backend):
    """The target's taps come back from the engine, the head's taps and features go down to it, through
    eager passes and captured graphs (padded to the bucket) alike: the host backend's tokens, greedy and
    sampled, for the chain and the dynamic tree."""
    reference = specrt.load(eagle_bundle, threads=1)
    gen = specrt.load(eagle_bundle, backend=backend)
    runs = [dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,5"),
            dict(method="eagle", gamma=2, temperature=0.8, seed=1),
            dict(method="eagle-tree", eagle_tree="2,2,4", temperature=0.8, top_k=20, seed=2)]
    for prompt in PROMPTS:
        for kwargs in runs:
            want = reference.generate(prompt, max_new_tokens=20, **kwargs).token_ids
            assert gen.generate(prompt, max_new_tokens=20, **kwargs).token_ids == want, (prompt, kwargs)
    if backend in ("trt-graphs", "trt-summary", "trt-jetson"):  # the head's steps replay captured graphs too
        assert gen._models["eagle"].decoder.graphs and gen._models["target"].decoder.graphs


def test_tensorrt_profiles_cover_the_heads_inputs(eagle_bundle):
    from specrt.export.tensorrt import BuildOptions, profiles

    manifest = load_manifest(eagle_bundle)
    opts = BuildOptions(max_context=256, max_prompt=64, max_verify=16)
    head, target = manifest.models["eagle"], manifest.target
    for shapes in profiles(head, opts):
        (lo, _, hi), (flo, _, fhi) = shapes["eagle_taps"], shapes["eagle_features"]
        assert lo[2] == hi[2] == head.tap_width and flo[2] == fhi[2] == head.dims.hidden_size
        assert hi[1] == shapes["input_ids"][2][1]  # one row per new position
    assert all("eagle_taps" not in shapes for shapes in profiles(target, opts))  # an output of the target


def test_tensorrt_needs_engines_and_auto_skips_it_without_them(close_bundle, tmp_path, monkeypatch):
    manifest = load_manifest(close_bundle)
    with pytest.raises(ConfigError, match="specrt build --bundle"):
        engine_record(manifest, role_of(manifest, manifest.target), close_bundle)
    info = base._BACKENDS["tensorrt"]
    monkeypatch.setitem(base._BACKENDS, "tensorrt", base.BackendInfo("tensorrt", lambda: True, info.factory,
                                                                     info.heads, info.accepts))
    assert base._backend("auto", close_bundle).name == "onnxruntime"
    built = tmp_path / "bundle"
    shutil.copytree(close_bundle, built)
    manifest = json.loads((built / "specrt.json").read_text())
    manifest["engines"] = {"target": {"file": "engines/target-x.engine", "key": "x", "tensorrt": "10.9", "sm": "9.0",
                                      "options": {"max_context": 256, "max_prompt": 64, "max_verify": 16}}}
    (built / "specrt.json").write_text(json.dumps(manifest))
    assert base._backend("auto", built).name == "tensorrt"
    built_manifest = load_manifest(built)
    record = engine_record(built_manifest, "target", built)
    check_engine(record, "10.9", "9.0")
    with pytest.raises(ConfigError, match="rerun `specrt build`"):
        check_engine(record, "10.13", "9.0")
    assert role_of(built_manifest, built_manifest.draft) == "draft"
    with pytest.raises(ConfigError, match="no TensorRT engine for its draft"):
        engine_record(built_manifest, "draft", built)


def test_tensorrt_medusa_heads_return_what_onnxruntime_returns(medusa_bundle):
    file = load_manifest(medusa_bundle).medusa.file
    session = _session(medusa_bundle / file, 1)
    dtypes = {x.name: np.dtype(ORT_TYPES[x.type]) for x in [*session.get_inputs(), *session.get_outputs()]}
    heads = TrtHeads(medusa_bundle, file, context=OrtEngineContext(session), memory=HostMemory(), dtypes=dtypes,
                     max_rows=8)
    reference = OrtHeads(medusa_bundle, file, threads=1)
    hidden = np.random.default_rng(0).standard_normal((1, 3, heads_hidden(medusa_bundle))).astype(np.float32)
    (ids, lp), (ref_ids, ref_lp) = heads(hidden), reference(hidden)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(lp, ref_lp, rtol=0, atol=1e-6)
    with pytest.raises(ContextLengthError, match="max of 8"):
        heads(np.zeros((1, 9, hidden.shape[2]), np.float32))


def heads_hidden(bundle) -> int:
    return load_manifest(bundle).target.dims.hidden_size


def _cuda_devices() -> int:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return 0
    err, count = cudart.cudaGetDeviceCount()
    return count if int(err) == 0 else 0


@pytest.mark.skipif(_cuda_devices() == 0, reason="needs cuda-python and a GPU")
def test_cuda_memory_cache_compaction_on_the_gpu(llama_bundle):
    """The real cudaMemcpy2DAsync path of DeviceKVCache against the host cache (the GPU check's own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[2] / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.kv_cache_check(llama_bundle)["rows_compared"] == 27


@pytest.mark.skipif(not _trt_available() or _cuda_devices() == 0, reason="needs TensorRT, cuda-python and a GPU")
def test_tensorrt_engines_give_the_tokens_of_onnxruntime(close_bundle, tmp_path):
    from specrt.export.tensorrt import BuildOptions, build_bundle_engines

    bundle = tmp_path / "bundle"
    shutil.copytree(close_bundle, bundle)
    build_bundle_engines(bundle, BuildOptions(max_context=256, max_prompt=64, max_verify=16))  # fp32, as the graphs
    reference, gen = specrt.load(close_bundle, threads=1), specrt.load(bundle, backend="tensorrt")
    for prompt in PROMPTS:  # other kernels than ORT's: compare the first tokens, where near-ties are unlikely
        want = reference.generate(prompt, max_new_tokens=8, method="none").token_ids
        assert gen.generate(prompt, max_new_tokens=8, method="draft", gamma=4).token_ids == want


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers() and _cuda_devices() > 0


@pytest.mark.skipif(not _ort_has_cuda(), reason="needs onnxruntime-gpu, cuda-python and a GPU")
@pytest.mark.parametrize("graph", ["fused", "gqa"])
def test_onnxruntime_cuda_keeps_the_cache_on_the_device(graph, close_bundle, gqa_close_bundle):
    gen = specrt.load(close_bundle if graph == "fused" else gqa_close_bundle)
    model = gen._models["target"]
    assert model.decoder.provider == "CUDAExecutionProvider" and isinstance(model.cache, DeviceKVCache)
    want = gen.generate(PROMPTS[0], max_new_tokens=16, method="none").token_ids
    for method, extra in (("draft", {"gamma": 4}), ("tree", {"tree": "2,2,1"})):  # rollback and compaction
        assert gen.generate(PROMPTS[0], max_new_tokens=16, method=method, **extra).token_ids == want


class RefusingContext(OrtEngineContext):
    """An execution context that refuses a setting, as TensorRT does by returning False."""

    def __init__(self, session, refuse: str) -> None:
        super().__init__(session)
        self.refuse = refuse

    def set_input_shape(self, name: str, shape) -> bool:
        return self.refuse != "shape" and super().set_input_shape(name, shape)

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        return self.refuse != "address" and super().set_tensor_address(name, ptr)


@pytest.mark.parametrize("refuse,match", [("shape", "refused the shape"), ("address", "refused the address")])
def test_a_refused_tensorrt_binding_is_an_error_not_a_stale_run(close_bundle, refuse, match):
    entry = load_manifest(close_bundle).target
    session = _session(close_bundle / entry.file, 1)
    dec = TrtDecoder(close_bundle, entry, context_factory=lambda profile: RefusingContext(session, refuse),
                     memory=HostMemory(), limits=LIMITS, graphs=False)
    cache = dec.new_cache(64)
    with pytest.raises(SpecrtError, match=match):
        dec.forward(cache, np.array([1, 2, 3]), np.arange(3), causal_mask(3, 0))


@pytest.mark.parametrize("row_bytes", [64, 128, 256, 384])
def test_every_tensorrt_binding_is_aligned_whatever_the_row_size(row_bytes):
    """New K/V at ptr + past * row_bytes are 256-byte aligned only for some lengths: the eager pass
    then writes to an aligned scratch block and copies the rows into the cache afterwards."""
    from specrt.bundle.contract import ModelDims
    from specrt.bundle.manifest import ModelEntry

    dims = ModelDims(num_layers=2, num_heads=2, num_kv_heads=1, head_dim=row_bytes // 4, hidden_size=16,
                     vocab_size=50)
    entry = ModelEntry(file="x.onnx", source="x", architecture="llama", dtype="float32", dims=dims)
    mem = HostMemory()
    dec = TrtDecoder(Path("."), entry, context_factory=lambda profile: None, memory=mem, limits=LIMITS, graphs=False)
    cache = DeviceKVCache(dims, 37, np.float32, mem)  # 37 rows: plane sizes that are no multiple of 256
    in_place = 0
    for past in range(0, 30):
        cache.length = past
        scratch = dec.scratch_for(cache)
        in_place += scratch is None
        plan = tensor_plan(past, 3, cache, dec.io, dims, new_kv=scratch.new_kv if scratch else None)
        misaligned = {name: ptr % 256 for name, (_, ptr) in plan.items() if ptr % 256}
        assert not misaligned, (row_bytes, past, misaligned)
    assert in_place == {64: 8, 128: 15, 256: 30, 384: 15}[row_bytes]  # in place whenever it is aligned


class FakeCudart:
    """The cuda.bindings.runtime calls CudaMemory makes around a capture, answering as the real
    functions do ((error, value) tuples, error 0 = success), and a log of them."""

    class cudaStreamCaptureMode:
        cudaStreamCaptureModeThreadLocal = 1

    def __init__(self) -> None:
        self.log: list[str] = []

    def _call(self, name, *result):
        self.log.append(name)
        return (0, *result)

    def cudaStreamBeginCapture(self, stream, mode):
        return self._call("begin")

    def cudaStreamEndCapture(self, stream):
        # After a failure inside the capture the real call reports the invalidated capture.
        return (901, None) if "raised" in self.log else self._call("end", "graph")

    def cudaGraphInstantiate(self, graph, flags):
        return self._call("instantiate", "executable")

    def cudaGraphDestroy(self, graph):
        return self._call("destroy graph")

    def cudaGraphExecDestroy(self, graph):
        return self._call("destroy executable")

    def cudaStreamSynchronize(self, stream):
        return self._call("sync")

    def cudaStreamDestroy(self, stream):
        return self._call("destroy stream")

    def cudaFree(self, ptr):
        return self._call("free")

    def cudaFreeHost(self, ptr):
        return self._call("free host")

    def cudaGetErrorName(self, err):
        return (0, b"cudaErrorStreamCaptureInvalidated")


def _cuda_memory_on(rt):
    from specrt.runtime.backends.cuda import CudaMemory

    mem = object.__new__(CudaMemory)  # what __init__ sets, without a device
    mem._rt, mem.stream, mem.integrated, mem._owned, mem._owned_host, mem._graphs = rt, "stream", False, [], [], []
    return mem


def test_a_failure_inside_a_capture_is_the_error_raised_not_the_capture_s():
    rt = FakeCudart()
    mem = _cuda_memory_on(rt)

    def work():
        rt.log.append("raised")
        raise ValueError("the real problem")

    with pytest.raises(ValueError, match="the real problem"):
        mem.capture(work)
    assert rt.log == ["begin", "raised"] and mem._graphs == []


def test_captured_graphs_and_the_stream_are_released():
    rt = FakeCudart()
    mem = _cuda_memory_on(rt)
    assert mem.capture(lambda: None) == "executable"
    assert rt.log == ["begin", "end", "instantiate", "destroy graph"]
    mem._owned.append(1)
    mem.__del__()
    assert rt.log[4:] == ["sync", "destroy executable", "free", "destroy stream"]
