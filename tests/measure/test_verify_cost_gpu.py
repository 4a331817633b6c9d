"""benchmarks/gpu/verify_cost_gpu.py's dry run on the CPU (the GPU run is scripts/gpu_check.sh's): a random
checkpoint of the named shape is built, timed per row count through specrt's torch backend, and reported
with verify_cost.py's fit."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "verify_cost_gpu.py"


@pytest.fixture()
def script(monkeypatch):
    spec = importlib.util.spec_from_file_location("verify_cost_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(module.MODELS, "tiny", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512))
    return module


def test_the_dry_run_times_every_row_count_and_fits_them(script, tmp_path):
    out = tmp_path / "v.json"
    assert script.main(["--device", "cpu", "--models", "tiny", "--repeats", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    row = report["models"]["tiny"]
    assert report["gpu"] is None and row["graphs"] is False
    assert list(row["ms"]) == [str(r) for r in script.ROWS] and all(v > 0 for v in row["ms"].values())
    fit = row["fit"]
    assert fit["ratio"]["1"] == 1.0 and set(fit["ratio"]) == set(row["ms"])
    attention = 2 * 64 * 64 + 2 * 64 * 32  # q, o; k, v over 2 kv heads of 16
    n_params = 512 * 64 + 2 * (attention + 3 * 64 * 128 + 2 * 64) + 64  # the embedding tied to the LM head
    assert row["weight_bytes"] == 2 * n_params
