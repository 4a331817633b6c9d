"""`specrt export --eagle`: the target's eagle_taps output, the head graph (eagle.onnx), its ascending
vocabulary map, parity of both against PyTorch, quantize and TensorRT with a head, and the refusals.

Targets and heads are tiny and random: a 5-layer llama (default taps 1, 2, 4) and heads written with
save_eagle3 in the published layout (tests/support/models.py save_eagle_head).
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from support.models import make_tokenizer, save_eagle_head, save_model
from transformers import AutoModelForCausalLM

from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.bundle.parity import PARITY_TOLERANCE
from specrt.cli import main
from specrt.errors import ConfigError, EagleHeadError, ParityError
from specrt.export import eagle_export
from specrt.export.bundle import ExportOptions, export_bundle
from specrt.export.eagle import tap_layers
from specrt.export.eagle_vocab import draft_logits_to_target
from specrt.export.eagle_checkpoint import load_eagle3
from specrt.export.quantize import (
    QuantizeOptions,
    describe,
    quantize_bundle,
)
from specrt.runtime.masks import causal_mask, tree_mask

LAYERS, HIDDEN, DRAFT_VOCAB = 5, 64, 96
TAPS = tap_layers(LAYERS)  # (1, 2, 4)
EXPLICIT_TAPS = (1, 3, 4)
HEAD_CASES = {"prefill", "step", "chain", "tree"}
TARGET_CASES = {"prefill", "decode", "chain", "tree", "far"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A llama target and draft sharing a tokenizer, a head with shuffled (non-ascending) draft ids, and
    one with ascending ids, explicit taps and its own embedding table, narrower than the target."""
    root = tmp_path_factory.mktemp("eagle-src")
    tok = make_tokenizer()
    target = save_model(root / "target", "llama", seed=1, layers=LAYERS, hidden=HIDDEN, tokenizer=tok)
    draft = save_model(root / "draft", "llama", seed=2, layers=1, hidden=32, heads=2, kv_heads=1, tokenizer=tok)
    shuffled = save_eagle_head(root / "head-shuffled", target, seed=3, draft_vocab=DRAFT_VOCAB, ascending=False)
    ascending = save_eagle_head(root / "head-ascending", target, seed=4, draft_vocab=DRAFT_VOCAB, hidden=48,
                                embedding=True, taps=EXPLICIT_TAPS)
    return {"target": target, "draft": draft, "shuffled": shuffled, "ascending": ascending, "root": root}


@pytest.fixture(scope="module")
def fused_bundle(sources, tmp_path_factory):
    """The default export (dynamo, fused graphs on llama) of the target with the shuffled head."""
    out = tmp_path_factory.mktemp("eagle-fused") / "bundle"
    export_bundle(str(sources["target"]), None, out, eagle=str(sources["shuffled"]))
    return out


@pytest.fixture(scope="module")
def portable_bundle(sources, tmp_path_factory):
    """Through the CLI: target + draft + the ascending head, plain-op graphs traced by torchscript."""
    out = tmp_path_factory.mktemp("eagle-portable") / "bundle"
    res = CliRunner().invoke(main, ["export", str(sources["target"]), "--draft", str(sources["draft"]), "--eagle",
                                    str(sources["ascending"]), "--graph", "portable", "--exporter", "torchscript",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "EAGLE-3 head (portable graph) reading target layers 1, 3, 4" in res.output
    assert "eagle_taps from layers 1, 3, 4" in res.output
    return out


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(session, feed):
    """Every output by name; every row's logits (logits_index 0 .. Q-1)."""
    feed = {C.LOGITS_INDEX: np.arange(feed[C.INPUT_IDS].shape[1]), **feed}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


# --- the manifest and the graphs' I/O --------------------------------------------------------------


@pytest.mark.parametrize("which", ["fused", "portable"])
def test_manifest_records_the_head_and_the_target_s_taps(request, sources, which):
    bundle = request.getfixturevalue(f"{which}_bundle")
    m = load_manifest(bundle)
    head_src, taps = (sources["shuffled"], TAPS) if which == "fused" else (sources["ascending"], EXPLICIT_TAPS)
    cfg = load_eagle3(head_src)[0]
    head, target = m.eagle, m.target
    assert set(m.models) == ({"target", "eagle"} if which == "fused" else {"target", "draft", "eagle"})
    assert (target.eagle_taps, target.tap_width, target.kind) == (taps, 3 * HIDDEN, "decoder")
    assert (head.kind, head.architecture, head.file, head.vocab_map) == ("eagle3", "eagle3", "eagle.onnx",
                                                                          "eagle_vocab.npy")
    assert (head.eagle_taps, head.tap_width, head.graph, head.dtype) == (taps, 3 * HIDDEN, which, "float32")
    assert head.source == str(head_src)
    d = head.dims
    assert (d.num_layers, d.num_heads, d.num_kv_heads, d.head_dim, d.hidden_size, d.vocab_size) == (
        1, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size, DRAFT_VOCAB)
    assert head.weight_bytes > 0 and head.matmul_flops_per_token > 0
    tol = PARITY_TOLERANCE["float32"]
    assert set(head.parity) == HEAD_CASES and head.parity_tolerance == tol.to_json()
    for f in head.parity.values():
        assert f["rel"] < 1e-5 and f["kl"] < 1e-9 and f["hidden_rel"] < 1e-5 and f["top1"] == 1.0
    assert set(target.parity) == TARGET_CASES
    assert all(f["taps_rel"] < 1e-5 and f["rel"] < 1e-5 for f in target.parity.values())
    if which == "portable":
        assert m.draft.eagle_taps == () and m.draft.tap_width == 0 and "taps_rel" not in m.draft.parity["prefill"]
    raw = json.loads((bundle / "specrt.json").read_text())["models"]["eagle"]
    ins, outs = C.decoder_io(head.dims, "float32", "eagle3", 3 * HIDDEN, logits_index=True)
    assert head.logits_index and target.logits_index
    assert raw["inputs"] == [s.to_json() for s in ins] and raw["outputs"] == [s.to_json() for s in outs]


@pytest.mark.parametrize("which", ["fused", "portable"])
def test_both_graphs_match_the_contract(request, which):
    bundle = request.getfixturevalue(f"{which}_bundle")
    m = load_manifest(bundle)
    elem = {"int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL, "float32": onnx.TensorProto.FLOAT}
    for entry, kind in ((m.target, "decoder"), (m.eagle, "eagle3")):
        model = onnx.load(str(bundle / entry.file), load_external_data=False)
        ins, outs = C.decoder_io(entry.dims, "float32", kind, 3 * HIDDEN, logits_index=True)
        for values, specs in ((model.graph.input, ins), (model.graph.output, outs)):
            assert [v.name for v in values] == [s.name for s in specs], entry.file
            for v, s in zip(values, specs):
                assert v.type.tensor_type.elem_type == elem[s.dtype], (entry.file, v.name)
                assert [x.dim_param or x.dim_value for x in v.type.tensor_type.shape.dim] == list(s.shape), v.name
        if which == "fused":  # the head too: single-node attention, rotary and RMS norm
            ops = {n.op_type for n in model.graph.node}
            assert {"Attention", "RotaryEmbedding", "RMSNormalization"} <= ops, entry.file
    outputs = [o.name for o in onnx.load(str(bundle / "target.onnx"), load_external_data=False).graph.output]
    assert outputs[:4] == [C.LOGITS, C.HIDDEN, C.EAGLE_TAPS, C.new_key(0)]


# --- the target's taps ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["fused", "portable"])
def test_target_taps_are_hf_hidden_states_entering_the_tap_layers(request, sources, which):
    bundle = request.getfixturevalue(f"{which}_bundle")
    m = load_manifest(bundle)
    hf = AutoModelForCausalLM.from_pretrained(sources["target"]).eval()
    ids = np.random.default_rng(5).integers(0, 300, 10)
    with torch.no_grad():
        states = hf(torch.tensor(ids)[None], output_hidden_states=True).hidden_states
    want = np.concatenate([states[t][0].numpy() for t in m.target.eagle_taps], axis=-1)
    session, d = _session(bundle / "target.onnx"), m.target.dims
    empty = np.zeros((1, 0, d.num_kv_heads, d.head_dim), np.float32)
    feed = {C.INPUT_IDS: ids[None, :7], C.POSITION_IDS: np.arange(7)[None], C.ATTENTION_MASK: causal_mask(7, 0)}
    feed.update({n: empty for i in range(d.num_layers) for n in (C.past_key(i), C.past_value(i))})
    pre = _run(session, feed)
    feed = {C.INPUT_IDS: ids[None, 7:], C.POSITION_IDS: np.arange(7, 10)[None], C.ATTENTION_MASK: causal_mask(3, 7)}
    for i in range(d.num_layers):
        feed[C.past_key(i)], feed[C.past_value(i)] = pre[C.new_key(i)], pre[C.new_value(i)]
    chain = _run(session, feed)
    got = np.concatenate([pre[C.EAGLE_TAPS][0], chain[C.EAGLE_TAPS][0]])
    assert got.shape == (10, 3 * HIDDEN)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)  # the states are ~0.05 here (random init)
    # not an accident of similar layers: the neighbouring tap choice is far off
    other = np.concatenate([states[t][0].numpy() for t in (1, 2, 3)], axis=-1)
    assert np.abs(got - other).max() > 1e-2


# --- the head graph against the PyTorch reference ----------------------------------------------------


def _head_calls(head_entry, rng):
    """A prefill reading taps, then with its past: a 1-row step reading features, a 3-row chain mixing
    taps rows and feature rows, and a 4-node tree reading features."""
    width, h = head_entry.tap_width, head_entry.dims.hidden_size
    p = 6
    mask, depth = tree_mask((-1, 0, 0, 1), p)
    calls = [("prefill", rng.integers(0, 300, p), np.arange(p), causal_mask(p, 0), np.ones(p, bool)),
             ("step", rng.integers(0, 300, 1), np.array([p]), causal_mask(1, p), np.zeros(1, bool)),
             ("chain", rng.integers(0, 300, 3), np.arange(p, p + 3), causal_mask(3, p), np.array([True, False, True])),
             ("tree", rng.integers(0, 300, 4), p + depth, mask, np.zeros(4, bool))]
    out = []
    for name, ids, pos, m, reads_taps in calls:
        q = len(ids)
        taps = (rng.standard_normal((q, width)) * reads_taps[:, None]).astype(np.float32)
        features = (rng.standard_normal((q, h)) * ~reads_taps[:, None]).astype(np.float32)
        out.append((name, ids, pos, m, taps, features))
    return out


@pytest.mark.parametrize("which", ["fused", "portable"])
def test_head_graph_equals_the_eagle3_reference(request, sources, which):
    bundle = request.getfixturevalue(f"{which}_bundle")
    m = load_manifest(bundle)
    head_src = sources["shuffled"] if which == "fused" else sources["ascending"]
    cfg, head, d2t, _ = load_eagle3(head_src)
    table = (head.embed_tokens.weight if head.embed_tokens is not None else
             AutoModelForCausalLM.from_pretrained(sources["target"]).get_input_embeddings().weight).detach()
    vocab = np.load(bundle / "eagle_vocab.npy")
    order = torch.argsort(torch.arange(DRAFT_VOCAB) + d2t)  # graph row j is draft id order[j]
    session, d = _session(bundle / "eagle.onnx"), m.eagle.dims
    past_k = past_v = np.zeros((1, 0, d.num_kv_heads, d.head_dim), np.float32)
    ref_k = ref_v = None
    for name, ids, pos, mask, taps, features in _head_calls(m.eagle, np.random.default_rng(6)):
        got = _run(session, {C.INPUT_IDS: ids[None], C.POSITION_IDS: pos[None], C.ATTENTION_MASK: mask,
                             C.EAGLE_TAPS: taps[None], C.EAGLE_FEATURES: features[None],
                             C.past_key(0): past_k, C.past_value(0): past_v})
        with torch.no_grad():
            fused = head.fc(torch.tensor(taps)[None]) + torch.tensor(features)[None]
            ref = head.step(fused, table[torch.tensor(ids)][None], torch.tensor(pos)[None],
                            torch.tensor(np.array(mask)), ref_k, ref_v)
        assert got[C.LOGITS].dtype == np.float32 and got[C.LOGITS].shape == (1, len(ids), DRAFT_VOCAB)
        np.testing.assert_allclose(got[C.LOGITS][0], ref.logits[0][:, order].numpy(), atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[C.HIDDEN][0], ref.hidden[0].numpy(), atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[C.new_key(0)], ref.key.numpy(), atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[C.new_value(0)], ref.value.numpy(), atol=1e-5, err_msg=name)
        # per target id: the graph's row j is target id vocab[j], the reference's draft id i is i + d2t[i]
        full = np.full((len(ids), cfg.vocab_size), -np.inf, np.float32)
        full[:, vocab] = got[C.LOGITS][0]
        want = draft_logits_to_target(ref.logits[0], d2t, cfg.vocab_size).numpy()
        np.testing.assert_allclose(full, want, atol=1e-5, err_msg=name)
        if name == "prefill":
            past_k, past_v, ref_k, ref_v = got[C.new_key(0)], got[C.new_value(0)], ref.key, ref.value


def test_the_vocabulary_map_ascends_and_the_lm_head_rows_follow_it(fused_bundle, portable_bundle, sources):
    for bundle, src, ascending in ((fused_bundle, sources["shuffled"], False),
                                   (portable_bundle, sources["ascending"], True)):
        _, _, d2t, t2d = load_eagle3(src)
        targets = (torch.arange(DRAFT_VOCAB) + d2t).numpy()
        assert bool(np.all(np.diff(targets) > 0)) == ascending  # the shuffled head really is out of order
        vocab = np.load(bundle / "eagle_vocab.npy")
        assert vocab.dtype == np.int64 and vocab.shape == (DRAFT_VOCAB,) and np.all(np.diff(vocab) > 0)
        assert vocab.tolist() == sorted(targets.tolist()) == np.flatnonzero(t2d.numpy()).tolist()


def test_a_head_graph_with_unpermuted_rows_fails_parity(sources, fused_bundle, tmp_path):
    """The permutation is what makes the graph right: skipping it is caught by the parity check."""
    from specrt.export.parity import ParityCases, reference_outputs

    m = load_manifest(fused_bundle)
    hf = AutoModelForCausalLM.from_pretrained(sources["target"]).eval()
    cases = ParityCases.draw(300, m.max_context)
    _, taps_ref = reference_outputs(hf, cases, TAPS)
    info = eagle_export.read_head(sources["shuffled"], hf.config)
    _, head, d2t, _ = load_eagle3(sources["shuffled"])
    order, _vocab = eagle_export.ascending_vocab(d2t)
    head_cases = eagle_export.HeadCases.build(cases, taps_ref, "float32")
    reference = eagle_export.reference_head(head, hf.get_input_embeddings().weight, head_cases)
    path = tmp_path / "eagle.onnx"
    dims = eagle_export.export_eagle_head(head, hf.get_input_embeddings().weight, path, "float32", taps=info.taps,
                                          order=None, exporter="torchscript", positions=64)
    with pytest.raises(ParityError, match="differs from the EAGLE-3 reference"):
        eagle_export.check_head_parity(reference, head_cases, path, dims, "float32", info.tap_width, order.numpy())
    eagle_export.export_eagle_head(head, hf.get_input_embeddings().weight, path, "float32", taps=info.taps,
                                   order=order, exporter="torchscript", positions=64)
    figures = eagle_export.check_head_parity(reference, head_cases, path, dims, "float32", info.tap_width,
                                             order.numpy())
    assert set(figures) == HEAD_CASES and max(f["rel"] for f in figures.values()) < 1e-5


def test_head_parity_failure_writes_nothing(sources, tmp_path, monkeypatch):
    real = eagle_export.reference_head

    def off(*args):
        ref = real(*args)
        ref["chain"]["logits"] = ref["chain"]["logits"] + np.linspace(0, 3, DRAFT_VOCAB, dtype=np.float32)
        return ref

    monkeypatch.setattr(eagle_export, "reference_head", off)
    out = tmp_path / "out"
    with pytest.raises(ParityError, match=r"eagle.onnx: .*\(chain rel"):
        export_bundle(str(sources["target"]), None, out, ExportOptions(exporter="torchscript", graph="portable"),
                      eagle=str(sources["shuffled"]))
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor a .partial folder


@pytest.mark.parametrize("arch", ["qwen3", "phi3"])
def test_other_llama_style_targets(tmp_path, arch):
    """Qwen3 (q/k norms, sliding layers, tied embedding) and Phi-3 (packed projections, longrope). Qwen3's
    is an fp16 export whose PyTorch side runs in a child process, so the head's graph, reference and
    cases travel back by pickle, and both graphs hold to the fp16 tolerance against fp32 PyTorch."""
    target = save_model(tmp_path / arch, arch, seed=1, layers=4)
    head = save_eagle_head(tmp_path / "head", target, seed=2, draft_vocab=64)
    dtype = "float16" if arch == "qwen3" else "float32"
    options = ExportOptions(exporter="torchscript", isolate=arch == "qwen3", dtype=dtype)
    m = export_bundle(str(target), None, tmp_path / "b", options, eagle=str(head))
    assert m.target.eagle_taps == m.eagle.eagle_taps == tap_layers(4)
    assert m.eagle.dtype == m.target.dtype == dtype
    bound = 1e-5 if dtype == "float32" else PARITY_TOLERANCE[dtype].rel / 4
    assert all(f["taps_rel"] < bound for f in m.target.parity.values())
    assert all(f["rel"] < bound and f["hidden_rel"] < bound for f in m.eagle.parity.values()), m.eagle.parity
    session = _session(tmp_path / "b" / "eagle.onnx")
    want = "tensor(float16)" if dtype == "float16" else "tensor(float)"
    assert {i.name: i.type for i in session.get_inputs()}[C.EAGLE_TAPS] == want
    # The runtime binds the head's inputs by address: float32 rows converted for an fp16 graph must still be
    # alive when it runs (they once were freed first, and the head drafted from garbage: NaN logits).
    from specrt.runtime.backends.onnxruntime import OrtDecoder

    rng, n = np.random.default_rng(3), 5
    ids = rng.integers(0, m.target.dims.vocab_size, n)
    extra = {C.EAGLE_TAPS: rng.standard_normal((n, m.eagle.tap_width)).astype(np.float32),
             C.EAGLE_FEATURES: rng.standard_normal((n, HIDDEN)).astype(np.float32)}
    head = OrtDecoder(tmp_path / "b", m.eagle, threads=1, role="draft")
    got = head.forward(head.new_cache(n), ids, np.arange(n), causal_mask(n, 0), extra=extra).logits
    cast = np.float16 if dtype == "float16" else np.float32
    feed = {C.INPUT_IDS: ids[None], C.POSITION_IDS: np.arange(n)[None], C.ATTENTION_MASK: causal_mask(n, 0),
            **{k: v.astype(cast)[None] for k, v in extra.items()},
            **{i.name: np.zeros((1, 0, *i.shape[2:]), cast) for i in session.get_inputs() if i.name.startswith("past")}}
    np.testing.assert_array_equal(got, _run(session, feed)[C.LOGITS][0])


# --- quantize and TensorRT ----------------------------------------------------------------------------


def test_quantize_can_keep_the_head_float_and_unchanged(portable_bundle, tmp_path):
    out = tmp_path / "int8"
    q = quantize_bundle(portable_bundle, out, QuantizeOptions(bits=8, block_size=16, eagle_bits=None))
    m = load_manifest(portable_bundle)
    assert q.eagle.quantization is None and q.target.quantization["bits"] == 8
    assert q.draft.quantization["bits"] == 8
    assert (q.eagle.eagle_taps, q.eagle.tap_width, q.eagle.vocab_map, q.eagle.parity) == (
        m.eagle.eagle_taps, m.eagle.tap_width, m.eagle.vocab_map, m.eagle.parity)
    assert q.target.eagle_taps == m.target.eagle_taps
    for name in ("eagle.onnx", "eagle_vocab.npy"):
        assert (out / name).read_bytes() == (portable_bundle / name).read_bytes()
    graph = onnx.load(str(out / "target.onnx"))
    assert [o.name for o in graph.graph.output][2] == C.EAGLE_TAPS
    assert "eagle: float32 (not quantized)" in describe(load_manifest(out))
    # What the quantized target costs the float head, recorded with the target: teacher-forced first-draft
    # acceptance on the float pair and on this one
    acc = q.target.quantization["eagle_acceptance"]
    assert 0 <= acc["quantized"] <= 1 and abs(acc["quantized"] - acc["float"]) <= 0.1
    assert "first-draft acceptance" in describe(load_manifest(out))
    from specrt.export.quality import head_acceptance

    same = head_acceptance([portable_bundle, portable_bundle], m, ["def fib(n):\n    return", "import os\n"])
    assert same[0] == same[1]


def _weight_matmuls(path) -> tuple[int, int]:
    """(float MatMuls with a constant weight, MatMulNBits) in the graph at ``path``."""
    graph = onnx.load(str(path)).graph
    weights = {t.name for t in graph.initializer}
    return (sum(n.op_type == "MatMul" and n.input[1] in weights for n in graph.node),
            sum(n.op_type == "MatMulNBits" for n in graph.node))


@pytest.mark.parametrize("target_bits", [8, None])
def test_quantize_quantizes_the_head_and_eagle_stays_exact(portable_bundle, tmp_path, target_bits):
    """By default the head follows the target's bits; a float target may have an int8 head alone. Either
    way eagle's greedy tokens are the (quantized or float) target's own."""
    from specrt import load

    out = tmp_path / "q"
    q = quantize_bundle(portable_bundle, out, QuantizeOptions(bits=target_bits, block_size=16, eagle_bits=8,
                                                              draft_bits=None))
    float_left, nbits = _weight_matmuls(out / "eagle.onnx")
    assert float_left == 0 and nbits == len(q.eagle.quantization["quantized_matmuls"]) >= 6
    # its copy of the target's embedding table is int8 as well, and no float copy is left behind
    head_graph = onnx.load(str(out / "eagle.onnx")).graph
    assert [n.op_type for n in head_graph.node if "Gather" in n.op_type and n.input[0].endswith(".int8")] == [
        "GatherBlockQuantized"] and q.eagle.quantization["quantized_lookups"]
    table = [q.target.dims.vocab_size, HIDDEN]
    assert not [i.name for i in head_graph.initializer if list(i.dims) == table and
                i.data_type == onnx.TensorProto.FLOAT]
    assert q.eagle.weight_bytes < load_manifest(portable_bundle).eagle.weight_bytes
    assert (out / "eagle_vocab.npy").read_bytes() == (portable_bundle / "eagle_vocab.npy").read_bytes()
    acc = q.eagle.quantization["eagle_acceptance"]
    assert 0 <= acc["quantized"] <= 1 and abs(acc["quantized"] - acc["float"]) <= 0.15
    if target_bits is None:
        assert q.target.quantization is None
        assert (out / "target.onnx").read_bytes() == (portable_bundle / "target.onnx").read_bytes()
    lines = describe(load_manifest(out))
    assert "eagle: int8" in lines and "first-draft acceptance" in lines
    gen = load(out)
    prompt = "def fib(n):\n    "
    plain = gen.generate(prompt, method="none", max_new_tokens=24)
    assert gen.generate(prompt, method="eagle", max_new_tokens=24, gamma=3).token_ids == plain.token_ids


def test_quantizing_only_the_draft_of_a_bundle_with_a_head_leaves_the_head_alone(portable_bundle, tmp_path):
    q = quantize_bundle(portable_bundle, tmp_path / "q", QuantizeOptions(bits=None, block_size=16, draft_bits=8,
                                                                         eagle_bits=None))
    assert q.draft.quantization["bits"] == 8 and q.target.quantization is None and q.eagle.quantization is None
    assert (tmp_path / "q" / "eagle.onnx").read_bytes() == (portable_bundle / "eagle.onnx").read_bytes()
    assert "eagle_acceptance" not in q.draft.quantization  # nothing the head reads or is changed


def test_quantize_with_nothing_to_quantize_is_a_one_line_error():
    with pytest.raises(ConfigError, match="nothing to quantize"):
        QuantizeOptions(bits=None, draft_bits="same", eagle_bits=None)


def test_tensorrt_builds_the_head_and_runs_it(portable_bundle, tmp_path, monkeypatch):
    """specrt build on a bundle with a head, then eagle and eagle-tree on the engines: the builder's and the
    runtime's call sequences against the TensorRT stand-in, on host memory; ONNX Runtime's greedy tokens."""
    import shutil
    import sys

    from support.fake_device import HostMemory
    from support.trt_standin import VERSIONS, fake_cudart, make_tensorrt

    import specrt
    from specrt.export.tensorrt import BuildOptions, build_bundle_engines
    from specrt.runtime.backends import tensorrt as trt_backend

    monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt(VERSIONS[-1]))
    for name, module in fake_cudart().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(trt_backend, "CudaMemory", HostMemory)
    bundle = tmp_path / "bundle"
    shutil.copytree(portable_bundle, bundle)
    built = build_bundle_engines(bundle, BuildOptions(max_context=128, max_prompt=64, max_verify=16))
    assert {"target", "eagle", "summary"} <= set(built)
    gen, reference = specrt.load(bundle), specrt.load(portable_bundle, threads=1)
    for kwargs in (dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,6")):
        want = reference.generate("def fib(n):", max_new_tokens=20, **kwargs).token_ids
        assert gen.generate("def fib(n):", max_new_tokens=20, **kwargs).token_ids == want, kwargs
    assert gen.decoders["eagle"].provider == "TensorRT"
    # The same bundle on another machine (another user's cache): its engines came with it, so they are
    # not loaded unless trusted explicitly, and `specrt build` rebuilds rather than reusing them.
    from specrt.errors import BundleError

    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(BundleError, match="was not built on this machine by `specrt build`"):
        specrt.load(bundle, backend="tensorrt")
    monkeypatch.setenv("SPECRT_TRUST_ENGINES", "1")
    assert specrt.load(bundle, backend="tensorrt").decoders["target"].provider == "TensorRT"
    monkeypatch.delenv("SPECRT_TRUST_ENGINES")
    seen = []
    build_bundle_engines(bundle, BuildOptions(max_context=128, max_prompt=64, max_verify=16),
                         progress=lambda role, cached: seen.append(cached))
    assert seen and not any(seen)  # every engine rebuilt, none reused from the bundle
    assert specrt.load(bundle, backend="tensorrt").decoders["target"].provider == "TensorRT"


# --- bad input: one line, exit 1, nothing written -------------------------------------------------------


def _eagle12(folder, hidden: int, vocab: int) -> None:
    """An EAGLE-1/2 checkpoint: layers.0.*, fc over cat(embedding, feature) with a bias, no lm_head/d2t."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": vocab}))
    state = {"fc.weight": torch.randn(hidden, 2 * hidden), "fc.bias": torch.randn(hidden)}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"layers.0.self_attn.{n}.weight"] = torch.randn(hidden, hidden)
    save_file(state, str(folder / "model.safetensors"))


BAD = {
    "another hidden size": (None, "hidden size 32 .*this target's is 64"),
    "another vocabulary": (None, "vocab_size is 400; this target's is 336"),
    "EAGLE-1 layout": (None, "EAGLE-1/2 checkpoint"),
    "a d2t out of range": (None, r"outside \[0, 336\)"),
    "another layer count": (None, "taps target layer 6 but the target has only 5 layers"),
    "gemma2 target": ("gemma2", "gemma2 is not one: Gemma scales its token embedding"),
    "gpt2 target": ("gpt2", "gpt2 is not one: GPT-2 adds learned absolute positions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_heads_and_targets_are_one_line_errors(sources, tmp_path, case):
    arch, message = BAD[case]
    target = sources["target"]
    if arch is not None:
        target = save_model(tmp_path / arch, arch, seed=1, layers=4)
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64)  # a fine head for that target
    elif case == "another hidden size":
        narrow = save_model(tmp_path / "narrow", "llama", seed=1, layers=LAYERS, hidden=32)
        head = save_eagle_head(tmp_path / "head", narrow, draft_vocab=64)
    elif case == "another vocabulary":
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64, config_overrides={"vocab_size": 400})
    elif case == "EAGLE-1 layout":
        head = tmp_path / "head"
        _eagle12(head, HIDDEN, 336)
    elif case == "another layer count":
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64, taps=(2, 4, 6))
    else:
        head = save_eagle_head(tmp_path / "head", target, draft_vocab=64)
        state = load_file(str(head / "model.safetensors"))
        state["d2t"][-1] = 1000
        save_file(state, str(head / "model.safetensors"))
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    res = CliRunner().invoke(main, ["export", str(target), "--eagle", str(head), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    errors = [line for line in res.output.strip().splitlines() if line.startswith("Error")]
    assert len(errors) == 1, res.output
    assert re.search(message, errors[0]), errors[0]
    assert not out.exists() and set(tmp_path.iterdir()) == before


def test_unsupported_targets_are_named():
    for arch in eagle_export.EAGLE_TARGETS:
        eagle_export.check_eagle_target(arch)
    with pytest.raises(EagleHeadError, match="gemma3_text is not one"):
        eagle_export.check_eagle_target("gemma3_text")
    with pytest.raises(EagleHeadError, match="falcon is not one: not a llama-style rotary decoder"):
        eagle_export.check_eagle_target("falcon")


@pytest.mark.parametrize("flags", [["--quantize", "int8"], ["--eagle-quantize", "int8"]])
def test_quantized_export_with_a_head_leaves_only_the_bundle(sources, tmp_path, flags):
    """`specrt export --eagle --quantize`: float export beside the output, quantized, float removed. The head
    follows the target's bits, or is quantized alone on a float target."""
    out = tmp_path / "int8"
    res = CliRunner().invoke(main, ["export", str(sources["target"]), "--eagle", str(sources["shuffled"]),
                                    "--exporter", "torchscript", *flags, "--block-size", "16", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "eagle: int8 (blocks of 16" in res.output
    assert [p.name for p in tmp_path.iterdir()] == ["int8"]
    m = load_manifest(out)
    assert m.eagle is not None and (out / m.eagle.vocab_map).is_file() and m.eagle.quantization["bits"] == 8
    assert (m.target.quantization or {}).get("bits") == (8 if "--quantize" in flags else None)
    shutil.rmtree(out)
