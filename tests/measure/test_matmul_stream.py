"""benchmarks/verify-cost/matmul_stream.py's two graph cuts: the matmuls alone (a tied head read through its Transpose
included) compute what they computed in the whole graph, and an integer-kernel graph without its activation ops
keeps every matmul on rows of the same shapes."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.quant.integer_matmul import rewrite_integer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "verify-cost" / "matmul_stream.py"


def _load():
    spec = importlib.util.spec_from_file_location("matmul_stream", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _two_layer(rng) -> onnx.ModelProto:
    """x -> MatMul(w1) -> Relu -> MatMul(w2) -> MatMul(Transpose(embed)): a body and a tied LM head."""
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((16, 24), (24, 16)))
    embed = rng.standard_normal((40, 16)).astype(np.float32) * 0.1
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="up"), helper.make_node("Relu", ["h1"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["h2"], name="down"),
         helper.make_node("Transpose", ["embed"], ["embed_t"], perm=[1, 0]),
         helper.make_node("MatMul", ["h2", "embed_t"], ["logits"], name="head")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", 40])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(embed, "embed")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_the_matmuls_alone_are_the_graphs_own_tied_head_included():
    ms = _load()
    rng = np.random.default_rng(0)
    model = _two_layer(rng)
    alone, inputs, weight_bytes, counts = ms.matmuls_alone(model)
    assert counts == {"MatMul": 3} and weight_bytes == 4 * (16 * 24 + 24 * 16 + 40 * 16)
    assert sorted((k, per) for _, k, per in inputs) == [(16, 1), (24, 1)]  # one input per width, shared
    x16, x24 = rng.standard_normal((1, 3, 16)).astype(np.float32), rng.standard_normal((1, 3, 24)).astype(np.float32)
    feed = {name: x16 if k == 16 else x24 for name, k, _ in inputs}
    outputs = ort.InferenceSession(alone.SerializeToString()).run(None, feed)
    got = dict(zip([o.name for o in alone.graph.output], outputs))
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_allclose(got["h1"], x16 @ weights["w1"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["h2"], x24 @ weights["w2"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["logits"], x16 @ weights["embed"].T, rtol=1e-5, atol=1e-6)


def test_an_integer_graph_without_its_activation_ops_keeps_its_matmuls_and_shapes():
    ms = _load()
    rng = np.random.default_rng(1)
    model = _two_layer(rng)
    model.graph.node.remove(next(n for n in model.graph.node if n.op_type == "Transpose"))
    model.graph.node.remove(next(n for n in model.graph.node if n.name == "head"))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("h2", TensorProto.FLOAT, [1, "s", 16])])
    assert not ms.without_activation_ops(model)  # a float graph: nothing to cut
    assert rewrite_integer(model) == ["up", "down"]
    full = len(model.graph.node)
    alone = ms.matmuls_alone(model)
    assert alone[3] == {"MatMulIntegerToFloat": 2} and all(per == 2 for _, _, per in alone[1])  # the halves
    assert ms.without_activation_ops(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and len(ops) == 2 * 4 + 1 < full  # Concat Cast MM Split, Relu
    onnx.checker.check_model(model)
    x = rng.standard_normal((1, 5, 16)).astype(np.float32)
    (h2,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert h2.shape == (1, 5, 16)  # the same rows as before the cut (numbers: not the point)
