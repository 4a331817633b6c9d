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
