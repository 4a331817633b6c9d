"""TensorRT build logic on the CPU (profiles, cache keys, options, Jetson defaults, the clear error when
TensorRT is absent); the engine build itself runs where TensorRT and a GPU exist."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from specrt.bundle.contract import ModelDims
from specrt.bundle.manifest import ModelEntry
from specrt.cli import main
from specrt.errors import ConfigError
from specrt.export.tensorrt import (
    BuildOptions,
    engine_key,
    heads_profiles,
    jetson_defaults,
    profiles,
)

ENTRY = ModelEntry(file="target.onnx", source="x", architecture="llama", dtype="float16",
                   dims=ModelDims(num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64, hidden_size=512,
                                  vocab_size=4096))


def test_profiles_cover_prefill_and_verify():
    prefill, verify = profiles(ENTRY, BuildOptions(max_context=1024, max_prompt=512, max_verify=32))
    assert prefill["input_ids"] == ((1, 1), (1, 128), (1, 512))
    assert prefill["past_key.0"] == ((1, 0, 2, 64),) * 3  # prefill has no past
    assert verify["input_ids"][2] == (1, 32)
    assert verify["past_value.1"] == ((1, 0, 2, 64), (1, 512, 2, 64), (1, 992, 2, 64))
    # The mask's last axis is always past + query.
    for prof in (prefill, verify):
        for (b, one, q, s), (_, p, _, _) in zip(prof["attention_mask"], prof["past_key.0"]):
            assert s == p + q
    assert len(verify) == 3 + 2 * 2
    # Every profile is ordered min <= opt <= max on every axis, also when max_verify > max_context / 2.
    for opts in (BuildOptions(max_context=1024, max_prompt=512, max_verify=32),
                 BuildOptions(max_context=64, max_prompt=64, max_verify=48), BuildOptions(max_context=16, max_prompt=16, max_verify=16)):
        for prof in profiles(ENTRY, opts):
            for lo, mid, hi in prof.values():
                assert all(a <= b <= c for a, b, c in zip(lo, mid, hi)), (opts, lo, mid, hi)


def test_profiles_give_logits_index_the_query_s_rows():
    """A graph with logits_index: TensorRT computes every row's logits, so R ranges as Q does."""
    from dataclasses import replace

    opts = BuildOptions(max_context=1024, max_prompt=512, max_verify=32)
    for prof in profiles(replace(ENTRY, logits_index=True), opts):
        assert prof["logits_index"] == tuple((q,) for _, q in prof["input_ids"])
    assert all("logits_index" not in prof for prof in profiles(ENTRY, opts))


def test_engine_key_changes_with_everything_that_changes_the_engine():
    opts = BuildOptions()
    shapes = profiles(ENTRY, opts)
    base = engine_key("abc", "10.3", "8.7", opts, shapes)
    assert base == engine_key("abc", "10.3", "8.7", opts, shapes)
    assert len({base, engine_key("abd", "10.3", "8.7", opts, shapes), engine_key("abc", "10.4", "8.7", opts, shapes),
                engine_key("abc", "10.3", "9.0", opts, shapes),
                engine_key("abc", "10.3", "8.7", BuildOptions(precision="bf16"), shapes),
                engine_key("abc", "10.3", "8.7", opts, profiles(ENTRY, BuildOptions(max_context=4096)))}) == 6


def test_options_validation_and_jetson_defaults():
    for bad in (dict(precision="fp4"), dict(precision="int8"), dict(max_context=0), dict(max_prompt=5000)):
        with pytest.raises(ConfigError):
            BuildOptions(**bad)
    j = jetson_defaults(30_000, BuildOptions(precision="bf16", workspace_mb=99_999))
    assert j.jetson and j.precision == "bf16" and j.workspace_mb == 4096
    assert jetson_defaults(1_000, BuildOptions()).workspace_mb == 500


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_build_without_tensorrt_is_a_one_line_error(llama_bundle):
    res = CliRunner().invoke(main, ["build", "--bundle", str(llama_bundle)])
    assert res.exit_code == 1 and "TensorRT is not available" in res.output and "specrt[trt]" in res.output
    assert "Traceback" not in res.output


def _gpu_with_tensorrt() -> bool:
    try:
        from specrt.export.tensorrt import require_tensorrt

        require_tensorrt()
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _gpu_with_tensorrt(), reason="needs TensorRT and an NVIDIA GPU")
def test_build_engines_and_cache(llama_bundle, tmp_path):
    import shutil

    from specrt.bundle.manifest import load_manifest
    from specrt.export.tensorrt import build_bundle_engines

    bundle = tmp_path / "b"
    shutil.copytree(llama_bundle, bundle)
    opts = BuildOptions(max_context=256, max_prompt=128, max_verify=16, workspace_mb=512)
    first = build_bundle_engines(bundle, opts)
    assert (bundle / first["target"]["file"]).stat().st_size > 0
    assert load_manifest(bundle).engines["target"]["key"] == first["target"]["key"]
    assert build_bundle_engines(bundle, opts) == first  # cached: same key, same file


def test_heads_profile_covers_one_verify_pass():
    (profile,) = heads_profiles(64, BuildOptions(max_verify=24))
    assert profile == {"hidden": ((1, 1, 64), (1, 8, 64), (1, 24, 64))}


# ---- the builder's call sequence against stand-ins of the real TensorRT 10.13 and 11.4 bindings
from support.trt_standin import VERSIONS, Names, make_tensorrt  # noqa: E402


def test_the_stand_ins_come_from_both_api_generations():
    assert [v.split(".")[0] for v in VERSIONS] == ["10", "11"]
    old, new = (make_tensorrt(v) for v in VERSIONS)
    assert old.BuilderFlag.FP16 is not None and old.NetworkDefinitionCreationFlag.EXPLICIT_BATCH is not None
    with pytest.raises(AttributeError):  # removed in TensorRT 11: the build read it and died there
        new.BuilderFlag.FP16
    with pytest.raises(AttributeError):
        new.BuilderFlag.BF16
    assert new.NetworkDefinitionCreationFlag.STRONGLY_TYPED == old.NetworkDefinitionCreationFlag.STRONGLY_TYPED


# What the runtime backend calls on TensorRT objects: every name exists in both generations.
RUNTIME_NAMES = ("Runtime", "Logger", "deserialize_cuda_engine", "create_execution_context",
                 "set_optimization_profile_async", "get_tensor_dtype", "set_input_shape", "set_tensor_address",
                 "execute_async_v3", "num_io_tensors", "get_tensor_name", "get_tensor_mode")


@pytest.mark.parametrize("version", VERSIONS)
def test_runtime_names_exist_in_the_bindings(version):
    names = Names(version)
    assert [n for n in RUNTIME_NAMES if n not in names] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_build_runs_its_whole_call_sequence_on_both_tensorrt_generations(version, llama_bundle, tmp_path, monkeypatch):
    import shutil

    from specrt.bundle.manifest import load_manifest
    from specrt.export import tensorrt

    trt = make_tensorrt(version)
    monkeypatch.setattr(tensorrt, "require_tensorrt", lambda: trt)
    bundle = tmp_path / "b"
    shutil.copytree(llama_bundle, bundle)
    m = load_manifest(bundle)
    opts = BuildOptions(max_context=64, max_prompt=32, max_verify=48)  # max_verify > max_context / 2 too
    engine = tmp_path / "t.engine"
    tensorrt.build_engine(bundle / m.target.file, engine, profiles(m.target, opts), opts, tmp_path / "timing")
    assert json.loads(engine.read_bytes())["strongly_typed"] and (tmp_path / "timing").is_file()
    (_, network, config), = trt.calls
    assert network.strongly_typed and config.flags == []  # the graph's types decide, no precision flags
    assert len(config.profiles) == 2 and set(config.profiles[1].shapes) == set(profiles(m.target, opts)[1])


def test_precision_comes_from_the_graphs():
    from specrt.export.tensorrt import resolve_precision

    assert resolve_precision([ENTRY, ENTRY], None) == "fp16" and resolve_precision([ENTRY], "fp16") == "fp16"
    with pytest.raises(ConfigError, match="export with --dtype bf16"):
        resolve_precision([ENTRY], "bf16")


@pytest.mark.parametrize("version", VERSIONS)
def test_built_engines_load_and_decode_on_both_tensorrt_generations(version, portable_close_bundle, tmp_path,
                                                                      monkeypatch):
    """specrt build, then specrt run with backend tensorrt: the runtime's whole call sequence (engine
    check, deserialisation, a context per profile, bindings, graph capture) against the stand-in of
    each TensorRT generation, on host memory; greedy tokens equal ONNX Runtime's."""
    import shutil
    import sys

    from support.fake_device import HostMemory
    from support.trt_standin import fake_cudart

    import specrt
    from specrt.bundle.contract import SUMMARY_TOP_K
    from specrt.export import tensorrt
    from specrt.runtime.backends import tensorrt as trt_backend

    trt = make_tensorrt(version)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    for name, module in fake_cudart().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(trt_backend, "CudaMemory", HostMemory)
    bundle = tmp_path / "bundle"
    shutil.copytree(portable_close_bundle, bundle)
    built = tensorrt.build_bundle_engines(bundle, BuildOptions(max_context=128, max_prompt=64, max_verify=16))
    assert built["target"]["tensorrt"] == version and built["target"]["options"]["precision"] == "fp32"
    gen, reference = specrt.load(bundle), specrt.load(portable_close_bundle, threads=1)
    assert gen.decoders["target"].provider == "TensorRT"  # auto picks the engines
    for method in ("none", "draft", "tree"):
        assert (gen.generate("def fib(n):", max_new_tokens=20, method=method).token_ids
                == reference.generate("def fib(n):", max_new_tokens=20, method=method).token_ids), method
    assert [c.profile for c in gen.decoders["target"].contexts] == [0, 1]
    # The logits summary engine was built and read: a pass's logits stayed where the engine wrote them.
    assert set(built) == {"target", "draft", "summary"} and gen.decoders["target"].summary is not None
    out = gen.generate("def fib(n):", max_new_tokens=20, method="draft")
    st, hidden_row = out.stats, 4 * gen.manifest.target.dims.hidden_size
    rows, read = st.prompt_tokens + st.drafted + st.target_passes - 1, 1 + st.drafted + st.target_passes - 1
    assert st.d2h_bytes_per_target_pass * st.target_passes == rows * hidden_row + read * (8 * SUMMARY_TOP_K + 4)


def test_summary_profile_covers_every_vocabulary_and_the_widest_pass():
    import onnx

    from specrt.bundle.contract import summary_graph_path
    from specrt.export.tensorrt import summary_profiles

    (profile,) = summary_profiles([152_064, 151_936], BuildOptions(max_context=512, max_prompt=256, max_verify=32))
    assert profile == {"logits": ((1, 151_936), (8, 152_064), (256, 152_064))}
    graph = onnx.load(summary_graph_path()).graph
    dynamic = {i.name for i in graph.input if any(d.dim_param for d in i.type.tensor_type.shape.dim)}
    assert set(profile) == dynamic  # a profile for every dynamic input, none for the static [1] temperature
