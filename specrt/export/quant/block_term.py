"""A per-block float term beside an integer ``MatMulNBits``: how specrt runs 4-bit weights whose blocks
have a float offset (GGUF's Q4_1 minimum, HQQ's fractional zero point) on ONNX Runtime's fast kernel.

A block's weights are s·(q − z) with z not an integer (or d·q + m). ``MatMulNBits`` without zero points
computes s·(q − 8) exactly; the rest, s·(8 − z) per block, is the same for all 32 weights of the block, so
its product with the input is (block sums of A) · offsetᵀ: a [K, K/32] indicator MatMul (once per input)
and a [K/32, N] MatMul, 1/32 of the weight's arithmetic. ONNX Runtime 1.32's own float zero points would
compute the same in one node, but its CPU kernel runs them 20-40× slower than the integer path.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32


class BlockTerms:
    """Adds the nodes and initializers of block terms to a graph being rebuilt (``nodes``: the new node list),
    sharing each input's block sums and each K's indicator matrix."""

    def __init__(self, graph, block: int = BLOCK) -> None:
        self.graph, self.block = graph, block
        self.names = {i.name for i in graph.initializer}
        self._sums: dict[str, str] = {}

    def add(self, nodes: list, a: str, offset: np.ndarray, k: int, dtype: np.dtype, base: str, blocks_out: str,
            out: str) -> None:
        """out = blocks_out + (block sums of input ``a`` [.., K]) · offsetᵀ, offset [N, K/block] in ``dtype``."""
        from onnx import helper, numpy_helper

        if a not in self._sums:
            ind = f"block_term.indicator.{k}.{np.dtype(dtype).name}"
            if ind not in self.names:
                eye = np.repeat(np.eye(k // self.block, dtype=dtype), self.block, axis=0)  # [K, K/block]
                self.graph.initializer.append(numpy_helper.from_array(eye, ind))
                self.names.add(ind)
            self._sums[a] = f"{a}.block_sums"
            nodes.append(helper.make_node("MatMul", [a, ind], [self._sums[a]], name=f"{a}.block_sums"))
        term = f"{base}_block_offset"
        if term not in self.names:
            self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(offset.T.astype(dtype)), term))
            self.names.add(term)
        nodes.append(helper.make_node("MatMul", [self._sums[a], term], [f"{out}.block_term"], name=f"{out}.block_term"))
        nodes.append(helper.make_node("Add", [blocks_out, f"{out}.block_term"], [out], name=f"{out}.block_add"))


def split_float_zero_points(model, block: int = BLOCK) -> int:
    """Rewrite each 4-bit ``MatMulNBits`` with float zero points z into the integer kernel (default zero point
    8) plus the block term s·(8 − z); returns how many were rewritten. Exact up to fp32 rounding."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    terms = BlockTerms(g, block)
    nodes, done = [], 0
    for node in g.node:
        attrs = {a.name: a.i for a in node.attribute}
        zp = inits.get(node.input[3]) if node.op_type == "MatMulNBits" and len(node.input) >= 4 else None
        if (zp is None or attrs.get("bits") != 4 or attrs.get("block_size") != block or len(node.input) > 4
                or zp.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)):
            nodes.append(node)
            continue
        k, n = attrs["K"], attrs["N"]
        scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, -1)
        z = numpy_helper.to_array(zp).reshape(n, -1).astype(np.float32)
        offset = scales.astype(np.float32) * (8.0 - z)
        out = node.output[0]
        node.output[0] = f"{out}.blocks"
        del node.input[3:]
        nodes.append(node)
        terms.add(nodes, node.input[0], offset, k, scales.dtype, node.input[1], node.output[0], out)
        done += 1
    if done:
        del g.node[:]
        g.node.extend(nodes)
    return done
