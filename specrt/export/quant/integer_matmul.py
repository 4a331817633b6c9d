"""int8 weights on ONNX Runtime's integer matmul, each row's activations in two 7-bit halves: the format
``specrt quantize --bits int8 --kernel integer`` writes.

Why: ``MatMulNBits`` (the default int8 format) quantizes activations to int8 per block, and its CPU kernel's
time grows almost linearly with the rows it multiplies (a 5-row verify pass costs 1.7-1.9 one-row passes on
SmolLM2-135M, 2 cores), and what it gives a row moves with the pass's row count. ``MatMulIntegerToFloat``
(MLAS's u8 × s8 kernels) costs little per extra row; with each row quantized on its own and split in two
halves it keeps about the weights' error only, and each row's product is the same whatever else is in the pass
(docs/performance/int8-integer-kernel-cpu.md):

    s   = max|x| / 63 per row                  x: one row of activations
    hi  = round(x / s)                         in [-63, 63]
    lo  = round((x / s - hi) / (1/126))        in [-63, 63]; x ≈ s · (hi + lo / 126), ~13 bits
    y   = s · (M(hi) + M(lo) / 126)            M(a) = MatMulIntegerToFloat(a + 64, Wq, zero point 64) · w_scale

The halves go through ONE matmul as rows [hi; lo] (the weights are read once; a plain step's two rows cost
what one does). ``QuantizeLinear`` makes each half's uint8 in one node (it divides by the float32 1/126 and rounds
half to even, as the numpy reference does): ten nodes per quantized input where rounding, shifting and casting
separately took twelve (a SmolLM2-135M step 2-3 % faster: docs/performance/int8-integer-kernel-cpu.md).

Weights are int8 per output column (symmetric, scale max|W[:, n]| / 127). Activations stay within 7 bits
(0..127 around 64) so that AVX2's u8 × s8 pair sums (``vpmaddubsw``: int16, saturating) cannot overflow with full
8-bit weights (2 · 127 · 127 < 32767); VNNI, AMX and ARM's dot products sum in int32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ACT_MAX = 63  # each half's magnitude
LO_STEPS = 2 * ACT_MAX  # lo = round(126 · (x/s - hi)): |x/s - hi| ≤ 1/2, so |lo| ≤ 63
LO_SCALE = np.float32(1 / LO_STEPS)  # QuantizeLinear's scale for lo: it divides by it
ZERO_POINT = 64  # the halves as uint8 in 1..127, the type MLAS's fast kernels take
WEIGHT_MAX = 127
FORMAT = "MatMulIntegerToFloat, int8 weights per column, per-row activations in two 7-bit halves"


def quantize_columns(weight: np.ndarray, limit: int = WEIGHT_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-column int8 of a [K, N] weight: (q [K, N] int8 with |q| ≤ ``limit``, scale [N] float32)."""
    w = weight.astype(np.float32)
    scale = np.abs(w).max(axis=0) / limit
    safe = np.where(scale == 0, 1, scale)
    return np.clip(np.rint(w / safe), -limit, limit).astype(np.int8), scale.astype(np.float32)


def split_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph's activation quantization in numpy: (hi, lo) as uint8 around ZERO_POINT, and the per-row
    scale (trailing axis kept). The reference the tests hold the graph to."""
    x = x.astype(np.float32)
    scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) * np.float32(1 / ACT_MAX), np.float32(1e-30))
    t = x / scale
    hi = np.rint(t)
    lo = np.rint((t - hi) / LO_SCALE)
    return (hi + ZERO_POINT).astype(np.uint8), (lo + ZERO_POINT).astype(np.uint8), scale


def reference_matmul(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What a rewritten MatMul computes (integer sums in int64), for x [..., K] and q, scale from
    :func:`quantize_columns`."""
    hi, lo, s = split_rows(x)
    acc = lambda a: ((a.astype(np.int64) - ZERO_POINT) @ q.astype(np.int64)).astype(np.float32) * scale  # noqa: E731
    return (acc(hi) + acc(lo) * np.float32(1 / LO_STEPS)) * s


@dataclass
class _Rewrite:
    inits: list = field(default_factory=list)
    halves: dict = field(default_factory=dict)  # activation tensor -> (uint8 [hi; lo] tensor, scale tensor)

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def shared(self, name: str, value) -> str:
        full = f"specrt.integer.{name}"
        if not any(i.name == full for i in self.inits):
            self.const(full, np.asarray(value))
        return full

    def split(self, x: str, nodes: list) -> tuple[str, str]:
        """x's rows as uint8 [hi; lo] (stacked on the row axis) and its per-row scale, made once however many
        MatMuls read x."""
        from onnx import helper

        if x in self.halves:
            return self.halves[x]
        p = f"{x}.i8"
        f32 = lambda v: np.array(v, np.float32)  # noqa: E731
        zero_point = self.shared("zero_point", np.array(ZERO_POINT, np.uint8))
        nodes += [
            helper.make_node("Abs", [x], [f"{p}.abs"]),
            helper.make_node("ReduceMax", [f"{p}.abs", self.shared("axes_last", np.array([-1], np.int64))],
                             [f"{p}.max"], keepdims=1),  # axes as an input: opset 18
            helper.make_node("Mul", [f"{p}.max", self.shared("inv_act_max", f32(1 / ACT_MAX))], [f"{p}.s0"]),
            # an all-zero row: scale 1e-30, halves 0, result 0 (not 0/0)
            helper.make_node("Max", [f"{p}.s0", self.shared("tiny", f32(1e-30))], [f"{p}.scale"]),
            helper.make_node("Div", [x, f"{p}.scale"], [f"{p}.t"]),
            helper.make_node("Round", [f"{p}.t"], [f"{p}.hi"]),
            helper.make_node("Sub", [f"{p}.t", f"{p}.hi"], [f"{p}.rest"]),
            # round(v / scale) + 64 as uint8 in one node each (hi is whole already: its scale is 1)
            helper.make_node("QuantizeLinear", [f"{p}.hi", self.shared("one", f32(1)), zero_point], [f"{p}.hi_u8"]),
            helper.make_node("QuantizeLinear", [f"{p}.rest", self.shared("lo_scale", LO_SCALE), zero_point],
                             [f"{p}.lo_u8"]),
            helper.make_node("Concat", [f"{p}.hi_u8", f"{p}.lo_u8"], [f"{p}.u8"], axis=-2),
        ]
        self.halves[x] = (f"{p}.u8", f"{p}.scale")
        return self.halves[x]

    def matmul(self, node, weight: np.ndarray, nodes: list) -> None:
        from onnx import helper

        q, scale = quantize_columns(weight)
        halves, s = self.split(node.input[0], nodes)
        y, w = node.output[0], node.input[1]
        nodes += [
            helper.make_node("MatMulIntegerToFloat", [halves, self.const(f"{w}.int8", q),
                                                      self.shared("one", np.array(1, np.float32)),
                                                      self.const(f"{w}.int8.scales", scale),
                                                      self.shared("zero_point", np.array(ZERO_POINT, np.uint8))],
                             [f"{y}.halves"], name=node.name, domain="com.microsoft"),
            helper.make_node("Split", [f"{y}.halves"], [f"{y}.hi", f"{y}.lo"], axis=-2, num_outputs=2),
            helper.make_node("Mul", [f"{y}.lo", self.shared("inv_lo_steps", np.array(1 / LO_STEPS, np.float32))],
                             [f"{y}.lo_scaled"]),
            helper.make_node("Add", [f"{y}.hi", f"{y}.lo_scaled"], [f"{y}.sum"]),
            helper.make_node("Mul", [f"{y}.sum", s], [y]),
        ]


def rewrite_integer(model, names: set[str] | None = None) -> list[str]:
    """Rewrite in place every MatMul of ``model`` with a constant 2-D float weight (or those named in ``names``)
    into the integer form of the module docstring. Needs opset ≥ 18 (``Split``'s ``num_outputs``, ``ReduceMax``'s
    axes input). Returns the rewritten nodes' names; their float weights are dropped. A float16 weight is left as
    it is (its activations would need casts): :func:`integer_graph` refuses such graphs."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 18:
        raise ValueError(f"the integer rewrite needs opset 18 or later, this graph has {opset}")
    inits = {i.name: i for i in g.initializer}
    rw = _Rewrite()
    done, nodes, replaced = [], [], set()
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if (w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT
                or (names is not None and node.name not in names)):
            nodes.append(node)
            continue
        rw.matmul(node, numpy_helper.to_array(w), nodes)
        replaced.add(w.name)
        done.append(node.name)
    if done:
        replace_nodes(g, nodes, rw.inits, replaced)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return done


def replace_nodes(graph, nodes: list, inits: list, replaced: set[str]) -> None:
    """A rewrite's last step: ``graph``'s nodes become ``nodes``, ``inits`` are added, and the ``replaced``
    initializers nothing reads any more are dropped."""
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    read = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name in replaced and i.name not in read]:
        graph.initializer.remove(init)


def integer_graph(model, path, out, lookups: bool, lookup_block: int, untied: bool, before: set[str]) -> dict:
    """``quantize.quantize_graph`` with ``kernel="integer"``: every constant MatMul of ``model`` (read from
    ``path``, its LM head untied) rewritten, the lookups (``lookups``) on GatherBlockQuantized at int8 (a tied
    head's bytes cannot be shared: the layouts differ), saved to ``out``; the quantization record."""
    import onnx

    from ...bundle import contract as C
    from ...errors import ConfigError
    from .lookups import quantize_lookups
    from ..staging import save_graph

    inits = {i.name: i.data_type for i in model.graph.initializer}
    if any(inits.get(n.input[1]) == onnx.TensorProto.FLOAT16 for n in model.graph.node if n.op_type == "MatMul"):
        raise ConfigError(f"{path.name} is float16: --kernel integer rewrites float32 graphs (export with --dtype "
                          "fp32, or use --kernel nbits)")
    try:
        rewrite_integer(model)
    except ValueError as e:
        raise ConfigError(f"{path.name}: {e} (export again with --opset 18 or later, or use --kernel nbits)") from None
    tables = quantize_lookups(model, lookup_block) if lookups else []
    after = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    save_graph(model, out)
    return {"bits": 8, "block_size": None, "kernel": "integer", "format": FORMAT, "symmetric": True,
            "algorithm": "rtn", "quantized_matmuls": sorted(before - after), "lm_head_untied": untied,
            **({"quantized_lookups": tables, "lookup_bits": 8, "lookup_block_size": lookup_block} if tables else {}),
            "bytes_before": C.graph_bytes(path), "bytes_after": C.graph_bytes(out)}
