"""A graph's token lookups and the LM head tied to them: untie a head read through Transpose so a quantizer sees a
constant, find which head holds an embedding table, and rewrite the lookups to int8 blocks (sharing a tied int8
head's bytes). Used by int8/int4 quantization, the integer kernel and kept GGUF blocks alike."""

from __future__ import annotations

import numpy as np

from ...bundle import contract as C
from ..graph.edit import drop_dead


def untie_lm_head(model) -> str | None:
    """Give a MatMul that reads a weight through Transpose(initializer) its own transposed initializer,
    so the quantizer sees a constant; the original stays for whatever else reads it (the embedding
    Gather). Returns the new initializer's name, or None when no MatMul reads a transposed constant."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    consumers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    for node in g.node:
        if node.op_type != "MatMul" or node.input[1] not in producers:
            continue
        t = producers[node.input[1]]
        if t.op_type != "Transpose" or t.input[0] not in inits:
            continue
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), None)
        weight = numpy_helper.to_array(inits[t.input[0]])
        if weight.ndim != 2 or perm not in (None, [1, 0]):
            continue
        name = f"{t.input[0]}.lm_head_transposed"
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), name))
        node.input[1] = name
        if consumers.get(t.output[0], 0) == 1:
            g.node.remove(t)
        return name
    return None


LOOKUP_ZERO_POINT = 128  # GatherBlockQuantized's default for uint8 data: symmetric int8 stored as uint8


def tied_heads(model) -> dict[str, str]:
    """{embedding table: the MatMul weight initializer that holds the same matrix transposed} (a tied LM head,
    whichever way the exporter stored it). Read before quantizing, while both are float."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    tables = {n.input[0] for n in g.node if n.op_type == "Gather" and n.input[0] in inits}
    weights = {n.input[1] for n in g.node if n.op_type == "MatMul" and n.input[1] in inits}
    out = {}
    for t in tables:
        dims = list(inits[t].dims)
        for w in weights:
            if list(inits[w].dims) == dims[::-1] and np.array_equal(numpy_helper.to_array(inits[w]).T,
                                                                    numpy_helper.to_array(inits[t])):
                out[t] = w
                break
    return out


def quantize_lookups(model, block_size: int, tied: dict[str, str] | None = None,
                     only: set[str] | None = None) -> list[str]:
    """Rewrite each token lookup (a Gather of ``input_ids`` on axis 0 from a float [V, H] initializer) into ONNX Runtime's
    ``GatherBlockQuantized`` at int8: symmetric blocks of ``block_size`` along H, scales in the table's dtype.
    (ORT's own quantizer writes that op at 4 bits only.) Where an int8 ``MatMulNBits`` LM head holds the same
    table (``tied``: from ``tied_heads`` before quantizing), the lookup reads that head's bytes and scales, as
    llama.cpp's Q8_0 files store a tied table once. Float tables nothing else reads are dropped. ``only``: the
    tables to rewrite (default: every token lookup). Returns the rewritten tables' names."""
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    heads = {n.input[1]: n for n in g.node if n.op_type == "MatMulNBits" and len(n.input) == 3}
    ids = token_ids(model)
    done, nodes = [], []
    for node in g.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        # Only the token lookup: a float table gathered by position (a rotary cache) must keep its precision.
        table = inits.get(node.input[0]) if node.op_type == "Gather" and node.input[1] in ids else None
        if (table is None or (only is not None and table.name not in only) or axis != 0 or len(table.dims) != 2
                or table.dims[1] % block_size
                or table.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)):
            nodes.append(node)
            continue
        shared = _shared_head(heads, inits, table, block_size, (tied or {}).get(table.name))
        if shared is not None:
            extra, replacement = shared(node)
            g.initializer.extend(extra)
            nodes.extend(replacement)
        else:
            w = numpy_helper.to_array(table)
            blocks = w.astype(np.float32).reshape(w.shape[0], -1, block_size)  # (V, H / block, block)
            scale = (np.abs(blocks).max(-1) / 127).astype(w.dtype)
            safe = np.where(scale == 0, 1, scale).astype(np.float32)[..., None]
            q = np.clip(np.rint(blocks / safe), -127, 127) + LOOKUP_ZERO_POINT
            name = table.name + ".int8"
            g.initializer.extend([numpy_helper.from_array(q.astype(np.uint8).reshape(w.shape), name),
                                  numpy_helper.from_array(scale, name + ".scales")])
            nodes.append(helper.make_node(
                "GatherBlockQuantized", [name, node.input[1], name + ".scales"], list(node.output), name=node.name,
                domain="com.microsoft", gather_axis=0, quantize_axis=1, block_size=block_size, bits=8))
        done.append(table.name)
    if done:
        del g.node[:]
        g.node.extend(nodes)
    if done:
        drop_dead(model)
    return done


# Ops that pass token ids through unchanged in value (a DFlash draft's graph selects its batch row first).
_ID_PASSING = ("Gather", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Identity")


def token_ids(model) -> set[str]:
    """The graph's tensors that hold token ids: ``input_ids`` and what reshaping or selecting from it gives."""
    ids = {C.INPUT_IDS}
    for node in model.graph.node:  # topologically sorted, as ONNX requires
        if node.op_type in _ID_PASSING and node.input and node.input[0] in ids:
            ids.update(node.output)
    return ids


def _shared_head(heads: dict, inits: dict, table, block_size: int, weight: str | None):
    """If an int8 MatMulNBits (no zero points: 128, as the lookup's default) quantized ``weight``, the LM head
    tied to ``table``, with the same blocks: a function making the lookup nodes that read that head's data
    [V, H/b, b] (rank 3, quantized along its last axis) and scales; else None."""
    from onnx import helper, numpy_helper

    head = heads.get(f"{weight}_Q8") if weight is not None else None  # the quantizer's name for an int8 weight
    if head is None or head.input[1] not in inits:
        return None
    attrs = {a.name: a.i for a in head.attribute}
    vocab, hidden = table.dims
    if (attrs.get("bits"), attrs.get("block_size"), attrs.get("N"), attrs.get("K")) != (8, block_size, vocab, hidden):
        return None
    data, scales = head.input[1], head.input[2]

    def lookup(node):
        out, ids, blocks = node.output[0], node.input[1], hidden // block_size
        shape = lambda name, dims: numpy_helper.from_array(np.array(dims, np.int64), name)  # noqa: E731
        graph_inits = [shape(f"{data}.lookup_scale_shape", [vocab, blocks, 1]),
                       shape(f"{data}.lookup_hidden", [hidden])]
        # The rows come out [*ids' shape, H/b, b]: back to [*ids' shape, H], whatever the ids' rank (a decoder's
        # [batch, T], a DFlash draft's [Q]).
        nodes = [helper.make_node("Reshape", [scales, graph_inits[0].name], [f"{scales}.lookup"]),
                 helper.make_node("GatherBlockQuantized", [data, ids, f"{scales}.lookup"], [f"{out}.blocks"],
                                  domain="com.microsoft", gather_axis=0, quantize_axis=2, block_size=block_size, bits=8),
                 helper.make_node("Shape", [ids], [f"{out}.ids_shape"]),
                 helper.make_node("Concat", [f"{out}.ids_shape", graph_inits[1].name], [f"{out}.shape"], axis=0),
                 helper.make_node("Reshape", [f"{out}.blocks", f"{out}.shape"], [out], name=node.name)]
        return graph_inits, nodes

    return lookup


def head_matmuls(model) -> list[str]:
    """The LM head's MatMul nodes: constant weight [H, V] with V the rows of the table the graph looks tokens
    up in (tied or not). A head over a reduced vocabulary (EAGLE-3's) has none."""
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    vocab = {inits[n.input[0]][0] for n in model.graph.node
             if n.op_type == "Gather" and n.input[0] in inits and n.input[1] == C.INPUT_IDS}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits
            and len(inits[n.input[1]]) == 2 and inits[n.input[1]][1] in vocab]
