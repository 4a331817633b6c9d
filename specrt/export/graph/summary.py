"""The logits summary graph (see :data:`specrt.bundle.contract.SUMMARY_FILE`): top-K logits and the log-sum-exp
of each row at a temperature, so a GPU backend copies a few hundred bytes per row instead of V floats.

Regenerate the shipped file with ``python -m specrt.export.graph.summary``; a test checks the shipped
bytes are what this builds. Opset 17 and plain ops (TopK with a constant K, Reduce*, Exp, Log, a zero Pad), which
ONNX Runtime's CUDA provider and TensorRT's ONNX parser both take.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ...bundle import contract as C

OPSET = 17


def build_summary_model(k: int = C.SUMMARY_TOP_K) -> onnx.ModelProto:
    """lse = m + log(sum(exp((z - z_max) * inv_T))) with m = z_max * inv_T: the row's maximum comes off
    before the exp (no overflow at any temperature), and the difference is scaled after the
    subtraction, so each exponent carries one rounding of (z - z_max) and one of the product.

    The sum runs in blocks of :data:`~specrt.bundle.contract.SUMMARY_BLOCK` ids (the last one padded with
    zeros), then over the blocks: whatever order an engine sums a block in, the error is bounded by the
    block's length plus the number of blocks, ~1,000 roundings on a 152k row instead of 152k
    (:func:`specrt.runtime.backends.summary.lse_error_bound` is that bound)."""
    node, block = helper.make_node, C.SUMMARY_BLOCK
    nodes = [
        node("TopK", [C.SUMMARY_LOGITS, "k"], ["values", "ids64"], axis=-1, largest=1, sorted=1),
        node("Cast", ["values"], [C.SUMMARY_VALUES], to=TensorProto.FLOAT),
        node("Cast", ["ids64"], [C.SUMMARY_IDS], to=TensorProto.INT32),
        node("ReduceMax", [C.SUMMARY_LOGITS], ["zmax"], axes=[-1], keepdims=1),
        node("Sub", [C.SUMMARY_LOGITS, "zmax"], ["shifted"]),
        node("Mul", ["shifted", C.SUMMARY_INV_T], ["scaled"]),
        node("Exp", ["scaled"], ["weights"]),
        # zero-padded to whole blocks, [Q, ceil(V / block), block]: no empty tensor for any V (ONNX Runtime
        # 1.30 fails on a reduction over an empty slice, which a V < block or a multiple of it made)
        node("Shape", ["weights"], ["shape"]),
        node("Gather", ["shape", "one"], ["vocab"]),
        node("Mod", ["vocab", "block"], ["rest"]),
        node("Sub", ["block", "rest"], ["short"]),
        node("Mod", ["short", "block"], ["pad"]),
        node("Concat", ["zero", "zero", "zero", "pad"], ["pads"], axis=0),
        node("Pad", ["weights", "pads"], ["padded"], mode="constant"),
        node("Reshape", ["padded", "block_shape"], ["grid"]),
        node("ReduceSum", ["grid", "last_axis"], ["block_sums"], keepdims=0),
        node("ReduceSum", ["block_sums", "last_axis"], ["total"], keepdims=0),
        node("Log", ["total"], ["log_total"]),
        node("Squeeze", ["zmax", "last_axis"], ["zmax_row"]),
        node("Mul", ["zmax_row", C.SUMMARY_INV_T], ["top_scaled"]),
        node("Add", ["top_scaled", "log_total"], [C.SUMMARY_LSE]),
    ]
    i64 = TensorProto.INT64
    graph = helper.make_graph(
        nodes, "logits_summary",
        [helper.make_tensor_value_info(C.SUMMARY_LOGITS, TensorProto.FLOAT, ["rows", "vocab"]),
         helper.make_tensor_value_info(C.SUMMARY_INV_T, TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(C.SUMMARY_VALUES, TensorProto.FLOAT, ["rows", k]),
         helper.make_tensor_value_info(C.SUMMARY_IDS, TensorProto.INT32, ["rows", k]),
         helper.make_tensor_value_info(C.SUMMARY_LSE, TensorProto.FLOAT, ["rows"])],
        initializer=[helper.make_tensor("k", i64, [1], [k]),
                     helper.make_tensor("last_axis", i64, [1], [-1]),
                     helper.make_tensor("zero", i64, [1], [0]),
                     helper.make_tensor("one", i64, [1], [1]),
                     helper.make_tensor("block", i64, [1], [block]),
                     helper.make_tensor("block_shape", i64, [3], [0, -1, block])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="specrt",
                              ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv: list[str] | None = None) -> int:
    path = Path(argv[0]) if argv else C.summary_graph_path()
    path.write_bytes(build_summary_model().SerializeToString())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
