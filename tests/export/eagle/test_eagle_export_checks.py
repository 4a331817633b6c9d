"""`specrt export --eagle` beyond the graphs: quantize and TensorRT with a head, and the refusals (bad heads and
targets, each one line, nothing left behind). The bundles come from conftest.py; test_eagle_export.py checks
their graphs."""

from __future__ import annotations

import json
import re
import shutil

import onnx
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from support.eagle_export_cases import HIDDEN, LAYERS
from support.models import save_eagle_head, save_model

from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import ConfigError, EagleHeadError
from specrt.export.eagle import graph as eagle_export
from specrt.export.quant.quantize import QuantizeOptions, describe, quantize_bundle

# --- quantize and TensorRT ----------------------------------------------------------------------------


def test_quantize_can_keep_the_head_float_and_unchanged(portable_bundle, tmp_path):
    out = tmp_path / "int8"
    q = quantize_bundle(portable_bundle, out, QuantizeOptions(bits=8, block_size=16, eagle_bits=None))
    m = load_manifest(portable_bundle)
    assert q.eagle.quantization is None and q.target.quantization["bits"] == 8
    assert q.draft.quantization["bits"] == 8
    assert (q.eagle.eagle_taps, q.eagle.tap_width, q.eagle.vocab_map, q.eagle.parity) == (
        m.eagle.eagle_taps, m.eagle.tap_width, m.eagle.vocab_map, m.eagle.parity)
    assert q.target.eagle_taps == m.target.eagle_taps
    for name in ("eagle.onnx", "eagle_vocab.npy"):
        assert (out / name).read_bytes() == (portable_bundle / name).read_bytes()
    graph = onnx.load(str(out / "target.onnx"))
    assert [o.name for o in graph.graph.output][2] == C.EAGLE_TAPS
    assert "eagle: float32 (not quantized)" in describe(load_manifest(out))
    # What the quantized target costs the float head, recorded with the target: teacher-forced first-draft
    # acceptance on the float pair and on this one
    acc = q.target.quantization["eagle_acceptance"]
    assert 0 <= acc["quantized"] <= 1 and abs(acc["quantized"] - acc["float"]) <= 0.1
    assert "first-draft acceptance" in describe(load_manifest(out))
    from specrt.export.quant.quality import head_acceptance

    same = head_acceptance([portable_bundle, portable_bundle], m, ["def fib(n):\n    return", "import os\n"])
    assert same[0] == same[1]


def _weight_matmuls(path) -> tuple[int, int]:
    """(float MatMuls with a constant weight, MatMulNBits) in the graph at ``path``."""
    graph = onnx.load(str(path)).graph
    weights = {t.name for t in graph.initializer}
    return (sum(n.op_type == "MatMul" and n.input[1] in weights for n in graph.node),
            sum(n.op_type == "MatMulNBits" for n in graph.node))


@pytest.mark.parametrize("target_bits", [8, None])
def test_quantize_quantizes_the_head_and_eagle_stays_exact(portable_bundle, tmp_path, target_bits):
    """By default the head follows the target's bits; a float target may have an int8 head alone. Either
    way eagle's greedy tokens are the (quantized or float) target's own."""
    from specrt import load

    out = tmp_path / "q"
    q = quantize_bundle(portable_bundle, out, QuantizeOptions(bits=target_bits, block_size=16, eagle_bits=8,
                                                              draft_bits=None))
    float_left, nbits = _weight_matmuls(out / "eagle.onnx")
    assert float_left == 0 and nbits == len(q.eagle.quantization["quantized_matmuls"]) >= 6
    # its copy of the target's embedding table is int8 as well, and no float copy is left behind
    head_graph = onnx.load(str(out / "eagle.onnx")).graph
    assert [n.op_type for n in head_graph.node if "Gather" in n.op_type and n.input[0].endswith(".int8")] == [
        "GatherBlockQuantized"] and q.eagle.quantization["quantized_lookups"]
    table = [q.target.dims.vocab_size, HIDDEN]
    assert not [i.name for i in head_graph.initializer if list(i.dims) == table and
                i.data_type == onnx.TensorProto.FLOAT]
    assert q.eagle.weight_bytes < load_manifest(portable_bundle).eagle.weight_bytes
    assert (out / "eagle_vocab.npy").read_bytes() == (portable_bundle / "eagle_vocab.npy").read_bytes()
    acc = q.eagle.quantization["eagle_acceptance"]
    assert 0 <= acc["quantized"] <= 1 and abs(acc["quantized"] - acc["float"]) <= 0.15
    if target_bits is None:
        assert q.target.quantization is None
        assert (out / "target.onnx").read_bytes() == (portable_bundle / "target.onnx").read_bytes()
    lines = describe(load_manifest(out))
    assert "eagle: int8" in lines and "first-draft acceptance" in lines
    gen = load(out)
    prompt = "def fib(n):\n    "
    plain = gen.generate(prompt, method="none", max_new_tokens=24)
    assert gen.generate(prompt, method="eagle", max_new_tokens=24, gamma=3).token_ids == plain.token_ids


def test_quantizing_only_the_draft_of_a_bundle_with_a_head_leaves_the_head_alone(portable_bundle, tmp_path):
    q = quantize_bundle(portable_bundle, tmp_path / "q", QuantizeOptions(bits=None, block_size=16, draft_bits=8,
                                                                         eagle_bits=None))
    assert q.draft.quantization["bits"] == 8 and q.target.quantization is None and q.eagle.quantization is None
    assert (tmp_path / "q" / "eagle.onnx").read_bytes() == (portable_bundle / "eagle.onnx").read_bytes()
    assert "eagle_acceptance" not in q.draft.quantization  # nothing the head reads or is changed


def test_quantize_with_nothing_to_quantize_is_a_one_line_error():
    with pytest.raises(ConfigError, match="nothing to quantize"):
        QuantizeOptions(bits=None, draft_bits="same", eagle_bits=None)


def test_tensorrt_builds_the_head_and_runs_it(portable_bundle, tmp_path, monkeypatch):
    """specrt build on a bundle with a head, then eagle and eagle-tree on the engines: the builder's and the
    runtime's call sequences against the TensorRT stand-in, on host memory; ONNX Runtime's greedy tokens."""
    import shutil
    import sys

    from support.fake_device import HostMemory
    from support.trt_standin import VERSIONS, fake_cudart, make_tensorrt

    import specrt
    from specrt.export.tensorrt import BuildOptions, build_bundle_engines
    from specrt.runtime.backends import tensorrt as trt_backend

    monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt(VERSIONS[-1]))
    for name, module in fake_cudart().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(trt_backend, "CudaMemory", HostMemory)
    bundle = tmp_path / "bundle"
    shutil.copytree(portable_bundle, bundle)
    built = build_bundle_engines(bundle, BuildOptions(max_context=128, max_prompt=64, max_verify=16))
    assert {"target", "eagle", "summary"} <= set(built)
    gen, reference = specrt.load(bundle), specrt.load(portable_bundle, threads=1)
    for kwargs in (dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,6")):
        want = reference.generate("def fib(n):", max_new_tokens=20, **kwargs).token_ids
        assert gen.generate("def fib(n):", max_new_tokens=20, **kwargs).token_ids == want, kwargs
    assert gen.decoders["eagle"].provider == "TensorRT"
    # The same bundle on another machine (another user's cache): its engines came with it, so they are
    # not loaded unless trusted explicitly, and `specrt build` rebuilds rather than reusing them.
    from specrt.errors import BundleError

    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(BundleError, match="was not built on this machine by `specrt build`"):
        specrt.load(bundle, backend="tensorrt")
    monkeypatch.setenv("SPECRT_TRUST_ENGINES", "1")
    assert specrt.load(bundle, backend="tensorrt").decoders["target"].provider == "TensorRT"
    monkeypatch.delenv("SPECRT_TRUST_ENGINES")
    seen = []
    build_bundle_engines(bundle, BuildOptions(max_context=128, max_prompt=64, max_verify=16),
                         progress=lambda role, cached: seen.append(cached))
    assert seen and not any(seen)  # every engine rebuilt, none reused from the bundle
    assert specrt.load(bundle, backend="tensorrt").decoders["target"].provider == "TensorRT"


# --- bad input: one line, exit 1, nothing written -------------------------------------------------------


def _eagle12(folder, hidden: int, vocab: int) -> None:
    """An EAGLE-1/2 checkpoint: layers.0.*, fc over cat(embedding, feature) with a bias, no lm_head/d2t."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": vocab}))
    state = {"fc.weight": torch.randn(hidden, 2 * hidden), "fc.bias": torch.randn(hidden)}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"layers.0.self_attn.{n}.weight"] = torch.randn(hidden, hidden)
    save_file(state, str(folder / "model.safetensors"))


BAD = {
    "another hidden size": (None, "hidden size 32 .*this target's is 64"),
    "another vocabulary": (None, "vocab_size is 400; this target's is 336"),
    "EAGLE-1 layout": (None, "EAGLE-1/2 checkpoint"),
    "a d2t out of range": (None, r"outside \[0, 336\)"),
    "another layer count": (None, "taps target layer 6 but the target has only 5 layers"),
    "gemma2 target": ("gemma2", "gemma2 is not one: Gemma scales its token embedding"),
    "gpt2 target": ("gpt2", "gpt2 is not one: GPT-2 adds learned absolute positions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_heads_and_targets_are_one_line_errors(sources, tmp_path, case):
    arch, message = BAD[case]
    target = sources["target"]
    if arch is not None:
        target = save_model(tmp_path / arch, arch, seed=1, layers=4)
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64)  # a fine head for that target
    elif case == "another hidden size":
        narrow = save_model(tmp_path / "narrow", "llama", seed=1, layers=LAYERS, hidden=32)
        head = save_eagle_head(tmp_path / "head", narrow, draft_vocab=64)
    elif case == "another vocabulary":
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64, config_overrides={"vocab_size": 400})
    elif case == "EAGLE-1 layout":
        head = tmp_path / "head"
        _eagle12(head, HIDDEN, 336)
    elif case == "another layer count":
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64, taps=(2, 4, 6))
    else:
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64)
        state = load_file(str(head / "model.safetensors"))
        state["d2t"][-1] = 1000
        save_file(state, str(head / "model.safetensors"))
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    res = CliRunner().invoke(main, ["export", str(target), "--eagle", str(head), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    errors = [line for line in res.output.strip().splitlines() if line.startswith("Error")]
    assert len(errors) == 1, res.output
    assert re.search(message, errors[0]), errors[0]
    assert not out.exists() and set(tmp_path.iterdir()) == before


def test_unsupported_targets_are_named():
    for arch in eagle_export.EAGLE_TARGETS:
        eagle_export.check_eagle_target(arch)
    with pytest.raises(EagleHeadError, match="gemma3_text is not one"):
        eagle_export.check_eagle_target("gemma3_text")
    with pytest.raises(EagleHeadError, match="falcon is not one: not a llama-style rotary decoder"):
        eagle_export.check_eagle_target("falcon")


@pytest.mark.parametrize("flags", [["--quantize", "int8"], ["--eagle-quantize", "int8"]])
def test_quantized_export_with_a_head_leaves_only_the_bundle(sources, tmp_path, flags):
    """`specrt export --eagle --quantize`: float export beside the output, quantized, float removed. The head
    follows the target's bits, or is quantized alone on a float target."""
    out = tmp_path / "int8"
    res = CliRunner().invoke(main, ["export", str(sources["target"]), "--eagle", str(sources["shuffled"]),
                                    "--exporter", "torchscript", *flags, "--block-size", "16", "--no-measure",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "eagle: int8 (blocks of 16" in res.output
    assert [p.name for p in tmp_path.iterdir()] == ["int8"]
    m = load_manifest(out)
    assert m.eagle is not None and (out / m.eagle.vocab_map).is_file() and m.eagle.quantization["bits"] == 8
    assert (m.target.quantization or {}).get("bits") == (8 if "--quantize" in flags else None)
    shutil.rmtree(out)
