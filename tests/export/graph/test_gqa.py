"""GroupQueryAttention graphs (``--graph gqa``): the fused graph with one in-place KV buffer per layer.

The same checkpoints exported gqa and fused must decode the same tokens by every method (chains, trees
with rollback and compaction, sampling); the export's parity check runs the rewritten graph the way the
runtime does; a graph that is not the fused pattern, and a TensorRT build, are refused in one line.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from support.exactness import tree_pass_logits
from support.refusals import assert_rewrite_refused_unchanged

import specrt
from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError
from specrt.export.exporter import ExportOptions, export_bundle
from specrt.export.graph.gqa import rewrite

PROMPT = "def fib(n):"


@pytest.fixture
def gqa_bundle(gqa_close_bundle):
    return gqa_close_bundle


def _ops(bundle, role="target") -> collections.Counter:
    model = onnx.load(str(bundle / f"{role}.onnx"), load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


def test_every_layer_is_one_gqa_node_over_a_shared_buffer(gqa_bundle, close_bundle):
    manifest = load_manifest(gqa_bundle)
    assert {role: e.graph for role, e in manifest.models.items()} == {"target": "gqa", "draft": "gqa"}
    for role, entry in manifest.models.items():
        ops, fused = _ops(gqa_bundle, role), _ops(close_bundle, role)
        assert ops["GroupQueryAttention"] == entry.dims.num_layers
        assert not {"Attention", "RotaryEmbedding", "Concat"} & set(ops)
        # each layer's two residual Adds and the norms after them are one node each; only the first
        # layer's input norm (over the embedding, no Add) stays a plain RMSNormalization
        assert ops["SkipSimplifiedLayerNormalization"] == 2 * entry.dims.num_layers
        assert ops["RMSNormalization"] == 1 and ops["Add"] < fused["Add"]
        assert sum(ops.values()) < sum(fused.values())
        names = {o.name for o in onnx.load(str(gqa_bundle / entry.file), load_external_data=False).graph.output}
        assert C.present_key(0) in names and C.new_key(0) not in names
    assert all(f["kl"] < 1e-5 for f in manifest.target.parity.values())  # the export checked it against HF


def test_gqa_and_fused_graphs_decode_the_same_tokens(gqa_bundle, close_bundle):
    gqa, fused = specrt.load(gqa_bundle, threads=1), specrt.load(close_bundle, threads=1)
    for method in ("none", "draft", "tree", "ngram"):
        got = gqa.generate(PROMPT, max_new_tokens=40, method=method)
        assert got.token_ids == fused.generate(PROMPT, max_new_tokens=40, method=method).token_ids, method
    assert got.stats.target_passes < 40  # chains and trees really were verified (and rolled back)
    sampled = dict(max_new_tokens=30, method="tree", temperature=0.8, seed=3)
    assert gqa.generate(PROMPT, **sampled).token_ids == fused.generate(PROMPT, **sampled).token_ids


def test_a_tree_pass_then_compaction_matches_the_fused_graph(gqa_bundle, close_bundle):
    """Branching mask over a past, then the kept path compacted and decoded from: both graphs agree."""
    for a, b in zip(tree_pass_logits(gqa_bundle), tree_pass_logits(close_bundle)):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_a_portable_graph_is_refused_not_half_rewritten(portable_close_bundle):
    entry = load_manifest(portable_close_bundle).target
    model = onnx.load(str(portable_close_bundle / entry.file), load_external_data=False)
    assert_rewrite_refused_unchanged(rewrite, model, entry.dims, "--graph fused")


def test_gqa_needs_the_dynamo_exporter_and_tensorrt_refuses_it(gqa_bundle):
    from specrt.export.tensorrt import resolve_precision

    with pytest.raises(ConfigError, match="dynamo"):
        ExportOptions(graph="gqa", exporter="torchscript")
    with pytest.raises(ConfigError, match="--graph portable"):
        resolve_precision(list(load_manifest(gqa_bundle).models.values()), None)


def test_a_quantized_gqa_bundle_stays_gqa(gqa_bundle, tmp_path):
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    out = tmp_path / "q8"
    quantize_bundle(gqa_bundle, out, QuantizeOptions(bits=8))
    manifest = load_manifest(out)
    assert manifest.target.graph == "gqa" and manifest.target.quantization["bits"] == 8
    assert specrt.load(out, threads=1).generate(PROMPT, max_new_tokens=20, method="draft").token_ids


@pytest.mark.parametrize("arch", ["mistral", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_each_fused_architecture_rewrites_and_decodes_as_fused(arch, pairs, bundles, tmp_path):
    """Sliding windows (their masks read the past length), QK norms (unpacked q/k/v), soft-capping and
    per-layer rope bases: the parity check passes and greedy tokens equal the default fused bundle's."""
    export_bundle(str(pairs[arch][0]), None, tmp_path / "gqa", ExportOptions(graph="gqa"))
    assert load_manifest(bundles[arch]).target.graph == "fused"
    gqa, fused = specrt.load(tmp_path / "gqa", threads=1), specrt.load(bundles[arch], threads=1)
    for method in ("none", "ngram"):
        assert (gqa.generate(PROMPT, max_new_tokens=24, method=method).token_ids
                == fused.generate(PROMPT, max_new_tokens=24, method="none").token_ids), method


def test_fp16_and_eagle_targets_rewrite_too(pairs, tmp_path):
    """fp16 caches (the op's float16 kernel, an fp16 bias) and a target with EAGLE-3 taps beside its head."""
    from support.models import make_tokenizer, save_eagle_head, save_model

    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    target, draft = pairs["llama"]
    for graph in ("gqa", "fused"):
        export_bundle(str(target), str(draft), tmp_path / graph, ExportOptions(graph=graph, dtype="float16"))
    gqa, fused = specrt.load(tmp_path / "gqa", threads=1), specrt.load(tmp_path / "fused", threads=1)
    assert load_manifest(tmp_path / "gqa").target.graph == "gqa"
    for method in ("none", "draft"):
        assert (gqa.generate(PROMPT, max_new_tokens=24, method=method).token_ids
                == fused.generate(PROMPT, max_new_tokens=24, method=method).token_ids), method
    deep = save_model(tmp_path / "deep", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    head = save_eagle_head(tmp_path / "head", deep, seed=3, draft_vocab=240, ascending=False)
    export_bundle(str(deep), None, tmp_path / "eagle", ExportOptions(graph="gqa"), eagle=str(head))
    manifest = load_manifest(tmp_path / "eagle")
    # the head's one layer is rewritten too (its cache written in place), and its parity ran on that graph
    assert manifest.target.graph == "gqa" and manifest.models["eagle"].graph == "gqa"
    head_ops = _ops(tmp_path / "eagle", "eagle")
    assert head_ops["GroupQueryAttention"] == 1 and head_ops["SkipSimplifiedLayerNormalization"] == 2
    assert set(manifest.models["eagle"].parity) == {"prefill", "step", "chain", "tree"}
    quantize_bundle(tmp_path / "eagle", tmp_path / "q8", QuantizeOptions(bits=None, eagle_bits=8))
    assert load_manifest(tmp_path / "q8").models["eagle"].graph == "gqa"
    for bundle in ("eagle", "q8"):
        gen = specrt.load(tmp_path / bundle, threads=1)
        want = gen.generate(PROMPT, max_new_tokens=24, method="none").token_ids
        for method in ("eagle", "eagle-tree"):  # a fixed tree: "auto" sizes it by timing, and near-ties follow rows
            got = gen.generate(PROMPT, max_new_tokens=24, method=method, eagle_tree="4,4,16")
            assert got.token_ids == want and got.stats.drafted > 0, (bundle, method)


def test_a_steady_one_row_step_rebinds_only_the_mask(gqa_bundle):
    """After the first one-row pass, ids, positions, outputs and the cache stay bound (their buffers are
    rewritten in place); only the mask, one column wider each pass, is bound again."""
    gen = specrt.load(gqa_bundle, threads=1)
    model = gen._models["target"]
    decoder = model.decoder
    calls: list[str] = []
    inner = decoder.binding.binding
    for kind in ("bind_input", "bind_output"):
        real = getattr(inner, kind)
        setattr(inner, kind, lambda name, *a, _real=real, **k: (calls.append(name), _real(name, *a, **k))[1])
    sampling = specrt.DecodeOptions().sampling
    model.feed(gen.encode(PROMPT), sampling)
    model.feed([5], sampling)
    first = list(calls)
    calls.clear()
    rows = [model.feed([t], sampling).logits[0].copy() for t in (7, 9, 11)]
    assert C.INPUT_IDS in first and C.LOGITS in first
    assert calls == [C.ATTENTION_MASK] * 3
    # The same tokens fed as one chain give the same rows: nothing stale was read from a kept binding.
    model.cache.truncate(model.cache.length - 3)
    chain = model.feed([7, 9, 11], sampling, last=3).logits
    np.testing.assert_allclose(chain, np.stack(rows), atol=1e-4)
