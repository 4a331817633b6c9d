"""`specrt export --eagle`: the target's eagle_taps output, the head graph (eagle.onnx), its ascending
vocabulary map, parity of both against PyTorch (quantize, TensorRT and the refusals: test_eagle_export_checks.py).

Targets and heads are tiny and random: a 5-layer llama (default taps 1, 2, 4) and heads written with
save_eagle3 in the published layout (tests/support/models.py save_eagle_head).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from support.eagle_export_cases import DRAFT_VOCAB, EXPLICIT_TAPS, HIDDEN, TAPS
from support.models import save_eagle_head, save_model
from transformers import AutoModelForCausalLM

from specrt.bundle import contract as C
from specrt.bundle.manifest import load_manifest
from specrt.bundle.parity import PARITY_TOLERANCE
from specrt.errors import ParityError
from specrt.export.eagle import graph as eagle_export
from specrt.export.eagle.config import tap_layers
from specrt.export.exporter import ExportOptions, export_bundle
from specrt.export.eagle.vocab import draft_logits_to_target
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.runtime.masks import causal_mask, tree_mask

HEAD_CASES = {"prefill", "step", "chain", "tree"}
TARGET_CASES = {"prefill", "decode", "chain", "tree", "far"}


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
    from specrt.export.graph.parity import ParityCases, reference_outputs

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
