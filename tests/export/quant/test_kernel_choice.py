"""``--kernel auto``: both int8 graphs made and timed on this machine, the faster kept, the other roles
following the target's choice; the timing recorded and printed."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import onnx
import pytest
from click.testing import CliRunner

import specrt.export.quant.kernel_choice as kc
from specrt.bundle.machine import cpu_name, kernel_choice_note
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.export.quant.quantize import QuantizeOptions, describe, quantize_bundle


def _ops(bundle, entry) -> list[str]:
    return [n.op_type for n in onnx.load(str(bundle / entry.file)).graph.node]


def test_the_choice_is_the_faster_graph_at_the_rows_weighed():
    slow_one_row = kc.KernelTiming(4, {"nbits": {1: 9.0, 4: 12.0}, "integer": {1: 11.0, 4: 11.5}})
    assert slow_one_row.chosen == "integer"  # a proposer's bundle weighs its verify passes
    assert kc.KernelTiming(1, {"nbits": {1: 9.0}, "integer": {1: 11.0}}).chosen == "nbits"
    assert kc.KernelTiming(1, {"nbits": {1: 9.0}, "integer": {1: 9.0}}).chosen == "nbits"  # a tie: the portable one
    record = slow_one_row.record()
    assert record["chosen"] == "integer" and record["ms"]["nbits"] == {"1": 9.0, "4": 12.0}
    assert kc.describe_choice(record) == ("--kernel auto chose integer (ms per pass at 1/4 rows: nbits 9.00/12.00, "
                                          "integer 11.00/11.50)")


def test_the_rows_weighed_follow_what_the_bundle_can_propose_with(close_bundle):
    m = load_manifest(close_bundle)
    assert kc.decisive_rows(m) == kc.VERIFY_ROWS  # it has a draft model
    assert kc.decisive_rows(replace(m, models={"target": m.target})) == 1


def test_auto_keeps_what_it_timed_faster_here(close_bundle, tmp_path):
    out = tmp_path / "auto"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=8, kernel="auto"))
    choice = m.target.quantization["kernel_choice"]
    assert choice["rows"] == kc.VERIFY_ROWS and set(choice["ms"]) == {"nbits", "integer"}
    times = {k: t[str(choice["rows"])] for k, t in choice["ms"].items()}
    assert all(t > 0 for ms in choice["ms"].values() for t in ms.values())
    assert choice["chosen"] == min(times, key=times.get) == m.target.quantization["kernel"]
    on_integer = choice["chosen"] == "integer"
    for entry in m.models.values():  # the draft follows the target's kernel
        ops = _ops(out, entry)
        assert ("MatMulIntegerToFloat" in ops) == on_integer and ("MatMulNBits" in ops) != on_integer
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no candidate left behind
    assert "--kernel auto chose " + choice["chosen"] in describe(m)
    assert choice["cpu"] == cpu_name()
    # run where it was timed: no note; moved to another CPU, bench says the choice may not hold there
    assert kernel_choice_note(m.target.quantization) is None
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    raw = json.loads((moved / "specrt.json").read_text())
    raw["models"]["target"]["quantization"]["kernel_choice"]["cpu"] = "Other CPU (family 6, model 143)"
    (moved / "specrt.json").write_text(json.dumps(raw))
    res = CliRunner().invoke(main, ["bench", "--bundle", str(moved), "--methods", "none", "--max-new-tokens", "4",
                                    "--repeats", "1", "--prompt-set", "prose"])
    assert res.exit_code == 0, res.output
    assert f"({choice['chosen']}) was chosen by timing on Other CPU (family 6, model 143)" in " ".join(res.output.split())


def test_the_cpu_is_named_by_model_and_family(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                   "model name\t: AMD EPYC\n\nprocessor\t: 1\nmodel name\t: other\n")
    assert cpu_name(x86) == "AMD EPYC (family 25, model 17)"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 62.50\nCPU part\t: 0xd42\n")
    assert cpu_name(arm) == cpu_name(tmp_path / "absent")  # no model name: what Python knows of the machine
    timed = {"kernel_choice": {"chosen": "integer", "cpu": "Intel Xeon (family 6, model 143)"}}
    assert kernel_choice_note(timed, here="Intel Xeon (family 6, model 143)") is None
    assert "timing on Intel Xeon" in kernel_choice_note(timed, here="AMD EPYC (family 25, model 17)")
    assert kernel_choice_note({"bits": 8}) is None and kernel_choice_note(None) is None


@pytest.mark.parametrize("faster", ["integer", "nbits"])
def test_every_role_follows_the_timing(close_bundle, tmp_path, monkeypatch, faster):
    other = "nbits" if faster == "integer" else "integer"

    def timed(folders, entry, rows):
        assert set(folders) == {"nbits", "integer"} and all((f / entry.file).is_file() for f in folders.values())
        return kc.KernelTiming(rows, {faster: {1: 5.0, rows: 6.0}, other: {1: 7.0, rows: 8.0}})

    monkeypatch.setattr(kc, "time_graphs", timed)
    out = tmp_path / faster
    res = CliRunner().invoke(main, ["quantize", str(close_bundle), "-o", str(out), "--bits", "int8", "--kernel", "auto"])
    assert res.exit_code == 0, res.output
    assert f"--kernel auto chose {faster}" in res.output and "timing both" in res.output
    m = load_manifest(out)
    op = "MatMulIntegerToFloat" if faster == "integer" else "MatMulNBits"
    for role, entry in m.models.items():
        assert op in _ops(out, entry), role
        assert entry.quantization["parity"]["mean_kl"] <= entry.quantization["parity"]["max_mean_kl"]
    assert "kernel_choice" not in m.draft.quantization  # the target's timing decided it


def test_auto_on_int4_is_nbits_without_timing(close_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(kc, "time_graphs", lambda *a: pytest.fail("an int4 target has one kernel: nothing to time"))
    m = quantize_bundle(close_bundle, tmp_path / "q4", QuantizeOptions(bits=4, draft_bits=8, kernel="auto"))
    assert "kernel_choice" not in m.target.quantization
    assert "MatMulNBits" in _ops(tmp_path / "q4", m.draft)  # auto without a timed target: the default format


def test_a_graph_the_integer_kernel_refuses_keeps_nbits_untimed(close_bundle, tmp_path, monkeypatch):
    import specrt.export.quant.integer_matmul as im
    from specrt.errors import ConfigError

    def refuse(model, path, *args):
        raise ConfigError(f"{path.name} is float16: --kernel integer rewrites float32 graphs (export with --dtype fp32)")

    monkeypatch.setattr(im, "integer_graph", refuse)
    monkeypatch.setattr(kc, "time_graphs", lambda *a: pytest.fail("one candidate left: nothing to time"))
    out = tmp_path / "kept"
    m = quantize_bundle(close_bundle, out, QuantizeOptions(bits=8, kernel="auto"))
    choice = m.target.quantization["kernel_choice"]
    assert choice["chosen"] == m.target.quantization["kernel"] == "nbits" and "float16" in choice["refused"]["integer"]
    assert all("MatMulNBits" in _ops(out, e) for e in m.models.values())
    assert "kept nbits, the only format this graph takes (integer: target.onnx is float16" in describe(m)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert kernel_choice_note(m.target.quantization, here="another CPU") is None  # nothing was timed


def test_graphs_too_large_for_two_are_timed_one_at_a_time(close_bundle, tmp_path, monkeypatch):
    import specrt.runtime.backends.onnxruntime as ort_backend

    made = []
    real = kc._loaded
    monkeypatch.setattr(ort_backend, "available_memory", lambda: 1)  # nothing to spare: never two sessions
    monkeypatch.setattr(kc, "_loaded", lambda *a: made.append(a[0].name) or real(*a))
    m = quantize_bundle(close_bundle, tmp_path / "seq", QuantizeOptions(bits=8, kernel="auto"))
    choice = m.target.quantization["kernel_choice"]
    assert made == [".kernel-nbits", ".kernel-integer"] * kc.BLOCKS  # each block loads its candidate afresh
    assert choice["measure"].endswith("each loaded afresh per block")
    times = {k: t[str(choice["rows"])] for k, t in choice["ms"].items()}
    assert choice["chosen"] == min(times, key=times.get)
