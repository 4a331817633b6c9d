"""specrt.export.graph.edit: Gemm rewritten as MatMul computes the same, a shared weight is transposed once."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.graph.edit import gemms_to_matmuls


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_gemms_become_matmuls_with_the_same_outputs():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)  # [out, in], as torch's linear stores it
    plain = rng.standard_normal((4, 3)).astype(np.float32)  # [in, out]
    bias = rng.standard_normal(6).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["a"], name="a", transB=1),
             helper.make_node("Gemm", ["x", "w", "b"], ["b_out"], name="b", transB=1),  # the same weight, a bias
             helper.make_node("Gemm", ["x", "plain"], ["c"], name="c"),
             helper.make_node("Gemm", ["x", "plain"], ["d"], name="d", alpha=0.5)]  # not a plain product: kept
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b_out", "c", "d")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(plain, "plain"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    before = _run(model, x)

    assert gemms_to_matmuls(model) == ["a", "b", "c"]
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul", "Add", "MatMul", "Gemm"]
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    assert weights == {"plain": [4, 3], "b": [6], "w.in_out": [4, 6]}  # w transposed once, the original dropped
    for got, want in zip(_run(model, x), before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
