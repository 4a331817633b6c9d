"""The static gqa graph (``--graph gqa-static``): lengths from ``seqlens_k``, no mask (causal only).

On CPU ONNX Runtime it must compute exactly what the gqa graph computes, for a prefill, plain steps and a
multi-row chain verify; no GroupQueryAttention of it (target or EAGLE-3 head) has the attention_bias that ORT's
CUDA kernel refuses; its bundle records the graph kind, decodes the gqa bundle's tokens with chains and refuses
tree methods in one line.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from support.ort_graph_standin import cuda_gqa_refusal
from support.refusals import assert_rewrite_refused_unchanged

import specrt
from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError
from specrt.export.graph.gqa_static import rewrite_static
from specrt.runtime.masks import causal_mask

PROMPT = "def fib(n):"
CAPACITY = 40


def _run(session, static: bool, buffers: list[np.ndarray], ids, pos, mask, past: int) -> np.ndarray:
    """One pass on ``buffers`` (each layer's K and V buffer, bound as past and present): its logits [Q, V]. The
    static graph takes no mask: its causality is ``mask``."""
    q_len = len(ids)
    feed = {C.INPUT_IDS: np.array([ids]), C.POSITION_IDS: np.array([pos]), C.LOGITS_INDEX: np.arange(q_len)}
    if static:
        feed[C.SEQLENS_K] = np.array([past + q_len - 1], np.int32)
    else:
        feed[C.ATTENTION_MASK] = mask
    binding = session.io_binding()
    for name, value in feed.items():
        binding.bind_cpu_input(name, value)
    for i, buf in enumerate(buffers):
        layer, value = divmod(i, 2)
        past_name, present = ((C.past_value(layer), C.present_value(layer)) if value
                              else (C.past_key(layer), C.present_key(layer)))
        binding.bind_input(past_name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        binding.bind_output(present, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
    binding.bind_output(C.LOGITS, "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[-1][0]


def _passes(path, static: bool, dims) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    buffers = [np.zeros((1, dims.num_kv_heads, CAPACITY, dims.head_dim), np.float32) for _ in range(2 * dims.num_layers)]
    return [_run(session, static, buffers, list(range(3, 9)), list(range(6)), causal_mask(6, 0), 0),  # prefill
            _run(session, static, buffers, [5], [6], causal_mask(1, 6), 6),  # plain steps
            _run(session, static, buffers, [8], [7], causal_mask(1, 7), 7),
            _run(session, static, buffers, [7, 9], [8, 9], causal_mask(2, 8), 8),  # a chain verified
            # one of the chain accepted: the next chain writes over its rejected row 9
            _run(session, static, buffers, [5, 7, 11, 4], [9, 10, 11, 12], causal_mask(4, 9), 9)]


def test_the_static_graph_computes_exactly_what_the_gqa_graph_does(gqa_close_bundle, tmp_path):
    for role, entry in load_manifest(gqa_close_bundle).models.items():
        model = onnx.load(str(gqa_close_bundle / entry.file))
        rewrite_static(model, entry.dims)
        onnx.save(model, str(tmp_path / f"{role}.onnx"))
        want = _passes(gqa_close_bundle / entry.file, False, entry.dims)
        got = _passes(tmp_path / f"{role}.onnx", True, entry.dims)
        for a, b in zip(want, got):
            assert a.shape == b.shape and np.array_equal(a, b), role


def _graph(bundle, entry) -> onnx.ModelProto:
    return onnx.load(str(bundle / entry.file), load_external_data=False)


def test_its_lengths_are_inputs_and_it_takes_no_mask(gqa_static_close_bundle, gqa_close_bundle, eagle_static_bundle):
    manifest = load_manifest(gqa_static_close_bundle)
    assert {e.graph for e in manifest.models.values()} == {"gqa-static"}
    model = _graph(gqa_static_close_bundle, manifest.target)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert inputs[C.SEQLENS_K] == ["batch"] and C.ATTENTION_MASK not in inputs
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert {n.input[5] for n in gqa} == {C.SEQLENS_K}
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["GroupQueryAttention"] == manifest.target.dims.num_layers and not ops["Where"]  # no bias is made
    assert all(f["kl"] < 1e-5 for f in manifest.target.parity.values())  # the export's own check ran on it
    assert "tree" not in manifest.target.parity and "chain" in manifest.target.parity  # it verifies no trees
    # what ORT's CUDA GroupQueryAttention refuses (any attention_bias): in the gqa graph, in no static one
    assert cuda_gqa_refusal(_graph(gqa_close_bundle, load_manifest(gqa_close_bundle).target))
    eagle = load_manifest(eagle_static_bundle)
    for bundle, entry in [(gqa_static_close_bundle, e) for e in manifest.models.values()] + [
            (eagle_static_bundle, e) for e in eagle.models.values()]:
        graph = _graph(bundle, entry)
        assert cuda_gqa_refusal(graph) is None, entry.file
        assert C.ATTENTION_MASK not in {i.name for i in graph.graph.input}, entry.file
        assert [s.name for s in entry.io()[0]] == [i.name for i in graph.graph.input], entry.file  # the contract's
    assert eagle.eagle.graph == "gqa-static" and "tree" not in eagle.eagle.parity
    gqa_manifest = load_manifest(gqa_close_bundle)  # bundles of the other kinds load as before
    assert C.SEQLENS_K not in {s.name for s in gqa_manifest.target.io()[0]} and gqa_manifest.runs_trees
    assert not manifest.runs_trees


def test_a_static_bundle_decodes_the_gqa_bundle_s_chains_and_refuses_trees(gqa_static_close_bundle, gqa_close_bundle):
    """Eagerly on the CPU: chains with rollback, sampling; a tree method is one line naming the fix."""
    static, gqa = specrt.load(gqa_static_close_bundle, threads=1), specrt.load(gqa_close_bundle, threads=1)
    for method in ("none", "draft", "ngram"):
        got = static.generate(PROMPT, max_new_tokens=32, method=method)
        assert got.token_ids == gqa.generate(PROMPT, max_new_tokens=32, method=method).token_ids, method
    sampled = dict(max_new_tokens=24, method="draft", temperature=0.8, seed=3)
    assert static.generate(PROMPT, **sampled).token_ids == gqa.generate(PROMPT, **sampled).token_ids
    with pytest.raises(ConfigError, match=r"'tree' verifies token trees .* causal only.*--graph gqa \(ONNX Runtime\)"
                       ) as e:
        static.generate(PROMPT, max_new_tokens=8, method="tree")
    assert "\n" not in str(e.value)
    assert static.default_method == gqa.default_method == "draft"


def test_what_is_not_a_gqa_graph_is_refused_unchanged(gqa_close_bundle, close_bundle):
    entry = load_manifest(close_bundle).target
    fused = onnx.load(str(close_bundle / entry.file), load_external_data=False)
    assert_rewrite_refused_unchanged(rewrite_static, fused, entry.dims, "GroupQueryAttention nodes")
    gqa = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    # a sliding window's mask reads the past length from the mask's width (gqa._past_length_reads)
    gqa.graph.node.append(onnx.helper.make_node("Sub", ["gqa.width64", "gqa.query64"], ["window.past"]))
    with pytest.raises(ConfigError, match="sliding-window"):
        rewrite_static(gqa, entry.dims)
    twice = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    rewrite_static(twice, entry.dims)
    with pytest.raises(ConfigError, match="lengths are not the gqa graph's"):
        rewrite_static(twice, entry.dims)
    # a bias that is not the plain mask's (the op's causality cannot stand for it), and a mask read elsewhere
    edited = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    where = next(n for n in edited.graph.node if n.op_type == "Where")
    edited.graph.node.insert(0, onnx.helper.make_node("Not", [C.ATTENTION_MASK], ["hidden.cells"]))
    where.input[0] = "hidden.cells"
    read = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    read.graph.node.append(onnx.helper.make_node("Identity", [C.ATTENTION_MASK], ["mask.copy"]))
    read.graph.output.append(onnx.helper.make_tensor_value_info("mask.copy", onnx.TensorProto.BOOL, None))
    for model, why in ((edited, "attention bias is not the plain mask's"), (read, "reads the attention mask")):
        before = model.SerializeToString()
        with pytest.raises(ConfigError, match=why):
            rewrite_static(model, entry.dims)
        assert model.SerializeToString() == before


def test_verify_checks_the_chains_a_causal_only_bundle_runs(eagle_static_bundle):
    """`specrt verify` on a head over gqa-static graphs checks eagle and ngram, not the tree it cannot verify."""
    from support.exactness import PROMPTS

    from specrt.check.verify import verify_bundle

    gen = specrt.load(eagle_static_bundle, threads=1)
    checks = list(verify_bundle(gen, PROMPTS[:2], samples=20, max_new_tokens=6))
    names = [c.name for c in checks]
    assert "greedy eagle == plain" in names and "sampled eagle ~ target" in names
    assert not any("tree" in n for n in names), names
    assert all(c.passed for c in checks if c.name.startswith("greedy")), checks
