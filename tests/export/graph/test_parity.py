"""The export's parity criterion (relative to the logits' scale, plus KL) against an fp32 reference:
correct fp16 exports of models with trained-like logits pass; real bugs are refused even at fp16's
looser tolerance, and leave no bundle behind."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from support.models import make_tokenizer

from specrt.bundle.parity import PARITY_TOLERANCE, compare_logits, within, worst
from specrt.errors import ParityError
from specrt.export.graph.architectures import RotaryDecoderAdapter
from specrt.export.exporter import ExportOptions, export_bundle
from specrt.export.graph.parity import float32_compute

CONTEXT = 1024


def _save(folder, model):
    with torch.no_grad():  # logits spread like a trained model's (std ~4), not a random one's (~1)
        std = float(model(torch.arange(40)[None]).logits.std())
        model.model.norm.weight.mul_(4.0 / std)
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """Llama with llama3 rope scaling (factor 8 past 128 positions): wrong scaling shows far out only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                         rope_parameters=rope, tie_word_embeddings=True, bos_token_id=0,
                                         eos_token_id=1)).eval()
    return _save(tmp_path_factory.mktemp("llama3") / "m", model)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                         max_position_embeddings=CONTEXT, tie_word_embeddings=True, bos_token_id=0,
                                         eos_token_id=1)).eval()
    return _save(tmp_path_factory.mktemp("qwen3") / "m", model)


@pytest.mark.parametrize("graph", ["fused", "portable"])
def test_a_correct_fp16_export_passes_with_room(llama3, tmp_path, graph):
    m = export_bundle(str(llama3), None, tmp_path / "b", ExportOptions(dtype="float16", graph=graph))
    figures, tol = worst(m.target.parity), PARITY_TOLERANCE["float16"]
    assert set(m.target.parity) == {"prefill", "decode", "chain", "tree", "far"}
    # Not at the edge: well inside the tolerance (measured: rel 2.6e-3), and the best token unchanged.
    assert figures["rel"] < tol.rel / 5 and figures["kl"] < tol.kl / 10 and figures["top1"] >= 0.9
    assert figures["abs"] > 1e-3  # fp16 really is inexact here: the criterion is what lets it pass


def _unscaled_rope(monkeypatch):
    """Bug: rotary tables from the plain rope frequencies, ignoring the checkpoint's llama3 scaling."""
    original = RotaryDecoderAdapter._rotary_tables

    def tables(self, positions):
        rot = self.model.model.rotary_emb
        scaled = rot.inv_freq
        d = self.dims().head_dim
        rot.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        try:
            return original(self, positions)
        finally:
            rot.inv_freq = scaled

    monkeypatch.setattr(RotaryDecoderAdapter, "_rotary_tables", tables)


def _swapped_layers(monkeypatch):
    """Bug: the first two blocks run in the wrong order."""
    original = RotaryDecoderAdapter.layer
    monkeypatch.setattr(RotaryDecoderAdapter, "layer",
                        lambda self, i, *rest: original(self, {0: 1, 1: 0}.get(i, i), *rest))


def _dropped_head_norms(monkeypatch):
    """Bug: Qwen3's per-head q/k RMS norms left out."""
    monkeypatch.setattr(RotaryDecoderAdapter, "_head_norms", lambda self, attn, q, k: (q, k))


@pytest.mark.parametrize("bug,model", [(_unscaled_rope, "llama3"), (_swapped_layers, "llama3"),
                                       (_dropped_head_norms, "qwen3")])
def test_real_bugs_are_refused_even_at_fp16_tolerance(bug, model, request, tmp_path, monkeypatch):
    bug(monkeypatch)
    with pytest.raises(ParityError, match="differs from PyTorch"):
        export_bundle(str(request.getfixturevalue(model)), None, tmp_path / "b",
                      ExportOptions(dtype="float16", graph="portable"))
    assert not (tmp_path / "b").exists()


def test_float32_compute_is_exact_and_restores_the_model(llama3):
    from transformers import AutoModelForCausalLM

    ids = torch.arange(5, 30)[None]
    fp16 = AutoModelForCausalLM.from_pretrained(llama3, dtype=torch.float16).eval()
    fp16.model.norm.register_buffer("probe", torch.ones(3))  # an fp32 tensor beside fp16 weights stays fp32
    before = {k: v.clone() for k, v in fp16.state_dict().items()}
    with torch.no_grad():
        ref = copy.deepcopy(fp16).float()(ids).logits  # the same fp16-rounded weights, computed in fp32
        with float32_compute(fp16):
            got = fp16(ids).logits
    assert got.dtype == torch.float32 and torch.equal(got, ref)
    after = fp16.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert after["model.norm.probe"].dtype == torch.float32
    assert {v.dtype for k, v in after.items() if k != "model.norm.probe"} == {torch.float16}
    assert fp16.lm_head.weight is fp16.model.embed_tokens.weight  # still tied


def test_compare_logits_measures_against_each_rows_scale():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 1000)) * 5  # std 5: an error of 0.05 is 1 % of the scale
    f = compare_logits(ref, ref + 0.05)
    assert f["abs"] == pytest.approx(0.05) and f["rel"] == pytest.approx(0.01, rel=0.05)
    assert f["kl"] < 1e-12 and f["top1"] == 1.0  # a constant shift is the same distribution
    flat = rng.standard_normal((2, 1000)) * 0.1  # near-flat rows: the scale never drops below 1 logit
    assert compare_logits(flat, flat + 1e-3)["rel"] == pytest.approx(1e-3)
    noisy = compare_logits(ref, ref + rng.standard_normal(ref.shape))
    assert not within(noisy, PARITY_TOLERANCE["float16"]) and noisy["kl"] > 0.1
    assert not within(compare_logits(ref, np.full_like(ref, np.nan)), PARITY_TOLERANCE["float32"])
