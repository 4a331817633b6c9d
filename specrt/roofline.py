"""Where the limit is: what one pass of each model reads and computes, and what that means per token.

Decoding one token at batch size 1 reads every weight once and the whole KV cache once, and does
about two FLOPs per weight: it is memory-bound, so bytes per generated token divided by the
machine's sustainable bandwidth bounds tokens/s from above (the roofline). Speculation trades more
arithmetic (theory.ops_factor) for fewer passes, so fewer bytes per token.

Per model figures come from the manifest (recorded at export/quantize time, when ``onnx`` is
installed anyway), else from the graph with ``onnx`` if it is importable, else are estimated from the
file size and dtype; ``ModelCost.source`` says which.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .contract import ModelDims, graph_bytes
from .errors import ConfigError

SOURCES = ("manifest", "onnx graph", "estimated from file size and dtype")
# Ops that hand a constant to a MatMul unchanged in size: a tied LM head reads the embedding table
# through Transpose (see export.quantize.untie_lm_head), fp16 graphs may Cast.
_PASS_THROUGH = ("Transpose", "Cast", "Identity")


@dataclass(frozen=True)
class ModelCost:
    """What one pass of a decoder reads and computes, apart from the KV cache.

    weight_bytes: every initializer at its stored precision, except tables that are only gathered from
    (an untied embedding: a pass reads one row per token, not the table).
    matmul_flops_per_token: 2·K·N per MatMul / Gemm with a constant weight and per MatMulNBits (its K
    and N attributes), LM head included; attention's context-dependent FLOPs are not in it (see
    :func:`attention_flops_per_token`)."""

    weight_bytes: int
    matmul_flops_per_token: int
    source: str

    def __post_init__(self) -> None:
        if self.weight_bytes < 0 or self.matmul_flops_per_token < 0:
            raise ValueError(f"weight bytes and FLOPs must be >= 0, got {self.weight_bytes}, "
                             f"{self.matmul_flops_per_token}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")

    def manifest_fields(self) -> dict[str, int]:
        """The figures as ``ModelEntry`` records them (export and quantize write them)."""
        return {"weight_bytes": self.weight_bytes, "matmul_flops_per_token": self.matmul_flops_per_token}


def graph_cost(path: str | Path) -> ModelCost:
    """Weight bytes and matmul FLOPs per token read from an ONNX graph (needs ``onnx``; weights in
    external data are sized from their shapes, never loaded)."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name: i for i in g.initializer}
    numel = {n: int(np.prod(i.dims, dtype=np.int64)) for n, i in inits.items()}
    producers = {o: n for n in g.node for o in n.output}

    def constant(name: str) -> str | None:
        """The initializer behind ``name``, followed through Transpose/Cast/Identity; None: an activation."""
        while name not in inits:
            node = producers.get(name)
            if node is None or node.op_type not in _PASS_THROUGH:
                return None
            name = node.input[0]
        return name

    flops = 0
    read: set[str] = set()
    for node in g.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1:
            w = constant(node.input[1])
            if w is not None:
                flops += 2 * numel[w]  # one multiply-add per weight per token
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            flops += 2 * attrs["K"] * attrs["N"]
        for pos, name in enumerate(node.input):
            if node.op_type == "Gather" and pos == 0:
                continue  # a lookup table: one row per token
            w = constant(name) if name else None
            if w is not None:
                read.add(w)
    weight_bytes = sum(numel[n] * np.dtype(tensor_dtype_to_np_dtype(inits[n].data_type)).itemsize for n in read)
    return ModelCost(weight_bytes=int(weight_bytes), matmul_flops_per_token=int(flops), source="onnx graph")


def estimated_cost(path: str | Path, bytes_per_weight: float) -> ModelCost:
    """Without ``onnx``: every byte of the file is read per pass, and each weight is one multiply-add
    (2 FLOPs) per token. An upper bound: an untied embedding table is counted though only gathered."""
    if bytes_per_weight <= 0:
        raise ValueError(f"bytes per weight must be > 0, got {bytes_per_weight}")
    size = graph_bytes(Path(path))
    return ModelCost(weight_bytes=size, matmul_flops_per_token=int(2 * size / bytes_per_weight),
                     source="estimated from file size and dtype")


def entry_cost(bundle: str | Path, entry) -> ModelCost:
    """The cost of a manifest ``ModelEntry``: recorded figures, else the graph read with onnx, else an estimate."""
    if entry.weight_bytes is not None and entry.matmul_flops_per_token is not None:
        return ModelCost(entry.weight_bytes, entry.matmul_flops_per_token, "manifest")
    bits = (entry.quantization or {}).get("bits")
    return file_cost(Path(bundle) / entry.file, bits / 8 if bits else np.dtype(entry.dtype).itemsize)


def file_cost(path: Path, bytes_per_weight: float) -> ModelCost:
    """:func:`graph_cost` where ``onnx`` is importable, else :func:`estimated_cost`."""
    if importlib.util.find_spec("onnx") is None:  # not a runtime dependency
        return estimated_cost(path, bytes_per_weight)
    return graph_cost(path)


def kv_bytes_per_position(dims: ModelDims, dtype: str) -> int:
    """KV-cache bytes one position holds, read by every later pass: 2 (K and V) · layers · kv heads ·
    head dim · bytes per element."""
    return 2 * dims.num_layers * dims.num_kv_heads * dims.head_dim * np.dtype(dtype).itemsize


def attention_flops_per_token(dims: ModelDims, context: int) -> int:
    """Attention's FLOPs per new token at a context of ``context`` positions: Q·Kᵀ and P·V, each 2 · heads ·
    head dim · context per layer. Not in the graph's matmul count: it grows with the context."""
    if context < 0:
        raise ConfigError(f"context must be >= 0, got {context}")
    return 4 * dims.num_layers * dims.num_heads * dims.head_dim * context


@dataclass(frozen=True)
class PassBytes:
    """Bytes one pass of a model reads: its weights, and its KV cache at the context it runs at."""

    weights: float
    kv: float

    def __post_init__(self) -> None:
        if self.weights < 0 or self.kv < 0:
            raise ValueError(f"bytes must be >= 0, got weights {self.weights}, kv {self.kv}")

    @property
    def total(self) -> float:
        return self.weights + self.kv


def bytes_per_token(tokens: float, target_passes: float, target: PassBytes, draft_passes: float = 0.0,
                    draft: PassBytes | None = None) -> float:
    """(target passes · target bytes + draft passes · draft bytes) / tokens: the memory traffic one
    generated token costs. Plain decoding: one target pass per token."""
    if tokens <= 0:
        raise ValueError(f"tokens must be > 0, got {tokens}")
    if target_passes < 0 or draft_passes < 0:
        raise ValueError(f"passes must be >= 0, got {target_passes}, {draft_passes}")
    if draft_passes and draft is None:
        raise ValueError("draft passes without the draft's bytes")
    return (target_passes * target.total + (draft_passes * draft.total if draft_passes else 0.0)) / tokens


def achieved_gbps(bytes_per_tok: float, tokens_per_second: float) -> float:
    """The bandwidth a method used, in GB/s (1e9 bytes): bytes per token × tokens per second."""
    return bytes_per_tok * tokens_per_second / 1e9


def roofline_tokens_per_second(bandwidth_gbps: float, bytes_per_tok: float) -> float:
    """The most tokens/s a machine with this bandwidth can give when every token reads ``bytes_per_tok``."""
    if bandwidth_gbps <= 0 or bytes_per_tok <= 0:
        raise ValueError(f"bandwidth and bytes per token must be > 0, got {bandwidth_gbps}, {bytes_per_tok}")
    return bandwidth_gbps * 1e9 / bytes_per_tok


def mu(draft: ModelCost, target: ModelCost, draft_dims: ModelDims | None = None,
       target_dims: ModelDims | None = None, context: int = 0) -> float:
    """Draft / target arithmetic operations per token: matmul FLOPs, plus attention at ``context``
    positions where both models' dims are given."""
    d, t = draft.matmul_flops_per_token, target.matmul_flops_per_token
    if context and draft_dims is not None and target_dims is not None:
        d += attention_flops_per_token(draft_dims, context)
        t += attention_flops_per_token(target_dims, context)
    if t <= 0:
        raise ConfigError("the target graph has no matmul with constant weights: cannot compute mu")
    return d / t
