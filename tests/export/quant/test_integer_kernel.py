"""int8 on ONNX Runtime's integer matmul (``--kernel integer``): the graph computes its numpy reference, each
row alone, close to float; a bundle made with it passes the gate, and speculation over it is plain decoding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from support.exactness import PROMPTS

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import ConfigError
from specrt.export.quant.integer_matmul import (ACT_MAX, ZERO_POINT, quantize_columns, reference_matmul, rewrite_integer,
                                          split_rows)
from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle
from specrt.runtime.masks import causal_mask

K, N = 96, 40


def _matmul_graph(weight: np.ndarray, opset: int = 21) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "q", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "q", N])],
                          [numpy_helper.from_array(weight, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture(scope="module")
def rewritten():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    model = _matmul_graph(w)
    assert rewrite_integer(model) == ["proj"]
    assert not any(i.name == "w" for i in model.graph.initializer)  # the float weight is gone
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return w, lambda x: session.run(None, {"x": x})[0]


def test_the_graph_computes_its_reference_and_stays_close_to_float(rewritten):
    w, run = rewritten
    x = np.random.default_rng(1).standard_normal((1, 6, K)).astype(np.float32)
    x[..., 3] *= 40  # an outlier channel, as LLM activations have: one scale per row must still fit the rest
    q, scale = quantize_columns(w)
    y = run(x)
    np.testing.assert_allclose(y, reference_matmul(x, q, scale), rtol=1e-5, atol=1e-5)
    exact = x @ w
    # the weights' rounding only: well under 1 % of the output's range; the hi half alone errs several times more
    assert np.abs(y - exact).max() < 0.01 * np.abs(exact).max()
    hi_only = (split_rows(x)[0].astype(np.float32) - ZERO_POINT) * split_rows(x)[2] @ w
    assert np.abs(hi_only - exact).max() > 3 * np.abs(y - exact).max()


def test_each_row_is_computed_alone(rewritten):
    """The point of per-row halves: a verify pass's matmul gives a row what a one-row pass gives it, bit for
    bit (integer sums are exact): no drafted row moves another's product."""
    _, run = rewritten
    x = np.random.default_rng(2).standard_normal((1, 9, K)).astype(np.float32)
    together = run(x)
    for r in range(9):
        np.testing.assert_array_equal(run(x[:, r:r + 1]), together[:, r:r + 1])
    x[:, 4] = 0  # an all-zero row: zeros out, nothing undefined
    assert np.array_equal(run(x)[:, 4], np.zeros((1, N), np.float32))


def test_halves_stay_within_seven_bits(rewritten):
    """AVX2's u8 x s8 kernel adds pairs of products in int16: activations ≤ 127 cannot saturate with 8-bit
    weights. Fractions of exactly ±1/2 are the edge (the graph rounds them as the reference does)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, K)).astype(np.float32)
    x[:, 0] = ACT_MAX  # the row's max: scale 1, so the next columns are exact half-steps
    x[:, 1], x[:, 2], x[:, 3] = 0.5, -0.5, 62.5
    hi, lo, s = split_rows(x)
    for half in (hi, lo):
        assert half.min() >= ZERO_POINT - ACT_MAX and half.max() <= ZERO_POINT + ACT_MAX <= 127
    back = (hi.astype(np.float32) - ZERO_POINT + (lo.astype(np.float32) - ZERO_POINT) / (2 * ACT_MAX)) * s
    assert np.abs(back - x).max() <= s.max() / (4 * ACT_MAX) + 1e-6
    w, run = rewritten
    q, scale = quantize_columns(w)
    np.testing.assert_allclose(run(x[None]), reference_matmul(x[None], q, scale), rtol=1e-5, atol=1e-5)


def test_the_graphs_halves_are_the_references_bit_for_bit_in_ten_nodes():
    """Each quantized input takes ten nodes (QuantizeLinear makes each half's uint8: it divides by the float32
    1/126, and the reference does the same; multiplying by 126 instead rounds a few in 10^5 the other way)."""
    rng = np.random.default_rng(4)
    model = _matmul_graph((rng.standard_normal((K, N)) * 0.05).astype(np.float32))
    rewrite_integer(model)
    ops = [n.op_type for n in model.graph.node]
    before = ops[:ops.index("MatMulIntegerToFloat")]
    assert len(before) == 10 and before.count("QuantizeLinear") == 2 and "Cast" not in before
    model.graph.output.append(helper.make_tensor_value_info("x.i8.u8", TensorProto.UINT8, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 4000, K)).astype(np.float32) * rng.uniform(0.01, 50, (1, 4000, 1)).astype(np.float32)
    x[0, :50, 0], x[0, :50, 1:51] = ACT_MAX, np.arange(-25, 25, dtype=np.float32) / 126 + 1 / 252  # half-steps
    hi, lo, _ = split_rows(x)
    np.testing.assert_array_equal(session.run(None, {"x": x})[1], np.concatenate([hi, lo], axis=-2))


def test_graphs_it_cannot_rewrite_are_refused_in_one_line(tmp_path):
    from specrt.export.quant.quantize import quantize_graph

    with pytest.raises(ValueError, match="opset 18"):
        rewrite_integer(_matmul_graph(np.ones((K, N), np.float32), opset=17))
    for name, model in (("old.onnx", _matmul_graph(np.ones((K, N), np.float32), opset=17)),
                        ("half.onnx", _matmul_graph(np.ones((K, N), np.float16)))):
        onnx.save(model, str(tmp_path / name))
        with pytest.raises(ConfigError, match="opset 18|float16"):
            quantize_graph(tmp_path / name, tmp_path / f"q-{name}", 8, 32, 4, kernel="integer")
        assert not (tmp_path / f"q-{name}").exists()


@pytest.fixture(scope="module")
def int8_integer(close_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("qi") / "int8-integer"
    quantize_bundle(close_bundle, out, QuantizeOptions(bits=8, kernel="integer"))
    return out


def test_a_bundle_on_the_integer_kernel_passes_the_gate_and_records_it(int8_integer, close_bundle):
    m, floats = load_manifest(int8_integer), load_manifest(close_bundle)
    for role, entry in m.models.items():
        ops = [n.op_type for n in onnx.load(str(int8_integer / entry.file)).graph.node]
        q = entry.quantization
        assert q["kernel"] == "integer" and q["bits"] == 8 and "MatMulNBits" not in ops
        per_layer = 4 if entry.graph == "fused" else 7
        assert ops.count("MatMulIntegerToFloat") == len(q["quantized_matmuls"]) == per_layer * entry.dims.num_layers + 1
        assert q["parity"]["mean_kl"] <= q["parity"]["max_mean_kl"]
        # the same arithmetic counted as the float graph's, for the roofline and bench's ops factor
        assert entry.matmul_flops_per_token == floats.models[role].matmul_flops_per_token
        assert entry.weight_bytes < 0.5 * floats.models[role].weight_bytes


def test_speculation_over_the_integer_kernel_is_plain_decoding(int8_integer):
    gen = specrt.load(int8_integer, threads=1)
    target = gen.decoders["target"]
    ids = np.array(gen.encode(PROMPTS[0])[:12])
    n = len(ids)
    wide = target.forward(target.new_cache(n), ids, np.arange(n), causal_mask(n, 0)).logits.copy()
    cache = target.new_cache(n)
    for j in range(n):  # the same rows one pass each
        row = target.forward(cache, ids[j:j + 1], np.arange(j, j + 1), causal_mask(1, j)).logits[0]
        cache.advance(1)
        np.testing.assert_allclose(row, wide[j], atol=1e-4)
    for prompt in PROMPTS:
        want = gen.generate(prompt, max_new_tokens=24, method="none").token_ids
        for method in ("draft", "tree", "ngram"):
            assert gen.generate(prompt, max_new_tokens=24, method=method).token_ids == want, (prompt, method)


def test_kernel_requests_are_checked_in_one_line(close_bundle, int8_integer, tmp_path):
    with pytest.raises(ConfigError, match="--kernel"):
        QuantizeOptions(bits=8, kernel="gemm")
    res = CliRunner().invoke(main, ["quantize", str(close_bundle), "-o", str(tmp_path / "a"), "--bits", "int4",
                                    "--kernel", "integer"])
    assert res.exit_code == 1 and "int8 weights only" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "a").exists()
    res = CliRunner().invoke(main, ["quantize", str(int8_integer), "-o", str(tmp_path / "b"), "--bits", "int8"])
    assert res.exit_code == 1 and "already quantized" in res.output
    from specrt.export.tensorrt import resolve_precision

    with pytest.raises(ConfigError, match="MatMulIntegerToFloat.*float bundle"):
        resolve_precision(list(load_manifest(int8_integer).models.values()), None)
