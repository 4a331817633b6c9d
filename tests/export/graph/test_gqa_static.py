"""The static gqa graph (``--graph gqa-static``): lengths from ``seqlens_k``, a mask as wide as the cache buffer.

On CPU ONNX Runtime it must compute exactly what the gqa graph computes, for a prefill, plain steps, a
multi-row verify and a tree mask; its bundle records the graph kind, and decodes the gqa bundle's tokens.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import specrt
from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError
from specrt.export.graph.gqa_static import rewrite_static
from specrt.runtime.masks import causal_mask

PROMPT = "def fib(n):"
CAPACITY = 40


def _run(session, static: bool, buffers: list[np.ndarray], ids, pos, mask, past: int) -> np.ndarray:
    """One pass on ``buffers`` (each layer's K and V buffer, bound as past and present): its logits [Q, V]."""
    q_len = len(ids)
    feed = {C.INPUT_IDS: np.array([ids]), C.POSITION_IDS: np.array([pos]), C.LOGITS_INDEX: np.arange(q_len)}
    if static:
        wide = np.zeros((1, 1, q_len, CAPACITY), bool)
        wide[..., :past + q_len] = mask
        feed.update({C.ATTENTION_MASK: wide, C.SEQLENS_K: np.array([past + q_len - 1], np.int32)})
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
    tree = causal_mask(4, 10)
    tree[0, 0, 2, 11] = tree[0, 0, 3, 11] = False  # nodes 2 and 3 branch off before node 1
    return [_run(session, static, buffers, list(range(3, 9)), list(range(6)), causal_mask(6, 0), 0),  # prefill
            _run(session, static, buffers, [5], [6], causal_mask(1, 6), 6),  # plain steps
            _run(session, static, buffers, [8], [7], causal_mask(1, 7), 7),
            _run(session, static, buffers, [7, 9], [8, 9], causal_mask(2, 8), 8),  # a chain verified
            _run(session, static, buffers, [5, 7, 11, 4], [10, 11, 11, 12], tree, 10)]  # a tree


def test_the_static_graph_computes_exactly_what_the_gqa_graph_does(gqa_close_bundle, tmp_path):
    for role, entry in load_manifest(gqa_close_bundle).models.items():
        model = onnx.load(str(gqa_close_bundle / entry.file))
        rewrite_static(model, entry.dims)
        onnx.save(model, str(tmp_path / f"{role}.onnx"))
        want = _passes(gqa_close_bundle / entry.file, False, entry.dims)
        got = _passes(tmp_path / f"{role}.onnx", True, entry.dims)
        for a, b in zip(want, got):
            assert a.shape == b.shape and np.array_equal(a, b), role


def test_its_lengths_are_inputs_and_the_mask_spans_the_buffer(gqa_static_close_bundle, gqa_close_bundle):
    manifest = load_manifest(gqa_static_close_bundle)
    assert {e.graph for e in manifest.models.values()} == {"gqa-static"}
    model = onnx.load(str(gqa_static_close_bundle / manifest.target.file), load_external_data=False)
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert inputs[C.SEQLENS_K] == ["batch"] and inputs[C.ATTENTION_MASK] == ["batch", 1, "query", "capacity"]
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert {n.input[5] for n in gqa} == {C.SEQLENS_K}
    # nothing reads the mask's width any more: the lengths are fixed by the buffer and seqlens_k
    assert not [n for n in model.graph.node if n.op_type == "Shape" and C.ATTENTION_MASK in n.input]
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["GroupQueryAttention"] == manifest.target.dims.num_layers
    assert all(f["kl"] < 1e-5 for f in manifest.target.parity.values())  # the export's own check ran on it
    gqa_manifest = load_manifest(gqa_close_bundle)  # bundles of the other kinds load as before
    assert C.SEQLENS_K not in {s.name for s in gqa_manifest.target.io()[0]}


def test_a_static_bundle_decodes_the_gqa_bundle_s_tokens(gqa_static_close_bundle, gqa_close_bundle):
    """Eagerly on the CPU: chains with rollback, trees with compaction, sampling."""
    static, gqa = specrt.load(gqa_static_close_bundle, threads=1), specrt.load(gqa_close_bundle, threads=1)
    for method in ("none", "draft", "tree", "ngram"):
        got = static.generate(PROMPT, max_new_tokens=32, method=method)
        assert got.token_ids == gqa.generate(PROMPT, max_new_tokens=32, method=method).token_ids, method
    sampled = dict(max_new_tokens=24, method="tree", temperature=0.8, seed=3)
    assert static.generate(PROMPT, **sampled).token_ids == gqa.generate(PROMPT, **sampled).token_ids


def test_what_is_not_a_gqa_graph_is_refused_unchanged(gqa_close_bundle, close_bundle):
    entry = load_manifest(close_bundle).target
    fused = onnx.load(str(close_bundle / entry.file), load_external_data=False)
    before = fused.SerializeToString()
    with pytest.raises(ConfigError, match="GroupQueryAttention nodes"):
        rewrite_static(fused, entry.dims)
    assert fused.SerializeToString() == before
    gqa = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    # a sliding window's mask reads the past length from the mask's width (gqa._past_length_reads)
    gqa.graph.node.append(onnx.helper.make_node("Sub", ["gqa.width64", "gqa.query64"], ["window.past"]))
    with pytest.raises(ConfigError, match="sliding-window"):
        rewrite_static(gqa, entry.dims)
    twice = onnx.load(str(gqa_close_bundle / entry.file), load_external_data=False)
    rewrite_static(twice, entry.dims)
    with pytest.raises(ConfigError, match="lengths are not the gqa graph's"):
        rewrite_static(twice, entry.dims)
