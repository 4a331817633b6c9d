"""The export pipeline's torch-free surface: one install line, the summary `specrt export` prints, and the
Jetson memory read `specrt build --jetson` sizes its workspace from."""

from __future__ import annotations

from specrt.bundle.manifest import load_manifest
from specrt.demo import BUNDLE
from specrt.export.pipeline import INSTALL, describe, missing_extra
from specrt.export.tensorrt import BuildOptions, free_memory_mb, jetson_defaults


def test_missing_extra_names_the_package_and_the_install_line():
    err = missing_extra("medusa train", ImportError("No module named 'torch'", name="torch"))
    assert str(err) == f"medusa train needs the export extra (torch is missing): {INSTALL}"
    assert INSTALL.startswith("pip install torch==") and "'specrt[export]'" in INSTALL


def test_describe_gives_each_model_its_graph_and_parity_and_the_medusa_tree():
    m = load_manifest(BUNDLE)
    lines = describe(m).splitlines()
    assert lines[0].startswith(f"target: {m.target.architecture} ({m.target.graph} graph), "
                               f"{m.target.dims.num_layers} layers, ")
    assert lines[1].startswith("draft: ")
    assert m.medusa is not None  # the demo ships Medusa heads
    assert lines[-1].startswith(f"medusa: {m.medusa.num_heads} heads, tree of {len(m.medusa.tree)} nodes")


def test_free_memory_feeds_the_jetson_workspace():
    free = free_memory_mb()
    assert free > 0
    assert 256 <= jetson_defaults(free, BuildOptions()).workspace_mb <= 4096
