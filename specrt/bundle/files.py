"""What one pass of a bundle's graph reads and computes, apart from the KV cache: recorded in the manifest at
export/quantize time (when ``onnx`` is installed anyway), else read from the graph with ``onnx`` if it is
importable, else estimated from the file size and dtype; ``ModelCost.source`` says which."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .contract import graph_bytes

SOURCES = ("manifest", "onnx graph", "estimated from file size and dtype")
# Ops that hand a constant to a MatMul unchanged in size: a tied LM head reads the embedding table
# through Transpose (see export.quant.lookups.untie_lm_head), fp16 graphs may Cast.
_PASS_THROUGH = ("Transpose", "Cast", "Identity")


@dataclass(frozen=True)
class ModelCost:
    """What one pass of a decoder reads and computes, apart from the KV cache.

    weight_bytes: every initializer at its stored precision, except tables that are only gathered from
    (an untied embedding: a pass reads one row per token, not the table).
    matmul_flops_per_token: 2·K·N per MatMul / Gemm / MatMulInteger(ToFloat) with a constant weight and per
    MatMulNBits (its K and N attributes), LM head included; attention's context-dependent FLOPs are not in it (see
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


# Ops whose second input, when constant, is a [K, N] weight (integer ones count a multiply-add as float ones do)
_MATMULS = ("MatMul", "Gemm", "MatMulInteger", "MatMulIntegerToFloat")


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
        if node.op_type in _MATMULS and len(node.input) > 1:
            w = constant(node.input[1])
            if w is not None:
                flops += 2 * numel[w]  # one multiply-add per weight per token
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            flops += 2 * attrs["K"] * attrs["N"]
        for pos, name in enumerate(node.input):
            if node.op_type in ("Gather", "GatherBlockQuantized") and pos in (0, 2, 3):
                continue  # a lookup table (its scales, zero points): one row per token
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
