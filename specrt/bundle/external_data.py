"""Where an ONNX graph says its tensors' bytes live, read off the file without onnx and without its weights.

An initializer (or a tensor attribute, in a subgraph too) stored outside the graph names its file in
``external_data["location"]``. ONNX Runtime older than ~1.24 opens that path as it is, absolute or ``../``, and so
would read any file on the machine into a tensor; the TensorRT parser reads it too. So a bundle's graphs are
checked here before any session or parser sees them: every location relative, inside the bundle once links are
resolved, and a regular file. The ONNX file is read through its protobuf wire format with ``mmap``: only
message headers are touched, a tensor's inline bytes are skipped, so a graph of any size costs milliseconds.
Field numbers: onnx/onnx.proto (ModelProto.graph 7, .training_info 20, .functions 25; TrainingInfoProto 1, 2; GraphProto.node 1, .initializer 5,
.sparse_initializer 15; NodeProto.attribute 5; FunctionProto.node 7; AttributeProto.t 5, .g 6, .tensors 10,
.graphs 11, .sparse_tensor 22, .sparse_tensors 23; SparseTensorProto.values 1, .indices 2;
TensorProto.name 8, .external_data 13, .data_location 14; StringStringEntryProto.key 1, .value 2).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from pathlib import Path
from typing import Iterator

from ..errors import BundleError
from .safety import climbs_out

EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_MAX_DEPTH = 64  # subgraphs inside subgraphs: far past any real model, short of Python's recursion limit

# message kind -> {field number: kind of the embedded message}; fields not listed are skipped
_CHILDREN = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}


class Malformed(Exception):
    """The bytes do not parse as protobuf."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf: memoryview, pos: int, end: int):
    """(field number, wire type, value or (start, stop) of a length-delimited field) of one message's fields."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise Malformed
            yield number, wire, (pos, pos + size)
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise Malformed
        else:  # groups (3, 4) are not in onnx.proto
            raise Malformed
    if pos != end:
        raise Malformed


def _tensor_location(buf: memoryview, start: int, end: int) -> tuple[str, str] | None:
    name, location, where = "", None, 0
    for number, wire, value in fields(buf, start, end):
        if number == 8 and wire == 2:
            name = bytes(buf[value[0]:value[1]]).decode("utf-8", "replace")
        elif number == 14 and wire == 0:
            where = value
        elif number == 13 and wire == 2:
            entry = {k: bytes(buf[v[0]:v[1]]).decode("utf-8", "replace")
                     for k, w, v in fields(buf, *value) if w == 2 and k in (1, 2)}
            if entry.get(1) == "location":
                location = entry.get(2, "")
    if where == EXTERNAL or location is not None:
        return name, location or ""
    return None


def _walk(buf: memoryview, kind: str, start: int, end: int, depth: int, found: list[tuple[str, str]]) -> None:
    if depth > _MAX_DEPTH:
        raise Malformed
    if kind == "tensor":
        ref = _tensor_location(buf, start, end)
        if ref is not None:
            found.append(ref)
        return
    children = _CHILDREN[kind]
    for number, wire, value in fields(buf, start, end):
        if wire == 2 and number in children:
            _walk(buf, children[number], value[0], value[1], depth + 1, found)


@contextlib.contextmanager
def mapped_model(path: Path) -> Iterator[memoryview]:
    """``path``'s bytes, memory-mapped for a wire-format walk; a :class:`Malformed` raised while walking them, an
    empty file or one that cannot be read is one BundleError line."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise Malformed
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                buf = memoryview(mapped)
                try:
                    yield buf
                finally:
                    buf.release()
    except Malformed:
        raise BundleError(f"{path.name} is not an ONNX model (its protobuf does not parse)") from None
    except OSError as e:
        raise BundleError(f"cannot read {path}: {e.strerror}") from None


def external_locations(path: Path) -> list[tuple[str, str]]:
    """(tensor name, external data location) of every tensor ``path`` stores outside itself."""
    found: list[tuple[str, str]] = []
    with mapped_model(path) as buf:
        _walk(buf, "model", 0, len(buf), 0, found)
    return found


def check_external_data(graph: Path, folder: Path) -> None:
    """Refuse a graph whose external data is not a regular file inside ``folder`` (the bundle), links resolved."""
    root = folder.resolve()
    for tensor, location in external_locations(graph):
        if not location or "\x00" in location or climbs_out(location):
            raise BundleError(f"{graph.name}: tensor {tensor!r} keeps its data at {location!r}, outside the bundle: "
                              "external data must be a relative path inside the bundle's folder")
        target = (graph.parent / location).resolve()
        if not target.is_relative_to(root):
            raise BundleError(f"{graph.name}: tensor {tensor!r} reads {location!r}, a link leading outside the "
                              f"bundle (to {target})")
        try:
            regular = stat.S_ISREG(target.stat().st_mode)
        except OSError:
            raise BundleError(f"{graph.name}: tensor {tensor!r} reads {location!r}, which is missing: the bundle "
                              "is incomplete") from None
        if not regular:
            raise BundleError(f"{graph.name}: tensor {tensor!r} reads {location!r}, which is not a regular file")
