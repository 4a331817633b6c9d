"""``specrt export --dflash``: every bad draft refused in one line before anything is written, the draft graph
against its PyTorch reference, and a bundle holding an EAGLE-3 head and a DFlash draft that share the target's
taps, both exact."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from support.dflash import save_dflash_draft
from support.models import make_tokenizer, save_eagle_head, save_model

from specrt.cli import main
from specrt.export.dflash.config import DFlashConfig
from specrt.export.dflash.graph import (DraftCases, check_draft_parity, export_dflash_draft, reference_draft)
from specrt.export.dflash.model import DFlashDraft


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("t") / "target", "llama", seed=1, layers=4, hidden=64,
                      tokenizer=make_tokenizer())


def _rewrite_config(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("case, message", [
    ("an EAGLE-3 head", r"is an EAGLE-3 head, not a DFlash draft; pass it with --eagle"),
    ("another width", r"the DFlash draft is 32 wide, the target 64"),
    ("a layer past the target's", r"reads target layer 9 but the target has 4 layers"),
    ("block 0", r"block_size must be a positive integer"),
    ("block 65", r"block size is 65; specrt runs blocks of 2 to 64"),
    ("a d2t outside the vocabulary", r"d2t must map draft ids to strictly ascending target ids"),
])
def test_a_bad_draft_is_one_line_and_nothing_is_written(target, tmp_path, case, message):
    draft = tmp_path / "draft"
    if case == "an EAGLE-3 head":
        save_eagle_head(draft, target, draft_vocab=64)
    elif case == "another width":
        other = save_model(tmp_path / "other", "llama", seed=2, layers=4, hidden=32, heads=2, kv_heads=1)
        save_dflash_draft(draft, other)
    elif case == "a layer past the target's":
        save_dflash_draft(draft, target, ids=(1, 9))
    elif case.startswith("block"):
        save_dflash_draft(draft, target)
        _rewrite_config(draft, block_size=int(case.split()[1]))
    else:
        save_dflash_draft(draft, target, draft_vocab=64)
        state = load_file(str(draft / "model.safetensors"))
        state["d2t"][-1] = 1000
        save_file(state, str(draft / "model.safetensors"))
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    res = CliRunner().invoke(main, ["export", str(target), "--dflash", str(draft), "-o", str(out), "--quantize",
                                    "none", "--no-measure"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    errors = [line for line in res.output.strip().splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and re.search(message, errors[0]), res.output
    assert not out.exists() and set(tmp_path.iterdir()) == before


def test_method_dflash_on_a_bundle_without_one_is_one_line(llama_bundle):
    res = CliRunner().invoke(main, ["run", "x", "--bundle", str(llama_bundle), "--method", "dflash",
                                    "--max-new-tokens", "2"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "needs a DFlash draft and this bundle has none" in res.output


@pytest.mark.parametrize("dtype, fused", [("float32", False), ("float16", False), ("float32", True),
                                          ("float16", True)])
def test_the_draft_graph_computes_the_reference_step_and_its_context_cache(tmp_path, dtype, fused):
    """Two passes as the runtime makes them (a prompt's context, then two rows more over the first's K/V); a
    reduced draft vocabulary's LM head is the target's rows, an untied head its own table. The fused graph (single
    norm, rotary and attention nodes, packed projections) computes the same."""
    raw = {"architectures": ["DFlashDraftModel"], "block_size": 5, "num_target_layers": 6,
           "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3]}, "hidden_size": 32,
           "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 128,
           "vocab_size": 50}
    cfg = DFlashConfig.from_json(raw, "test")
    torch.manual_seed(0)
    draft = DFlashDraft(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a norm read from the wrong module shows
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    embedding, head = torch.randn(50, 32), torch.randn(50, 32)
    lm_head = head[torch.tensor([1, 4, 7, 20, 33, 49])]
    taps = np.random.default_rng(0).normal(size=(9, cfg.feature_width)).astype(np.float32)
    cases = DraftCases.build(taps, cfg.block_size, cfg.mask_token_id, cfg.vocab_size, dtype)
    reference = reference_draft(draft, embedding, lm_head, cases)
    dims = export_dflash_draft(draft, embedding, lm_head, tmp_path / "d.onnx", dtype, fused=fused, positions=64)
    figures = check_draft_parity(reference, cases, tmp_path / "d.onnx", dims, dtype)
    assert set(figures) == {"first", "step"} and all(f["top1"] == 1.0 for f in figures.values())
    import onnx

    ops = [n.op_type for n in onnx.load(str(tmp_path / "d.onnx")).graph.node]
    assert ("Attention" in ops and "RotaryEmbedding" in ops and "Pow" not in ops) == fused
    assert reference["first"].shape == (4, 6)  # slots 1..4 over the 6 draft ids


def test_a_head_and_a_draft_share_the_targets_taps_and_both_stay_exact(target, tmp_path):
    from support.exactness import PROMPTS

    import specrt
    from specrt.export.exporter import ExportOptions, export_bundle

    head = save_eagle_head(tmp_path / "head", target, draft_vocab=64, taps=(1, 2, 3))
    draft = save_dflash_draft(tmp_path / "draft", target, ids=(1, 3), block=3)  # reads taps 2 (the head's) and 4
    export_bundle(str(target), None, tmp_path / "bundle", ExportOptions(eagle=str(head), dflash=str(draft)))
    gen = specrt.load(tmp_path / "bundle", threads=1)
    assert gen.manifest.target.eagle_taps == (1, 2, 3, 4) and gen.manifest.dflash.eagle_taps == (2, 4)
    assert gen.default_method == "eagle-tree"
    for prompt in PROMPTS[:2]:
        plain = gen.generate(prompt, max_new_tokens=20, method="none").token_ids
        for method in ("eagle", "dflash", "eagle"):  # the other's caches stay consistent across switches
            assert gen.generate(prompt, max_new_tokens=20, method=method).token_ids == plain


def test_export_says_what_the_draft_is_and_what_auto_runs(target, tmp_path):
    draft = save_dflash_draft(tmp_path / "draft", target, ids=(2,), block=5, draft_vocab=100)
    res = CliRunner().invoke(main, ["export", str(target), "--dflash", str(draft), "-o", str(tmp_path / "b"),
                                    "--quantize", "none", "--no-measure"])
    assert res.exit_code == 0, res.output
    assert "dflash: DFlash draft, 1 layer, blocks of 5, reading target layers 3, 100 draft ids" in res.output
    assert "auto will run dflash (the DFlash draft's block, one pass per step)" in res.output


@pytest.mark.parametrize("bits, graph", [(8, "auto"), (4, "auto"), (8, "portable")])
def test_a_quantized_draft_proposes_what_the_float_one_does_and_stays_exact(target, tmp_path, bits, graph):
    """--dflash-quantize: the draft graph's linears (Gemm on its 2-D rows) and its input table are quantized, its
    logits stay close to the float draft's on the same context, and the target's output is unchanged (a tied head's
    shared lookup: tests/export/quant/test_lookups.py)."""
    import onnx

    import specrt
    from specrt.bundle.manifest import load_manifest
    from specrt.export.exporter import ExportOptions, export_bundle
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle
    from specrt.runtime.backends.ort_dflash import OrtDFlash

    draft = save_dflash_draft(tmp_path / "draft", target, ids=(1, 3), block=4, draft_vocab=100)
    export_bundle(str(target), None, tmp_path / "float", ExportOptions(dflash=str(draft), graph=graph))
    quantize_bundle(tmp_path / "float", tmp_path / "q", QuantizeOptions(bits=None, dflash_bits=bits))
    before = onnx.load(str(tmp_path / "float" / "dflash.onnx")).graph
    weights = {i.name for i in before.initializer}
    linears = [n for n in before.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
    assert {n.op_type for n in linears} == ({"Gemm"} if graph == "portable" else {"MatMul"})  # 2-D rows or 3-D
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q" / "dflash.onnx")).graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops and "Gemm" not in ops
    record = load_manifest(tmp_path / "q").models["dflash"].quantization
    # every linear: fc, the layer's (packed in the fused graph: 5, else 8), the LM head rows
    assert record["bits"] == bits and len(record["quantized_matmuls"]) == len(linears) == (11 if graph == "portable"
                                                                                           else 7)
    assert record["bytes_after"] < 0.6 * record["bytes_before"] and "parity" not in record  # a proposer: no gate

    logits = []
    for name in ("float", "q"):
        manifest = load_manifest(tmp_path / name)
        runner = OrtDFlash(tmp_path / name, manifest.dflash, 64, threads=1)
        context = np.random.default_rng(0).standard_normal((6, manifest.dflash.tap_width)).astype(np.float32)
        logits.append(runner.run([5, 7, 7, 7], 6, context))
    spread = logits[0].std(axis=-1, keepdims=True)
    assert np.abs(logits[1] - logits[0]).max() / spread.min() < (0.1 if bits == 8 else 0.5)
    assert (logits[1].argmax(-1) == logits[0].argmax(-1)).mean() >= 0.75

    gen = specrt.load(tmp_path / "q", threads=1)
    plain = gen.generate("def f(x):", max_new_tokens=20, method="none").token_ids
    assert gen.generate("def f(x):", max_new_tokens=20, method="dflash").token_ids == plain


def test_export_times_each_drafter_and_auto_runs_the_fastest(target, tmp_path):
    """With a draft model and a DFlash draft, export's --measure times both here and records the faster for auto."""
    import specrt
    from specrt.bundle.manifest import load_manifest

    draft = save_dflash_draft(tmp_path / "draft", target, ids=(2,), block=4)
    small = save_model(tmp_path / "small", "llama", seed=5, layers=1, hidden=32, tokenizer=make_tokenizer())
    res = CliRunner().invoke(main, ["export", str(target), "--draft", str(small), "--dflash", str(draft),
                                    "-o", str(tmp_path / "b"), "--quantize", "none"])
    assert res.exit_code == 0, res.output
    record = load_manifest(tmp_path / "b").chosen["auto"]
    rates = record["tokens_per_s"]
    assert set(rates) == {"dflash", "draft"} and all(set(r) == {"0", "0.7"} and min(r.values()) > 0
                                                      for r in rates.values())
    score = {m: (r["0"] * r["0.7"]) ** 0.5 for m, r in rates.items()}
    assert record["method"] == max(score, key=score.get)  # rounding aside, the faster by the geometric mean
    assert f"auto will run {record['method']}, the fastest drafter measured here" in res.output
    assert f"auto will run {record['method']} (" in res.output  # the next-steps line agrees
    assert specrt.load(tmp_path / "b", threads=1).default_method == record["method"]
