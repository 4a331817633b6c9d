"""specrt export: contract, parity vs PyTorch, greedy equality with HF generate, and every error path."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from support.models import FACTORIES, make_tokenizer, save_model
from transformers import AutoModelForCausalLM

from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.bundle.parity import PARITY_TOLERANCE, ParityTolerance, within, worst
from specrt.errors import (
    ModelLoadError,
    OutputPathError,
    ParityError,
    UnsupportedArchitectureError,
    VocabMismatchError,
)
from specrt.export import exporter as bundle_mod
from specrt.export.exporter import ExportOptions, export_bundle
from specrt.export.graph.parity import ParityCases, check_parity, reference_outputs
from specrt.runtime.backends import create_decoder
from specrt.runtime.masks import causal_mask

ARCHS = sorted(FACTORIES)


@pytest.mark.parametrize("arch", ARCHS)
def test_manifest_records_dims_io_and_parity(bundles, arch):
    m = load_manifest(bundles[arch])
    raw = json.loads((bundles[arch] / "specrt.json").read_text())
    assert raw["format_version"] == C.FORMAT_VERSION
    for role in ("target", "draft"):
        e = m.models[role]
        assert e.architecture == arch
        assert set(e.parity) == {"prefill", "decode", "chain", "tree", "far"}
        assert e.parity_tolerance == PARITY_TOLERANCE["float32"].to_json()
        assert all(within(f, PARITY_TOLERANCE["float32"]) and f["top1"] == 1.0 for f in e.parity.values())
        names = [t["name"] for t in raw["models"][role]["inputs"]]
        assert names[:3] == [C.INPUT_IDS, C.POSITION_IDS, C.ATTENTION_MASK]
        assert len(names) == 3 + 2 * e.dims.num_layers + 1 and names[-1] == C.LOGITS_INDEX and e.logits_index
    assert m.tokenizer.bos_token_id == 0 and 1 in m.tokenizer.eos_token_ids and m.tokenizer.add_bos_token
    assert m.vocab_check["padded"] and m.vocab_check["draft_logits"] == m.draft.dims.vocab_size
    assert {"specrt", "torch", "transformers", "onnx", "onnxruntime"} <= set(m.versions)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_graph_matches_the_contract(bundles, arch):
    m = load_manifest(bundles[arch])
    model = onnx.load(str(bundles[arch] / "target.onnx"), load_external_data=False)
    ins, outs = C.decoder_io(m.target.dims, "float32", logits_index=True)
    elem = {"int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL, "float32": onnx.TensorProto.FLOAT}
    for graph_values, specs in ((model.graph.input, ins), (model.graph.output, outs)):
        assert [v.name for v in graph_values] == [s.name for s in specs]
        for v, s in zip(graph_values, specs):
            assert v.type.tensor_type.elem_type == elem[s.dtype]
            dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            assert dims == list(s.shape), v.name


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_a_pass_computes_the_logits_of_the_rows_asked_for(bundles, arch):
    """logits_index: a prefill asks for its last row only and gets that row's logits (the LM head's matmul
    over fewer rows may round differently in the last bits)."""
    from specrt.runtime.backends.onnxruntime import OrtDecoder
    from specrt.runtime.masks import causal_mask

    m = load_manifest(bundles[arch])
    dec = OrtDecoder(bundles[arch], m.target, threads=1)
    ids = np.array([0, 5, 9, 13, 2, 7], np.int64)
    run = lambda **kw: dec.forward(dec.new_cache(8), ids, np.arange(6), causal_mask(6, 0), **kw)  # noqa: E731
    every = run().logits.copy()
    assert every.shape == (6, m.target.dims.vocab_size)
    for rows in (1, 2, 6):
        out = run(logits_rows=rows)
        assert out.logits.shape == (rows, m.target.dims.vocab_size) and len(out.hidden) == 6
        np.testing.assert_allclose(out.logits, every[6 - rows:], rtol=1e-5, atol=1e-5)


def test_a_prefill_computes_one_row_of_logits(bundles):
    """The runtime asks each pass for the rows it reads: a 30-token prompt's prefill makes one row of logits."""
    import specrt

    gen = specrt.load(bundles["llama"], threads=1)
    prompt = "def fib(n):\n    return fib(n - 1) + fib(n - 2) if n > 1 else n\n"
    assert len(gen.encode(prompt)) > 20
    gen.generate(prompt, max_new_tokens=8, method="draft", gamma=3)
    assert gen._models["target"].decoder._logits.shape[1] == 4  # the widest pass read: γ + 1 rows


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decoding_through_onnx_equals_hf_generate(pairs, bundles, arch):
    import specrt

    target, _ = pairs[arch]
    gen = specrt.load(bundles[arch], threads=1)
    prompt = "def fib(n):"
    ids = gen.encode(prompt)
    hf = AutoModelForCausalLM.from_pretrained(target).eval()
    with torch.no_grad():
        x = torch.tensor([ids])  # explicit mask: BOS id 0 would otherwise be taken for padding
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                          eos_token_id=None, pad_token_id=1)[0, len(ids):].tolist()
    out = gen.generate(prompt, max_new_tokens=24, method="none")
    assert out.token_ids == ref


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cache_equals_no_cache(bundles, arch):
    m = load_manifest(bundles[arch])
    dec = create_decoder("onnxruntime", bundles[arch], m.target, threads=1)
    tokens = np.random.default_rng(0).integers(0, 300, 12)
    full_cache = dec.new_cache(64)
    full = dec.forward(full_cache, tokens, np.arange(12), causal_mask(12, 0)).logits.copy()
    inc = dec.new_cache(64)
    rows = []
    for chunk in (tokens[:5], tokens[5:6], tokens[6:9], tokens[9:]):
        out = dec.forward(inc, chunk, np.arange(inc.length, inc.length + len(chunk)), causal_mask(len(chunk), inc.length))
        rows.append(out.logits.copy())
        inc.advance(len(chunk))
    assert np.abs(np.concatenate(rows) - full).max() < 1e-5
    for layer in range(m.target.dims.num_layers):
        assert np.abs(inc.keys[layer][:, :12] - full_cache.keys[layer][:, :12]).max() < 1e-5


def test_torchscript_exporter_and_fp16(pairs, tmp_path):
    target, draft = pairs["qwen2"]
    m = export_bundle(str(target), str(draft), tmp_path / "ts", ExportOptions(exporter="torchscript"))
    assert worst(m.target.parity)["rel"] < 1e-4
    m16 = export_bundle(str(target), str(draft), tmp_path / "fp16", ExportOptions(dtype="float16", max_context=128))
    assert m16.target.dtype == "float16" and m16.max_context == 128
    assert all(within(f, PARITY_TOLERANCE["float16"]) for f in m16.target.parity.values())


def test_parity_check_fails_beyond_tolerance(pairs, bundles):
    target, _ = pairs["llama"]
    hf = AutoModelForCausalLM.from_pretrained(target).eval()
    m = load_manifest(bundles["llama"])
    cases = ParityCases.draw(300, m.max_context)
    path = bundles["llama"] / "target.onnx"
    reference, _ = reference_outputs(hf, cases)
    with pytest.raises(ParityError, match="differs from PyTorch"):
        check_parity(reference, cases, path, m.target.dims, "float32", tolerance=ParityTolerance(1e-12, 1.0))
    # A graph that no longer matches its model (one weight changed) is caught at the default tolerance.
    with torch.no_grad():
        hf.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(ParityError):
        check_parity(reference_outputs(hf, cases)[0], cases, path, m.target.dims, "float32")


# ---- errors: each a typed error with a one-line message; nothing half-written is left behind ----

def test_missing_folder(tmp_path, pairs):
    with pytest.raises(ModelLoadError, match="not found"):
        export_bundle(str(tmp_path / "nope"), str(pairs["llama"][1]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_non_causal_lm_is_refused(tmp_path, pairs):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path / "bert")
    with pytest.raises(UnsupportedArchitectureError, match="'bert' is not supported; supported: gemma2, gemma3_text, gpt2, llama"):
        export_bundle(str(tmp_path / "bert"), None, tmp_path / "out")


def test_vocab_mismatch_names_the_ids(tmp_path, pairs):
    other_tok = make_tokenizer(extra_text="zzzz qqqq wwww " * 50)
    draft = save_model(tmp_path / "odd-draft", "llama", seed=3, layers=1, hidden=32, heads=2, kv_heads=1,
                       tokenizer=other_tok)
    with pytest.raises(VocabMismatchError, match=r"differ at \d+ ids: \d+ \("):
        export_bundle(str(pairs["llama"][0]), str(draft), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(tmp_path, pairs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    t, d = pairs["gpt2"]
    with pytest.raises(OutputPathError, match="--force"):
        export_bundle(str(t), str(d), out, ExportOptions(exporter="torchscript"))
    assert (out / "keep.txt").read_text() == "user data"
    export_bundle(str(t), str(d), out, ExportOptions(exporter="torchscript", force=True))
    assert load_manifest(out).target.architecture == "gpt2" and not (out / "keep.txt").exists()


def test_unwritable_output(tmp_path, pairs):
    t, d = pairs["gpt2"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError):
        export_bundle(str(t), str(d), tmp_path / "file" / "out")
    with pytest.raises(OutputPathError):
        export_bundle(str(t), str(d), "/proc/specrt-bundle")


def test_failure_leaves_no_bundle_behind(tmp_path, pairs, monkeypatch):
    def broken(*args, **kwargs):
        raise ParityError("draft.onnx: ONNX Runtime differs from PyTorch beyond 0.001 (chain 0.5)")

    monkeypatch.setattr(bundle_mod, "check_parity", broken)
    t, d = pairs["gpt2"]
    with pytest.raises(ParityError):
        export_bundle(str(t), str(d), tmp_path / "out", ExportOptions(exporter="torchscript"))
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor a .partial folder


def test_max_context_beyond_the_model_is_refused(tmp_path, pairs):
    from specrt.errors import ConfigError

    t, d = pairs["llama"]
    with pytest.raises(ConfigError, match="exceeds what the models support"):
        export_bundle(str(t), str(d), tmp_path / "out", ExportOptions(max_context=100_000))


def test_a_bundle_is_an_ordinary_folder_with_the_users_file_modes(bundles):
    """Staged in a private temporary folder, published with the modes the umask gives new files (0o755 / 0o644
    under 022), so a service account or a container user can read what was exported."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    bundle = bundles["llama"]
    assert bundle.stat().st_mode & 0o777 == 0o777 & ~umask
    for path in bundle.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o777 if path.is_dir() else 0o666) & ~umask, path
