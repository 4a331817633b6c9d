"""`specrt export --for`: what export chooses where a setting is left unset (export.pipeline.choose), and the quality
gate's fallback from int4 to int8 to float that a CPU's choice relies on."""

from __future__ import annotations

import pytest

from specrt.errors import ConfigError
from specrt.export.pipeline import choose

CPU = dict(dtype=None, graph="auto", bits=None, decided=False, gguf=False, requantize_gguf=False)


def test_a_cpu_gets_int4_falling_back_to_int8_then_float_on_gqa_graphs():
    c = choose("cpu", **CPU)
    assert (c.dtype, c.graph, c.auto_graph, c.bits, c.fallback) == ("fp32", "auto", "gqa", 4, (8, None))
    assert any("int4 weights (HQQ)" in line for line in c.why) and c.record(8)["quantize"] == "int8"


def test_a_gguf_keeps_its_blocks_unless_a_drafter_asks_for_int4():
    kept = choose("cpu", **{**CPU, "gguf": True})
    assert kept.bits is None and kept.auto_graph == "fused" and "blocks kept" in " ".join(kept.why)
    requant = choose("cpu", **{**CPU, "gguf": True, "requantize_gguf": True})
    assert (requant.bits, requant.fallback, requant.auto_graph) == (4, (8,), "gqa")  # blocks dequantized: no float


def test_what_the_user_set_wins():
    c = choose("cpu", **{**CPU, "dtype": "fp16", "graph": "fused", "bits": 8, "decided": True})
    assert (c.dtype, c.graph, c.bits, c.fallback) == ("fp16", "fused", 8, ())
    assert not any("int4" in line or "fp32" in line for line in c.why)  # nothing chosen, nothing said
    proposer_only = choose("cpu", **{**CPU, "decided": True})
    assert proposer_only.bits is None and proposer_only.fallback == ()


@pytest.mark.parametrize("platform, graph", [("cuda", "gqa-static"), ("jetson", "gqa-static"),
                                             ("tensorrt", "portable")])
def test_nvidia_platforms_get_fp16_graphs_they_run_best(platform, graph):
    c = choose(platform, **CPU)
    assert (c.dtype, c.graph, c.bits, c.record(None)["quantize"]) == ("fp16", graph, None, "float")


def test_auto_is_this_machine_and_says_so():
    c = choose("auto", **CPU)
    assert c.platform == "cpu" and c.why[0] == "for cpu: this machine: no CUDA GPU that torch can see"


def test_an_unknown_platform_is_one_line():
    with pytest.raises(ConfigError, match="--for must be one of auto, cpu, cuda, tensorrt, jetson"):
        choose("tpu", **CPU)


def test_the_gate_s_refusal_falls_back_to_the_next_bits_then_to_float(pairs, tmp_path, monkeypatch):
    from specrt.bundle.manifest import load_manifest
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline
    from specrt.export.quant import quantize
    from specrt.export.quant.quantize import QuantizeOptions

    target, _ = pairs["llama"]
    said: list[str] = []
    monkeypatch.setattr(quantize, "MAX_MEAN_KL", {4: -1.0, 8: 0.01})  # int4 never passes here
    opts, q = ExportOptions(auto_graph="gqa"), QuantizeOptions(4, embeddings=False)
    m = export_pipeline(str(target), None, tmp_path / "b", opts, q, progress=said.append, fallback=(8, None))
    assert m.target.quantization["bits"] == 8 and m.target.graph == "gqa"
    assert any(line.startswith("target at int4 drifts too far") and line.endswith("trying int8") for line in said)
    monkeypatch.setattr(quantize, "MAX_MEAN_KL", {4: -1.0, 8: -1.0})  # nor int8: the float bundle
    m = export_pipeline(str(target), None, tmp_path / "f", opts, q, progress=said.append, fallback=(8, None))
    assert m.target.quantization is None and load_manifest(tmp_path / "f").target.quantization is None
    assert said[-1] == "target: kept float: no quantization passed the gate"
    with pytest.raises(ConfigError, match="int8 drifts too far"):  # no float to fall back to: refused, nothing written
        export_pipeline(str(target), None, tmp_path / "n", opts, q, fallback=(8,))
    assert not (tmp_path / "n").exists()
