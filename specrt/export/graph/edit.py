"""Edits on a loaded ONNX graph that several rewrites share (the gqa graph, quantization, kept GGUF blocks): a leaf."""

from __future__ import annotations


def drop_dead(model) -> None:
    """Remove nodes whose outputs nothing reads (an untied head's old Transpose) and unread initializers.
    Not in a graph with subgraphs: what a subgraph reads looks unread from the outside."""
    import onnx

    g = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        return
    wanted = {o.name for o in g.output}
    while True:
        read = wanted | {i for n in g.node for i in n.input}
        dead = [n for n in g.node if not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    read = {i for n in g.node for i in n.input}
    for init in [i for i in g.initializer if i.name not in read]:
        g.initializer.remove(init)


def gemms_to_matmuls(model) -> list[str]:
    """Rewrite each Gemm with a constant 2-D weight (alpha 1, transA 0; what torch's ``linear`` exports as on 2-D
    rows, as in a DFlash draft's graph) into MatMul (+ Add for its bias), its weight stored [in, out], so the
    weight-only quantizers, which rewrite MatMul, see it. A weight several Gemms read is transposed once. Returns the
    rewritten nodes' names."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    transposed: dict[str, str] = {}
    nodes, done = [], []
    for node in g.node:
        attrs = {a.name: (a.f if a.type == a.FLOAT else a.i) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            if weight not in transposed:
                transposed[weight] = f"{weight}.in_out"
                w = numpy_helper.to_array(inits[weight])
                g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.T), transposed[weight]))
            weight = transposed[weight]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}.matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
        done.append(node.name)
    if done:
        del g.node[:]
        g.node.extend(nodes)
        drop_dead(model)
    return done
