"""A residual Add and the RMS norm that reads it as one ``com.microsoft.SkipSimplifiedLayerNormalization``.

Every decoder layer adds its attention and its MLP output to the residual stream and normalises the sum
(the next norm, or the final one): two nodes, each a pass over the row and one of ONNX Runtime's per-node
costs, twice a layer. The contrib op does both in one pass and also returns the sum, which the next
residual Add (and any EAGLE-3 tap) reads under its old name. Part of the gqa graph (ONNX Runtime only,
like ``GroupQueryAttention``); TensorRT keeps the portable graph.
"""

from __future__ import annotations

_MS = "com.microsoft"


def fuse_skip_norms(graph) -> int:
    """Fuse each Add → opset-23 RMSNormalization (last axis, constant weight) in ``graph`` (an
    ``onnx.GraphProto``, in place); returns how many. The fused node takes the Add's place, so every later
    reader of the sum still finds it after its producer; a norm whose weight is computed, or whose Add has a
    constant operand (a broadcast), is left as it is."""
    from onnx import helper as h

    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output}
    fused: dict[int, object] = {}  # id(Add) -> the fused node
    dead: set[int] = set()  # id(RMSNormalization)
    for n in graph.node:
        if n.op_type != "RMSNormalization" or n.domain not in ("", "ai.onnx"):
            continue
        add = producer.get(n.input[0])
        attrs = {a.name: h.get_attribute_value(a) for a in n.attribute}
        if (add is None or add.op_type != "Add" or id(add) in fused or attrs.get("axis", -1) != -1
                or len(n.input) < 2 or n.input[1] not in constants or set(add.input) & constants):
            continue
        fused[id(add)] = h.make_node(
            "SkipSimplifiedLayerNormalization", [add.input[0], add.input[1], n.input[1]],
            [n.output[0], "", "", add.output[0]], name=f"skip_norm.{len(fused)}", domain=_MS,
            epsilon=float(attrs.get("epsilon", 1e-5)))
        dead.add(id(n))
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dead]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(fused)
