"""The ONNX decoder contract, declared once; exporter, manifest and runtime all read it from here.

One graph per model serves prefill (P = 0), single-token decode, chain verification and tree
verification (a gqa-static graph, below, all but the last). See docs/design/contract.md for the reasoning
behind each choice.

Shapes (B = batch, Q = new tokens, P = past length, S = P + Q, H_kv = kv heads, D = head dim):

    input_ids       int64    [B, Q]
    position_ids    int64    [B, Q]
    attention_mask  bool     [B, 1, Q, S]     True = may attend; expresses causal chains and trees
    past_key.N      {dtype}  [B, P, H_kv, D]  seq-major: a prefix of one [B, max_ctx, H_kv, D]
    past_value.N    {dtype}  [B, P, H_kv, D]  buffer is a contiguous view (B = 1), so no copy
    logits          float32  [B, Q, V]        always fp32, whatever the weights' dtype
    hidden          {dtype}  [B, Q, H]        final hidden state (after the last norm), for Medusa
    new_key.N       {dtype}  [B, Q, H_kv, D]  ONLY the Q new slices; the runtime owns the cache
    new_value.N     {dtype}  [B, Q, H_kv, D]
    eagle_taps      {dtype}  [B, Q, T*H]      only in a target exported with an EAGLE-3 head: the hidden
                                              states ENTERING layers ``eagle_taps`` (T of them, 3 for
                                              EAGLE-3), concatenated in that order
    logits_index    int64    [R]              graphs whose manifest entry says ``logits_index`` (exports
                                              since it existed): the rows of this pass whose logits the
                                              graph computes, so ``logits`` is [B, R, V]. A prefill asks
                                              for its last row only: the LM head over every prompt row
                                              was ~16 % of a SmolLM2 prefill. Old bundles lack it.

An EAGLE-3 head (kind "eagle3") is one decoder layer (or a stack of them) with the same cache I/O and two more
inputs; its logits are over the draft vocabulary (D_v ids, mapped to target ids by the bundle's vocab
map) and its ``hidden`` is the layer's output before the final norm: the next draft step's features.

    eagle_taps      {dtype}  [B, Q, T*H_t]    the target's taps at the row's position (zeros: none)
    eagle_features  {dtype}  [B, Q, H]        the head's own ``hidden`` of the row before (zeros: none)
    logits          float32  [B, Q, D_v]

The head fuses ``fc(eagle_taps) + eagle_features`` (fc has no bias, so a row passes exactly one of the
two and zeros for the other): rows that follow verified tokens read the target's taps, rows of deeper
draft steps the head's own features, in one graph.

A DFlash block drafter (kind "dflash") takes a block of Q slots, [last token, MASK x (Q-1)], and the target's
taps of the C positions committed since its last pass; its cache holds only the context's K/V (C rows are
appended per pass: ``new_key.N`` has C rows, not Q), and every block row attends to all of the context and
the whole block (no mask). No ``attention_mask``, no ``hidden``:

    input_ids          int64    [B, Q]          the block: the last sampled token, then the mask token
    position_ids       int64    [B, Q]          its positions, start .. start + Q - 1
    dflash_context     {dtype}  [B, C, T*H_t]   the target's taps at the new context positions
    context_positions  int64    [B, C]          those positions (start - C .. start - 1)
    logits             float32  [B, Q - 1, D_v] slots 1 .. Q-1: the drafted tokens, over the draft vocabulary
    new_key.N          {dtype}  [B, C, H_kv, D] the context rows' K/V only: block K/V are never cached
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_VERSION = 1

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"
HIDDEN = "hidden"
EAGLE_TAPS = "eagle_taps"
EAGLE_FEATURES = "eagle_features"
LOGITS_INDEX = "logits_index"
DFLASH_CONTEXT = "dflash_context"
CONTEXT_POSITIONS = "context_positions"
KINDS = ("decoder", "eagle3", "dflash")
MAX_BLOCK = 64  # the longest block a DFlash draft runs (the runtime's speculation length is capped at 64 tokens)

DTYPES = ("float32", "float16")


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def new_key(layer: int) -> str:
    return f"new_key.{layer}"


def new_value(layer: int) -> str:
    return f"new_value.{layer}"


# A "gqa" graph (export/graph/gqa.py: ONNX Runtime's GroupQueryAttention) keeps each layer's cache as ONE buffer
# [B, H_kv, capacity, D] (head-major), bound as past_key.N and as present_key.N: the op writes the Q new
# rows in place at the current length (the mask's width - Q), so nothing is re-bound between passes.
GQA_GRAPH = "gqa"

# The gqa graph with static shapes (export/graph/gqa_static.py), for ONNX Runtime's CUDA-graph mode: the lengths come
# from a bound input instead of the mask's width, so a pass of Q rows has the same shapes (and, bound once, the same
# addresses) every step. It takes NO attention_mask: ONNX Runtime's CUDA GroupQueryAttention refuses any
# attention_bias, so the graph is causal only (new row i sees cache rows 0 .. past + i): prefills, plain steps and
# chains, never a token tree.
#
#     seqlens_k       int32    [B]                  past + Q - 1: the op writes the Q rows at past .. past + Q - 1
GQA_STATIC_GRAPH = "gqa-static"
SEQLENS_K = "seqlens_k"
SHARED_KV_GRAPHS = (GQA_GRAPH, GQA_STATIC_GRAPH)  # one head-major buffer per layer, read and written in place
CAUSAL_ONLY_GRAPHS = (GQA_STATIC_GRAPH,)  # no attention_mask input: they cannot verify a token tree


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"


@dataclass(frozen=True)
class ModelDims:
    """The fixed sizes of one decoder, recorded in the manifest; the runtime sizes its cache from them."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, element type and shape (str = dynamic axis, int = fixed)."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


def decoder_io(dims: ModelDims, dtype: str, kind: str = "decoder", tap_width: int = 0, graph: str = "portable",
               logits_index: bool = False) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The (inputs, outputs) of a graph with the given dims and weight/KV dtype. ``tap_width``: a decoder's
    ``eagle_taps`` output width (0: none), or an EAGLE-3 head's ``eagle_taps`` input width. ``graph``
    :data:`GQA_GRAPH`: the shared head-major cache buffers (past_key.N in, present_key.N out);
    :data:`GQA_STATIC_GRAPH`: the same, with :data:`SEQLENS_K` and no attention mask (causal only).
    ``logits_index``: the graph takes :data:`LOGITS_INDEX` (after the cache inputs, as the wrappers trace it)
    and returns logits for those rows only."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind in ("eagle3", "dflash") and tap_width < 1:
        raise ValueError(f"a {kind} drafter needs the width of the target taps it reads")
    if kind == "dflash":
        return dflash_io(dims, dtype, tap_width)
    kv_past = ("batch", "past", dims.num_kv_heads, dims.head_dim)
    kv_new = ("batch", "query", dims.num_kv_heads, dims.head_dim)
    static = graph == GQA_STATIC_GRAPH
    inputs = [TensorSpec(INPUT_IDS, "int64", ("batch", "query")), TensorSpec(POSITION_IDS, "int64", ("batch", "query"))]
    if graph not in CAUSAL_ONLY_GRAPHS:
        inputs.append(TensorSpec(ATTENTION_MASK, "bool", ("batch", 1, "query", "past_plus_query")))
    if kind == "eagle3":
        inputs += [TensorSpec(EAGLE_TAPS, dtype, ("batch", "query", tap_width)),
                   TensorSpec(EAGLE_FEATURES, dtype, ("batch", "query", dims.hidden_size))]
    outputs = [
        TensorSpec(LOGITS, "float32", ("batch", "logits_rows" if logits_index else "query", dims.vocab_size)),
        TensorSpec(HIDDEN, dtype, ("batch", "query", dims.hidden_size)),
    ]
    if kind == "decoder" and tap_width:
        outputs.append(TensorSpec(EAGLE_TAPS, dtype, ("batch", "query", tap_width)))
    if graph in SHARED_KV_GRAPHS:
        buffer = ("batch", dims.num_kv_heads, "capacity", dims.head_dim)
        for i in range(dims.num_layers):
            inputs += [TensorSpec(past_key(i), dtype, buffer), TensorSpec(past_value(i), dtype, buffer)]
            outputs += [TensorSpec(present_key(i), dtype, buffer), TensorSpec(present_value(i), dtype, buffer)]
    else:
        for i in range(dims.num_layers):
            inputs += [TensorSpec(past_key(i), dtype, kv_past), TensorSpec(past_value(i), dtype, kv_past)]
            outputs += [TensorSpec(new_key(i), dtype, kv_new), TensorSpec(new_value(i), dtype, kv_new)]
    if logits_index:
        inputs.append(TensorSpec(LOGITS_INDEX, "int64", ("logits_rows",)))
    if static:
        inputs.append(TensorSpec(SEQLENS_K, "int32", ("batch",)))
    return inputs, outputs


def tap_columns(taps: tuple[int, ...], wanted: tuple[int, ...], width: int) -> list[int]:
    """The columns of a target's ``eagle_taps`` output (``taps`` side by side, ``width`` each) that hold the layers
    ``wanted``, in ``wanted``'s order: what a drafter reading some of the taps takes."""
    return [taps.index(t) * width + j for t in wanted for j in range(width)]


def dflash_io(dims: ModelDims, dtype: str, tap_width: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """A DFlash draft's (inputs, outputs): the block, the new context's taps and positions, the context K/V."""
    kv_past = ("batch", "past", dims.num_kv_heads, dims.head_dim)
    kv_new = ("batch", "context", dims.num_kv_heads, dims.head_dim)
    inputs = [TensorSpec(INPUT_IDS, "int64", ("batch", "query")), TensorSpec(POSITION_IDS, "int64", ("batch", "query")),
              TensorSpec(DFLASH_CONTEXT, dtype, ("batch", "context", tap_width)),
              TensorSpec(CONTEXT_POSITIONS, "int64", ("batch", "context"))]
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "drafted", dims.vocab_size))]
    for i in range(dims.num_layers):
        inputs += [TensorSpec(past_key(i), dtype, kv_past), TensorSpec(past_value(i), dtype, kv_past)]
        outputs += [TensorSpec(new_key(i), dtype, kv_new), TensorSpec(new_value(i), dtype, kv_new)]
    return inputs, outputs


def io_mismatch(expected: tuple[list[TensorSpec], list[TensorSpec]], inputs: dict[str, str],
                outputs: dict[str, str]) -> str | None:
    """What differs between the contract's (inputs, outputs) and a graph's (name -> element type, numpy names),
    or None: a graph swapped for another, or of another dtype than its manifest entry says."""
    for side, specs, got in (("input", expected[0], inputs), ("output", expected[1], outputs)):
        want = {s.name: s.dtype for s in specs}
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        if missing or extra:
            return (f"its {side}s differ from the manifest's: " + ", ".join(
                [f"missing {n}" for n in missing[:3]] + [f"unexpected {n}" for n in extra[:3]]))
        wrong = [(n, t, got[n]) for n, t in want.items() if got[n] != t]
        if wrong:
            n, t, g = wrong[0]
            return f"its {side} {n} is {g}, the manifest says {t}"
    return None


def dynamic_axes(specs: list[TensorSpec]) -> dict[str, dict[int, str]]:
    """The symbolic axes of each tensor, in the form ``torch.onnx.export`` takes."""
    return {s.name: {i: d for i, d in enumerate(s.shape) if isinstance(d, str)} for s in specs}


def graph_file_bytes(path: Path) -> tuple[int, int]:
    """A graph's bytes on disk: (the .onnx file, its external data ``<file>.data`` or 0)."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size, (data.stat().st_size if data.is_file() else 0)


def graph_bytes(path: Path) -> int:
    """A graph's bytes on disk: the .onnx file plus its external data, if any."""
    return sum(graph_file_bytes(path))


# The logits summary graph (specrt/data/logits_summary.onnx, built by specrt.export.graph.summary): what a
# GPU backend sends up after a pass instead of whole rows of logits. One file serves every bundle, old
# or new, target or draft (V is dynamic), so the decoder graphs and the CPU path are unchanged.
#
#     logits           float32  [Q, V]   a decoder's logits, read where they lie in device memory
#     inv_temperature  float32  [1]      1 / T (1 for greedy, whose summary ignores the normaliser)
#     top_values       float32  [Q, K]   the K largest logits of each row, any order among ties
#     top_ids          int32    [Q, K]   their ids
#     lse              float32  [Q]      log sum exp(logits / T) over the whole row
SUMMARY_FILE = "logits_summary.onnx"
SUMMARY_LOGITS = "logits"
SUMMARY_INV_T = "inv_temperature"
SUMMARY_VALUES = "top_values"
SUMMARY_IDS = "top_ids"
SUMMARY_LSE = "lse"
SUMMARY_TOP_K = 64
SUMMARY_BLOCK = 256  # ids per partial sum of the normaliser (see export/graph/summary.py)
SUMMARY_ENGINE = "summary"  # its TensorRT engine's role in the manifest's engines (specrt build)


def summary_graph_path() -> Path:
    """The shipped logits summary graph."""
    return Path(__file__).parents[1] / "data" / SUMMARY_FILE
