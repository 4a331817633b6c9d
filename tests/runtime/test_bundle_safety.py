"""Hostile and corrupt bundles: each is refused in one line (a BundleError), before anything outside the bundle
is opened or anything is sized from a declared figure."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.refusals import assert_refused_in_one_line

import specrt
from specrt.errors import BundleError


def _manifest(bundle: Path, change) -> None:
    path = bundle / "specrt.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


def _outside(bundle: Path) -> Path:
    secret = bundle.parent / "outside" / "secret.json"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text('{"version": "1.0"}')
    return secret


def _tokenizer_to(name):
    return lambda b: _manifest(b, lambda m: m["tokenizer"].__setitem__("file", name))


def _symlinked_tokenizer(bundle: Path) -> None:
    (bundle / "tokenizer.json").unlink()
    (bundle / "tokenizer.json").symlink_to(_outside(bundle))


def _stray_link(bundle: Path) -> None:
    (bundle / "notes.txt").symlink_to(_outside(bundle))


def _dims(**dims):
    return lambda b: _manifest(b, lambda m: m["models"]["target"]["dims"].update(dims))


def _truncated(bundle: Path) -> None:
    data = (bundle / "target.onnx").read_bytes()
    (bundle / "target.onnx").write_bytes(data[: len(data) // 2])


def _external_data_out(bundle: Path) -> None:
    """The largest initializer moved into a file outside the bundle, which the graph names by '..'."""
    model = onnx.load(str(bundle / "target.onnx"))
    t = max(model.graph.initializer, key=lambda x: len(x.raw_data))
    (bundle.parent / "weights.bin").write_bytes(t.raw_data)
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../weights.bin"), ("offset", "0"), ("length", str(os.path.getsize(
            bundle.parent / "weights.bin")))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(bundle / "target.onnx"))


def _huge_manifest(bundle: Path) -> None:
    path = bundle / "specrt.json"
    path.write_text(path.read_text() + " " * (17 << 20))


HOSTILE = {
    "tokenizer through ..": (lambda b: _tokenizer_to("../outside/secret.json")(b) or _outside(b),
                             "points outside the bundle"),
    "tokenizer absolute": (_tokenizer_to("/etc/passwd"), "points outside the bundle"),
    "graph absolute": (lambda b: _manifest(b, lambda m: m["models"]["target"].__setitem__("file", "/etc/passwd")),
                       "points outside the bundle"),
    "tokenizer symlinked out": (_symlinked_tokenizer, "symlink leading outside"),
    "a stray symlink out": (_stray_link, "symlink leading outside"),
    "engine through ..": (lambda b: _manifest(b, lambda m: m.__setitem__("engines", {"target": {
        "file": "engines/../../x.engine"}})), "points outside the bundle"),
    "huge context": (lambda b: _manifest(b, lambda m: m.__setitem__("max_context", 10 ** 12)),
                     "max_context = 1000000000000"),
    "huge layer count": (_dims(num_layers=10 ** 6), "num_layers = 1000000"),
    "a cache larger than the machine": (lambda b: _manifest(b, lambda m: (
        m.__setitem__("max_context", 1 << 21), m["models"]["target"]["dims"].update(num_layers=1000))),
        "re-export with a smaller --max-context"),
    "huge manifest": (_huge_manifest, "refused as corrupt or hostile"),
    "dims of the wrong type": (_dims(num_layers="8"), "models.target.dims.num_layers must be an integer"),
    "truncated graph": (_truncated, "target.onnx is not an ONNX model"),
    "external data outside": (_external_data_out, "keeps its data at '../weights.bin', outside the bundle"),
    "a dtype the graph does not have": (lambda b: _manifest(b, lambda m: m["models"]["target"].__setitem__(
        "dtype", "float16")), "does not match its manifest entry"),
    "not JSON": (lambda b: (b / "specrt.json").write_text("{" * 100000), "not valid JSON"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_bundles_are_refused_in_one_line(llama_bundle, tmp_path, case):
    bundle = tmp_path / "bundle"
    shutil.copytree(llama_bundle, bundle)
    break_it, message = HOSTILE[case]
    break_it(bundle)
    assert_refused_in_one_line(bundle, message)


def test_a_vocabulary_map_outside_the_bundle_is_refused(eagle_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(eagle_bundle, bundle)
    np.save(tmp_path / "map.npy", np.arange(4))
    _manifest(bundle, lambda m: m["models"]["eagle"].__setitem__("vocab_map", "../map.npy"))
    with pytest.raises(BundleError, match="vocabulary map '../map.npy' points outside the bundle"):
        specrt.load(bundle, threads=1)


def test_symlinks_inside_the_bundle_are_fine(llama_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(llama_bundle, bundle)
    (bundle / "tokenizer.json").rename(bundle / "tok.json")
    (bundle / "tokenizer.json").symlink_to("tok.json")
    assert specrt.load(bundle, threads=1).generate("x", max_new_tokens=2).token_ids
