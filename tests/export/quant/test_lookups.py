"""specrt.export.quant.lookups on a DFlash-shaped graph: token ids selected to one row ([Q], not [batch, Q]) and an
LM head tied to the input table, written as Gemm (torch's linear on 2-D rows)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.quant.quantize import quantize_graph

V, H = 96, 64


def _graph(path) -> np.ndarray:
    table = np.random.default_rng(0).standard_normal((V, H)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["input_ids", "zero"], ["row"], axis=0),  # [1, Q] -> [Q]
             helper.make_node("Gather", ["embedding", "row"], ["rows"]),  # [Q, H]
             helper.make_node("Mul", ["rows", "two"], ["scaled"]),
             helper.make_node("Gemm", ["scaled", "embedding"], ["logits"], transB=1)]  # the tied head, [Q, V]
    graph = helper.make_graph(
        nodes, "draft", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "q"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["q", V])],
        [numpy_helper.from_array(table, "embedding"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return table


def test_a_tied_head_over_one_row_of_ids_shares_its_int8_bytes_with_the_lookup(tmp_path):
    _graph(tmp_path / "f.onnx")
    record = quantize_graph(tmp_path / "f.onnx", tmp_path / "q.onnx", 8, 32, 4, lookups=True)
    assert record["quantized_lookups"] == ["embedding"] and record["lookup_shares_lm_head"] == ["embedding"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert "GatherBlockQuantized" in ops and "Gemm" not in ops and ops.count("MatMulNBits") == 1

    ids = np.array([[5, 0, 95, 17]], np.int64)
    run = {name: ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
           .run(None, {"input_ids": ids})[0] for name in ("f.onnx", "q.onnx")}
    assert run["q.onnx"].shape == (4, V)
    spread = run["f.onnx"].std(axis=-1, keepdims=True)
    assert np.abs(run["q.onnx"] - run["f.onnx"]).max() / spread.min() < 0.05
    assert (run["q.onnx"].argmax(-1) == run["f.onnx"].argmax(-1)).all()
