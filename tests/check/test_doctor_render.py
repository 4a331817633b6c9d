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


def test_render_names_the_cpu_its_cores_and_the_instruction_sets_the_kernels_use(tmp_path):
    from specrt.bundle.machine import cpu_isa

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\ncpu family\t: 25\nmodel\t\t: 1\n"
                   "flags\t\t: fpu sse2 fma f16c avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp crc32\n")
    assert cpu_isa(x86) == (["avx2", "fma", "f16c", "avx512f", "avx512_vnni"],
                            ["avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16"])
    assert cpu_isa(arm) == (["asimd", "asimddp"], ["i8mm", "bf16", "sve"])
    assert cpu_isa(tmp_path / "absent") == ([], [])
    report = Report("3.11.7", {}, [], cpu="AMD EPYC 7B13 (family 25, model 1)", cores=(2, 8), isa=cpu_isa(x86))
    lines = render(report).splitlines()
    assert "CPU           AMD EPYC 7B13 (family 25, model 1), 2 cores usable of 8 online" in lines
    assert "ISA           avx2 fma f16c avx512f avx512_vnni (lacks avx_vnni avx512_bf16 amx_int8 amx_bf16)" in lines
    assert not any("dot-product" in line for line in lines)
    plain = render(Report("3.11.7", {}, [], cpu="x", cores=(1, 1), isa=(["avx2"], ["avx512_vnni"])))
    assert "CPU           x, 1 core usable" in plain and "no int8 dot-product instructions" in plain
