"""A graph's external data must live inside its bundle: specrt checks every location itself, before any ONNX Runtime
session (which confines it only from ~1.24 on) or TensorRT parser opens the graph, at any depth of subgraphs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import specrt
from specrt.bundle.external_data import check_external_data, external_locations
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import BundleError


OPENED: list[str] = []  # files opened from Python (open, os.open, mmap's file) while WATCHING holds an entry
WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if WATCHING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.path.realpath(args[0]))


sys.addaudithook(_audit)  # for good (hooks cannot be removed): it records only while a test watches


def _externalise(tensor: onnx.TensorProto, folder: Path, location: str, data_file: Path | None = None) -> None:
    """Move ``tensor``'s bytes to ``data_file`` (default: ``folder / location``) and name ``location`` in the graph."""
    data_file = data_file or folder / location
    data_file.parent.mkdir(parents=True, exist_ok=True)
    data_file.write_bytes(tensor.raw_data)
    size = len(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shared" / "bundle"
    shutil.copytree(bundle, out)
    return out


def _largest(model: onnx.ModelProto) -> onnx.TensorProto:
    return max(model.graph.initializer, key=lambda x: len(x.raw_data))


def _point_draft_at(bundle: Path, location: str, data_file: Path | None = None) -> Path:
    """The draft's largest initializer (its LM head) read from ``location``; returns the file holding the bytes."""
    model = onnx.load(str(bundle / "draft.onnx"))
    data_file = data_file or bundle / location
    _externalise(_largest(model), bundle, location, data_file)
    onnx.save(model, str(bundle / "draft.onnx"))
    return data_file


def _secret(tmp_path: Path) -> Path:
    return tmp_path / "secret.bin"


CASES = {
    "through ..": (lambda b, t: _point_draft_at(b, "../../secret.bin", _secret(t)), "outside the bundle"),
    "absolute": (lambda b, t: _point_draft_at(b, str(_secret(t)), _secret(t)), "outside the bundle"),
    "a link out": (lambda b, t: (_point_draft_at(b, "lm_head.bin", _secret(t)),
                                 (b / "lm_head.bin").symlink_to(_secret(t))), "leading outside"),
    "a folder": (lambda b, t: (_point_draft_at(b, "lm_head.bin", _secret(t)), (b / "lm_head.bin").mkdir()),
                 "not a regular file"),
    "missing": (lambda b, t: (_point_draft_at(b, "lm_head.bin", _secret(t))), "which is missing"),
}


@pytest.mark.parametrize("case", CASES)
def test_external_data_outside_the_bundle_is_refused_before_any_session(bundles, tmp_path, case):
    bundle = _copy(bundles["llama"], tmp_path)
    make, message = CASES[case]
    make(bundle, tmp_path)
    with pytest.raises(BundleError, match=message) as e:
        load_manifest(bundle)  # the manifest alone refuses it: no ONNX Runtime involved
    assert "\n" not in str(e.value)
    OPENED.clear()
    WATCHING.append(True)
    try:
        with pytest.raises(BundleError, match=message):
            specrt.load(bundle, threads=1)
    finally:
        WATCHING.clear()
    assert str(_secret(tmp_path).resolve()) not in OPENED
    # the hook does see the load's files (a link out is refused before even the manifest is read)
    assert case == "a link out" or str((bundle / "specrt.json").resolve()) in OPENED
    res = CliRunner().invoke(main, ["run", "x", "--bundle", str(bundle), "--method", "draft", "--max-new-tokens", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output and message in res.output, res.output


def test_external_data_inside_the_bundle_loads_and_decodes_the_same(bundles, tmp_path):
    bundle = _copy(bundles["llama"], tmp_path)
    before = specrt.load(bundle, threads=1).generate("x", max_new_tokens=6, method="draft").token_ids
    _point_draft_at(bundle, "weights/lm_head.bin")
    assert [loc for _, loc in external_locations(bundle / "draft.onnx")] == ["weights/lm_head.bin"]
    assert specrt.load(bundle, threads=1).generate("x", max_new_tokens=6, method="draft").token_ids == before


def _if_graph(tmp_path: Path, location: str) -> Path:
    """A model whose only external tensor sits in an If node's else-branch, two subgraphs down."""
    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    _externalise(weight, tmp_path, location, tmp_path / "w.bin")
    inner = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "inner", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [weight])
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "plain", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    nested = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=plain, else_branch=inner)],
                               "nested", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    top = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=plain, else_branch=nested)], "top",
                            [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                             helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(top), str(path))
    return path


def test_a_location_in_a_nested_subgraph_is_found(tmp_path):
    graph = _if_graph(tmp_path, "/etc/passwd")
    assert external_locations(graph) == [("w", "/etc/passwd")]
    with pytest.raises(BundleError, match="tensor 'w' keeps its data at '/etc/passwd', outside the bundle"):
        check_external_data(graph, tmp_path)
    check_external_data(_if_graph(tmp_path, "w.bin"), tmp_path)  # the same graph, its data beside it: fine
    (tmp_path / "bundle").mkdir()
    graph = _if_graph(tmp_path / "bundle", "w.bin")
    (tmp_path / "bundle" / "w.bin").unlink()
    (tmp_path / "bundle" / "w.bin").symlink_to(tmp_path / "w.bin")  # named inside, read outside
    with pytest.raises(BundleError, match="tensor 'w' reads 'w.bin', a link leading outside the bundle"):
        check_external_data(graph, tmp_path / "bundle")


@pytest.mark.parametrize("data", [b"", b"\x0a\xff\xff\xff\xff\x0f", b"\x0b\x00", b"not protobuf at all"])
def test_garbage_is_one_line_not_a_traceback(tmp_path, data):
    (tmp_path / "g.onnx").write_bytes(data)
    with pytest.raises(BundleError, match="g.onnx is not an ONNX model"):
        external_locations(tmp_path / "g.onnx")


def test_a_symlink_out_at_any_depth_is_refused(bundles, tmp_path):
    bundle = _copy(bundles["llama"], tmp_path)
    deep = bundle / "engines" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "notes").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="symlink leading outside it"):
        load_manifest(bundle)
