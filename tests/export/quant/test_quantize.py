"""Weight-only quantized bundles: what is quantized, what is recorded, bad input, and exactness of
speculation with respect to the quantized target."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from support.exactness import PROMPTS, exact_sequence_distribution

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import ConfigError, QualityGateError
from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle
from specrt.runtime.sampling import SamplingConfig


@pytest.fixture(scope="module")
def int4_close(close_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "int4"
    quantize_bundle(close_bundle, out, QuantizeOptions(bits=4, block_size=32, algorithm="rtn", embeddings=False))
    return out


def test_every_matmul_with_weights_is_quantized_and_the_lookup_stays_float(int4_close, close_bundle):
    m = load_manifest(int4_close)
    for role, entry in m.models.items():
        graph = onnx.load(str(int4_close / entry.file)).graph
        ops = [n.op_type for n in graph.node]
        q = entry.quantization
        assert q["bits"] == 4 and q["block_size"] == 32 and q["format"] == "MatMulNBits"
        per_layer = 4 if entry.graph == "fused" else 7  # fused: packed q|k|v and gate|up
        assert ops.count("MatMulNBits") == len(q["quantized_matmuls"]) == per_layer * entry.dims.num_layers + 1  # + head
        assert q["bytes_after"] < q["bytes_before"] and q["parity"]["mean_kl"] <= q["parity"]["max_mean_kl"]
        # The head reads a quantized copy; the embedding lookup still gathers from a float matrix.
        head = next(n for n in graph.node if "logits" in n.output)
        assert head.op_type == "MatMulNBits" or any(
            p.op_type == "MatMulNBits" for p in graph.node if p.output[0] in head.input)
        gather = next(n for n in graph.node if n.op_type == "Gather" and "input_ids" in n.input)
        table = next(i for i in graph.initializer if i.name == gather.input[0])
        assert table.data_type == onnx.TensorProto.FLOAT
    assert not m.engines and load_manifest(close_bundle).target.quantization is None


def test_hqq_fits_asymmetric_int4_blocks_at_accuracy_level_4(close_bundle, tmp_path):
    """--algorithm hqq: ORT's HQQ quantizer (scales and zero points fitted per block). Its float zero points
    become the integer kernel plus a per-block float term, at the accuracy level its own path leaves out;
    same gate, same exactness."""
    out = tmp_path / "hqq"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=4, algorithm="hqq"))
    q = m.target.quantization
    assert q["algorithm"] == "hqq" and not q["symmetric"] and q["parity"]["mean_kl"] <= q["parity"]["max_mean_kl"]
    graph = onnx.load(str(out / m.target.file)).graph
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert nodes and all(len(n.input) == 3 for n in nodes)  # no float zero points left
    assert sum(n.name.endswith(".block_add") for n in graph.node) == len(nodes)
    assert all({a.name: a.i for a in n.attribute}["accuracy_level"] == 4 for n in nodes)
    gen = specrt.load(out, threads=1)
    want = gen.generate(PROMPTS[0], max_new_tokens=16, method="none").token_ids
    assert gen.generate(PROMPTS[0], max_new_tokens=16, method="draft").token_ids == want
    with pytest.raises(ConfigError, match="--algorithm"):
        QuantizeOptions(bits=4, algorithm="gptq")


def test_speculation_over_a_quantized_target_gives_its_greedy_tokens(int4_close):
    gen = specrt.load(int4_close, threads=1)
    for prompt in PROMPTS:
        want = gen.generate(prompt, max_new_tokens=24, method="none").token_ids
        for method in ("draft", "tree", "ngram"):
            assert gen.generate(prompt, max_new_tokens=24, method=method).token_ids == want, (prompt, method)


def test_sampled_speculation_over_a_quantized_pair_is_the_quantized_target_s_distribution(int4_close):
    gen = specrt.load(int4_close, threads=1)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = "for i in range(10):\n    print(i"
    exact = exact_sequence_distribution(gen, gen.encode(prompt), 3, cfg)
    n = 1500
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        out = tuple(gen.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=3, seed=seed, method="draft",
                                 gamma=2).token_ids)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < np.sqrt(27 / n), tv


def test_bad_quantization_requests_are_one_line_errors_with_no_output(close_bundle, int4_close, tmp_path):
    with pytest.raises(ConfigError, match="int4 or int8"):
        QuantizeOptions(bits=3)
    with pytest.raises(ConfigError, match="block size"):
        QuantizeOptions(block_size=48)
    with pytest.raises(ConfigError, match="does not divide"):
        quantize_bundle(close_bundle, tmp_path / "a", QuantizeOptions(block_size=128))
    with pytest.raises(ConfigError, match="already quantized"):
        quantize_bundle(int4_close, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
    res = CliRunner().invoke(main, ["quantize", str(int4_close), "-o", str(tmp_path / "c")])
    assert res.exit_code == 1 and "already quantized" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["quantize", str(close_bundle), "-o", str(tmp_path / "d"), "--bits", "int8",
                                    "--draft-quantize", "none"])
    assert res.exit_code == 0, res.output
    m = load_manifest(tmp_path / "d")
    assert m.target.quantization["bits"] == 8 and m.draft.quantization is None
    assert "target: int8" in res.output and "draft: float32 (not quantized)" in res.output


def test_verify_compares_a_quantized_bundle_by_agreement(int4_close):
    from specrt.check.verify import check_golden

    gen = specrt.load(int4_close, threads=1)
    check = check_golden(gen, "target")
    assert check.passed and "int4: top-1 agrees" in check.detail


def test_tensorrt_build_refuses_a_quantized_bundle_in_one_line(int4_close):
    from specrt.export.tensorrt import resolve_precision

    with pytest.raises(ConfigError, match="MatMulNBits.*float bundle"):
        resolve_precision(list(load_manifest(int4_close).models.values()), None)


def test_export_quantize_writes_only_the_quantized_bundle(pairs, tmp_path):
    target, draft = pairs["llama"]
    out = tmp_path / "q"
    res = CliRunner().invoke(main, ["export", str(target), "--draft", str(draft), "-o", str(out), "--quantize", "int8",
                                    "--draft-quantize", "int4", "--exporter", "torchscript", "--no-measure"])
    assert res.exit_code == 0, res.output
    m = load_manifest(out)
    assert m.target.quantization["bits"] == 8 and m.draft.quantization["bits"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # the float export was staged and removed
    res = CliRunner().invoke(main, ["export", str(target), "-o", str(tmp_path / "r"), "--quantize", "int4",
                                    "--block-size", "128"])
    assert res.exit_code == 1 and "does not divide" in res.output and not (tmp_path / "r").exists()


def test_quantize_without_onnx_is_a_one_line_error(close_bundle, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)  # as on the runtime-only install
    res = CliRunner().invoke(main, ["quantize", str(close_bundle), "-o", str(tmp_path / "q")])
    assert res.exit_code == 1 and "pip install onnx" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "q").exists()


def test_a_hard_linked_weights_file_is_a_one_line_error(close_bundle, tmp_path):
    """onnx refuses external weights with several hard links (`cp -al` copies of a bundle): said in one line."""
    import os
    import shutil

    bundle = tmp_path / "linked"
    shutil.copytree(close_bundle, bundle)
    graph = onnx.load(str(bundle / "target.onnx"))
    onnx.save_model(graph, str(bundle / "target.onnx"), save_as_external_data=True, location="target.onnx.data")
    os.link(bundle / "target.onnx.data", tmp_path / "second-link.data")
    res = CliRunner().invoke(main, ["quantize", str(bundle), "-o", str(tmp_path / "q")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "Error: cannot read target.onnx's weights" in res.output and "instead of linking" in res.output
    assert not (tmp_path / "q").exists()


def test_export_and_quantize_record_what_each_pass_reads(int4_close, close_bundle):
    from specrt.measure.roofline import entry_cost, graph_cost

    floats, ints = load_manifest(close_bundle), load_manifest(int4_close)
    for role in ("target", "draft"):
        f, q = floats.models[role], ints.models[role]
        recorded = {"weight_bytes": f.weight_bytes, "matmul_flops_per_token": f.matmul_flops_per_token}
        assert recorded == graph_cost(close_bundle / f.file).manifest_fields()
        assert entry_cost(int4_close, q).source == "manifest"
        # int4 reads about a quarter of fp32's bytes (scales, norms and the float lookup table besides) ...
        assert q.weight_bytes < 0.5 * f.weight_bytes
        # ... for the same arithmetic: MatMulNBits' K x N is the float MatMul's
        assert q.matmul_flops_per_token == f.matmul_flops_per_token


def test_a_float_target_with_a_quantized_draft(close_bundle, tmp_path):
    """The seed's "quantized copy as the draft" on a float target: only the draft is quantized (and gated),
    the target's graph is copied byte for byte, and speculation still gives the float target's tokens."""
    out = tmp_path / "qdraft"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=None, block_size=32, draft_bits=8))
    assert m.target.quantization is None and m.draft.quantization["bits"] == 8
    assert m.draft.quantization["parity"]["mean_kl"] <= m.draft.quantization["parity"]["max_mean_kl"]
    assert (out / m.target.file).read_bytes() == (close_bundle / m.target.file).read_bytes()
    float_gen, gen = specrt.load(close_bundle, threads=1), specrt.load(out, threads=1)
    for prompt in PROMPTS[:2]:
        want = float_gen.generate(prompt, max_new_tokens=20, method="none").token_ids
        assert gen.generate(prompt, max_new_tokens=20, method="draft").token_ids == want, prompt
    res = CliRunner().invoke(main, ["quantize", str(close_bundle), "-o", str(tmp_path / "none"), "--bits", "none"])
    assert res.exit_code == 1 and "nothing to quantize" in res.output and "Traceback" not in res.output


def test_export_draft_self_is_a_quantized_copy_of_a_float_target(pairs, tmp_path):
    target, _ = pairs["llama"]
    out = tmp_path / "self"
    res = CliRunner().invoke(main, ["export", str(target), "--draft", "self", "--draft-quantize", "int8",
                                    "-o", str(out), "--exporter", "torchscript", "--no-measure"])
    assert res.exit_code == 0, res.output
    m = load_manifest(out)
    assert m.target.quantization is None and m.draft.quantization["bits"] == 8
    assert m.draft.source == m.target.source and m.draft.dims == m.target.dims
    gen = specrt.load(out, threads=1)
    want = gen.generate(PROMPTS[0], max_new_tokens=16, method="none").token_ids
    assert gen.generate(PROMPTS[0], max_new_tokens=16, method="draft").token_ids == want
    res = CliRunner().invoke(main, ["export", str(target), "--draft", "self", "-o", str(tmp_path / "f")])
    assert res.exit_code == 2 and "--draft-quantize int4 or int8" in res.output and not (tmp_path / "f").exists()


def test_quantized_embeddings_are_int8_lookups_and_speculation_stays_exact(close_bundle, tmp_path):
    """--quantize-embeddings: int8 lookups, gated, speculation exact (this pair's heads are not tied)."""
    out = tmp_path / "emb"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=8, block_size=32, embeddings=True))
    for role, entry in m.models.items():
        graph = onnx.load(str(out / entry.file)).graph
        lookup = next(n for n in graph.node if "input_ids" in n.input)
        assert lookup.op_type == "GatherBlockQuantized" and entry.quantization["quantized_lookups"]
        # no float [V, H] table is left (the untied LM head reads its own int8 copy)
        shape = [entry.dims.vocab_size, entry.dims.hidden_size]
        assert not [i.name for i in graph.initializer if list(i.dims) == shape and i.data_type in (
            onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
        assert entry.quantization["parity"]["mean_kl"] <= entry.quantization["parity"]["max_mean_kl"]
    without = quantize_bundle(close_bundle, tmp_path / "int8", QuantizeOptions(bits=8, block_size=32, embeddings=False))
    from specrt.bundle import contract as C

    assert m.target.weight_bytes == without.target.weight_bytes  # a lookup reads one row per token either way
    assert C.graph_bytes(out / "target.onnx") < C.graph_bytes(tmp_path / "int8" / "target.onnx")
    gen = specrt.load(out, threads=1)
    for prompt in PROMPTS[:2]:
        want = gen.generate(prompt, max_new_tokens=20, method="none").token_ids
        assert gen.generate(prompt, max_new_tokens=20, method="draft").token_ids == want, prompt


def test_a_tied_table_is_stored_once_and_the_lookup_reads_the_lm_head_s_int8_rows(tmp_path):
    """Gather(T) and MatMul(x, T^T), as an exporter writes tied embeddings: after int8 quantization with
    lookups, one uint8 table is read by both, and each looked-up row is the LM head's dequantized row."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from specrt.export.quant.quantize import quantize_graph

    vocab, hidden = 96, 64
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    rotary = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)  # gathered by position
    graph = helper.make_graph(
        [helper.make_node("Gather", ["T", "input_ids"], ["emb"], name="lookup"),
         helper.make_node("MatMul", ["emb", "W"], ["logits"], name="lm_head"),
         helper.make_node("Gather", ["R", "position_ids"], ["cos"], name="rotary")], "tied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "q"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "q"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, "q", hidden]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "q", vocab]),
         helper.make_tensor_value_info("cos", TensorProto.FLOAT, [1, "q", 64])],
        [numpy_helper.from_array(table, "T"), numpy_helper.from_array(np.ascontiguousarray(table.T), "W"),
         numpy_helper.from_array(rotary, "R")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "f.onnx"))
    record = quantize_graph(tmp_path / "f.onnx", tmp_path / "q.onnx", 8, 32, 4, lookups=True)
    assert record["lookup_shares_lm_head"] == ["T"]
    q = onnx.load(str(tmp_path / "q.onnx")).graph
    assert not [i.name for i in q.initializer if list(i.dims) in ([vocab, hidden], [hidden, vocab])]  # no float copy
    head = next(n for n in q.node if n.op_type == "MatMulNBits")
    gather = next(n for n in q.node if n.op_type == "GatherBlockQuantized")
    assert gather.input[0] == head.input[1]
    # a table gathered by position (a rotary cache) is not a token lookup: it stays float and unchanged
    assert [n.op_type for n in q.node if n.name == "rotary"] == ["Gather"]
    ids = np.array([[0, 7, 95, 7]], np.int64)
    emb, logits, cos = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "position_ids": np.arange(4)[None]})
    np.testing.assert_array_equal(cos[0], rotary[:4])
    data = numpy_helper.to_array(next(i for i in q.initializer if i.name == head.input[1])).astype(np.float32)
    scales = numpy_helper.to_array(next(i for i in q.initializer if i.name == head.input[2]))
    rows = ((data - 128) * scales.reshape(vocab, -1, 1)).reshape(vocab, hidden)
    np.testing.assert_array_equal(emb[0], rows[ids[0]])
    assert np.abs(emb[0] - table[ids[0]]).max() < 0.05  # int8: close to the float rows


def test_the_lm_head_and_lookups_can_take_their_own_block_size(close_bundle, tmp_path):
    """--head-block-size: the LM head (and the int8 lookups) at 16, every other matmul at 32; gated as ever."""
    out = tmp_path / "mixed"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=8, block_size=32, embeddings=True,
                                                           head_block_size=16))
    q = m.target.quantization
    assert (q["block_size"], q["head_block_size"]) == (32, 16)
    graph = onnx.load(str(out / m.target.file)).graph
    sizes = {n.name: next(a.i for a in n.attribute if a.name == "block_size")
             for n in graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")}
    inits = {i.name: list(i.dims) for i in graph.initializer}
    vocab = m.target.dims.vocab_size
    heads = [n.name for n in graph.node if n.op_type == "MatMulNBits" and inits[n.input[1]][0] == vocab]
    assert heads and all(sizes[h] == 16 for h in heads)
    others = [n.name for n in graph.node if n.op_type == "MatMulNBits" and n.name not in heads]
    assert others and {sizes[o] for o in others} == {32}
    assert all(sizes[n.name] == 16 for n in graph.node if n.op_type == "GatherBlockQuantized")
    assert q["parity"]["mean_kl"] <= q["parity"]["max_mean_kl"]
    gen = specrt.load(out, threads=1)
    want = gen.generate(PROMPTS[0], max_new_tokens=12, method="none").token_ids
    assert gen.generate(PROMPTS[0], max_new_tokens=12, method="draft").token_ids == want
    with pytest.raises(ConfigError, match="block size must be one of"):
        QuantizeOptions(bits=8, head_block_size=24)


def test_a_graph_past_protobuf_s_limit_is_saved_with_external_data(tmp_path, monkeypatch):
    """An int8 graph of a 1B model with its float embedding table is past 2 GB, where protobuf cannot even size
    the message (EncodeError from ByteSize): its weights go to <file>.data instead of a traceback."""
    from google.protobuf.message import EncodeError

    from specrt.export.staging import save_graph

    class Huge:
        def ByteSize(self) -> int:
            raise EncodeError("Failed to serialize proto")

    saved: list[dict] = []
    monkeypatch.setattr(onnx, "save_model", lambda model, path, **kw: saved.append({"path": path, **kw}))
    save_graph(Huge(), tmp_path / "target.onnx")
    assert saved == [{"path": str(tmp_path / "target.onnx"), "save_as_external_data": True,
                      "location": "target.onnx.data"}]


def test_the_defaults_are_the_best_setting_that_passes_the_gate(close_bundle, tmp_path, monkeypatch):
    """No option given: int4 by hqq where torch is installed (else rtn), the lookups at int8 where the gate passes;
    a gate that refuses int8 lookups gets float ones, and the record says what was refused."""
    from specrt.export.quant import quantize as Q

    chosen = [(c.algorithm, c.embeddings) for c in Q.candidates(QuantizeOptions(bits=4), "target")]
    assert chosen == [("hqq", True), ("hqq", False)]
    assert [c.embeddings for c in Q.candidates(QuantizeOptions(bits=8, embeddings=False), "target")] == [False]
    assert [c.algorithm for c in Q.candidates(QuantizeOptions(bits=8), "target")] == ["rtn", "rtn"]
    assert [c.embeddings for c in Q.candidates(QuantizeOptions(bits=None, eagle_bits=8), "eagle", "eagle3")] == [False]
    monkeypatch.setattr(Q, "_has_torch", lambda: False)
    assert Q.candidates(QuantizeOptions(bits=4), "target")[0].algorithm == "rtn"
    monkeypatch.undo()

    m = quantize_bundle(close_bundle, tmp_path / "q8", QuantizeOptions(bits=8))
    assert all(e.quantization["quantized_lookups"] and "refused" not in e.quantization for e in m.models.values())

    gate = Q._gate

    def refuse_int8_lookups(src, tmp, manifest, role, options, bits, prompts):
        if options.embeddings:
            raise QualityGateError(f"{role} at int{bits} drifts too far (a stand-in refusal)", 0.5)
        return gate(src, tmp, manifest, role, options, bits, prompts)

    monkeypatch.setattr(Q, "_gate", refuse_int8_lookups)
    m = quantize_bundle(close_bundle, tmp_path / "q8f", QuantizeOptions(bits=8))
    for entry in m.models.values():
        assert "quantized_lookups" not in entry.quantization
        assert entry.quantization["refused"] == ["int8 lookups, mean KL 0.500"]
    assert "refused with int8 lookups, mean KL 0.500" in Q.describe(m)
    with pytest.raises(ConfigError, match="stand-in refusal"):
        quantize_bundle(close_bundle, tmp_path / "q8e", QuantizeOptions(bits=8, embeddings=True))
    assert not (tmp_path / "q8e").exists()


def test_a_dflash_draft_is_int8_where_the_target_is_quantized_unless_told_otherwise():
    """--dflash-quantize auto: int8 beside an int4 or int8 target (its 8-16-row pass cost no less at int4 here),
    float beside a float target or kept GGUF blocks; an explicit choice wins; "auto" is the draft's word only."""
    from specrt.errors import ConfigError
    from specrt.export.quant.quantize import QuantizeOptions

    assert [QuantizeOptions(bits=b).bits_for("dflash") for b in (4, 8)] == [8, 8]
    assert QuantizeOptions(bits=None, gguf=(("target", "m.gguf"),)).bits_for("dflash") is None
    assert QuantizeOptions(bits=None, dflash_bits=4).bits_for("dflash") == 4
    assert QuantizeOptions(bits=4, dflash_bits="same").bits_for("dflash") == 4
    assert QuantizeOptions(bits=4, dflash_bits=None).bits_for("dflash") is None
    with pytest.raises(ConfigError, match="nothing to quantize"):
        QuantizeOptions(bits=None)
    with pytest.raises(ConfigError, match="eagle quantization must be"):
        QuantizeOptions(bits=4, eagle_bits="auto")
