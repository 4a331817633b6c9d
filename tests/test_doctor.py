import json

from click.testing import CliRunner

from specrt.cli import main
from specrt.doctor import jetson_info, parse_tegra_release


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


def test_doctor_on_this_machine():
    res = CliRunner().invoke(main, ["doctor"])
    assert res.exit_code == 0, res.output
    assert "onnxruntime" in res.output and "backend       onnxruntime" in res.output
    data = json.loads(CliRunner().invoke(main, ["doctor", "--json"]).output)
    assert data["python"] and "CPUExecutionProvider" in data["ort_providers"]
    assert data["backend"].startswith("onnxruntime")
