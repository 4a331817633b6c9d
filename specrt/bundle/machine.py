"""The machine a bundle's measured choices were made on (``specrt quantize --kernel auto``'s timing), so that
running the bundle elsewhere can say the choice may not hold there. Torch-free, numpy-free."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name and, on x86, its family and model ("AMD EPYC (family 25, model 17)": a VM's name
    alone may not tell a Zen 3 from a Zen 4), or what Python knows of it."""
    fields = _first_block(cpuinfo)
    name = fields.get("model name") or fields.get("Model")
    if not name:
        return platform.processor() or platform.machine() or "unknown"
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


# The instruction sets the kernels specrt runs depend on, as /proc/cpuinfo names them (x86 "flags", Arm
# "Features"): int8 matmuls (ORT's and export/quant/integer_matmul.py's) use AVX2's u8 x s8 pair sums, and VNNI's
# dot products where present (Arm: dotprod, i8mm); bf16 training is native only with AVX-512 BF16 or AMX.
KERNEL_ISA = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16",
              "asimd", "asimddp", "i8mm", "bf16", "sve")
_ARM_ONLY = {"asimd", "asimddp", "i8mm", "sve"}


def _first_block(cpuinfo: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_isa(cpuinfo: Path = CPUINFO) -> tuple[list[str], list[str]]:
    """(present, missing): the KERNEL_ISA instruction sets this CPU reports, and those of its architecture it
    lacks; ([], []) where /proc/cpuinfo says nothing (not Linux)."""
    fields = _first_block(cpuinfo)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    if not flags:
        return [], []
    arm = "flags" not in fields
    family = [f for f in KERNEL_ISA if (f in _ARM_ONLY or f == "bf16") == arm]
    return [f for f in family if f in flags], [f for f in family if f not in flags]


def cpu_cores() -> tuple[int, int]:
    """(usable by this process, online): a container or taskset may allow fewer than the machine has."""
    import os

    online = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else online
    return usable, online


def kernel_choice_note(quantization: dict | None, here: str | None = None) -> str | None:
    """A note when a target's int8 format was chosen by timing on another CPU than this one; else None."""
    choice = (quantization or {}).get("kernel_choice")
    if not choice or not choice.get("cpu"):
        return None
    here = here if here is not None else cpu_name()
    if choice["cpu"] == here:
        return None
    return (f"the target's int8 format ({choice['chosen']}) was chosen by timing on {choice['cpu']}; this is "
            f"{here}: `specrt quantize --kernel auto` here may choose the other")
