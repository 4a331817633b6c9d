"""The gqa graph with static shapes and no mask (``--graph gqa-static``): what ORT's CUDA-graph mode can replay.

The gqa graph (export/graph/gqa.py) derives GroupQueryAttention's lengths from the mask's width (seqlens_k =
S - 1, total_sequence_length = S), so the mask, and with it a pass's shapes, grow by a column every step and no
CUDA graph can be captured. Here the lengths come from elsewhere:

- ``seqlens_k`` [B] int32 is a graph input (past + Q - 1): device memory the runtime writes before each pass.
  On ONNX Runtime's CUDA provider the op reads it on the device (only ``total_sequence_length`` is a CPU
  input of the CUDA kernel), so a captured graph replays with the new value.
- ``total_sequence_length`` is the cache buffer's capacity, read from past_key.0's shape: a shape computation
  ORT places on the CPU, constant for a bound buffer (CUDA-graph mode allows such CPU shape nodes, not
  memcpys), and GQA only attends to seqlens_k + 1 columns whatever it says.
- There is no ``attention_mask`` and no ``attention_bias``: ONNX Runtime's CUDA GroupQueryAttention kernel
  refuses any attention_bias (every release to date: "attention_bias is not supported in GroupQueryAttention
  cuda kernel"). The op is causal over seqlens_k (new row i sees cache rows 0 .. past + i), which is exactly
  the mask of a prefill, a plain step and a chain; only a token tree needs more, so this graph verifies no
  trees (the runtime refuses tree methods on it: Manifest.runs_trees).

So a pass of Q rows has the same shapes every step, and with every input and output bound once, the same
addresses. For causal passes the numbers are those of the gqa graph, whose bias is all zeros over the rows
the op reads (tests/export/graph/test_gqa_static.py compares the logits on CPU ONNX Runtime).

Only a graph whose every bias is the plain mask's is rewritten: sliding-window layers (window masks built from
the past length to the width past + Q) and any other mask the op's causality cannot stand for are refused.
"""

from __future__ import annotations

from pathlib import Path

from ...bundle import contract as C
from ...errors import ConfigError
from .edit import drop_dead

_MS = "com.microsoft"
# The nodes of the gqa graph's prelude (gqa._lengths_and_biases) that read the mask's width or the batch;
# the static graph's lengths replace them.
_WIDTH = "gqa.width64"
_SEQLENS, _TOTAL = "gqa.seqlens_k", "gqa.total"
_BIAS = 10  # GroupQueryAttention's attention_bias input (0 query .. 9 position_ids, 10 attention_bias)


def _refuse(why: str) -> ConfigError:
    return ConfigError(f"cannot make the static gqa graph: {why} (export with --graph gqa)")


def _check(g, gqa: list, dims: C.ModelDims) -> None:
    """Refuse, before anything changes, a graph that is not exactly a gqa graph with plain-mask biases."""
    if len(gqa) != dims.num_layers:
        raise _refuse(f"the graph has {len(gqa)} GroupQueryAttention nodes for {dims.num_layers} layers")
    if any(list(n.input[5:7]) != [_SEQLENS, _TOTAL] for n in gqa):
        raise _refuse("its GroupQueryAttention lengths are not the gqa graph's")
    readers = [n for n in g.node if _WIDTH in n.input and n.op_type != "Cast"]
    if readers:  # gqa._past_length_reads: a window mask over past + Q columns
        raise _refuse("a sliding-window layer's mask reads the past length")
    if any(i.name == C.SEQLENS_K for i in g.input):
        raise _refuse("it already reads seqlens_k")
    prod = {o: n for n in g.node for o in n.output}
    # Each bias must be gqa's Where(attention_mask, 0, lowest): causal + that bias is the mask, so a causal pass
    # needs none. A bias of anything else (a window, a mask edited on its way) is semantics the op cannot keep.
    for n in gqa:
        bias = n.input[_BIAS] if len(n.input) > _BIAS else ""
        where = prod.get(bias)
        if len(n.input) > _BIAS + 1 or (bias and (where is None or where.op_type != "Where"
                                                  or where.input[0] != C.ATTENTION_MASK)):
            raise _refuse(f"{n.name or 'a GroupQueryAttention'}'s attention bias is not the plain mask's")
    reader = _live_mask_reader(g, gqa, prod)
    if reader is not None:
        raise _refuse(f"{reader.name or reader.op_type} reads the attention mask")


def _live_mask_reader(g, gqa: list, prod: dict):
    """A node that would still read attention_mask once the GQA nodes lose their bias and mask-width lengths
    (walking back from the graph's outputs), or None: the mask input can go."""
    trimmed = {id(n) for n in gqa}
    seen: set[int] = set()
    stack = [o.name for o in g.output]
    while stack:
        n = prod.get(stack.pop())
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        reads = [*n.input[:5], *n.input[7:_BIAS]] if id(n) in trimmed else list(n.input)
        if C.ATTENTION_MASK in reads:
            return n
        stack += reads
    return None


def rewrite_static(model, dims: C.ModelDims) -> None:
    """Rewrite a gqa graph (``onnx.ModelProto``, in place; export/graph/gqa.py's output) to the static, causal-only
    one; raises ConfigError, leaving ``model`` as it was, on a graph that is not exactly a gqa graph."""
    import onnx
    from onnx import helper as h

    g = model.graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention" and n.domain == _MS]
    _check(g, gqa, dims)
    # total_sequence_length: the buffer's capacity (a CPU shape computation), as a scalar int32.
    prelude = [h.make_node("Shape", [C.past_key(0)], ["gqa.capacity64"], start=2, end=3),
               h.make_node("Cast", ["gqa.capacity64"], ["gqa.capacity"], to=onnx.TensorProto.INT32),
               h.make_node("Squeeze", ["gqa.capacity", "gqa.axis0"], ["gqa.static_total"])]
    for n in gqa:
        n.input[5], n.input[6] = C.SEQLENS_K, "gqa.static_total"
        del n.input[_BIAS:]  # no attention_bias: the CUDA kernel refuses one (inputs 0 .. 9 remain, 9 set)
    nodes = prelude + [n for n in g.node if not set(n.output) & {_SEQLENS, _TOTAL}]
    del g.node[:]
    g.node.extend(nodes)
    inputs = [i for i in g.input if i.name != C.ATTENTION_MASK]  # its readers (width, biases) are dead now
    spec = {s.name: s for s in C.decoder_io(dims, "float32", graph=C.GQA_STATIC_GRAPH)[0]}
    inputs.append(h.make_tensor_value_info(C.SEQLENS_K, onnx.TensorProto.INT32, list(spec[C.SEQLENS_K].shape)))
    del g.input[:]
    g.input.extend(inputs)
    drop_dead(model)


def rewrite_static_file(src: Path, out: Path, dims: C.ModelDims) -> None:
    """Rewrite the gqa graph at ``src`` into ``out`` (same folder: external weight files stay referenced)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    rewrite_static(model, dims)
    onnx.save(model, str(out))
