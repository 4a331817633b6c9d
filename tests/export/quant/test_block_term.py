"""Float zero points as the integer MatMulNBits kernel plus a per-block float term: the same products."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.quant.block_term import split_float_zero_points


def test_float_zero_points_become_the_integer_kernel_and_a_block_term():
    k, n, block = 64, 24, 32
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, k // block, block // 2)
    scales = (rng.random(n * k // block) * 0.05 + 0.01).astype(np.float32)
    zero = (rng.random(n * k // block) * 15).astype(np.float32)  # fractional, as HQQ fits them
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S"),
                               numpy_helper.from_array(zero, "Z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    a = rng.standard_normal((3, k)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]  # noqa: E731
    before = run(model)
    weight = (q.reshape(n, -1, block) - zero.reshape(n, -1, 1)) * scales.reshape(n, -1, 1)
    np.testing.assert_allclose(before, a @ weight.reshape(n, k).T, rtol=1e-5, atol=1e-5)  # ORT's float-zp meaning

    assert split_float_zero_points(model) == 1
    ops = [x.op_type for x in model.graph.node]
    assert ops.count("MatMulNBits") == 1 and len(model.graph.node[0].input) == 3  # no zero points: 8, the default
    onnx.checker.check_model(model)
    np.testing.assert_allclose(run(model), before, rtol=1e-5, atol=1e-5)
