"""The fixed sizes a graph declares on its inputs and outputs, compared with its manifest entry before any session
is made.

A manifest whose vocab_size, hidden size, KV heads or head dim disagree with its graph otherwise loads, sizes its
caches and buffers from the manifest, and fails deep inside the first pass with a 40-line ONNX Runtime traceback.
The graph's own declaration is read off the protobuf without onnx (not a runtime dependency) and without touching
its weights, as :mod:`.external_data` reads locations: ModelProto.graph 7; GraphProto.input 11, .output 12;
ValueInfoProto.name 1, .type 2; TypeProto.tensor_type 1; TypeProto.Tensor.shape 2; TensorShapeProto.dim 1;
Dimension.dim_value 1, .dim_param 2. A symbolic axis, or a tensor the graph lacks, is left to the backend's own
check of names and types (an ONNX Runtime session's, in one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import BundleError
from .contract import TensorSpec
from .external_data import fields, mapped_model

Shape = tuple["int | str", ...]


def _one(buf: memoryview, start: int, end: int, number: int) -> tuple[int, int] | None:
    """The (start, stop) of the last length-delimited field ``number`` of a message (protobuf: the last one wins)."""
    found = None
    for n, wire, value in fields(buf, start, end):
        if n == number and wire == 2:
            found = value
    return found


def _shape(buf: memoryview, start: int, end: int) -> Shape | None:
    """A ValueInfoProto's tensor shape: an int per fixed axis, its name (or "?") per symbolic one; None: no shape."""
    tensor = _one(buf, start, end, 2)
    tensor = tensor and _one(buf, *tensor, 1)
    shape = tensor and _one(buf, *tensor, 2)
    if not shape:
        return None
    dims: list[int | str] = []
    for n, wire, value in fields(buf, *shape):
        if n != 1 or wire != 2:
            continue
        dim: int | str = "?"
        for k, w, v in fields(buf, *value):
            if k == 1 and w == 0:
                dim = v - (1 << 64) if v >= 1 << 63 else v  # int64 on the wire as two's complement
            elif k == 2 and w == 2:
                dim = bytes(buf[v[0]:v[1]]).decode("utf-8", "replace")
        dims.append(dim)
    return tuple(dims)


def graph_io(path: Path) -> tuple[dict[str, Shape | None], dict[str, Shape | None]]:
    """(inputs, outputs) of the ONNX graph at ``path``: tensor name -> declared shape."""
    found: tuple[dict, dict] = ({}, {})
    with mapped_model(path) as buf:
        graph = _one(buf, 0, len(buf), 7)
        for n, wire, value in fields(buf, *graph) if graph else ():
            if n in (11, 12) and wire == 2:
                name = _one(buf, *value, 1)
                key = bytes(buf[name[0]:name[1]]).decode("utf-8", "replace") if name else ""
                found[n - 11][key] = _shape(buf, *value)
    return found


def _differs(want: tuple, got: tuple | None) -> bool:
    """Whether a declared shape contradicts the contract's: a fixed axis of another size, or another rank."""
    if got is None:
        return False
    if len(got) != len(want):
        return True
    return any(isinstance(w, int) and isinstance(g, int) and w != g for w, g in zip(want, got))


def _show(shape: tuple) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def check_graph_dims(path: Path, io: tuple[list[TensorSpec], list[TensorSpec]], what: str) -> None:
    """Refuse a graph whose declared fixed axes (vocabulary, hidden size, KV heads, head dim, tap width) are not
    those its manifest entry ``what`` (``models.target``) gives through ``io`` (:func:`contract.decoder_io`)."""
    declared = graph_io(path)
    for side, specs, got in (("input", io[0], declared[0]), ("output", io[1], declared[1])):
        for spec in specs:
            if _differs(spec.shape, got.get(spec.name)):
                raise BundleError(f"{path.name}: its {side} {spec.name} is {_show(got[spec.name])} but the manifest's "
                                  f"{what} gives {_show(spec.shape)}: the manifest does not describe this graph")


def check_heads_dims(path: Path, hidden_size: int, medusa: Any) -> None:
    """Medusa heads read the target's hidden state [B, Q, H] and return [B, Q, heads, k] ids and log-probs: the
    target's H and the manifest's heads and k must be the graph's."""
    inputs, outputs = graph_io(path)
    want_in, want_out = ("batch", "query", hidden_size), ("batch", "query", medusa.num_heads, medusa.topk)
    problems = [("input hidden", inputs["hidden"], want_in)] if _differs(want_in, inputs.get("hidden")) else []
    problems += [(f"output {name}", shape, want_out) for name, shape in outputs.items() if _differs(want_out, shape)]
    if problems:
        where, shape, want = problems[0]
        raise BundleError(f"{path.name}: its {where} is {_show(shape)} but the manifest (the target's hidden size, "
                          f"medusa.num_heads and medusa.topk) gives {_show(want)}")
