"""``specrt doctor``: what specrt sees on this machine and which backend ``specrt run`` would use."""

from __future__ import annotations

import importlib
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

TEGRA_RELEASE = Path("/etc/nv_tegra_release")
DT_MODEL = Path("/proc/device-tree/model")
NVPMODEL = "nvpmodel"


@dataclass(frozen=True)
class JetsonInfo:
    model: str
    l4t: str | None  # e.g. "36.3.0"
    jetpack: str | None  # from the L4T release, where the mapping is known
    power_mode: str | None


# L4T release → JetPack (NVIDIA's published pairs; extend as JetPack releases appear).
_JETPACK = {"35.4": "5.1.2", "35.5": "5.1.3", "35.6": "5.1.4", "36.2": "6.0 DP", "36.3": "6.0", "36.4": "6.1/6.2",
            "38.2": "7.0"}


def parse_tegra_release(text: str) -> str | None:
    """'# R36 (release), REVISION: 3.0, GCID: ...' → '36.3.0'."""
    import re

    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def jetson_info(tegra_release: Path = TEGRA_RELEASE, dt_model: Path = DT_MODEL) -> JetsonInfo | None:
    """Jetson model / L4T / JetPack / power mode, or None when this is not a Jetson."""
    if not tegra_release.is_file():
        return None
    l4t = parse_tegra_release(tegra_release.read_text(errors="replace"))
    model = dt_model.read_text(errors="replace").strip("\x00\n ") if dt_model.is_file() else "unknown Jetson"
    jetpack = _JETPACK.get(".".join(l4t.split(".")[:2])) if l4t else None
    power = None
    if shutil.which(NVPMODEL):
        try:
            out = subprocess.run([NVPMODEL, "-q"], capture_output=True, text=True, timeout=5).stdout
            power = next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Power Mode" in line), None)
        except (OSError, subprocess.SubprocessError):
            power = None
    return JetsonInfo(model, l4t, jetpack, power)


# L4T release (major.minor) → the TensorRT major.minor its JetPack ships.
_JETPACK_TENSORRT = {"35.4": "8.5", "35.5": "8.5", "35.6": "8.5", "36.2": "8.6", "36.3": "8.6", "36.4": "10.3"}
_CUDA_BINDINGS_FOR_DRIVER = {12: "cuda-bindings>=12.6,<13", 13: "cuda-bindings>=13,<14"}


def install_conflicts(distributions: set[str], cuda_bindings: str | None, driver_cuda: int | None,
                      tensorrt: str | None, jetson: JetsonInfo | None) -> list[str]:
    """What is installed together that cannot work together, each with its fix.

    ``distributions``: installed distribution names; ``driver_cuda``: the driver's CUDA version as
    cudaDriverGetVersion gives it (12040 = 12.4); ``tensorrt``: the importable TensorRT's version."""
    notes = []
    if {"onnxruntime", "onnxruntime-gpu"} <= distributions:
        notes.append("onnxruntime and onnxruntime-gpu are both installed; they share one folder, so the CUDA "
                     "provider may silently be missing. Fix: pip uninstall -y onnxruntime onnxruntime-gpu && "
                     "pip install onnxruntime-gpu")
    if cuda_bindings and driver_cuda:
        major, driver_major = int(cuda_bindings.split(".")[0]), driver_cuda // 1000
        if major > driver_major:
            fix = _CUDA_BINDINGS_FOR_DRIVER.get(driver_major, f"cuda-bindings<{driver_major + 1}")
            notes.append(f"cuda-bindings {cuda_bindings} needs a CUDA {major} driver, this driver runs CUDA "
                         f"{driver_major}.{driver_cuda % 1000 // 10} (GPUs look absent). Fix: pip install '{fix}'")
    if jetson and jetson.l4t and tensorrt:
        want = _JETPACK_TENSORRT.get(".".join(jetson.l4t.split(".")[:2]))
        if want and not tensorrt.startswith(want + "."):
            notes.append(f"TensorRT {tensorrt} is not JetPack {jetson.jetpack}'s ({want}.x): a pip-installed TensorRT "
                         "does not match the Jetson's drivers. Fix: pip uninstall tensorrt, use JetPack's "
                         "(apt install tensorrt python3-libnvinfer)")
    return notes


def _driver_cuda() -> int | None:
    """The driver's CUDA version (12040 = 12.4), from cuda-bindings or nvidia-smi; None without a driver."""
    try:
        from cuda.bindings import runtime as cudart

        err, version = cudart.cudaDriverGetVersion()
        if int(err) == 0 and version:
            return int(version)
    except ImportError:
        pass
    if shutil.which("nvidia-smi"):
        import re

        try:
            out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
        if found:
            return int(found.group(1)) * 1000 + int(found.group(2)) * 10
    return None


def _distributions() -> set[str]:
    from importlib.metadata import distributions

    return {(d.metadata["Name"] or "").lower().replace("_", "-") for d in distributions()}


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except Exception:  # a broken optional install (e.g. TensorRT without its libs) counts as absent
        return None


@dataclass
class Report:
    python: str
    packages: dict[str, str | None]
    ort_providers: list[str]
    gpus: list[dict] = field(default_factory=list)
    gpu_source: str | None = None
    jetson: JetsonInfo | None = None
    backend: str = "none"
    notes: list[str] = field(default_factory=list)
    cache: str = ""  # specrt's per-user cache folder
    verify_curves: int = 0  # verify-cost curves kept there (runtime.costs), one per graph, backend and machine
    cpu: str = ""  # bundle.machine.cpu_name()
    cores: tuple[int, int] = (0, 0)  # (usable by this process, online)
    isa: tuple[list[str], list[str]] = ([], [])  # (present, missing) of bundle.machine.KERNEL_ISA


def _gpus_from_torch() -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1)})
    return out


def _gpus_from_nvidia_smi() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        idx, name, cc, mem = (x.strip() for x in line.split(","))
        gpus.append({"index": int(idx), "name": name, "compute_capability": cc, "memory_gib": round(float(mem) / 1024, 1)})
    return gpus


CONFINING_ORT = (1, 24)  # the first ONNX Runtime that keeps a graph's external data inside the graph's folder


def old_runtime(version: str | None) -> str | None:
    """A note when the installed ONNX Runtime reads external data from any path a graph names (before ~1.24)."""
    try:
        major_minor = tuple(int(part) for part in (version or "").split(".")[:2])
    except ValueError:
        return None
    if len(major_minor) < 2 or major_minor >= CONFINING_ORT:
        return None
    return (f"onnxruntime {version} reads a graph's external data from any path the graph names (absolute, ../): "
            "specrt checks every bundle it loads itself, but other tools opening a shared bundle's graphs do not. "
            f"Fix: pip install 'onnxruntime>={CONFINING_ORT[0]}.{CONFINING_ORT[1]}' (on a Jetson, the newest "
            "onnxruntime-gpu wheel for your JetPack)")


def diagnose() -> Report:
    from ..runtime.backends import available_backends

    packages = {m: _version(m) for m in ("numpy", "onnxruntime", "tokenizers", "tensorrt", "torch", "transformers",
                                         "onnx", "cuda.bindings", "cupy")}
    providers: list[str] = []
    if packages["onnxruntime"]:
        import onnxruntime as ort

        providers = ort.get_available_providers()
    gpus, source = _gpus_from_nvidia_smi(), "nvidia-smi"
    if not gpus:
        gpus, source = _gpus_from_torch(), "torch"
    from ..bundle.machine import cpu_cores, cpu_isa, cpu_name
    from ..bundle.safety import cache_dir
    from ..runtime.costs import CURVES_FOLDER

    cache = cache_dir()
    report = Report(python=platform.python_version(), packages=packages, ort_providers=providers, gpus=gpus,
                    gpu_source=source if gpus else None, jetson=jetson_info(), cache=str(cache),
                    verify_curves=len(list((cache / CURVES_FOLDER).glob("*.json"))), cpu=cpu_name(),
                    cores=cpu_cores(), isa=cpu_isa())
    backends = available_backends()
    report.backend = backends[0] if backends else "none"
    if report.backend == "tensorrt":
        report.backend = "tensorrt (for bundles with engines from `specrt build`), else onnxruntime"
    if report.backend == "onnxruntime":
        from ..runtime.backends.onnxruntime import choose_providers

        report.backend += f" ({choose_providers(providers)[0]})"
    if "CUDAExecutionProvider" in providers and not gpus:
        report.notes.append("onnxruntime-gpu lists CUDA but no GPU is visible: sessions will fall back to CPU")
    report.notes += install_conflicts(_distributions(), packages["cuda.bindings"], _driver_cuda(),
                                      packages["tensorrt"], report.jetson)
    report.notes += [note for note in [old_runtime(packages["onnxruntime"])] if note]
    if gpus and not packages["tensorrt"]:
        report.notes.append("a GPU is present but TensorRT is not importable: pip install 'specrt[trt]' on x86-64, "
                            "or use JetPack's TensorRT on Jetson")
    return report


def as_dict(report: Report, bandwidth: list[dict] | None = None) -> dict:
    """``specrt doctor --json``: the report, and the bandwidth probes when they ran."""
    from dataclasses import asdict

    return {**asdict(report), **({"bandwidth": bandwidth} if bandwidth is not None else {})}


def render(report: Report, bandwidth: list[dict] | None = None) -> str:
    """``specrt doctor``'s text: one labelled line per fact, then the notes and the bandwidth probes."""
    r = report
    lines = [f"python        {r.python}", *(f"{name:<13} {version or '-'}" for name, version in r.packages.items()),
             f"ORT providers {', '.join(r.ort_providers) or '-'}"]
    if r.cpu:
        usable, online = r.cores
        lines.append(f"CPU           {r.cpu}, {usable} core{'s' * (usable != 1)} usable"
                     + (f" of {online} online" if online != usable else ""))
    present, missing = r.isa
    if present or missing:
        lines.append(f"ISA           {' '.join(present) or '-'}" + (f" (lacks {' '.join(missing)})" if missing else ""))
        if not {"avx512_vnni", "avx_vnni", "asimddp"} & set(present):
            lines.append("note          no int8 dot-product instructions (VNNI, dotprod): int8 matmuls use plain "
                         "multiply-adds here; `specrt export --quantize int8 --kernel auto` times both formats")
    lines += [f"GPU {g['index']}         {g['name']}, compute {g['compute_capability']}, {g['memory_gib']} GiB "
              f"(via {r.gpu_source})" for g in r.gpus] or ["GPU           none visible"]
    if r.jetson:
        j = r.jetson
        lines.append(f"Jetson        {j.model}, L4T {j.l4t or '?'}, JetPack {j.jetpack or '?'}, "
                     f"power mode {j.power_mode or '?'}")
    lines.append(f"backend       {r.backend}")
    if r.cache:
        lines.append(f"cache         {r.cache}: {r.verify_curves} verify-cost curve{'s' * (r.verify_curves != 1)} "
                     "kept (delete its verify-costs folder to measure them again)")
    lines += [f"note          {note}" for note in r.notes]
    for p in bandwidth or []:
        if "read_gbps" in p:
            lines.append(f"bandwidth     {p['device']}: read {p['read_gbps']:.1f} GB/s, copy {p['copy_gbps']:.1f} "
                         f"GB/s ({p['array_bytes'] / 2**20:.0f} MiB, best of {p['repeats']})")
        else:
            lines.append(f"bandwidth     {p['device']}: skipped, {p['skipped']}")
    return "\n".join(lines)
