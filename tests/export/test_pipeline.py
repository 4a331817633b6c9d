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


def test_the_export_says_what_auto_runs_and_what_to_do_next(bundles, eagle_bundle):
    """A bundle without a drafter is told that prompt lookup rarely pays and how to get a drafter; one with a draft
    or a head is told which runs. The rule is the generator's own (runtime.drafters.auto_method)."""
    from dataclasses import replace

    import specrt
    from specrt.export.pipeline import next_steps

    pair = load_manifest(bundles["llama"])
    alone = replace(pair, models={"target": pair.models["target"]})
    said = next_steps(alone, "smol")
    assert said.startswith("auto will run ngram (prompt lookup)") and "slower than plain decoding" in said
    assert "specrt eagle train MODEL -o HEAD" in said and "--eagle HUB_ID" in said and "--draft DRAFT" in said
    assert said.endswith("\nnext: specrt bench --bundle smol --methods none,ngram")
    assert next_steps(pair, "b").startswith("auto will run draft (the draft model's chain)")
    assert next_steps(load_manifest(eagle_bundle), "e").startswith("auto will run eagle-tree")
    head = load_manifest(eagle_bundle)  # gqa-static graphs are causal only: auto runs the head's chain
    static = replace(head, models={r: replace(e, graph="gqa-static") for r, e in head.models.items()})
    assert next_steps(static, "s").startswith("auto will run eagle (the EAGLE-3 head's chain")
    for bundle, method in ((bundles["llama"], "draft"), (eagle_bundle, "eagle-tree")):
        assert specrt.load(bundle, threads=1).default_method == method


def test_auto_runs_the_drafter_export_measured_fastest_and_only_one_the_bundle_holds(bundles):
    """Manifest.chosen["auto"] (export's timing of several drafters) decides auto; a record naming a drafter the
    bundle lacks, or no method at all, falls back to the static order."""
    from dataclasses import replace

    from specrt.runtime.drafters import auto_candidates, auto_method

    pair = load_manifest(bundles["llama"])
    assert auto_candidates(pair) == ["draft"] and auto_method(pair) == "draft"
    for record in ({"method": "dflash"}, {"method": 3}, "draft", {}):
        assert auto_method(replace(pair, chosen={"auto": record})) == "draft"
    alone = replace(pair, models={"target": pair.models["target"]})
    assert auto_method(replace(alone, chosen={"auto": {"method": "draft"}})) == "ngram"
