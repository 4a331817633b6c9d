"""The fused graph rewritten for ONNX Runtime's ``GroupQueryAttention``: one KV buffer, written in place.

The fused graph (export/graph/fused_ops.py) reads the past K/V as [B, P, H_kv, D] inputs, concatenates the new
rows onto them (a copy of the whole cache per layer and pass) and returns only the new rows, so the runtime
re-binds 4 tensors per layer every pass (120 on a 30-layer model, ~0.35 ms of Python). Here each layer's
rotary pair, concatenations and opset-23 ``Attention`` become one ``com.microsoft.GroupQueryAttention``
over the packed q|k|v projection, with ``past_key.N`` / ``present_key.N`` one [B, H_kv, capacity, D]
buffer (head-major, as the op wants it) that the op writes the Q new rows into at the current length.
The runtime binds the buffers once per cache; a steady one-row pass re-binds only its mask.

The tree mask keeps its contract: the op is causal, and the boolean mask enters as an additive
``attention_bias`` over [Q, past + Q]; a tree in topological order only ever removes causal edges, so
causal + bias is exactly the mask. The op takes the lengths from the mask's width (seqlens_k = S - 1,
total_sequence_length = S). The rewrite is ONNX Runtime only (contrib op): TensorRT keeps the portable
graph. Only the exact pattern the fused export writes is rewritten; anything else is refused, never
half-converted. Each residual Add and the norm after it become one ``SkipSimplifiedLayerNormalization``
(export/graph/skip_norm.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...bundle import contract as C
from ...errors import ConfigError
from .edit import drop_dead
from .skip_norm import fuse_skip_norms

_MS = "com.microsoft"


@dataclass(frozen=True)
class _Layer:
    attention: object  # the opset-23 Attention node
    layer: int
    qkv: tuple[str, str, str]  # packed (name, "", "") or separate q, k, v (pre-rotary)
    cos: str
    sin: str
    positions: str
    mask: str
    removed: tuple  # the nodes the GQA node replaces (rotaries, past views, concats)


def _producers(graph) -> dict[str, object]:
    return {o: n for n in graph.node for o in n.output}


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _refuse(node, why: str) -> ConfigError:
    return ConfigError(f"cannot rewrite {node.name or node.op_type} for GroupQueryAttention: {why} "
                       "(export with --graph fused or portable)")


def _past_input(prod: dict, tensor: str, node, prefix: str) -> tuple[str, object | None]:
    """The graph input ``prefix.N`` that ``tensor`` is (or is a Reshape of), and that Reshape."""
    view = prod.get(tensor)
    if view is not None and view.op_type == "Reshape":
        name = view.input[0]
    else:
        name, view = tensor, None
    if not name.startswith(prefix + "."):
        raise _refuse(node, f"its past is {name!r}, not a {prefix}.N input")
    return name, view


def _match(node, prod: dict, head_dim: int) -> _Layer:
    """The fused layer around one Attention node: Attention(rot(q), Concat(past_k, rot(k)), Concat(past_v, v), m)."""
    q_rot, k_cat, v_cat, mask = node.input[:4]
    rq, ck, cv = prod.get(q_rot), prod.get(k_cat), prod.get(v_cat)
    if rq is None or rq.op_type != "RotaryEmbedding" or any(c is None or c.op_type != "Concat" for c in (ck, cv)):
        raise _refuse(node, "its q is not a RotaryEmbedding or its k/v are not past + new concatenations")
    rk = prod.get(ck.input[1])
    if rk is None or rk.op_type != "RotaryEmbedding" or list(rk.input[1:4]) != list(rq.input[1:4]):
        raise _refuse(node, "its k is not rotated with the same cos/sin/positions as its q")
    for rot in (rq, rk):
        a = _attrs(rot)
        if a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) not in (0, head_dim):
            raise _refuse(node, "its rotary is interleaved or partial")
    past_k, view_k = _past_input(prod, ck.input[0], node, "past_key")
    past_v, view_v = _past_input(prod, cv.input[0], node, "past_value")
    layer = int(past_k.rsplit(".", 1)[1])
    if past_v != C.past_value(layer):
        raise _refuse(node, f"its key and value caches are {past_k} and {past_v}")
    q, k, v = rq.input[0], rk.input[0], cv.input[1]
    split = prod.get(q)
    packed = (split is not None and split.op_type == "Split" and list(split.output) == [q, k, v]
              and _attrs(split).get("axis") in (2, -1))
    qkv = (split.input[0], "", "") if packed else (q, k, v)
    if len(rq.input) < 4 or not rq.input[3]:
        raise _refuse(node, "its rotary has no position_ids")
    removed = tuple(n for n in (rq, rk, ck, cv, view_k, view_v, split if packed else None) if n is not None)
    return _Layer(node, layer, qkv, rq.input[1], rq.input[2], rq.input[3], mask, removed)


def _lengths_and_biases(graph, layers: list[_Layer], dtype: int) -> tuple[list, str, str, dict[str, str]]:
    """Nodes computing seqlens_k [B] / total_sequence_length (int32) from the mask width, and one
    additive bias per distinct boolean mask (0 where attending, the dtype's lowest value elsewhere)."""
    import numpy as np
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper

    low = np.finfo(np.float16 if dtype == onnx.TensorProto.FLOAT16 else np.float32).min
    consts = {"gqa.one": np.array([1], np.int32), "gqa.axis0": np.array([0], np.int64),
              "gqa.zero_bias": np.array(0, onnx.helper.tensor_dtype_to_np_dtype(dtype)),
              "gqa.low_bias": np.array(low, onnx.helper.tensor_dtype_to_np_dtype(dtype))}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [h.make_node("Shape", [C.ATTENTION_MASK], ["gqa.width64"], start=3, end=4),
             h.make_node("Cast", ["gqa.width64"], ["gqa.width"], to=onnx.TensorProto.INT32),
             h.make_node("Sub", ["gqa.width", "gqa.one"], ["gqa.last"]),
             h.make_node("Shape", [C.INPUT_IDS], ["gqa.batch"], start=0, end=1),
             h.make_node("Expand", ["gqa.last", "gqa.batch"], ["gqa.seqlens_k"]),
             h.make_node("Squeeze", ["gqa.width", "gqa.axis0"], ["gqa.total"]),
             h.make_node("Shape", [C.INPUT_IDS], ["gqa.query64"], start=1, end=2)]
    biases: dict[str, str] = {}
    for layer in layers:
        if layer.mask not in biases:
            biases[layer.mask] = f"gqa.bias.{len(biases)}"
            nodes.append(h.make_node("Where", [layer.mask, "gqa.zero_bias", "gqa.low_bias"], [biases[layer.mask]]))
    return nodes, "gqa.seqlens_k", "gqa.total", biases


def rewrite(model, dims: C.ModelDims) -> None:
    """Rewrite a fused decoder graph (``onnx.ModelProto``, in place) to the GQA one; raises ConfigError
    on a graph that is not exactly the fused pattern (every layer is converted, or none)."""
    from onnx import helper as h


    g = model.graph
    prod = _producers(g)
    attentions = [n for n in g.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    if len(attentions) != dims.num_layers:
        raise ConfigError(f"cannot rewrite for GroupQueryAttention: the graph has {len(attentions)} opset-23 "
                          f"Attention nodes for {dims.num_layers} layers (export with --graph fused)")
    layers = [_match(n, prod, dims.head_dim) for n in attentions]
    if sorted(x.layer for x in layers) != list(range(dims.num_layers)):
        raise ConfigError("cannot rewrite for GroupQueryAttention: the layers' caches are not past_key.0..N-1")
    inputs = {i.name: i for i in g.input}
    dtype = inputs[C.past_key(0)].type.tensor_type.elem_type
    prelude, seqlens, total, biases = _lengths_and_biases(g, layers, dtype)
    new_nodes = []
    for x in layers:
        a = _attrs(x.attention)
        extra = {"softcap": float(a["softcap"])} if a.get("softcap") else {}
        new_nodes.append(h.make_node(
            "GroupQueryAttention",
            [*x.qkv, C.past_key(x.layer), C.past_value(x.layer), seqlens, total, x.cos, x.sin, x.positions,
             biases[x.mask]],
            [x.attention.output[0], C.present_key(x.layer), C.present_value(x.layer)],
            name=f"gqa.{x.layer}", domain=_MS, num_heads=int(a["q_num_heads"]), kv_num_heads=int(a["kv_num_heads"]),
            scale=float(a.get("scale", dims.head_dim ** -0.5)), do_rotary=1, **extra))
    dead = {id(n) for x in layers for n in (x.attention, *x.removed)}
    _past_length_reads(g, dead)
    # Each GQA node where its Attention was, so the order stays topological.
    position = {id(x.attention): gqa for x, gqa in zip(layers, new_nodes)}
    ordered = prelude + [position.get(id(n), n) for n in g.node if id(n) in position or id(n) not in dead]
    del g.node[:]
    g.node.extend(ordered)
    _retype_io(g, dims, dtype)
    fuse_skip_norms(g)
    drop_dead(model)
    if not any(o.domain == _MS for o in model.opset_import):
        model.opset_import.append(h.make_opsetid(_MS, 1))


def _past_length_reads(g, dead: set[int]) -> None:
    """Point what else reads a cache input at the new layout: its batch (dim 0) is still there, its past
    length (dim 1, a sliding window's mask reads it) becomes the mask's width - Q. Any other read is refused."""
    from onnx import helper as h

    for i, n in enumerate(g.node):
        if id(n) in dead or not any(x.startswith(("past_key.", "past_value.")) for x in n.input):
            continue
        a = _attrs(n)
        if n.op_type == "Shape" and (a.get("start"), a.get("end")) == (0, 1):
            continue
        if n.op_type == "Shape" and (a.get("start"), a.get("end")) == (1, 2):
            g.node[i].CopyFrom(h.make_node("Sub", ["gqa.width64", "gqa.query64"], list(n.output), name=n.name))
            continue
        raise _refuse(n, "it reads the cache other than through its attention")


def _retype_io(g, dims: C.ModelDims, dtype: int) -> None:
    """past_key.N / past_value.N become [batch, H_kv, capacity, D]; new_key.N / new_value.N outputs give way
    to present_key.N / present_value.N of the same shape (the same buffers)."""
    from onnx import helper as h

    specs, _ = C.decoder_io(dims, "float32", graph=C.GQA_GRAPH)  # the contract's shape; dtype is the graph's
    shape = list(next(s.shape for s in specs if s.name == C.past_key(0)))
    for i in g.input:
        if i.name.startswith(("past_key.", "past_value.")):
            i.CopyFrom(h.make_tensor_value_info(i.name, dtype, shape))
    outputs = [o for o in g.output if not o.name.startswith(("new_key.", "new_value."))]
    outputs += [h.make_tensor_value_info(f(i), dtype, shape) for i in range(dims.num_layers)
                for f in (C.present_key, C.present_value)]
    del g.output[:]
    g.output.extend(outputs)


def rewrite_file(src: Path, out: Path, dims: C.ModelDims) -> None:
    """Rewrite the graph at ``src`` into ``out`` (same folder: external weight files stay referenced)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    rewrite(model, dims)
    onnx.save(model, str(out))
