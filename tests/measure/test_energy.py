from pathlib import Path

import pytest

from specrt.measure import energy


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _rapl(root: Path, zone: str, uj: int, max_uj: int = 1000_000_000) -> Path:
    z = root / "sys/class/powercap" / zone
    _write(z / "energy_uj", str(uj))
    _write(z / "max_energy_range_uj", str(max_uj))
    return z


def test_energy_arithmetic_by_hand():
    assert energy.counter_delta(100, 250, 1000) == 150
    assert energy.counter_delta(900, 100, 1000) == 200  # wrapped once past max_energy_range_uj
    assert energy.integrate_power([(0.0, 10.0), (1.0, 20.0), (3.0, 20.0)]) == pytest.approx(15 + 40)
    assert energy.integrate_power([(0.0, 5.0)]) == 0.0
    assert energy.per_token(10.0, 4) == (2.5, 0.4)
    with pytest.raises(ValueError):
        energy.per_token(0.0, 4)


def test_rapl_packages_with_wrap_around(tmp_path):
    z0 = _rapl(tmp_path, "intel-rapl:0", 999_000_000)
    z1 = _rapl(tmp_path, "intel-rapl:1", 5_000_000)
    _rapl(tmp_path, "intel-rapl:0:0", 1)  # a core sub-zone: inside package 0, must not count twice
    found = energy.find_sources(tmp_path, nvml=False)
    (rapl,) = found.sources
    assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"] and found.notes == []
    rapl.begin()
    _write(z0 / "energy_uj", "2000000")  # wrapped: 1 J to the wrap + 2 J after it
    _write(z1 / "energy_uj", "9500000")  # 4.5 J
    assert rapl.end() == pytest.approx(7.5)


def test_rapl_permission_denied_is_said_plainly(tmp_path, monkeypatch):
    _rapl(tmp_path, "intel-rapl:0", 1)
    real = Path.read_text

    def denied(self, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", denied)  # tests may run as root, where chmod denies nothing
    found = energy.find_sources(tmp_path, nvml=False)
    assert found.sources == []
    assert len(found.notes) == 1 and "readable by root only" in found.notes[0] and "run as root" in found.notes[0]


def test_jetson_hwmon_rails_prefer_the_module_input(tmp_path):
    hw = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    for n, label, ma, mv in [(1, "VDD_IN", 1000, 5000), (2, "VDD_CPU_GPU_CV", 500, 5000), (3, "VDD_SOC", 200, 5000)]:
        _write(hw / f"in{n}_label", label)
        _write(hw / f"curr{n}_input", str(ma))
        _write(hw / f"in{n}_input", str(mv))
    _write(hw / "curr4_input", "1700")  # the sum channel: never added
    rails = energy.ina3221_rails(tmp_path)
    assert [r.label for r in rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert [r.watts() for r in rails] == [5.0, 2.5, 1.0]  # mA * mV / 1e6
    (src,) = energy.find_sources(tmp_path, nvml=False).sources
    assert src.name == "INA3221 (VDD_IN)" and src.power() == 5.0  # the input rail holds the others
    (hw / "in1_label").write_text("VDD_GPU_SOC\n")  # AGX-like: no input rail, so every rail is summed
    (src,) = energy.find_sources(tmp_path, nvml=False).sources
    assert src.power() == pytest.approx(8.5)


def test_jetson_older_iio_rails(tmp_path):
    dev = tmp_path / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    _write(dev / "rail_name_0", "POM_5V_IN")
    _write(dev / "in_power0_input", "4200")  # mW
    _write(dev / "rail_name_1", "POM_5V_GPU")
    _write(dev / "in_power1_input", "800")
    (src,) = energy.find_sources(tmp_path, nvml=False).sources
    assert src.name == "INA3221 (POM_5V_IN)" and src.power() == pytest.approx(4.2)


def test_sampled_power_integrates_on_a_thread():
    src = energy.SampledPowerSource([energy.Rail("VDD_IN", lambda: 5.0)], "test", interval_s=0.005)
    src.begin()
    import time

    time.sleep(0.05)
    joules = src.end()
    assert len(src._samples) >= 3  # the thread sampled between begin and end
    assert joules == pytest.approx(5.0 * (src._samples[-1][0] - src._samples[0][0]))
    assert joules > 5.0 * 0.04


def test_no_source_is_a_note_not_an_error(tmp_path):
    found = energy.find_sources(tmp_path, nvml=False)
    assert found.sources == [] and "no Jetson INA3221 power monitors and no RAPL counters" in found.notes[0]
    with pytest.raises(ValueError):
        energy.EnergyMeter([])
