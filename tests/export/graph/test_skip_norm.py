"""Add → RMSNormalization as one SkipSimplifiedLayerNormalization: same numbers, the sum still readable,
and only the pattern whose operands the contrib op takes as they are."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper as h, numpy_helper

from specrt.export.graph.skip_norm import fuse_skip_norms

H = 16


def _graph(weight_computed: bool = False, bias_add: bool = False) -> onnx.ModelProto:
    """x + y -> norm (out) and the sum itself (residual); optionally a norm whose weight is a node's output,
    and an Add with a constant [H] operand before a second norm."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=H).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=H).astype(np.float32), "b")]
    nodes = [h.make_node("Add", ["x", "y"], ["sum"]),
             h.make_node("RMSNormalization", ["sum", "w"], ["out"], epsilon=1e-5, axis=-1),
             h.make_node("Relu", ["sum"], ["residual"])]
    outputs = ["out", "residual"]
    if weight_computed:
        nodes += [h.make_node("Add", ["x", "residual"], ["sum2"]), h.make_node("Neg", ["w"], ["w2"]),
                  h.make_node("RMSNormalization", ["sum2", "w2"], ["out2"], epsilon=1e-5, axis=-1)]
        outputs.append("out2")
    if bias_add:
        nodes += [h.make_node("Add", ["residual", "b"], ["sum3"]),
                  h.make_node("RMSNormalization", ["sum3", "w"], ["out3"], epsilon=1e-5, axis=-1)]
        outputs.append("out3")
    io = lambda name: h.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3, H])  # noqa: E731
    graph = h.make_graph(nodes, "g", [io("x"), io("y")], [io(o) for o in outputs], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 23), h.make_opsetid("com.microsoft", 1)])


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_fused_node_gives_the_norm_and_the_sum_its_readers_need():
    rng = np.random.default_rng(1)
    feeds = {n: rng.normal(size=(1, 3, H)).astype(np.float32) for n in ("x", "y")}
    model = _graph()
    want = _run(model, feeds)
    assert fuse_skip_norms(model.graph) == 1
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops == {"SkipSimplifiedLayerNormalization": 1, "Relu": 1}
    got = _run(model, feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_computed_weight_or_a_broadcast_add_stays_as_it_is():
    model = _graph(weight_computed=True, bias_add=True)
    assert fuse_skip_norms(model.graph) == 1  # only the first pair
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["RMSNormalization"] == 2 and ops["Add"] == 2
    rng = np.random.default_rng(2)
    feeds = {n: rng.normal(size=(1, 3, H)).astype(np.float32) for n in ("x", "y")}
    for a, b in zip(_run(model, feeds), _run(_graph(weight_computed=True, bias_add=True), feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
