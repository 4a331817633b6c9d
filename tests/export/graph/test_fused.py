"""Fused graphs (single-node rotary / attention / RMS norm, packed projections): same model, fewer nodes.

The same checkpoints exported fused and portable must decode the same tokens; the parity check against
Hugging Face must catch a wrong translation; bundles TensorRT cannot parse are refused in one line.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from support.exactness import tree_pass_logits

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError, ParityError, UnsupportedArchitectureError
from specrt.export.graph import fused_ops
from specrt.export.exporter import ExportOptions, export_bundle

PROMPT = "def fib(n):"


def _ops(bundle, role="target") -> collections.Counter:
    model = onnx.load(str(bundle / f"{role}.onnx"), load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node)


def test_default_llama_export_is_fused_and_much_smaller(close_bundle, portable_close_bundle):
    fused, plain = _ops(close_bundle), _ops(portable_close_bundle)
    layers = load_manifest(close_bundle).target.dims.num_layers
    assert fused["Attention"] == fused["RotaryEmbedding"] / 2 == layers
    assert fused["RMSNormalization"] == 2 * layers + 1 and fused["MatMul"] == 4 * layers + 1
    assert "Attention" not in plain and sum(fused.values()) < 0.5 * sum(plain.values())
    assert {e.graph for e in load_manifest(close_bundle).models.values()} == {"fused"}
    assert {e.graph for e in load_manifest(portable_close_bundle).models.values()} == {"portable"}


def test_fused_and_portable_graphs_decode_the_same_tokens(close_bundle, portable_close_bundle):
    fused, plain = specrt.load(close_bundle, threads=1), specrt.load(portable_close_bundle, threads=1)
    for method in ("none", "draft", "tree"):
        assert (fused.generate(PROMPT, max_new_tokens=30, method=method).token_ids
                == plain.generate(PROMPT, max_new_tokens=30, method=method).token_ids), method
    sampled = dict(max_new_tokens=30, method="draft", temperature=0.8, seed=3)
    assert fused.generate(PROMPT, **sampled).token_ids == plain.generate(PROMPT, **sampled).token_ids


def test_the_same_logits_on_a_tree_pass(close_bundle, portable_close_bundle):
    """One verify pass over a branching mask, past included, then the kept path compacted: the two graphs
    agree to float rounding."""
    for a, b in zip(tree_pass_logits(close_bundle), tree_pass_logits(portable_close_bundle)):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_a_wrong_translation_is_refused_by_the_parity_check(pairs, tmp_path, monkeypatch):
    """Rotary applied to interleaved pairs instead of halves: ONNX Runtime now differs from Hugging Face."""
    from onnxscript import opset23 as op

    table = fused_ops.translation_table()

    def interleaved(x, position_ids, cos_cache, sin_cache, num_heads: int):
        return op.RotaryEmbedding(x, cos_cache, sin_cache, position_ids, num_heads=num_heads, interleaved=1)

    table[next(k for k in table if "rotary" in str(k))] = interleaved
    monkeypatch.setattr(fused_ops, "translation_table", lambda: table)
    target = pairs["llama"][0]
    with pytest.raises(ParityError, match="differs from PyTorch"):
        export_bundle(str(target), None, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_bad_graph_requests_are_one_line_errors(pairs, tmp_path):
    with pytest.raises(ConfigError, match="dynamo"):
        ExportOptions(graph="fused", exporter="torchscript")
    with pytest.raises(ConfigError, match="graph must be one of"):
        ExportOptions(graph="fast")
    with pytest.raises(UnsupportedArchitectureError, match="--graph portable"):
        export_bundle(str(pairs["gpt2"][0]), None, tmp_path / "gpt2", ExportOptions(graph="fused"))
    assert not (tmp_path / "gpt2").exists()


def test_tensorrt_build_refuses_a_fused_bundle(close_bundle):
    from specrt.export.tensorrt import resolve_precision

    with pytest.raises(ConfigError, match="--graph portable"):
        resolve_precision(list(load_manifest(close_bundle).models.values()), None)


def test_the_fused_ops_pytorch_bodies_match_the_plain_layers(pairs):
    """The custom ops' PyTorch bodies (what a torch run of a fused adapter executes) against the plain path."""
    import torch
    from transformers import AutoModelForCausalLM

    from specrt.export.graph.architectures import DecoderWrapper, RotaryDecoderAdapter

    model = AutoModelForCausalLM.from_pretrained(pairs["llama"][0]).eval()
    dims = RotaryDecoderAdapter(model).dims()
    ids, pos = torch.tensor([[5, 7, 11]]), torch.tensor([[4, 5, 5]])
    mask = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    mask[0, 0, 2, 5] = False
    past = tuple(torch.randn(1, 4, dims.num_kv_heads, dims.head_dim) for _ in range(2 * dims.num_layers))
    with torch.no_grad():
        plain = DecoderWrapper(RotaryDecoderAdapter(model))(ids, pos, mask, past)
        fused = DecoderWrapper(RotaryDecoderAdapter(model, fused=True, positions=64))(ids, pos, mask, past)
    for a, b in zip(plain, fused):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
