import json

from click.testing import CliRunner

from specrt.check.doctor import jetson_info, parse_tegra_release
from specrt.cli import main


def test_parse_tegra_release():
    text = "# R36 (release), REVISION: 3.0, GCID: 36106755, BOARD: generic, EABI: aarch64, DATE: Thu Apr 25\n"
    assert parse_tegra_release(text) == "36.3.0"
    assert parse_tegra_release("garbage") is None


def test_jetson_detection_from_fixture_files(tmp_path):
    rel, model = tmp_path / "nv_tegra_release", tmp_path / "model"
    assert jetson_info(rel, model) is None  # not a Jetson
    rel.write_text("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64\n")
    model.write_text("NVIDIA Jetson AGX Orin Developer Kit\x00")
    info = jetson_info(rel, model)
    assert info.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert info.l4t == "35.4.1" and info.jetpack == "5.1.2"


def test_doctor_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path))
    res = CliRunner().invoke(main, ["doctor"])
    assert res.exit_code == 0, res.output
    assert "onnxruntime" in res.output and "backend       onnxruntime" in res.output
    assert f"cache         {tmp_path}: 0 verify-cost curves kept" in res.output
    (tmp_path / "verify-costs").mkdir()
    (tmp_path / "verify-costs" / "0123.json").write_text("{}")
    data = json.loads(CliRunner().invoke(main, ["doctor", "--json"]).output)
    assert data["python"] and "CPUExecutionProvider" in data["ort_providers"]
    assert data["backend"].startswith("onnxruntime")
    assert data["cache"] == str(tmp_path) and data["verify_curves"] == 1


def test_install_conflicts_are_named_with_their_fix():
    from specrt.check.doctor import JetsonInfo, install_conflicts

    assert install_conflicts({"onnxruntime", "numpy"}, "12.9.0", 12040, None, None) == []
    both = install_conflicts({"onnxruntime", "onnxruntime-gpu"}, None, None, None, None)
    assert len(both) == 1 and "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in both[0]
    (too_new,) = install_conflicts(set(), "13.5.0", 12040, None, None)  # CUDA 13 bindings on a CUDA 12.4 driver
    assert "CUDA 12.4" in too_new and "cuda-bindings>=12.6,<13" in too_new
    assert install_conflicts(set(), "12.9.0", 13000, None, None) == []  # older bindings on a newer driver: fine
    orin = JetsonInfo(model="NVIDIA Jetson AGX Orin", l4t="36.4.3", jetpack="6.1/6.2", power_mode=None)
    assert install_conflicts(set(), None, None, "10.3.0.30", orin) == []
    (pip_trt,) = install_conflicts(set(), None, None, "10.13.3.9", orin)
    assert "JetPack 6.1/6.2's (10.3.x)" in pip_trt and "use JetPack's" in pip_trt


def test_a_driver_older_than_cuda_bindings_is_not_reported_as_no_gpu(monkeypatch):
    import sys
    import types

    from specrt.export.tensorrt import TensorRTUnavailable, require_tensorrt

    class Err(int):
        pass

    runtime = types.SimpleNamespace(cudaError_t=types.SimpleNamespace(cudaErrorInsufficientDriver=Err(35)),
                                    cudaGetDeviceCount=lambda: (Err(35), None))
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    try:
        require_tensorrt()
    except TensorRTUnavailable as e:
        assert "driver is older" in str(e) and "no NVIDIA GPU" not in str(e)
    else:
        raise AssertionError("require_tensorrt accepted a driver too old for cuda-bindings")


def test_an_onnxruntime_that_reads_external_data_anywhere_is_named():
    from specrt.check.doctor import old_runtime

    note = old_runtime("1.23.2")
    assert "reads a graph's external data from any path" in note and "onnxruntime>=1.24" in note
    assert old_runtime("1.17.0") and old_runtime("1.24.0") is None and old_runtime("1.32.0") is None
    assert old_runtime("2.0.1") is None and old_runtime(None) is None and old_runtime("dev") is None
