"""The gqa graph with static shapes (``--graph gqa-static``): what ONNX Runtime's CUDA-graph mode can replay.

The gqa graph (export/graph/gqa.py) derives GroupQueryAttention's lengths from the mask's width (seqlens_k =
S - 1, total_sequence_length = S), so the mask, and with it a pass's shapes, grow by a column every step and no
CUDA graph can be captured. Here the lengths come from elsewhere:

- ``seqlens_k`` [B] int32 is a graph input (past + Q - 1): device memory the runtime writes before each pass.
  On ONNX Runtime's CUDA provider the op reads it on the device (only ``total_sequence_length`` is a CPU
  input of the CUDA kernel), so a captured graph replays with the new value.
- ``total_sequence_length`` is the cache buffer's capacity, read from past_key.0's shape: a shape computation
  ORT places on the CPU, constant for a bound buffer (CUDA-graph mode allows such CPU shape nodes, not
  memcpys), and GQA only attends to seqlens_k + 1 columns whatever it says.
- ``attention_mask`` spans the whole buffer, [B, 1, Q, capacity]: column j is cache row j, so the new rows
  are columns past .. past + Q - 1 (where the op writes them). Its additive bias is made as in the gqa graph.

So a pass of Q rows has the same shapes every step, and with every input and output bound once, the same
addresses. The numbers are those of the gqa graph: the op reads the same rows with the same bias over
them (tests/export/graph/test_gqa_static.py compares the logits on CPU ONNX Runtime).

Sliding-window layers are refused: their window masks are built from the past length to the width
past + Q, not the buffer's. Note that ONNX Runtime's CUDA GroupQueryAttention kernel refuses any
``attention_bias`` (every release to date: "attention_bias is not supported in GroupQueryAttention cuda
kernel"), so this graph, like the gqa one, runs its attention on CUDA only where that changes (docs/gpu.md).
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


def _refuse(why: str) -> ConfigError:
    return ConfigError(f"cannot make the static gqa graph: {why} (export with --graph gqa)")


def rewrite_static(model, dims: C.ModelDims) -> None:
    """Rewrite a gqa graph (``onnx.ModelProto``, in place; export/graph/gqa.py's output) to the static one;
    raises ConfigError, leaving ``model`` as it was, on a graph that is not exactly a gqa graph."""
    import onnx
    from onnx import helper as h

    g = model.graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention" and n.domain == _MS]
    if len(gqa) != dims.num_layers:
        raise _refuse(f"the graph has {len(gqa)} GroupQueryAttention nodes for {dims.num_layers} layers")
    if any(list(n.input[5:7]) != [_SEQLENS, _TOTAL] for n in gqa):
        raise _refuse("its GroupQueryAttention lengths are not the gqa graph's")
    readers = [n for n in g.node if _WIDTH in n.input and n.op_type != "Cast"]
    if readers:  # gqa._past_length_reads: a window mask over past + Q columns
        raise _refuse("a sliding-window layer's mask reads the past length")
    if any(i.name == C.SEQLENS_K for i in g.input):
        raise _refuse("it already reads seqlens_k")
    inputs = {i.name: i for i in g.input}
    # total_sequence_length: the buffer's capacity (a CPU shape computation), as a scalar int32.
    prelude = [h.make_node("Shape", [C.past_key(0)], ["gqa.capacity64"], start=2, end=3),
               h.make_node("Cast", ["gqa.capacity64"], ["gqa.capacity"], to=onnx.TensorProto.INT32),
               h.make_node("Squeeze", ["gqa.capacity", "gqa.axis0"], ["gqa.static_total"])]
    for n in gqa:
        n.input[5], n.input[6] = C.SEQLENS_K, "gqa.static_total"
    nodes = prelude + [n for n in g.node if not set(n.output) & {_SEQLENS, _TOTAL}]
    del g.node[:]
    g.node.extend(nodes)
    spec = {s.name: s for s in C.decoder_io(dims, "float32", graph=C.GQA_STATIC_GRAPH)[0]}
    mask = spec[C.ATTENTION_MASK]
    inputs[C.ATTENTION_MASK].CopyFrom(h.make_tensor_value_info(C.ATTENTION_MASK, onnx.TensorProto.BOOL,
                                                               list(mask.shape)))
    g.input.append(h.make_tensor_value_info(C.SEQLENS_K, onnx.TensorProto.INT32, list(spec[C.SEQLENS_K].shape)))
    drop_dead(model)


def rewrite_static_file(src: Path, out: Path, dims: C.ModelDims) -> None:
    """Rewrite the gqa graph at ``src`` into ``out`` (same folder: external weight files stay referenced)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    rewrite_static(model, dims)
    onnx.save(model, str(out))
