"""GGUF in: llama.cpp's Q4_0 / Q4_1 / Q8_0 blocks reach MatMulNBits unchanged, and a GGUF exports end to end."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.gguf import write_llama_gguf
from support.models import CHAT_TEMPLATE, make_tokenizer

import specrt
from specrt.errors import ConfigError, ModelLoadError
from specrt.export.quant import gguf as G


def _write_tensors(path, tensors: dict[str, tuple[np.ndarray, str]]) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (value, kind) in tensors.items():
        qtype = gguf.GGMLQuantizationType[kind]
        w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _matmul_graph(path, weights: dict[str, np.ndarray]) -> None:
    """Y_name = A @ W for each [K, N] weight: the float graph an export writes for a linear layer."""
    k = next(iter(weights.values())).shape[0]
    nodes = [helper.make_node("MatMul", ["A", name], [f"Y_{name}"], name=f"mm_{name}") for name in weights]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info(f"Y_{n}", TensorProto.FLOAT, ["M", w.shape[1]])
                               for n, w in weights.items()],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _dequantized(value: np.ndarray, kind: str) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.dequantize(gguf.quants.quantize(value, qtype), qtype).reshape(value.shape)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_the_blocks_compute_what_the_dequantized_weights_do(kind, tmp_path):
    """A graph whose weight columns are a GGUF tensor's dequantized rows, shuffled and a subset (as q/k
    permutations and split tensors arrive), computes with MatMulNBits what it computed in float (fp32
    accumulation, accuracy level 0), and a Q8_0 row's bytes are llama.cpp's bytes plus 128."""
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((48, 64)) * 0.05 + rng.standard_normal((48, 1)) * 0.02).astype(np.float32)
    _write_tensors(tmp_path / "w.gguf", {"blk.0.ffn_up.weight": (value, kind)})
    rows = rng.permutation(48)[:40]
    weight = np.ascontiguousarray(_dequantized(value, kind)[rows].T)  # [K, N]: the export's MatMul weight
    _matmul_graph(tmp_path / "float.onnx", {"w": weight})
    record = G.keep_blocks(tmp_path / "float.onnx", tmp_path / "kept.onnx", tmp_path / "w.gguf", 0)
    assert record["gguf"]["kept"] == {"mm_w": kind} and record["bits"] == G.KEPT[kind]

    a = rng.standard_normal((5, 64)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "kept.onnx"), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, a.astype(np.float64) @ weight.astype(np.float64), rtol=1e-5, atol=1e-5)
    model = onnx.load(str(tmp_path / "kept.onnx"))
    assert {n.op_type for n in model.graph.node} == ({"MatMulNBits"} if kind != "Q4_1" else {"MatMulNBits", "MatMul", "Add"})
    assert len(model.graph.initializer) == len({i.name for i in model.graph.initializer})
    if kind == "Q8_0":
        data = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w_Q8"))
        raw = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0).reshape(48, 2, 34)[rows]
        assert np.array_equal(data.astype(np.int16) - 128, raw[..., 2:].view(np.int8))


def test_weights_that_are_not_gguf_rows_stay_float(tmp_path):
    rng = np.random.default_rng(1)
    value = rng.standard_normal((32, 64)).astype(np.float32)
    _write_tensors(tmp_path / "w.gguf", {"blk.0.attn_q.weight": (value, "Q4_0")})
    own = rng.standard_normal((64, 16)).astype(np.float32)
    _matmul_graph(tmp_path / "float.onnx", {"gguf": np.ascontiguousarray(_dequantized(value, "Q4_0").T), "own": own})
    record = G.keep_blocks(tmp_path / "float.onnx", tmp_path / "kept.onnx", tmp_path / "w.gguf", 4)
    assert record["gguf"]["kept"] == {"mm_gguf": "Q4_0"} and record["gguf"]["float_matmuls"] == ["mm_own"]
    _matmul_graph(tmp_path / "other.onnx", {"own": own})
    with pytest.raises(ConfigError, match="no weight"):
        G.keep_blocks(tmp_path / "other.onnx", tmp_path / "x.onnx", tmp_path / "w.gguf", 4)


def _tiny_gguf(root, layers: int = 2):
    """A tiny tied-embedding llama written as llama.cpp would: Q4_1 linears, a Q8_0 embedding, a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
                                         tie_word_embeddings=True)).eval()
    model.save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    return write_llama_gguf(root / "hf", root / "tiny.gguf", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return _tiny_gguf(tmp_path_factory.mktemp("gguf"))


def test_a_gguf_exports_with_its_blocks_kept(tiny_gguf, tmp_path):
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline

    manifest = export_pipeline(str(tiny_gguf), None, tmp_path / "b", ExportOptions())
    q = manifest.target.quantization
    assert q["format"] == "gguf" and q["gguf"]["types"] == {"Q4_1": 8, "Q8_0": 1}  # 2 layers × 4 packed + head
    assert q["gguf"]["float_matmuls"] == [] and q["quantized_lookups"]  # the lookup reads the Q8_0 head's bytes
    assert q["parity"]["mean_kl"] < 1e-3 and q["parity"]["top1_agreement"] == 1.0
    assert manifest.target.source == str(tiny_gguf.resolve())
    from tokenizers import Tokenizer

    # transformers' GGUF tokenizer adds an <|endoftext|> past this vocabulary; the bundle's does not
    assert Tokenizer.from_file(str(tmp_path / "b" / "tokenizer.json")).get_vocab_size() == manifest.target.dims.vocab_size
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["chat_template.jinja", "specrt.json",
                                                                   "target.onnx", "tokenizer.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the hidden work folder is gone

    gen = specrt.load(tmp_path / "b", threads=1)
    want = gen.generate("def fib(n):", max_new_tokens=12, method="none").token_ids
    assert len(want) == 12 and gen.generate("def fib(n):", max_new_tokens=12, method="ngram").token_ids == want
    # --backend torch runs the checkpoint the bundle names: the GGUF, dequantized by transformers again.
    # (threads=1 sets torch's process-wide pool: put it back, later exports compare figures across processes)
    threads = torch.get_num_threads()
    try:
        torch_gen = specrt.load(tmp_path / "b", backend="torch", threads=1)
        assert len(torch_gen.generate("def fib(n):", max_new_tokens=4, method="none").token_ids) == 4
    finally:
        torch.set_num_threads(threads)


def test_an_fp16_bundle_keeps_the_blocks_too(tiny_gguf, tmp_path):
    """An fp16 graph holds the dequantized weights rounded to fp16; they still match their GGUF rows."""
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline

    q = export_pipeline(str(tiny_gguf), None, tmp_path / "b", ExportOptions(dtype="float16")).target.quantization
    assert q["gguf"]["types"] == {"Q4_1": 8, "Q8_0": 1} and q["gguf"]["float_matmuls"] == []
    assert "rounded to fp16" in q["gguf"]["weights"] and q["parity"]["top1_agreement"] >= 0.95


def test_a_gguf_target_and_draft_export_as_a_pair(tiny_gguf, tmp_path):
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline

    draft = write_llama_gguf(tiny_gguf.parent / "hf", tmp_path / "draft.gguf", linear="Q8_0")
    manifest = export_pipeline(str(tiny_gguf), str(draft), tmp_path / "b", ExportOptions())
    assert manifest.target.quantization["gguf"]["types"] == {"Q4_1": 8, "Q8_0": 1}
    assert manifest.draft.quantization["gguf"]["types"] == {"Q8_0": 9} and manifest.draft.quantization["bits"] == 8
    assert manifest.draft.source == str(draft.resolve())
    gen = specrt.load(tmp_path / "b", threads=1)
    want = gen.generate("def fib(n):", max_new_tokens=10, method="none").token_ids
    assert gen.generate("def fib(n):", max_new_tokens=10, method="draft", gamma=3).token_ids == want
    # --draft-quantize none: the draft dequantized, float; the target still keeps its blocks
    from specrt.export.quant.quantize import QuantizeOptions

    opts = QuantizeOptions(bits=None, draft_bits=None, eagle_bits=None, gguf=(("target", str(tiny_gguf)),))
    manifest = export_pipeline(str(tiny_gguf), str(draft), tmp_path / "c", ExportOptions(), opts)
    assert manifest.draft.quantization is None and manifest.target.quantization["format"] == "gguf"


def test_a_float_gguf_exports_float_and_quantize_re_quantizes(tiny_gguf, tmp_path):
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline
    from specrt.export.quant.quantize import QuantizeOptions

    plain = write_llama_gguf(tiny_gguf.parent / "hf", tmp_path / "f32.gguf", linear="F32", embedding="F32")
    manifest = export_pipeline(str(plain), None, tmp_path / "b", ExportOptions())
    assert manifest.target.quantization is None and manifest.target.source == str(plain.resolve())
    manifest = export_pipeline(str(tiny_gguf), None, tmp_path / "q", ExportOptions(), QuantizeOptions(bits=8))
    assert manifest.target.quantization["format"] == "MatMulNBits"  # asked for: RTN from the dequantized weights


def test_a_folder_holding_a_gguf_is_one_and_two_are_refused(tiny_gguf, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(tiny_gguf, folder / "a.gguf")
    assert G.find_gguf(str(folder)) == folder / "a.gguf"
    shutil.copy(tiny_gguf, folder / "b.gguf")
    with pytest.raises(ModelLoadError, match="2 GGUF files"):
        G.find_gguf(str(folder))
    (folder / "config.json").write_text(json.dumps({}))
    assert G.find_gguf(str(folder)) is None  # a Hugging Face folder, whatever else it holds


@pytest.mark.parametrize("size", [16, 20, 24])  # truncated inside the header, at its end, past it
def test_a_broken_gguf_is_one_line(tmp_path, size):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * size)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        G.stage(bad, tmp_path / "out")
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        G.has_blocks(bad)
    from click.testing import CliRunner

    from specrt.cli import main

    result = CliRunner().invoke(main, ["export", str(bad), "-o", str(tmp_path / "b")])
    assert result.exit_code != 0 and "bad.gguf" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b").exists()


def test_the_cli_exports_a_gguf(tiny_gguf, tmp_path):
    from click.testing import CliRunner

    from specrt.cli import main

    result = CliRunner().invoke(main, ["export", str(tiny_gguf), "--no-measure", "-o", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "Q4_1+Q8_0 blocks of tiny.gguf kept" in result.output and "done:" in result.output
    assert "Writing the float bundle, quantized next" in result.output and "Loading target tiny.gguf" in result.output
    assert ".b.float-" not in result.output  # the hidden work folder is the pipeline's business
    result = CliRunner().invoke(main, ["export", str(tiny_gguf), "--draft", str(tiny_gguf), "--draft-quantize", "none",
                                       "--gguf-blocks", "keep", "--no-measure", "-o", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "draft: float32 (not quantized)" in result.output and "target: Q4_1+Q8_0" in result.output


def test_a_head_trains_for_a_gguf_target(tmp_path):
    from specrt.export.eagle.checkpoint import load_eagle3
    from specrt.export.eagle.train import EagleTrainConfig, train_eagle

    (tmp_path / "m").mkdir()
    tiny_gguf = _tiny_gguf(tmp_path / "m", layers=4)  # the fewest a head can tap
    cfg = EagleTrainConfig(steps=4, batch_size=2, seq_len=64, num_sequences=4, draft_vocab=64, topk=8)
    record = train_eagle(tiny_gguf, tmp_path / "head", cfg, prompts=["def fib(n):", "import os", "x = 1"])
    assert record["target"] == str(tiny_gguf) and not (tmp_path / "head" / ".train").exists()
    assert load_eagle3(tmp_path / "head")[0].hidden_size == 64


def test_two_matmuls_reading_one_weight_share_its_blocks(tmp_path):
    rng = np.random.default_rng(2)
    value = rng.standard_normal((32, 64)).astype(np.float32)
    _write_tensors(tmp_path / "w.gguf", {"blk.0.attn_q.weight": (value, "Q4_1")})
    w = np.ascontiguousarray(_dequantized(value, "Q4_1").T)
    nodes = [helper.make_node("MatMul", ["A", "w"], [f"Y{i}"], name=f"mm{i}") for i in range(2)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", 64])],
                              [helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, ["M", 32]) for i in range(2)],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "f.onnx"))
    G.keep_blocks(tmp_path / "f.onnx", tmp_path / "k.onnx", tmp_path / "w.gguf", 0)
    model = onnx.load(str(tmp_path / "k.onnx"))
    onnx.checker.check_model(model)
    names = [i.name for i in model.graph.initializer]
    assert len(names) == len(set(names)) == 4  # blocks, scales, block offsets, the indicator: once each
    a = rng.standard_normal((3, 64)).astype(np.float32)
    y0, y1 = ort.InferenceSession(str(tmp_path / "k.onnx"), providers=["CPUExecutionProvider"]).run(None, {"A": a})
    np.testing.assert_allclose(y0, a @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y0, y1)


def test_a_gguf_with_a_head_is_requantized_unless_told_to_keep_its_blocks(tmp_path):
    """A drafter verifies several rows a step, which Q4 blocks make dear on a CPU: with --eagle the target is
    re-quantized (int4, gqa graphs) and says so; --gguf-blocks keep keeps the blocks and is told what verifying them
    costs here, with the command to compare; without a drafter the blocks are kept, silently."""
    from click.testing import CliRunner
    from support.models import save_eagle_head

    from specrt.bundle.manifest import load_manifest
    from specrt.cli import main

    gguf_file = _tiny_gguf(tmp_path, layers=4)
    head = save_eagle_head(tmp_path / "head", tmp_path / "hf", seed=3)
    res = CliRunner().invoke(main, ["export", str(gguf_file), "--eagle", str(head), "--no-measure",
                                    "-o", str(tmp_path / "auto")])
    assert res.exit_code == 0, res.output
    assert "int4 weights (HQQ) where they pass the quality gate, else int8: a drafter verifies" in res.output
    m = load_manifest(tmp_path / "auto")
    assert m.target.graph == "gqa" and m.target.quantization["bits"] == 4 and "gguf" not in m.target.quantization
    assert m.chosen["for"] == "cpu" and m.chosen["quantize"] == "int4" and len(m.chosen["why"]) >= 3
    res = CliRunner().invoke(main, ["export", str(gguf_file), "--eagle", str(head), "--gguf-blocks", "keep",
                                    "--no-measure", "-o", str(tmp_path / "keep")])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("verifying 4 rows of Q4_1+Q8_0 blocks costs"))
    assert f"specrt export {gguf_file} --eagle {head} --gguf-blocks requantize" in line
    assert load_manifest(tmp_path / "keep").target.quantization["gguf"]
    res = CliRunner().invoke(main, ["export", str(gguf_file), "--no-measure", "-o", str(tmp_path / "plain")])
    assert res.exit_code == 0 and "verifying 4 rows" not in res.output and "int4 weights" not in res.output
    assert "the GGUF's Q4/Q8 blocks kept" in res.output
