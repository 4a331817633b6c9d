import json

import numpy as np
import pytest
from click.testing import CliRunner

from specrt.bundle.contract import ModelDims
from specrt.bundle.manifest import ModelEntry, load_manifest
from specrt.cli import main
from specrt.demo import bundle_path
from specrt.errors import BundleError, ConfigError
from specrt.measure import roofline

DIMS = ModelDims(num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64, hidden_size=512, vocab_size=4096)


def test_bytes_per_token_by_hand():
    plain = roofline.bytes_per_token(10, 10, roofline.PassBytes(100, 20))
    assert plain == 120  # one pass per token: weights + KV
    # 4 target passes and 12 draft passes for 10 tokens: (4 * 1200 + 12 * 60) / 10
    spec = roofline.bytes_per_token(10, 4, roofline.PassBytes(1000, 200), 12, roofline.PassBytes(50, 10))
    assert spec == pytest.approx(552.0)
    with pytest.raises(ValueError):
        roofline.bytes_per_token(0, 1, roofline.PassBytes(1, 1))
    with pytest.raises(ValueError, match="draft"):
        roofline.bytes_per_token(1, 1, roofline.PassBytes(1, 1), draft_passes=2)
    with pytest.raises(ValueError):
        roofline.PassBytes(-1, 0)


def test_kv_attention_and_roofline_arithmetic_by_hand():
    assert roofline.kv_bytes_per_position(DIMS, "float16") == 2 * 8 * 2 * 64 * 2  # 4096
    assert roofline.kv_bytes_per_position(DIMS, "float32") == 8192
    assert roofline.attention_flops_per_token(DIMS, 100) == 4 * 8 * 8 * 64 * 100
    assert roofline.achieved_gbps(50e6, 100) == pytest.approx(5.0)
    assert roofline.roofline_tokens_per_second(10, 50e6) == pytest.approx(200.0)
    with pytest.raises(ValueError):
        roofline.roofline_tokens_per_second(0, 1)
    with pytest.raises(ConfigError):
        roofline.attention_flops_per_token(DIMS, -1)
    t = roofline.ModelCost(1000, 1000, "manifest")
    d = roofline.ModelCost(100, 50, "manifest")
    assert roofline.mu(d, t) == pytest.approx(0.05)
    small = ModelDims(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=1, hidden_size=1, vocab_size=1)
    # + attention at context 10: draft 4*1*1*1*10 = 40, target 4*8*8*64*10 = 163840
    assert roofline.mu(d, t, small, DIMS, 10) == pytest.approx(90 / 164840)


def _tiny_graph(path):
    """MatMul on a constant, Gemm, a tied LM head (Transpose of the gathered embedding), a gather-only
    table and a MatMulNBits: every rule of graph_cost once."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.zeros((4, 3), np.float32), "w"),
             numpy_helper.from_array(np.zeros((3, 2), np.float32), "b"),
             numpy_helper.from_array(np.zeros((5, 4), np.float32), "tied"),
             numpy_helper.from_array(np.zeros((7, 4), np.float16), "table"),
             numpy_helper.from_array(np.zeros((6, 1, 4), np.uint8), "nbits_b"),
             numpy_helper.from_array(np.zeros((6,), np.float32), "nbits_scales")]
    nodes = [helper.make_node("Gather", ["tied", "ids"], ["e1"]),
             helper.make_node("Gather", ["table", "ids"], ["e2"]),
             helper.make_node("MatMul", ["x", "w"], ["h1"]),
             helper.make_node("Gemm", ["h1", "b"], ["h2"]),
             helper.make_node("Transpose", ["tied"], ["tied_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "tied_t"], ["logits"]),
             helper.make_node("MatMulNBits", ["y", "nbits_b", "nbits_scales"], ["z"], domain="com.microsoft",
                              K=8, N=6, bits=4, block_size=8),
             helper.make_node("MatMul", ["x", "h1"], ["act"])]  # activation x activation: no weight
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(g), str(path))


def test_graph_cost_counts_what_a_pass_reads_and_computes(tmp_path):
    _tiny_graph(tmp_path / "g.onnx")
    cost = roofline.graph_cost(tmp_path / "g.onnx")
    assert cost.matmul_flops_per_token == 2 * 12 + 2 * 6 + 2 * 20 + 2 * 8 * 6  # 172
    # w 48 + b 24 + tied 80 + MatMulNBits' packed 24 and scales 24; the gather-only fp16 table is not read
    assert cost.weight_bytes == 48 + 24 + 80 + 24 + 24
    assert cost.source == "onnx graph"
    est = roofline.estimated_cost(tmp_path / "g.onnx", 4)
    size = (tmp_path / "g.onnx").stat().st_size
    assert est.weight_bytes == size and est.matmul_flops_per_token == size // 2
    assert est.source.startswith("estimated")


def test_demo_bundle_costs_and_mu():
    m = load_manifest(bundle_path())
    assert m.target.weight_bytes is None  # shipped before the figures were recorded: read from the graph
    t, d = roofline.entry_cost(bundle_path(), m.target), roofline.entry_cost(bundle_path(), m.draft)
    assert t.source == d.source == "onnx graph"
    # fp16 target: 2 bytes per weight, 2 FLOPs per weight (the tied LM head reads the embedding table)
    assert t.weight_bytes == pytest.approx(t.matmul_flops_per_token, rel=0.01)
    assert 0.02 < roofline.mu(d, t) < 0.2
    recorded = roofline.entry_cost(bundle_path(), ModelEntry.from_json(
        {**m.target.to_json(), "dims": m.target.dims.__dict__, **t.manifest_fields()}))
    assert recorded.source == "manifest" and recorded.weight_bytes == t.weight_bytes


def test_manifest_records_costs_and_older_bundles_still_load(tmp_path):
    m = load_manifest(bundle_path())
    raw = {**m.target.to_json(), "dims": m.target.dims.__dict__}
    entry = ModelEntry.from_json({**raw, "weight_bytes": 10, "matmul_flops_per_token": 20})
    assert (entry.weight_bytes, entry.matmul_flops_per_token) == (10, 20)
    assert json.loads(json.dumps(entry.to_json()))["weight_bytes"] == 10
    assert ModelEntry.from_json(raw).weight_bytes is None
    with pytest.raises(BundleError, match="weight_bytes"):
        ModelEntry.from_json({**raw, "weight_bytes": -1, "matmul_flops_per_token": 20})


def test_plan_shows_ops_factor_and_oracle_ceiling():
    res = CliRunner().invoke(main, ["plan", "--alpha", "0.8", "--c", "0.02", "--mu", "0.01", "--max-gamma", "12"])
    assert res.exit_code == 0, res.output
    assert "2.60x its arithmetic" in res.output  # gamma 11: (1 - 0.8)(0.11 + 12) / (1 - 0.8^12) = 2.60
    assert "oracle ceiling (γ → ∞): 5.00 tokens per target pass; γ = 11 reaches 4.66, 93% of it" in res.output
    assert "time ratio" not in res.output
    stand_in = CliRunner().invoke(main, ["plan", "--alpha", "0.8", "--c", "0.02"])
    assert "μ = c = 0.020: a time ratio standing in" in stand_in.output
    bad = CliRunner().invoke(main, ["plan", "--alpha", "0.8", "--c", "0.02", "--mu", "-1"])
    assert bad.exit_code == 1 and bad.output.strip() == "Error: mu must be >= 0, got -1.0"


def test_plan_bundle_mu_reads_the_graphs():
    from specrt.measure.plan import bundle_mu

    m = load_manifest(bundle_path())
    mu0, line0 = bundle_mu(bundle_path(), m, context=0)
    mu, line = bundle_mu(bundle_path(), m, context=512)
    assert "onnx graph" in line0 and "attention" not in line0 and "attention at context 512" in line
    assert mu0 == pytest.approx(roofline.mu(roofline.entry_cost(bundle_path(), m.draft),
                                            roofline.entry_cost(bundle_path(), m.target)))
    assert mu != mu0


class _FixedMeter:
    """Two joules per measured stretch, whatever ran."""

    names = ["fixed"]

    def begin(self) -> None:
        pass

    def end(self) -> dict[str, float]:
        return {"fixed": 2.0}


@pytest.fixture(scope="module")
def demo_generator():
    import specrt

    return specrt.load(bundle_path(), threads=1)


def test_bench_rows_carry_bytes_roofline_and_energy(demo_generator):
    from specrt.data import prompts as builtin_prompts
    from specrt.measure.bandwidth import Bandwidth
    from specrt.measure.bench import BenchConfig, model_costs, run_bench

    prompts = builtin_prompts("code")[:1]
    res = run_bench(demo_generator, prompts, BenchConfig(methods=("none", "draft"), max_new_tokens=8, repeats=1),
                    bandwidth=Bandwidth("given", 10.0), energy=_FixedMeter())
    m, costs = demo_generator.manifest, model_costs(demo_generator)
    none, draft = res["methods"]["none"], res["methods"]["draft"]
    prompt_tokens = len(demo_generator.encode(prompts[0]))
    assert none["mean_context"] == prompt_tokens + 8 / 2
    kv = roofline.kv_bytes_per_position(m.target.dims, m.target.dtype)
    assert none["bytes_per_token"] == pytest.approx(costs["target"].weight_bytes + kv * none["mean_context"])
    assert none["ops_factor"] == 1.0 and none["draft_passes_per_token"] == 0
    expected = (draft["target_passes_per_token"] * (costs["target"].weight_bytes + kv * draft["mean_context"])
                + draft["draft_passes_per_token"] * (costs["draft"].weight_bytes + roofline.kv_bytes_per_position(
                    m.draft.dims, m.draft.dtype) * draft["mean_context"]))
    assert draft["bytes_per_token"] == pytest.approx(expected)
    assert draft["achieved_gbps"] == pytest.approx(draft["bytes_per_token"] * draft["tokens_per_second"] / 1e9)
    assert draft["roofline_fraction"] == pytest.approx(draft["achieved_gbps"] / 10.0)
    assert res["roofline"]["plain_roofline_tokens_per_second"] == pytest.approx(10e9 / none["bytes_per_token"])
    assert none["joules_per_token"] == pytest.approx(2.0 / 8) and none["tokens_per_joule"] == pytest.approx(4.0)
    assert res["config"]["energy_sources"] == ["fixed"]
    assert res["config"]["model_costs"]["target"]["source"] == "onnx graph"
    json.dumps(res)


def test_bench_cli_roofline_options(tmp_path):
    (tmp_path / "p.txt").write_text("def f(x):\n")
    bad = CliRunner().invoke(main, ["bench", "--bandwidth", "0"])
    assert bad.exit_code == 1 and bad.output.strip() == "Error: bandwidth must be > 0 GB/s, got 0.0"
    res = CliRunner().invoke(main, ["bench", "--prompts", str(tmp_path / "p.txt"), "--methods", "none,draft",
                                    "--max-new-tokens", "6", "--repeats", "1", "--threads", "1", "--bandwidth", "20",
                                    "--energy", "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    assert "% of roofline" in res.output and "plain decoding reads" in res.output
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["roofline"]["read_gbps"] == 20.0 and data["methods"]["draft"]["bytes_per_token"] > 0
    if "energy_sources" not in data["config"]:  # no source on this machine: said, not an error
        assert any(n.startswith("energy:") for n in data["notes"]) and "note: energy" in res.output
