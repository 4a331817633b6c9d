"""`specrt doctor`'s text and JSON come from check.doctor (render, as_dict), not from the CLI."""

from __future__ import annotations

import json

from specrt.check.doctor import JetsonInfo, Report, as_dict, render


def _report() -> Report:
    return Report("3.11.7", {"numpy": "2.0", "tensorrt": None}, ["CPUExecutionProvider"],
                  gpus=[{"index": 0, "name": "Orin", "compute_capability": "8.7", "memory_gib": 61.4}],
                  gpu_source="torch", jetson=JetsonInfo("NVIDIA Jetson AGX Orin", "36.4.3", "6.1/6.2", None),
                  backend="onnxruntime (CPUExecutionProvider)", notes=["a note"], cache="/home/u/.cache/specrt",
                  verify_curves=1)


def test_render_labels_every_fact():
    probes = [{"device": "host", "read_gbps": 12.34, "copy_gbps": 5.0, "array_bytes": 4 * 2**20, "repeats": 3},
              {"device": "GPU", "skipped": "no GPU here"}]
    assert render(_report(), probes).splitlines() == [
        "python        3.11.7",
        "numpy         2.0",
        "tensorrt      -",
        "ORT providers CPUExecutionProvider",
        "GPU 0         Orin, compute 8.7, 61.4 GiB (via torch)",
        "Jetson        NVIDIA Jetson AGX Orin, L4T 36.4.3, JetPack 6.1/6.2, power mode ?",
        "backend       onnxruntime (CPUExecutionProvider)",
        "cache         /home/u/.cache/specrt: 1 verify-cost curve kept (delete its verify-costs folder to measure them "
        "again)",
        "note          a note",
        "bandwidth     host: read 12.3 GB/s, copy 5.0 GB/s (4 MiB, best of 3)",
        "bandwidth     GPU: skipped, no GPU here"]
    bare = render(Report("3.11.7", {}, []))
    assert bare.splitlines() == ["python        3.11.7", "ORT providers -", "GPU           none visible",
                                 "backend       none"]


def test_json_carries_bandwidth_only_when_probed():
    assert "bandwidth" not in as_dict(_report())
    data = json.loads(json.dumps(as_dict(_report(), [{"device": "GPU", "skipped": "x"}])))
    assert data["bandwidth"] == [{"device": "GPU", "skipped": "x"}] and data["jetson"]["l4t"] == "36.4.3"
