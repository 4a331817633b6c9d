"""Energy over a stretch of work, from whatever the platform reports.

- Jetson: the on-board INA3221 power monitors. JetPack 5/6 (hwmon driver):
  ``/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in{N}_label``, ``curr{N}_input`` (mA) and ``in{N}_input``
  (bus mV), N = 1..3 (the kernel's Documentation/hwmon/ina3221.rst); older L4T (ina3221x, iio):
  ``/sys/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_{N}`` and ``in_power{N}_input`` (mW). These are
  power, so a background thread samples them and integrates (trapezoids).
- Intel/AMD RAPL: ``/sys/class/powercap/intel-rapl:N/energy_uj``, a µJ counter that wraps at
  ``max_energy_range_uj`` (Documentation/power/powercap/powercap.rst). Since Linux 5.10 (CVE-2020-8694)
  energy_uj is readable by root only.
- NVIDIA GPUs: NVML's nvmlDeviceGetTotalEnergyConsumption (mJ since the driver loaded; Volta and newer),
  through ``pynvml`` from the ``nvidia-ml-py`` package, an optional import.

Every sysfs path hangs off ``root`` so tests run the readers against fixture folders.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

# Rails that carry the whole module's input: when one is present it alone is the total (the other rails
# are inside it); otherwise every rail is summed. Names as L4T labels them (Orin Nano/NX: VDD_IN;
# Xavier NX: VDD_IN; TX2/Nano: VDD_IN / POM_5V_IN).
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "5V_IN", "VIN")


class EnergySource(Protocol):
    """Something that can say how many joules passed between :meth:`begin` and :meth:`end`."""

    name: str

    def begin(self) -> None: ...

    def end(self) -> float: ...


def counter_delta(before: int, after: int, max_range: int) -> int:
    """after - before for a counter that wraps to 0 past ``max_range`` (RAPL's energy_uj); at most one
    wrap is assumed, so read it more often than it wraps (minutes at hundreds of watts)."""
    if after >= before:
        return after - before
    return max_range - before + after


def integrate_power(samples: list[tuple[float, float]]) -> float:
    """Joules from (seconds, watts) samples, by trapezoids; 0 with fewer than two samples."""
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(samples, samples[1:]))


def per_token(joules: float, tokens: int) -> tuple[float, float]:
    """(joules per token, tokens per joule)."""
    if tokens <= 0 or joules <= 0:
        raise ValueError(f"need joules > 0 and tokens > 0, got {joules}, {tokens}")
    return joules / tokens, tokens / joules


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


@dataclass
class RaplSource:
    """CPU package energy from powercap's top-level RAPL zones (``intel-rapl:N``; sub-zones such as
    ``intel-rapl:0:0`` are inside their package and would count twice)."""

    zones: list[Path]
    name: str = "RAPL (CPU packages)"
    _start: list[int] = field(default_factory=list)

    def _read(self) -> list[int]:
        return [_read_int(z / "energy_uj") for z in self.zones]

    def begin(self) -> None:
        self._start = self._read()

    def end(self) -> float:
        now = self._read()
        return sum(counter_delta(a, b, _read_int(z / "max_energy_range_uj"))
                   for z, a, b in zip(self.zones, self._start, now)) / 1e6


@dataclass
class NvmlSource:
    """One GPU's energy counter through NVML (mJ since the driver loaded)."""

    handle: object
    nvml: object  # the pynvml module
    name: str = "NVML (GPU 0)"
    _start: int = 0

    def begin(self) -> None:
        self._start = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def end(self) -> float:
        return (self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self._start) / 1e3


@dataclass
class Rail:
    """One power rail: its label and a function giving its power now, in watts."""

    label: str
    watts: Callable[[], float]


@dataclass
class SampledPowerSource:
    """Power rails sampled on a background thread every ``interval_s`` and integrated to joules."""

    rails: list[Rail]
    name: str
    interval_s: float = 0.05
    clock: Callable[[], float] = time.perf_counter
    _samples: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def power(self) -> float:
        return sum(r.watts() for r in self.rails)

    def _sample(self) -> None:
        self._samples.append((self.clock(), self.power()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def begin(self) -> None:
        self._samples, self._stop = [], threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="specrt-power", daemon=True)
        self._thread.start()

    def end(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return integrate_power(self._samples)


def _choose_rails(rails: list[Rail]) -> list[Rail]:
    """The module-input rail(s) when the board has one, else every rail."""
    inputs = [r for r in rails if r.label.upper() in _INPUT_RAILS]
    return inputs or rails


def ina3221_rails(root: Path = Path("/")) -> list[Rail]:
    """Every INA3221 channel that has a label, from the hwmon driver (JetPack 5/6) or, where that has
    none, the older ina3221x iio driver."""
    rails = []
    for hw in sorted(root.glob("sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*")):
        for n in (1, 2, 3):  # curr4 / in7 are the sum channel: counted already
            label, curr, volt = hw / f"in{n}_label", hw / f"curr{n}_input", hw / f"in{n}_input"
            if label.is_file() and curr.is_file() and volt.is_file():
                rails.append(Rail(label.read_text().strip(),
                                  lambda c=curr, v=volt: _read_int(c) * _read_int(v) / 1e6))  # mA · mV → W
    if rails:
        return rails
    for dev in sorted(root.glob("sys/bus/i2c/drivers/ina3221x/*/iio:device*")):
        for name_file in sorted(dev.glob("rail_name_*")):
            n = name_file.name.rsplit("_", 1)[1]
            power = dev / f"in_power{n}_input"
            if power.is_file():
                rails.append(Rail(name_file.read_text().strip(), lambda p=power: _read_int(p) / 1e3))  # mW → W
    return rails


def rapl_zones(root: Path = Path("/")) -> list[Path]:
    """Top-level RAPL zones (``intel-rapl:N``, not ``intel-rapl:N:M``) that have an energy counter."""
    zones = [z for z in root.glob("sys/class/powercap/intel-rapl:*") if z.name.count(":") == 1]
    return sorted(z for z in zones if (z / "energy_uj").exists())


def _nvml_source() -> tuple[NvmlSource | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "NVML: pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        source = NvmlSource(handle, pynvml)
        source.begin()  # pre-Volta GPUs answer NOT_SUPPORTED here
    except pynvml.NVMLError as e:
        return None, f"NVML: no GPU energy counter ({e})"
    return source, None


@dataclass(frozen=True)
class Discovery:
    sources: list  # EnergySource objects that answered a first read
    notes: list[str]  # why each other source is missing or unreadable, in plain words


def find_sources(root: Path = Path("/"), nvml: bool = True, interval_s: float = 0.05) -> Discovery:
    """Every energy source readable here. Jetson power monitors, RAPL and NVML measure different parts of
    the machine (board input / CPU packages / one GPU), so their joules may be added."""
    sources: list = []
    notes: list[str] = []
    rails = ina3221_rails(root)
    if rails:
        chosen = _choose_rails(rails)
        power = SampledPowerSource(chosen, "INA3221 (" + " + ".join(r.label for r in chosen) + ")", interval_s)
        try:
            power.power()  # a first read: permissions and file contents
            sources.append(power)
        except PermissionError:
            notes.append("Jetson INA3221 power monitors: permission denied (run as root)")
        except (OSError, ValueError) as e:
            notes.append(f"Jetson INA3221 power monitors are unreadable: {e}")
    zones = rapl_zones(root)
    if zones:
        rapl = RaplSource(zones)
        try:
            rapl.begin()
            for z in zones:
                _read_int(z / "max_energy_range_uj")
            sources.append(rapl)
        except PermissionError:
            notes.append(f"RAPL: {zones[0] / 'energy_uj'} is readable by root only (since Linux 5.10): run as root, "
                         f"or sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj")
        except (OSError, ValueError) as e:
            notes.append(f"RAPL counters are unreadable: {e}")
    elif not rails:
        notes.append("no Jetson INA3221 power monitors and no RAPL counters under "
                     f"{root / 'sys'}")
    if nvml:
        source, why = _nvml_source()
        if source is not None:
            sources.append(source)
        elif why:
            notes.append(why)
    return Discovery(sources, notes)


class EnergyMeter:
    """All sources at once: ``begin()``, run the work, ``end()`` gives joules per source name."""

    def __init__(self, sources: list) -> None:
        if not sources:
            raise ValueError("an energy meter needs at least one source")
        self.sources = list(sources)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def begin(self) -> None:
        for s in self.sources:
            s.begin()

    def end(self) -> dict[str, float]:
        return {s.name: s.end() for s in self.sources}
